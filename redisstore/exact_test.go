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

func TestNeedsExact(t *testing.T) {
	year := 365 * 24 * time.Hour
	for _, tc := range []struct {
		rule ratelimit.Rule
		win  time.Duration
		want bool
	}{
		{ratelimit.Rule{Quota: 100, Period: time.Second}, 0, false},
		{ratelimit.Rule{Quota: 0, Block: true, Period: time.Second}, 0, true},
		{ratelimit.Rule{Quota: 1, Period: year}, 0, true},
		{ratelimit.Rule{Quota: 1000, Period: 30 * 24 * time.Hour}, 0, false},
		{ratelimit.Rule{Quota: 10, Period: time.Hour, Burst: 20000}, 0, true}, // capacity × interval ≥ 2^52
		{ratelimit.Rule{Algorithm: ratelimit.FixedWindow, Quota: 5, Period: 40 * 24 * time.Hour}, 0, false},
		{ratelimit.Rule{Algorithm: ratelimit.FixedWindow, Quota: 5, Period: year}, 0, true},
		{ratelimit.Rule{Algorithm: ratelimit.FixedWindow, Quota: 5, Calendar: ratelimit.Month}, 31 * 24 * time.Hour, false},
		{ratelimit.Rule{Algorithm: ratelimit.FixedWindow, Quota: 5, Calendar: ratelimit.Year}, year, true},
		{ratelimit.Rule{Algorithm: ratelimit.SlidingWindow, Quota: 5, Period: 30 * 24 * time.Hour}, 0, true}, // two periods
		{ratelimit.Rule{Algorithm: ratelimit.SlidingLog, Quota: 5, Period: 20 * 24 * time.Hour}, 0, false},
	} {
		if got := needsExact(&tc.rule, int64(tc.win)); got != tc.want {
			t.Errorf("needsExact(%+v, %v) = %v, want %v", tc.rule, tc.win, got, tc.want)
		}
	}
}

// TestExactConcurrent has goroutines race on a rule of the exact path
// (read, decide in Go, compare-and-set): the capacity is admitted exactly.
func TestExactConcurrent(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, []string{srv.Addr()}, nil, nil)
	r := &ratelimit.Rule{Name: "yearly", Quota: 40, Period: 365 * 24 * time.Hour}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}})
				if err != nil {
					t.Error(err)
					return
				}
				if ds[0].Reason != ratelimit.ReasonOK && ds[0].Reason != ratelimit.ReasonLimited {
					t.Errorf("decision %+v", ds[0])
					return
				}
				if ds[0].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 40 {
		t.Fatalf("admitted %d of 80 requests, want exactly 40", got)
	}
	if st := s.Stats(); st.Exact != st.Requests {
		t.Fatalf("%d of %d requests on the exact path, want all", st.Exact, st.Requests)
	}
}
