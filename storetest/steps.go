package storetest

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// The step tables below are those of package ratelimit's own tests with
// the steps where time goes backwards left out or replaced by forward ones
// (a Store may keep its clock monotonic; testTimeBackwards checks the
// weaker promise that an older instant creates nothing).

// A step decides cost at start+at (or at the absolute instant abs, when
// set) and expects want. Rule, when set, replaces the table's rule from
// this step on. Capacity and Rule of want are filled in from the rule.
type step struct {
	at   time.Duration
	abs  time.Time
	rule *ratelimit.Rule
	cost int64
	want ratelimit.Decision
}

func ok(rem int64, reset time.Duration) ratelimit.Decision {
	return ratelimit.Decision{Allowed: true, Reason: ratelimit.ReasonOK, Remaining: rem, ResetAfter: reset}
}

func limited(rem int64, reset, retry time.Duration) ratelimit.Decision {
	return ratelimit.Decision{Reason: ratelimit.ReasonLimited, Remaining: rem, ResetAfter: reset, RetryAfter: retry}
}

func never(rem int64, reset time.Duration) ratelimit.Decision {
	return ratelimit.Decision{Reason: ratelimit.ReasonExceedsCapacity, Remaining: rem, ResetAfter: reset, RetryAfter: ratelimit.Never}
}

// runSteps decides the steps in order on one key of a new Store.
func runSteps(t *testing.T, newStore NewStore, r *ratelimit.Rule, steps []step) {
	t.Helper()
	e := newEnv(t, newStore)
	key := e.key("k")
	for i, st := range steps {
		if st.rule != nil {
			r = st.rule
		}
		now := start.Add(st.at)
		if !st.abs.IsZero() {
			now = st.abs
		}
		e.clock.Set(now)
		want := st.want
		want.Capacity, want.Rule = r.Capacity(), r.Name
		if got := e.one(key, r, st.cost); got != want {
			t.Fatalf("step %d (rule %s, at %v, cost %d):\n got %+v\nwant %+v", i, r.Name, now.Sub(start), st.cost, got, want)
		}
	}
}

const ms = time.Millisecond

// gcraSteps is the table of GCRA and LeakyBucket: 10 per second (one unit
// every 100ms), capacity exactly Burst = 5.
func gcraSteps() []step {
	return []step{
		{at: 0, cost: 1, want: ok(4, 100*ms)},
		{at: 0, cost: 4, want: ok(0, 500*ms)}, // burst: exactly 5 at once
		{at: 0, cost: 1, want: limited(0, 500*ms, 100*ms)},
		{at: 50 * ms, cost: 1, want: limited(0, 450*ms, 50*ms)}, // denial consumed nothing
		{at: 100*ms - 1, cost: 1, want: limited(0, 400*ms+1, 1)},
		{at: 100 * ms, cost: 1, want: ok(0, 500*ms)},
		{at: 100 * ms, cost: 0, want: ok(0, 500*ms)},
		{at: 350 * ms, cost: 0, want: ok(2, 250*ms)},
		{at: 350 * ms, cost: 3, want: limited(2, 250*ms, 50*ms)},
		{at: 400 * ms, cost: 3, want: ok(0, 500*ms)},
		{at: 2 * time.Second, cost: 0, want: ok(5, 0)},
		{at: 2 * time.Second, cost: 6, want: never(5, 0)},
		{at: 2 * time.Second, cost: math.MaxInt64, want: never(5, 0)},
		{at: 2 * time.Second, cost: 5, want: ok(0, 500*ms)},
		{at: 2 * time.Second, cost: -2, want: ok(2, 300*ms)},
		{at: 2 * time.Second, cost: -10, want: ok(5, 0)},
		{at: 2 * time.Second, cost: math.MinInt64, want: ok(5, 0)},
		{at: 2 * time.Second, cost: 5, want: ok(0, 500*ms)},
		{at: 2 * time.Second, cost: 1, want: limited(0, 500*ms, 100*ms)},
	}
}

