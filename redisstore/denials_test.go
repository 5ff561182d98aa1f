package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestDenialCacheRateChange decides a GCRA key under one rule, then under
// a rule of another rate (a runtime override), whose denials are made on
// the state the first wrote: its debt is rescaled to the new rate, and
// runs down at the old one until an admission rewrites it, so its reset
// and retry do not shorten one for one with the clock. The Redis store,
// with its denial cache, must answer as memstore does at every instant,
// on the script and on the exact path, with the rate raised and lowered;
// once an admission under the new rule has rewritten the state, its
// denials are cached again.
func TestDenialCacheRateChange(t *testing.T) {
	srv := redistest.Standalone(t)
	day := 24 * time.Hour
	for _, tc := range []struct {
		name     string
		old, new *ratelimit.Rule
		take     int64         // consumed under old
		step     time.Duration // the clock's advance between decisions under new
	}{
		{"raised", &ratelimit.Rule{Name: "old", Quota: 2, Period: time.Minute, Burst: 6},
			&ratelimit.Rule{Name: "new", Quota: 4, Period: time.Minute}, 4, 110 * time.Millisecond},
		{"lowered", &ratelimit.Rule{Name: "old", Quota: 4, Period: time.Minute},
			&ratelimit.Rule{Name: "new", Quota: 2, Period: time.Minute, Burst: 3}, 4, 3 * time.Second},
		{"raised-exact", &ratelimit.Rule{Name: "old", Quota: 3, Period: 365 * day},
			&ratelimit.Rule{Name: "new", Quota: 6, Period: 365 * day, Burst: 2}, 3, 5 * day},
		{"lowered-exact", &ratelimit.Rule{Name: "old", Quota: 6, Period: 365 * day, Burst: 2},
			&ratelimit.Rule{Name: "new", Quota: 3, Period: 365 * day, Burst: 2}, 2, 5 * day},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_800_000_000, 123_456_789)
			clock := func() time.Time { return now }
			rs := newTestStore(t, []string{srv.Addr()}, clock, nil)
			ms := memstore.New(memstore.Options{Now: clock, JanitorInterval: -1})
			t.Cleanup(func() { ms.Close() })
			ctx := context.Background()
			step := 0
			decide := func(r *ratelimit.Rule, cost int64) ratelimit.Decision {
				t.Helper()
				items := []ratelimit.Item{{Key: "k", Rule: r, Cost: cost}}
				got, err := rs.Decide(ctx, nil, items)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				want, _ := ms.Decide(ctx, nil, items)
				if !sameDecision(got[0], want[0]) {
					t.Fatalf("step %d (%s cost %d at +%v):\n redis %+v\n   mem %+v",
						step, r.Name, cost, now.Sub(time.Unix(1_800_000_000, 123_456_789)), got[0], want[0])
				}
				step++
				return want[0]
			}
			if d := decide(tc.old, tc.take); !d.Allowed {
				t.Fatalf("the old rule denied %d: %+v", tc.take, d)
			}
			denied := 0
			for d := decide(tc.new, 1); !d.Allowed; d = decide(tc.new, 1) {
				denied++
				if denied > 1000 {
					t.Fatal("the new rule denies for ever")
				}
				now = now.Add(tc.step)
			}
			if denied < 2 {
				t.Fatalf("the new rule denied %d times: the case does not test a denial run down", denied)
			}
			// The state is the new rule's now: its denials are cached (one
			// of 2 is denied for at least an interval).
			for decide(tc.new, 1).Allowed {
			}
			decide(tc.new, 2)
			cached := rs.Stats().CachedDenials
			now = now.Add(tc.step)
			decide(tc.new, 2)
			if rs.Stats().CachedDenials != cached+1 {
				t.Errorf("a denial under the rule that wrote the state was not answered from the cache (%d cached)", cached)
			}
		})
	}
}
