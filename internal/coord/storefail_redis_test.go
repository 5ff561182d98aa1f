package coord

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestAcquireThroughRedisFreeze: on a redis-server that freezes (SIGSTOP)
// for several of the client's timeouts while an acquire waits for a
// permit, the acquire is granted once Redis answers again and the permit
// is released, within its wait: the timeouts were waits, not an error
// (Unavailable, serve's 503).
func TestAcquireThroughRedisFreeze(t *testing.T) {
	if testing.Short() {
		t.Skip("runs redis-server")
	}
	srv := redistest.Standalone(t)
	const timeout = 100 * time.Millisecond
	rc, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr()}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	store, err := redisstore.NewSemaphoreStore(rc, redisstore.SemaphoreOptions{Prefix: "freeze-test:"})
	if err != nil {
		t.Fatal(err)
	}
	for _, fair := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		s, err := New(Options{Store: store, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		name := "frozen-" + map[bool]string{false: "unfair", true: "fair"}[fair]
		held, err := s.Acquire(ctx, AcquireRequest{Name: name, Limit: 1, TTL: 10 * time.Second, Wait: 5 * time.Second, Fair: fair})
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			g   Grant
			err error
		}
		got := make(chan answer, 1)
		go func() {
			g, err := s.Acquire(ctx, AcquireRequest{Name: name, Limit: 1, TTL: 10 * time.Second, Wait: 8 * time.Second, Fair: fair})
			got <- answer{g, err}
		}()
		// Spans of real time, not synchronisations: the waiter waits, then
		// meets a Redis frozen for 10 of its client's timeouts.
		time.Sleep(300 * time.Millisecond)
		srv.Freeze()
		time.Sleep(10 * timeout)
		srv.Thaw()
		// Redis catches up after the thaw: a release may time out first.
		for i := 0; ; i++ {
			err := s.Release(ctx, name, held.PermitID)
			if err == nil {
				break
			}
			if i == 20 || code(t, err) != Unavailable {
				t.Fatalf("fair %v: release after the thaw: %v", fair, err)
			}
		}
		a := <-got
		if a.err != nil {
			t.Fatalf("fair %v: an acquire waiting through a Redis frozen for %v: %v", fair, 10*timeout, a.err)
		}
		if a.g.Fence <= held.Fence {
			t.Errorf("fair %v: fence %d, not above the released permit's %d", fair, a.g.Fence, held.Fence)
		}
		n := testutil.ToFloat64(s.metrics.storeErrors)
		t.Logf("fair %v: granted fence %d; %v store errors waited through", fair, a.g.Fence, n)
		if n < 1 {
			t.Errorf("fair %v: no store error waited through: was Redis frozen while the acquire waited?", fair)
		}
		if err := s.Release(context.Background(), name, a.g.PermitID); err != nil && code(t, err) != Unavailable {
			t.Error(err) // Unavailable: it lapses within its TTL
		}
		s.Shutdown()
	}
}
