package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestReplicasAccuracy has 4 Stores, each with its own go-redis client as
// separate replicas would have, hammer one GCRA rule for about 2 s on the
// server clock. Between the server instants t0 (before the first call) and
// t1 (after the last) the rule admits at most Burst + (t1-t0)/interval: the
// Stores together must admit no more; and, saturated, at least 99% of
// Burst + 2s/interval, what the 2 s the callers ran allow.
func TestReplicasAccuracy(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client()
	ctx := context.Background()
	r := &ratelimit.Rule{Name: "shared", Quota: 1000, Period: time.Second, Burst: 1000} // the burst absorbs scheduling stalls of up to 0.5 s
	const replicas, callers = 4, 4
	stores := make([]*Store, replicas)
	for i := range stores {
		stores[i] = newTestStore(t, []string{srv.Addr()}, nil, func(o *testConfig) { o.Prefix = "acc:" })
	}
	// Warm up: connections dialled and the script loaded before t0.
	for _, s := range stores {
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() { s.Decide(ctx, nil, []ratelimit.Item{{Key: "warm", Rule: r, Cost: 0}}) }) //nolint:errcheck
		}
		wg.Wait()
	}
	t0, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var admitted, calls, fallbacks atomic.Int64
	const run = 2 * time.Second
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	for _, s := range stores {
		for range callers {
			wg.Go(func() {
				items := []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}
				var ds []ratelimit.Decision
				for time.Now().Before(stop) {
					var err error
					ds, err = s.Decide(ctx, ds[:0], items)
					if err != nil {
						t.Error(err)
						return
					}
					calls.Add(1)
					switch {
					case ds[0].Reason != ratelimit.ReasonOK && ds[0].Reason != ratelimit.ReasonLimited:
						fallbacks.Add(1)
					case ds[0].Allowed:
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	t1, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if fallbacks.Load() != 0 {
		t.Fatalf("%d decisions fell back", fallbacks.Load())
	}
	bound := r.Burst + int64(t1.Sub(t0)/(time.Second/1000))
	got := admitted.Load()
	t.Logf("%d calls in %v (%.0f/s), admitted %d of at most %d (%.2f%%)",
		calls.Load(), t1.Sub(t0), float64(calls.Load())/t1.Sub(t0).Seconds(), got, bound, 100*float64(got)/float64(bound))
	if got > bound {
		t.Fatalf("admitted %d > %d", got, bound)
	}
	if 2*calls.Load() < 3*bound {
		t.Skipf("not saturated: %d calls for %d admissible", calls.Load(), bound)
	}
	// The lower bound counts only the time the callers ran (the server
	// window above also holds the round trips around them).
	least := r.Burst + int64(run/(time.Second/1000))
	if float64(got) < 0.99*float64(least) {
		t.Fatalf("admitted %d < 99%% of %d", got, least)
	}
}
