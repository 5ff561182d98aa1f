package coord

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/concurrency"
)

// errStoreTimeout is a store call past its timeout, as go-redis reports
// one.
var errStoreTimeout = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

// slowStore is a MemoryStore whose acquire attempts time out while fails
// is above 0 (counting it down; below 0, always), each after the store
// ran it: the answer is lost.
type slowStore struct {
	*concurrency.MemoryStore
	mu    sync.Mutex
	fails int
}

func (s *slowStore) fail() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fails == 0 {
		return false
	}
	if s.fails > 0 {
		s.fails--
	}
	return true
}

func (s *slowStore) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	fence, err := s.MemoryStore.Acquire(ctx, name, token, limit, ttl, wait)
	if s.fail() {
		return 0, errStoreTimeout
	}
	return fence, err
}

func (s *slowStore) AcquireFair(ctx context.Context, name, token string, weight, limit int64, ttl, wait time.Duration) (concurrency.FairResult, uint64, error) {
	res, fence, err := s.MemoryStore.AcquireFair(ctx, name, token, weight, limit, ttl, wait)
	if s.fail() {
		return concurrency.Queued, 0, errStoreTimeout
	}
	return res, fence, err
}

// TestAcquireWaitsThroughStoreTimeouts checks, in fake time, that an
// acquire that waits is granted through store timeouts shorter than its
// wait (not Unavailable), counting them; that one whose wait ends with
// the store still failing is Unavailable, wrapping the store's error;
// and that an acquire without a wait is Unavailable at once.
func TestAcquireWaitsThroughStoreTimeouts(t *testing.T) {
	for _, fair := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			store := &slowStore{MemoryStore: concurrency.NewMemoryStore(), fails: 5}
			reg := prometheus.NewRegistry()
			s, err := New(Options{Store: store, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			g, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: 2 * time.Second, Fair: fair})
			if err != nil {
				t.Fatalf("fair %v: an acquire through 5 store timeouts within its wait: %v", fair, err)
			}
			if g.Fence != 1 {
				t.Errorf("fair %v: fence %d, want 1 (the grant whose answer was lost, taken again)", fair, g.Fence)
			}
			if n := store.HoldersAt(time.Now(), "x"); n != 1 {
				t.Errorf("fair %v: %d holders, want 1", fair, n)
			}
			if n := testutil.ToFloat64(s.metrics.storeErrors); n != 5 {
				t.Errorf("fair %v: %v store errors waited through, want 5", fair, n)
			}
			if err := s.Release(ctx, "x", g.PermitID); err != nil {
				t.Fatal(err)
			}

			store.mu.Lock()
			store.fails = -1
			store.mu.Unlock()
			start := time.Now()
			_, err = s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: 2 * time.Second, Fair: fair})
			if code(t, err) != Unavailable || !errors.Is(err, errStoreTimeout) || !errors.Is(err, concurrency.ErrStoreFailing) {
				t.Errorf("fair %v: a wait that ends with the store failing: %v, want Unavailable wrapping the store's timeout", fair, err)
			}
			// An attempt timing out within 10 ms of the deadline ends it.
			if el := time.Since(start); el < 2*time.Second-10*time.Millisecond || el > 2*time.Second {
				t.Errorf("fair %v: answered after %v, want the wait, 2s", fair, el)
			}
			if n := store.HoldersAt(time.Now(), "x"); n != 0 {
				t.Errorf("fair %v: %d holders after the failed wait, want 0", fair, n)
			}
			start = time.Now()
			if _, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Fair: fair}); code(t, err) != Unavailable || time.Since(start) != 0 {
				t.Errorf("fair %v: an acquire without a wait: %v after %v, want Unavailable at once", fair, err, time.Since(start))
			}
			if n := testutil.ToFloat64(s.metrics.calls.WithLabelValues("acquire", "unavailable")); n != 2 {
				t.Errorf("fair %v: %v acquires unavailable, want 2", fair, n)
			}
		})
	}
}
