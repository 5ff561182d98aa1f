package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// testConfig is what a test may change in newTestStore: how the client
// connects and how the Store decides.
type testConfig struct {
	Client ClientOptions
	Options
}

// newTestStore returns a Store on addrs with a client clock, closed (with
// its client) when the test ends.
func newTestStore(t testing.TB, addrs []string, now func() time.Time, mod func(*testConfig)) *Store {
	t.Helper()
	cfg := testConfig{
		Client:  ClientOptions{Addrs: addrs, Timeout: time.Second},
		Options: Options{Now: now, Prefix: fmt.Sprintf("t%d:", rand.Uint64()), Timeout: time.Second},
	}
	if mod != nil {
		mod(&cfg)
	}
	return newStoreOn(t, cfg.Client, cfg.Options)
}

// newStoreOn returns a Store on a client made from co, both closed when the
// test ends.
func newStoreOn(t testing.TB, co ClientOptions, o Options) *Store {
	t.Helper()
	c, err := NewClient(co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// diffRules are rules of every algorithm, with small limits so that random
// traffic meets every branch, and edge shapes (uneven intervals, limit 0,
// long periods).
func diffRules() []*ratelimit.Rule {
	ms := time.Millisecond
	return []*ratelimit.Rule{
		{Name: "gcra", Quota: 5, Period: 100 * ms},
		{Name: "gcra-burst", Quota: 3, Period: 100 * ms, Burst: 7},
		{Name: "gcra-uneven", Quota: 3, Period: 1000*ms + 1},
		{Name: "gcra-fast", Quota: 10, Period: 50 * ms},
		{Name: "gcra-zero", Quota: 0, Block: true, Period: time.Second},
		{Name: "gcra-long", Quota: 7, Period: 40 * 24 * time.Hour},
		{Name: "fixed", Algorithm: ratelimit.FixedWindow, Quota: 5, Period: 100 * ms},
		{Name: "fixed-odd", Algorithm: ratelimit.FixedWindow, Quota: 4, Period: 77*ms + 3},
		{Name: "fixed-minute", Algorithm: ratelimit.FixedWindow, Quota: 6, Calendar: ratelimit.Minute},
		{Name: "fixed-day", Algorithm: ratelimit.FixedWindow, Quota: 6, Calendar: ratelimit.Day, Location: time.FixedZone("x", 5*3600+1800)},
		{Name: "log", Algorithm: ratelimit.SlidingLog, Quota: 5, Period: 100 * ms},
		{Name: "log-odd", Algorithm: ratelimit.SlidingLog, Quota: 4, Period: 77*ms + 3},
		{Name: "sliding", Algorithm: ratelimit.SlidingWindow, Quota: 5, Period: 100 * ms},
		{Name: "sliding-odd", Algorithm: ratelimit.SlidingWindow, Quota: 7, Period: 77*ms + 3},
		{Name: "sliding-long", Algorithm: ratelimit.SlidingWindow, Quota: 1000, Period: 30 * 24 * time.Hour},
		{Name: "leaky", Algorithm: ratelimit.LeakyBucket, Quota: 5, Period: 100 * ms},
		// Beyond the script's doubles: decided on the exact path.
		{Name: "gcra-year", Quota: 3, Period: 365 * 24 * time.Hour},
		{Name: "fixed-year", Algorithm: ratelimit.FixedWindow, Quota: 6, Calendar: ratelimit.Year},
		{Name: "log-year", Algorithm: ratelimit.SlidingLog, Quota: 4, Period: 365 * 24 * time.Hour},
		{Name: "sliding-year", Algorithm: ratelimit.SlidingWindow, Quota: 9, Period: 365 * 24 * time.Hour},
		{Name: "leaky-year", Algorithm: ratelimit.LeakyBucket, Quota: 2, Period: 365 * 24 * time.Hour},
		{Name: "leaky-burst", Algorithm: ratelimit.LeakyBucket, Quota: 3, Period: 100*ms + 1, Burst: 6},
	}
}

// TestDifferential drives the Redis store and memstore with the same random
// requests at the same instants and requires identical decisions.
func TestDifferential(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			diffRun(t, []string{srv.Addr()}, seed, 1500)
		})
	}
}