func fixedWindowSteps() []step {
	return []step{
		{at: 0, cost: 2, want: ok(1, time.Second)},
		{at: 500 * ms, cost: 2, want: limited(1, 500*ms, 500*ms)},
		{at: 500 * ms, cost: 1, want: ok(0, 500*ms)},
		{at: 999 * ms, cost: 0, want: ok(0, ms)},
		{at: time.Second - 1, cost: 1, want: limited(0, 1, 1)},
		{at: time.Second, cost: 3, want: ok(0, time.Second)},
		{at: 1500 * ms, cost: 4, want: never(0, 500*ms)},
		{at: 1500 * ms, cost: -1, want: ok(1, 500*ms)},
		{at: 1500 * ms, cost: 1, want: ok(0, 500*ms)},
		{at: 3200 * ms, cost: 0, want: ok(3, 0)},
		{at: 3200 * ms, cost: -5, want: ok(3, 0)},
		{at: 3200 * ms, cost: 3, want: ok(0, 800*ms)},
		{at: 3200 * ms, cost: 1, want: limited(0, 800*ms, 800*ms)},
	}
}

func slidingLogSteps() []step {
	return []step{
		{at: 0, cost: 1, want: ok(2, time.Second)},
		{at: 300 * ms, cost: 1, want: ok(1, time.Second)},
		{at: 600 * ms, cost: 1, want: ok(0, time.Second)},
		{at: 900 * ms, cost: 1, want: limited(0, 700*ms, 100*ms)},
		{at: time.Second - 1, cost: 1, want: limited(0, 600*ms+1, 1)},
		{at: time.Second, cost: 1, want: ok(0, time.Second)},
		{at: time.Second, cost: 2, want: limited(0, time.Second, 600*ms)},
		{at: 1600 * ms, cost: 2, want: ok(0, time.Second)},
		{at: 1600 * ms, cost: -1, want: ok(1, time.Second)},
		{at: 1600 * ms, cost: 4, want: never(1, time.Second)},
		{at: 1600 * ms, cost: -3, want: ok(3, 0)},
		{at: 1600 * ms, cost: 3, want: ok(0, time.Second)},
		{at: 2600 * ms, cost: 3, want: ok(0, time.Second)},
	}
}

func slidingWindowSteps() []step {
	return []step{
		{at: 0, cost: 6, want: ok(4, 2*time.Second)},
		{at: 500 * ms, cost: 4, want: ok(0, 1500*ms)},
		{at: 1200 * ms, cost: 3, want: limited(2, 800*ms, 100*ms)},
		{at: 1300*ms - 1, cost: 3, want: limited(2, 700*ms+1, 1)},
		{at: 1300 * ms, cost: 3, want: ok(0, 1700*ms)},
		{at: 1500 * ms, cost: 2, want: ok(0, 1500*ms)},
		{at: 1500 * ms, cost: 1, want: limited(0, 1500*ms, 100*ms)},
		{at: 2500 * ms, cost: 8, want: limited(7, 500*ms, 100*ms)},
		{at: 2600 * ms, cost: 8, want: ok(0, 1400*ms)},
		{at: 2600 * ms, cost: 9, want: limited(0, 1400*ms, 1275*ms)},
		{at: 2600 * ms, cost: 11, want: never(0, 1400*ms)},
		{at: 2600 * ms, cost: -10, want: ok(8, 400*ms)},
		{at: 2600 * ms, cost: -100, want: ok(10, 0)},
		{at: 2600 * ms, cost: 10, want: ok(0, 1400*ms)},
		// [3s,4s): prev 10 weighs ceil(10×0.1) = 1 from 3.9s on.
		{at: 3900*ms - 1, cost: 9, want: limited(8, 100*ms+1, 1)},
		{at: 3900 * ms, cost: 9, want: ok(0, 1100*ms)},
	}
}

