package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestServerClock decides on the Redis server's clock (the default), for
// every algorithm, a calendar window (read TIME first, then decide) and a
// rule of the exact path: the capacity is admitted, the next unit is denied
// with a RetryAfter within the state's life, and its keys have a TTL no
// longer than the state needs.
func TestServerClock(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client()
	ctx := context.Background()
	s := newTestStore(t, []string{srv.Addr()}, nil, nil)
	rules := []*ratelimit.Rule{
		{Name: "gcra", Quota: 5, Period: time.Minute},
		{Name: "fixed", Algorithm: ratelimit.FixedWindow, Quota: 5, Period: time.Minute},
		{Name: "log", Algorithm: ratelimit.SlidingLog, Quota: 5, Period: time.Minute},
		{Name: "sliding", Algorithm: ratelimit.SlidingWindow, Quota: 5, Period: time.Minute},
		{Name: "leaky", Algorithm: ratelimit.LeakyBucket, Quota: 5, Period: time.Minute},
		{Name: "calendar", Algorithm: ratelimit.FixedWindow, Quota: 5, Calendar: ratelimit.Hour, Location: time.FixedZone("+0530", 5*3600+1800)},
		{Name: "yearly", Quota: 5, Period: 365 * 24 * time.Hour},
	}
	for _, r := range rules {
		t.Run(r.Name, func(t *testing.T) {
			item := []ratelimit.Item{{Key: r.Name, Rule: r, Cost: 5}}
			ds, err := s.Decide(ctx, nil, item)
			if err != nil || !ds[0].Allowed || ds[0].Remaining != 0 {
				t.Fatalf("cost 5 of 5: %v %+v", err, ds)
			}
			period := r.Period
			if r.Calendar != ratelimit.NoCalendar {
				period = time.Hour
			}
			// A sliding window's counts matter for two periods.
			life := period
			if r.Algorithm == ratelimit.SlidingWindow {
				life = 2 * period
			}
			item[0].Cost = 1
			ds, err = s.Decide(ctx, nil, item)
			if err != nil || ds[0].Allowed || ds[0].Reason != ratelimit.ReasonLimited || ds[0].RetryAfter <= 0 || ds[0].RetryAfter > life {
				t.Fatalf("cost 1 after 5 of 5: %v %+v", err, ds)
			}
			k := string(appendKey(nil, s.prefix, r.Name, r.Name))
			keys := []string{k}
			if r.Algorithm == ratelimit.SlidingLog {
				keys = append(keys, k+logSuffix)
			}
			for _, k := range keys {
				ttl, err := admin.PTTL(ctx, k).Result()
				if err != nil || ttl <= 0 || ttl > life {
					t.Errorf("key %q: TTL %v (err %v), want within (0, %v]", k, ttl, err, life)
				}
			}
		})
	}
	if st := s.Stats(); st.Exact == 0 {
		t.Error("the yearly rule did not take the exact path")
	}
}
