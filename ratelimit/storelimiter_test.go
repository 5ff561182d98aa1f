package ratelimit_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestStoreLimiter: on a memory store, in fake time, 100/s with a burst of
// 10 admits 10 at once and then one every 10 ms; a cost above the burst
// fails at once; a wait past the deadline fails without waiting.
func TestStoreLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New(memstore.Options{})
		defer st.Close()
		l := &ratelimit.StoreLimiter{Store: st, Key: "k", Rule: &ratelimit.Rule{Name: "r", Quota: 100, Period: time.Second, Burst: 10}}
		ctx := context.Background()
		begin := time.Now()
		for i := range 30 {
			if err := l.WaitN(ctx, 1); err != nil {
				t.Fatal(err)
			}
			want := time.Duration(max(0, i-9)) * 10 * time.Millisecond
			if got := time.Since(begin); got != want {
				t.Fatalf("unit %d granted after %v, want %v", i, got, want)
			}
		}
		if err := l.WaitN(ctx, 11); !errors.Is(err, ratelimit.ErrExceedsBurst) {
			t.Fatalf("WaitN(11) with burst 10: %v, want ErrExceedsBurst", err)
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		defer cancel()
		before := time.Now()
		if err := l.WaitN(dctx, 1); !errors.Is(err, ratelimit.ErrWouldExceedDeadline) {
			t.Fatalf("WaitN past the deadline: %v", err)
		}
		if time.Since(before) != 0 {
			t.Fatalf("waited %v before refusing", time.Since(before))
		}
	})
}

// countingStore counts the Decide calls it passes on.
type countingStore struct {
	ratelimit.Store
	calls atomic.Int64
}

func (c *countingStore) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	c.calls.Add(1)
	return c.Store.Decide(ctx, dst, items)
}

// TestStoreLimiterReserves: with MaxWait, 30 callers at once on 100/s
// with a burst of 10 are granted at the instants the rule allows (10 at
// once, then one every 10 ms), each with one decision, no polling;
// beyond MaxWait a caller is refused, waits the RetryAfter and reserves
// again; and a cost above the burst fails at once.
func TestStoreLimiterReserves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(memstore.Options{})
		defer mem.Close()
		st := &countingStore{Store: mem}
		l := &ratelimit.StoreLimiter{Store: st, Key: "k", Rule: &ratelimit.Rule{Name: "r", Quota: 100, Period: time.Second, Burst: 10}, MaxWait: time.Second}
		ctx := context.Background()
		begin := time.Now()
		var (
			mu   sync.Mutex
			got  []time.Duration
			wg   sync.WaitGroup
			errs atomic.Int64
		)
		for range 30 {
			wg.Go(func() {
				if err := l.WaitN(ctx, 1); err != nil {
					errs.Add(1)
					return
				}
				mu.Lock()
				got = append(got, time.Since(begin))
				mu.Unlock()
			})
		}
		wg.Wait()
		if errs.Load() != 0 || st.calls.Load() != 30 {
			t.Fatalf("%d errors, %d decisions; want 0 and 30 (one each)", errs.Load(), st.calls.Load())
		}
		slices.Sort(got)
		for i, g := range got {
			if want := time.Duration(max(0, i-9)) * 10 * time.Millisecond; g != want {
				t.Fatalf("grant %d after %v, want %v", i, g, want)
			}
		}
		// The queue is empty again at 200ms. 120 units at once with a
		// wait of up to 1s: 110 are granted on reserving, the rest
		// refused, and reserve again after their RetryAfter.
		time.Sleep(time.Second) // fake time: the bucket refills
		st.calls.Store(0)
		begin = time.Now()
		got = got[:0]
		for range 120 {
			wg.Go(func() {
				if err := l.WaitN(ctx, 1); err != nil {
					errs.Add(1)
					return
				}
				mu.Lock()
				got = append(got, time.Since(begin))
				mu.Unlock()
			})
		}
		wg.Wait()
		slices.Sort(got)
		for i, g := range got {
			if want := time.Duration(max(0, i-9)) * 10 * time.Millisecond; g != want {
				t.Fatalf("grant %d of 120 after %v, want %v", i, g, want)
			}
		}
		if errs.Load() != 0 || st.calls.Load() <= 120 {
			t.Fatalf("%d errors, %d decisions; want 0, and more than 120 (the refused asked again)", errs.Load(), st.calls.Load())
		}
		if err := l.WaitN(ctx, 11); !errors.Is(err, ratelimit.ErrExceedsBurst) {
			t.Fatalf("WaitN(11) with burst 10: %v, want ErrExceedsBurst", err)
		}
	})
}