func diffRun(t *testing.T, addrs []string, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	now := time.Unix(1_800_000_000, 123_456_789)
	clock := func() time.Time { return now }
	// Seeds 1 to 4 take each combination of coalescing and the denial
	// cache (whose answers must be Redis's too).
	rs := newTestStore(t, addrs, clock, func(o *testConfig) { o.NoCoalesce, o.NoDenialCache = seed%2 == 0, seed%4 >= 2 })
	ms := memstore.New(memstore.Options{Now: clock, JanitorInterval: -1})
	t.Cleanup(func() { ms.Close() })
	rules := diffRules()
	keys := []string{"{a}1", "{a}2", "{a}3"}
	ctx := context.Background()
	var got, want []ratelimit.Decision
	var history []string
	for step := range steps {
		switch x := rng.IntN(20); {
		case x < 12:
			now = now.Add(time.Duration(rng.Int64N(int64(30 * time.Millisecond))))
		case x < 13:
			now = now.Add(-time.Duration(rng.Int64N(int64(20 * time.Millisecond)))) // backwards
		case x < 14:
			now = now.Add(time.Duration(rng.Int64N(int64(3 * time.Hour))))
		case x < 15 && rng.IntN(4) == 0:
			now = now.Add(time.Duration(rng.Int64N(int64(200 * 24 * time.Hour))))
		}
		n := 1 + rng.IntN(3)
		items := make([]ratelimit.Item, n)
		for i := range items {
			r := rules[rng.IntN(len(rules))]
			if rng.IntN(4) != 0 && i > 0 {
				r = items[0].Rule
			}
			cost := rng.Int64N(4)
			switch rng.IntN(12) {
			case 0:
				cost = -rng.Int64N(5)
			case 1:
				cost = r.Capacity() + 1
			}
			// Half the keys are shared by every rule (algorithm changes),
			// half by the rules of one algorithm and window shape.
			k := keys[rng.IntN(len(keys))]
			if rng.IntN(2) == 0 {
				k = fmt.Sprintf("%s:%d:%d:%d", k, r.Algorithm, r.Period, r.Calendar)
			}
			items[i] = ratelimit.Item{Key: k, Rule: r, Cost: cost}
		}
		var err error
		got, err = rs.Decide(ctx, got[:0], items)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		want, _ = ms.Decide(ctx, want[:0], items)
		history = append(history, fmt.Sprintf("step %d at %d: %s", step, now.UnixNano(), fmtItems(items, want)))
		for i := range items {
			if !sameDecision(got[i], want[i]) {
				for _, h := range history[max(0, len(history)-60):] {
					t.Log(h)
				}
				t.Fatalf("step %d item %d (%s key %s cost %d, %d items) at %v:\n redis %+v\n   mem %+v",
					step, i, items[i].Rule.Name, items[i].Key, items[i].Cost, n, now.UnixNano(), got[i], want[i])
			}
		}
	}
	if st := rs.Stats(); st.Exact == 0 || st.Exact == st.Requests {
		t.Errorf("exact path taken %d times of %d: both paths must be exercised", st.Exact, st.Requests)
	}
}

// sameDecision compares decisions exactly, except durations beyond 2^53 ns
// (104 days), which the script computes in doubles: those may differ in
// their last 10^-15.
func sameDecision(a, b ratelimit.Decision) bool {
	close := func(x, y time.Duration) bool {
		if x == y {
			return true
		}
		if x < 1<<53 && y < 1<<53 {
			return false
		}
		d := float64(x) - float64(y)
		return d < 1e-12*float64(y) && -d < 1e-12*float64(y)
	}
	return close(a.ResetAfter, b.ResetAfter) && close(a.RetryAfter, b.RetryAfter) &&
		a.Allowed == b.Allowed && a.Reason == b.Reason && a.Capacity == b.Capacity &&
		a.Remaining == b.Remaining && a.Rule == b.Rule
}

func fmtItems(items []ratelimit.Item, ds []ratelimit.Decision) string {
	s := ""
	for i, it := range items {
		s += fmt.Sprintf("[%s %s %d → %v %d %v] ", it.Key, it.Rule.Name, it.Cost, ds[i].Allowed, ds[i].Remaining, ds[i].ResetAfter)
	}
	return s
}