func testSteps(t *testing.T, newStore NewStore) {
	sec := time.Second
	tests := []struct {
		name  string
		rule  ratelimit.Rule
		steps []step
	}{
		{"gcra", ratelimit.Rule{Name: "g", Quota: 10, Period: sec, Burst: 5}, gcraSteps()},
		{"leaky_bucket", ratelimit.Rule{Name: "l", Algorithm: ratelimit.LeakyBucket, Quota: 10, Period: sec, Burst: 5}, gcraSteps()},
		{"fixed_window", ratelimit.Rule{Name: "f", Algorithm: ratelimit.FixedWindow, Quota: 3, Period: sec}, fixedWindowSteps()},
		{"sliding_log", ratelimit.Rule{Name: "s", Algorithm: ratelimit.SlidingLog, Quota: 3, Period: sec}, slidingLogSteps()},
		{"sliding_window", ratelimit.Rule{Name: "w", Algorithm: ratelimit.SlidingWindow, Quota: 10, Period: sec}, slidingWindowSteps()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, newStore, &tt.rule, tt.steps)
		})
	}
}

// testLimitChange changes the rule of a key mid-window (same name, new
// numbers): the cost already consumed carries over.
func testLimitChange(t *testing.T, newStore NewStore) {
	sec := time.Second
	rule := func(alg ratelimit.Algorithm, limit int64) *ratelimit.Rule { return ruleOf(alg, limit, sec) }
	t.Run("gcra", func(t *testing.T) {
		r10, r20, r5 := rule(ratelimit.GCRA, 10), rule(ratelimit.GCRA, 20), rule(ratelimit.GCRA, 5)
		runSteps(t, newStore, r10, []step{
			{at: 0, cost: 6, want: ok(4, 600*ms)},
			{at: 0, rule: r20, cost: 0, want: ok(14, 300*ms)},             // 6 of 20 consumed
			{at: 0, rule: r5, cost: 0, want: limited(0, 1200*ms, 200*ms)}, // 6 of 5: over
			{at: 0, rule: r20, cost: 14, want: ok(0, sec)},
			{at: 0, rule: r20, cost: 1, want: limited(0, sec, 50*ms)},
			{at: 0, rule: r10, cost: 0, want: limited(0, 2*sec, sec)}, // 20 of 10
		})
	})
	t.Run("leaky_bucket", func(t *testing.T) {
		r10, r20 := rule(ratelimit.LeakyBucket, 10), rule(ratelimit.LeakyBucket, 20)
		runSteps(t, newStore, r10, []step{
			{at: 0, cost: 6, want: ok(4, 600*ms)},
			{at: 0, rule: r20, cost: 0, want: ok(14, 300*ms)},
			{at: 0, rule: r20, cost: 14, want: ok(0, sec)},
			{at: 0, rule: r20, cost: 1, want: limited(0, sec, 50*ms)},
		})
	})
	t.Run("fixed_window", func(t *testing.T) {
		r5, r3, r6 := rule(ratelimit.FixedWindow, 5), rule(ratelimit.FixedWindow, 3), rule(ratelimit.FixedWindow, 6)
		runSteps(t, newStore, r5, []step{
			{at: 100 * ms, cost: 4, want: ok(1, 900*ms)},
			{at: 200 * ms, rule: r3, cost: 0, want: limited(0, 800*ms, 800*ms)},
			{at: 200 * ms, rule: r6, cost: 2, want: ok(0, 800*ms)},
			{at: 200 * ms, rule: r6, cost: 1, want: limited(0, 800*ms, 800*ms)},
			{at: sec, rule: r3, cost: 3, want: ok(0, sec)},
		})
	})
	t.Run("sliding_log", func(t *testing.T) {
		r5, r3, r6 := rule(ratelimit.SlidingLog, 5), rule(ratelimit.SlidingLog, 3), rule(ratelimit.SlidingLog, 6)
		runSteps(t, newStore, r5, []step{
			{at: 100 * ms, cost: 4, want: ok(1, sec)},
			{at: 200 * ms, rule: r3, cost: 1, want: limited(0, 900*ms, 900*ms)},
			{at: 200 * ms, rule: r6, cost: 2, want: ok(0, sec)},
			{at: 1100 * ms, rule: r3, cost: 1, want: ok(0, sec)},
		})
	})
	t.Run("sliding_window", func(t *testing.T) {
		r10, r5 := rule(ratelimit.SlidingWindow, 10), rule(ratelimit.SlidingWindow, 5)
		runSteps(t, newStore, r10, []step{
			{at: 100 * ms, cost: 6, want: ok(4, 1900*ms)},
			{at: 100 * ms, rule: r5, cost: 0, want: limited(0, 1900*ms, 900*ms+166666667)},
			{at: 100 * ms, rule: r10, cost: 4, want: ok(0, 1900*ms)},
		})
	})
}

// testCalendar checks calendar windows in time zones: real months, days of
// 23 and 25 hours across DST changes, and half-hour offsets.
func testCalendar(t *testing.T, newStore NewStore) {
	ny, err1 := time.LoadLocation("America/New_York")
	kolkata, err2 := time.LoadLocation("Asia/Kolkata")
	if err1 != nil || err2 != nil {
		t.Skipf("time zone database: %v %v", err1, err2)
	}
	at := func(loc *time.Location, y int, m time.Month, d, h, min int) time.Time {
		return time.Date(y, m, d, h, min, 0, 0, loc)
	}
	utc := func(y int, m time.Month, d, h, min int) time.Time { return at(time.UTC, y, m, d, h, min) }
	h := time.Hour
	cal := func(name string, c ratelimit.Calendar, loc *time.Location, limit int64) ratelimit.Rule {
		return ratelimit.Rule{Name: name, Algorithm: ratelimit.FixedWindow, Calendar: c, Location: loc, Quota: limit}
	}
	tests := []struct {
		name  string
		rule  ratelimit.Rule
		steps []step
	}{
		{"month_new_york", cal("m", ratelimit.Month, ny, 3), []step{
			// 19:00 on Jan 31 in New York is already Feb 1 in UTC.
			{abs: at(ny, 2026, 1, 31, 19, 0), cost: 2, want: ok(1, 5*h)},
			{abs: at(ny, 2026, 1, 31, 23, 0), cost: 1, want: ok(0, h)},
			{abs: at(ny, 2026, 2, 1, 0, 0).Add(-1), cost: 1, want: limited(0, 1, 1)},
			{abs: at(ny, 2026, 2, 1, 0, 0), cost: 3, want: ok(0, 28*24*h)},
			{abs: at(ny, 2026, 2, 28, 23, 0), cost: 1, want: limited(0, h, h)},
			{abs: at(ny, 2026, 3, 1, 0, 0), cost: 3, want: ok(0, 31*24*h-h)}, // March loses an hour
		}},
		{"day_dst_spring", cal("d", ratelimit.Day, ny, 1), []step{
			// 2026-03-08 in New York lasts 23 hours.
			{abs: at(ny, 2026, 3, 8, 1, 0), cost: 1, want: ok(0, 22*h)},
			{abs: at(ny, 2026, 3, 8, 23, 59), cost: 1, want: limited(0, time.Minute, time.Minute)},
			{abs: at(ny, 2026, 3, 9, 0, 0), cost: 1, want: ok(0, 24*h)},
		}},
		{"day_dst_autumn", cal("d", ratelimit.Day, ny, 1), []step{
			// 2026-11-01 in New York lasts 25 hours: 01:00 EDT is 05:00 UTC,
			// 01:00 EST is 06:00 UTC.
			{abs: utc(2026, 11, 1, 5, 0), cost: 1, want: ok(0, 24*h)},
			{abs: utc(2026, 11, 1, 6, 0), cost: 1, want: limited(0, 23*h, 23*h)},
			{abs: at(ny, 2026, 11, 2, 0, 0), cost: 1, want: ok(0, 24*h)},
		}},
		{"hour_dst_spring", cal("h", ratelimit.Hour, ny, 1), []step{
			{abs: at(ny, 2026, 3, 8, 1, 30), cost: 1, want: ok(0, 30*time.Minute)},
			{abs: at(ny, 2026, 3, 8, 3, 0), cost: 1, want: ok(0, h)}, // 02:00 never happened
		}},
		{"hour_kolkata", cal("h", ratelimit.Hour, kolkata, 2), []step{
			// Local hours start at :30 UTC.
			{abs: at(kolkata, 2026, 1, 1, 10, 15), cost: 2, want: ok(0, 45*time.Minute)},
			{abs: utc(2026, 1, 1, 5, 0), cost: 1, want: limited(0, 30*time.Minute, 30*time.Minute)},
			{abs: utc(2026, 1, 1, 5, 30), cost: 2, want: ok(0, h)},
		}},
		{"week_utc", cal("w", ratelimit.Week, nil, 1), []step{
			// 2026-01-01 is a Thursday; weeks start on Monday.
			{abs: start, cost: 1, want: ok(0, 4*24*h)},
			{abs: utc(2026, 1, 4, 23, 0), cost: 1, want: limited(0, h, h)},
			{abs: utc(2026, 1, 5, 0, 0), cost: 1, want: ok(0, 7*24*h)},
		}},
		{"year_utc", cal("y", ratelimit.Year, nil, 1), []step{
			{abs: utc(2026, 12, 31, 23, 0), cost: 1, want: ok(0, h)},
			{abs: utc(2027, 1, 1, 0, 0), cost: 1, want: ok(0, 365*24*h)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, newStore, &tt.rule, tt.steps)
		})
	}
}

// testEdgeRules covers limit 0, tiny rates and huge costs.
func testEdgeRules(t *testing.T, newStore NewStore) {
	year := 365 * 24 * time.Hour
	for _, alg := range algorithms {
		t.Run("limit0_"+alg.String(), func(t *testing.T) {
			r := ratelimit.Rule{Name: "z", Algorithm: alg, Quota: 0, Period: time.Second}
			runSteps(t, newStore, &r, []step{
				{at: 0, cost: 0, want: ok(0, 0)},
				{at: 0, cost: 1, want: never(0, 0)},
				{at: year, cost: 1, want: never(0, 0)},
				{at: year, cost: -1, want: ok(0, 0)},
			})
		})
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket} {
		t.Run("one_per_year_"+alg.String(), func(t *testing.T) {
			r := ratelimit.Rule{Name: "y", Algorithm: alg, Quota: 1, Period: year}
			runSteps(t, newStore, &r, []step{
				{at: 0, cost: 1, want: ok(0, year)},
				{at: 0, cost: 1, want: limited(0, year, year)},
				{at: year - 1, cost: 1, want: limited(0, 1, 1)},
				{at: year, cost: math.MaxInt64, want: never(1, 0)},
				{at: year, cost: 1, want: ok(0, year)},
				{at: year, cost: math.MinInt64, want: ok(1, 0)},
			})
		})
		t.Run("max_limit_"+alg.String(), func(t *testing.T) {
			// 2^40 per second: one unit per nanosecond, rounded up.
			r := ratelimit.Rule{Name: "m", Algorithm: alg, Quota: ratelimit.MaxQuota, Period: time.Second, Burst: ratelimit.MaxQuota}
			runSteps(t, newStore, &r, []step{
				{at: 0, cost: ratelimit.MaxQuota, want: ok(0, ratelimit.MaxQuota)},
				{at: 0, cost: 1, want: limited(0, ratelimit.MaxQuota, 1)},
				{at: ratelimit.MaxQuota, cost: ratelimit.MaxQuota + 1, want: never(ratelimit.MaxQuota, 0)},
				{at: ratelimit.MaxQuota, cost: ratelimit.MaxQuota, want: ok(0, ratelimit.MaxQuota)},
			})
		})
	}
	t.Run("max_period_sliding_window", func(t *testing.T) {
		r := ratelimit.Rule{Name: "p", Algorithm: ratelimit.SlidingWindow, Quota: ratelimit.MaxQuota, Period: ratelimit.MaxPeriod}
		e := newEnv(t, newStore)
		key := e.key("k")
		if d := e.one(key, &r, ratelimit.MaxQuota); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("cost MaxLimit: %+v", d)
		}
		if d := e.one(key, &r, 1); d.Allowed || d.Reason != ratelimit.ReasonLimited || d.RetryAfter <= 0 || d.RetryAfter == ratelimit.Never {
			t.Fatalf("cost 1 after MaxLimit: %+v", d)
		}
	})
}

// algorithms lists every algorithm.
var algorithms = []ratelimit.Algorithm{
	ratelimit.GCRA, ratelimit.FixedWindow, ratelimit.SlidingLog, ratelimit.SlidingWindow, ratelimit.LeakyBucket,
}
