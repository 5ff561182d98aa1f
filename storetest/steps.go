package storetest

import (
	"math"
	"testing"
	"time"
	_ "time/tzdata" // the calendar tables need New York and Kolkata

	"github.com/sluicehq/sluice/ratelimit"
)

// Start is the instant the step tables start from, and every subtest's
// clock: a whole second, minute, hour, day and month in UTC, so
// epoch-aligned windows start there.
var Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// A Step is one decision of a step table: cost decided at Start+At (or at
// the absolute instant Abs, when set), which must return Want. Rule, when
// set, replaces the table's rule from this step on. Want's Capacity and
// Rule are filled in from the rule.
type Step struct {
	At   time.Duration
	Abs  time.Time
	Rule *ratelimit.Rule
	Cost int64
	Want ratelimit.Decision
}

// A StepTable is a sequence of steps decided in order on one key, which
// starts fresh, with Rule.
type StepTable struct {
	Name  string // group/table, such as "algorithm/gcra"
	Rule  ratelimit.Rule
	Steps []Step
}

// StepTables returns the step tables of every algorithm, with fixed
// instants and exact decisions: Run decides them through a Store, and
// package ratelimit's tests with Rule.Decide on one State. Time goes
// backwards in some: an instant older than the key's state is decided as
// the state's, and the difference is added to RetryAfter and ResetAfter.
// Each call returns new tables.
func StepTables() []StepTable {
	var tables []StepTable
	add := func(name string, r ratelimit.Rule, steps ...Step) {
		tables = append(tables, StepTable{Name: name, Rule: r, Steps: steps})
	}
	sec, h := time.Second, time.Hour
	year := 365 * 24 * h

	// GCRA and LeakyBucket decide alike: 10 per second (one unit every
	// 100ms), capacity exactly Burst = 5.
	gcra := []Step{
		{At: 0, Cost: 1, Want: ok(4, 100*ms)},
		{At: 0, Cost: 4, Want: ok(0, 500*ms)}, // burst: exactly 5 at once
		{At: 0, Cost: 1, Want: limited(0, 500*ms, 100*ms)},
		{At: 50 * ms, Cost: 1, Want: limited(0, 450*ms, 50*ms)},  // denial consumed nothing
		{At: 100*ms - 1, Cost: 1, Want: limited(0, 400*ms+1, 1)}, // one ns early
		{At: 100 * ms, Cost: 1, Want: ok(0, 500*ms)},             // refilled one unit
		{At: 100 * ms, Cost: 0, Want: ok(0, 500*ms)},             // a check consumes nothing
		{At: 350 * ms, Cost: 0, Want: ok(2, 250*ms)},             // partial refill
		{At: 350 * ms, Cost: 3, Want: limited(2, 250*ms, 50*ms)}, // all or nothing
		{At: 400 * ms, Cost: 3, Want: ok(0, 500*ms)},             // RetryAfter was exact
		{At: 2 * sec, Cost: 0, Want: ok(5, 0)},                   // full again, never above Burst
		{At: 2 * sec, Cost: 6, Want: never(5, 0)},                // cost > capacity
		{At: 2 * sec, Cost: math.MaxInt64, Want: never(5, 0)},
		{At: 2 * sec, Cost: 5, Want: ok(0, 500*ms)},
		{At: 2 * sec, Cost: -2, Want: ok(2, 300*ms)},       // refund
		{At: 2 * sec, Cost: -10, Want: ok(5, 0)},           // refund capped at capacity
		{At: 2 * sec, Cost: math.MinInt64, Want: ok(5, 0)}, // no overflow
		{At: 2 * sec, Cost: 5, Want: ok(0, 500*ms)},
		{At: 2 * sec, Cost: 1, Want: limited(0, 500*ms, 100*ms)},
		// Time goes back 500ms: the debt looks larger and nothing is
		// created.
		{At: 1500 * ms, Cost: 1, Want: limited(0, sec, 600*ms)},
		{At: 1500 * ms, Cost: 0, Want: ok(0, sec)}, // decided at the state's instant, 2s
		{At: 2500 * ms, Cost: 5, Want: ok(0, 500*ms)},
	}
	add("algorithm/gcra", ratelimit.Rule{Name: "g", Quota: 10, Period: sec, Burst: 5}, gcra...)
	add("algorithm/leaky_bucket", ratelimit.Rule{Name: "l", Algorithm: ratelimit.LeakyBucket, Quota: 10, Period: sec, Burst: 5}, gcra...)
	add("algorithm/fixed_window", ratelimit.Rule{Name: "f", Algorithm: ratelimit.FixedWindow, Quota: 3, Period: sec},
		Step{At: 0, Cost: 2, Want: ok(1, sec)},
		Step{At: 500 * ms, Cost: 2, Want: limited(1, 500*ms, 500*ms)},
		Step{At: 500 * ms, Cost: 1, Want: ok(0, 500*ms)},
		Step{At: 999 * ms, Cost: 0, Want: ok(0, ms)},
		Step{At: sec - 1, Cost: 1, Want: limited(0, 1, 1)},
		Step{At: sec, Cost: 3, Want: ok(0, sec)}, // new window, full quota
		Step{At: 1500 * ms, Cost: 4, Want: never(0, 500*ms)},
		Step{At: 1500 * ms, Cost: -1, Want: ok(1, 500*ms)},
		Step{At: 1500 * ms, Cost: 1, Want: ok(0, 500*ms)},
		Step{At: 1500 * ms, Cost: -1, Want: ok(1, 500*ms)},
		// Time goes back into the previous window: the newest window
		// seen is kept, so its count still applies.
		Step{At: 900 * ms, Cost: 1, Want: ok(0, 1100*ms)},
		Step{At: 900 * ms, Cost: 1, Want: limited(0, 1100*ms, 1100*ms)},
		Step{At: 3200 * ms, Cost: 0, Want: ok(3, 0)},
		Step{At: 3200 * ms, Cost: -5, Want: ok(3, 0)}, // refund capped
		Step{At: 3200 * ms, Cost: 3, Want: ok(0, 800*ms)},
		Step{At: 3200 * ms, Cost: 1, Want: limited(0, 800*ms, 800*ms)},
	)
	add("algorithm/sliding_log", ratelimit.Rule{Name: "s", Algorithm: ratelimit.SlidingLog, Quota: 3, Period: sec},
		Step{At: 0, Cost: 1, Want: ok(2, sec)},
		Step{At: 300 * ms, Cost: 1, Want: ok(1, sec)},
		Step{At: 600 * ms, Cost: 1, Want: ok(0, sec)},
		Step{At: 900 * ms, Cost: 1, Want: limited(0, 700*ms, 100*ms)},
		Step{At: sec - 1, Cost: 1, Want: limited(0, 600*ms+1, 1)},
		Step{At: sec, Cost: 1, Want: ok(0, sec)}, // the entry at 0 left
		Step{At: sec, Cost: 2, Want: limited(0, sec, 600*ms)},
		Step{At: 1600 * ms, Cost: 2, Want: ok(0, sec)},
		Step{At: 1600 * ms, Cost: -1, Want: ok(1, sec)}, // refund the newest
		Step{At: 1600 * ms, Cost: 4, Want: never(1, sec)},
		Step{At: 1600 * ms, Cost: -3, Want: ok(3, 0)}, // refund capped, log emptied
		Step{At: 1600 * ms, Cost: 3, Want: ok(0, sec)},
		// Time goes back: decided at the newest instant seen (1.6s), and
		// the times are told from the caller's clock.
		Step{At: sec, Cost: 1, Want: limited(0, 1600*ms, 1600*ms)},
		Step{At: 2600 * ms, Cost: 3, Want: ok(0, sec)},
	)
	// 10 per second, weighted by the overlap of the previous window
	// rounded up.
	add("algorithm/sliding_window", ratelimit.Rule{Name: "w", Algorithm: ratelimit.SlidingWindow, Quota: 10, Period: sec},
		Step{At: 0, Cost: 6, Want: ok(4, 2*sec)},
		Step{At: 500 * ms, Cost: 4, Want: ok(0, 1500*ms)},
		// [1s,2s): prev 10 weighs ceil(10×0.8) = 8 at 1.2s.
		Step{At: 1200 * ms, Cost: 3, Want: limited(2, 800*ms, 100*ms)},
		Step{At: 1300*ms - 1, Cost: 3, Want: limited(2, 700*ms+1, 1)},
		Step{At: 1300 * ms, Cost: 3, Want: ok(0, 1700*ms)},
		Step{At: 1500 * ms, Cost: 2, Want: ok(0, 1500*ms)},
		Step{At: 1500 * ms, Cost: 1, Want: limited(0, 1500*ms, 100*ms)},
		// [2s,3s): prev 5 weighs ceil(5×0.5) = 3 at 2.5s.
		Step{At: 2500 * ms, Cost: 8, Want: limited(7, 500*ms, 100*ms)},
		Step{At: 2600 * ms, Cost: 8, Want: ok(0, 1400*ms)},
		// Only in the next window: at 3.875s prev 8 weighs ceil(8×0.125) = 1.
		Step{At: 2600 * ms, Cost: 9, Want: limited(0, 1400*ms, 1275*ms)},
		Step{At: 3875*ms - 1, Cost: 9, Want: limited(8, 125*ms+1, 1)}, // a denial: back to 2.6s next
		Step{At: 2600 * ms, Cost: 11, Want: never(0, 1400*ms)},
		// Refund: the current window first (8), then the previous (5-2).
		Step{At: 2600 * ms, Cost: -10, Want: ok(8, 400*ms)},
		Step{At: 2600 * ms, Cost: -100, Want: ok(10, 0)},
		Step{At: 2600 * ms, Cost: 10, Want: ok(0, 1400*ms)},
		// Time goes back into [1s,2s): the newest window is kept.
		Step{At: 1900 * ms, Cost: 0, Want: ok(0, 2100*ms)},
		Step{At: 1900 * ms, Cost: 1, Want: limited(0, 2100*ms, 1200*ms)},
		// [3s,4s): prev 10 weighs ceil(10×0.1) = 1 from 3.9s on.
		Step{At: 3900*ms - 1, Cost: 9, Want: limited(8, 100*ms+1, 1)},
		Step{At: 3900 * ms, Cost: 9, Want: ok(0, 1100*ms)},
	)

	// A rule changed mid-window (same name, new numbers) applies at once,
	// against the cost already consumed under the old one.
	rule := func(alg ratelimit.Algorithm, quota int64) *ratelimit.Rule {
		return &ratelimit.Rule{Name: "r", Algorithm: alg, Quota: quota, Period: sec}
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket} {
		r10, r20, r5 := rule(alg, 10), rule(alg, 20), rule(alg, 5)
		add("limit_change/"+alg.String(), *r10,
			Step{At: 0, Cost: 6, Want: ok(4, 600*ms)},
			// 6 consumed of 20: the debt is rescaled to 6 × 50ms.
			Step{At: 0, Rule: r20, Cost: 0, Want: ok(14, 300*ms)},
			// 6 consumed of 5: over capacity until one unit (200ms) refills.
			Step{At: 0, Rule: r5, Cost: 0, Want: limited(0, 1200*ms, 200*ms)},
			Step{At: 0, Rule: r20, Cost: 14, Want: ok(0, sec)},
			Step{At: 0, Rule: r20, Cost: 1, Want: limited(0, sec, 50*ms)},
			Step{At: 0, Rule: r10, Cost: 0, Want: limited(0, 2*sec, sec)}, // 20 of 10
		)
	}
	r5, r3, r6 := rule(ratelimit.FixedWindow, 5), rule(ratelimit.FixedWindow, 3), rule(ratelimit.FixedWindow, 6)
	add("limit_change/fixed_window", *r5,
		Step{At: 100 * ms, Cost: 4, Want: ok(1, 900*ms)},
		Step{At: 200 * ms, Rule: r3, Cost: 0, Want: limited(0, 800*ms, 800*ms)},
		Step{At: 200 * ms, Rule: r6, Cost: 2, Want: ok(0, 800*ms)},
		Step{At: 200 * ms, Rule: r6, Cost: 1, Want: limited(0, 800*ms, 800*ms)},
		Step{At: sec, Rule: r3, Cost: 3, Want: ok(0, sec)},
	)
	r5, r3, r6 = rule(ratelimit.SlidingLog, 5), rule(ratelimit.SlidingLog, 3), rule(ratelimit.SlidingLog, 6)
	add("limit_change/sliding_log", *r5,
		Step{At: 100 * ms, Cost: 4, Want: ok(1, sec)},
		Step{At: 200 * ms, Rule: r3, Cost: 1, Want: limited(0, 900*ms, 900*ms)},
		Step{At: 200 * ms, Rule: r6, Cost: 2, Want: ok(0, sec)},
		Step{At: 1100 * ms, Rule: r3, Cost: 1, Want: ok(0, sec)}, // the 4 left; 2+1
	)
	r10, r5 := rule(ratelimit.SlidingWindow, 10), rule(ratelimit.SlidingWindow, 5)
	add("limit_change/sliding_window", *r10,
		Step{At: 100 * ms, Cost: 6, Want: ok(4, 1900*ms)},
		// 6 > 5: only in the next window, once 6 × (1-e) ≤ 5: e = 1/6 s rounded up.
		Step{At: 100 * ms, Rule: r5, Cost: 0, Want: limited(0, 1900*ms, 900*ms+166666667)},
		Step{At: 100 * ms, Rule: r10, Cost: 4, Want: ok(0, 1900*ms)},
	)

	// Calendar windows in time zones: real months, days of 23 and 25 hours
	// across DST changes, and half-hour offsets.
	ny, kolkata := location("America/New_York"), location("Asia/Kolkata")
	at := func(loc *time.Location, y int, m time.Month, d, h, min int) time.Time {
		return time.Date(y, m, d, h, min, 0, 0, loc)
	}
	utc := func(y int, m time.Month, d, h, min int) time.Time { return at(time.UTC, y, m, d, h, min) }
	cal := func(name string, c ratelimit.Calendar, loc *time.Location, quota int64) ratelimit.Rule {
		return ratelimit.Rule{Name: name, Algorithm: ratelimit.FixedWindow, Calendar: c, Location: loc, Quota: quota}
	}
	add("calendar/month_new_york", cal("m", ratelimit.Month, ny, 3),
		// 19:00 on Jan 31 in New York is already Feb 1 in UTC.
		Step{Abs: at(ny, 2026, 1, 31, 19, 0), Cost: 2, Want: ok(1, 5*h)},
		Step{Abs: at(ny, 2026, 1, 31, 23, 0), Cost: 1, Want: ok(0, h)},
		Step{Abs: at(ny, 2026, 2, 1, 0, 0).Add(-1), Cost: 1, Want: limited(0, 1, 1)},
		Step{Abs: at(ny, 2026, 2, 1, 0, 0), Cost: 3, Want: ok(0, 28*24*h)},
		Step{Abs: at(ny, 2026, 2, 28, 23, 0), Cost: 1, Want: limited(0, h, h)},
		Step{Abs: at(ny, 2026, 3, 1, 0, 0), Cost: 3, Want: ok(0, 31*24*h-h)}, // March loses an hour to DST
	)
	add("calendar/day_dst_spring", cal("d", ratelimit.Day, ny, 1),
		// 2026-03-08 in New York lasts 23 hours.
		Step{Abs: at(ny, 2026, 3, 8, 1, 0), Cost: 1, Want: ok(0, 22*h)},
		Step{Abs: at(ny, 2026, 3, 8, 23, 59), Cost: 1, Want: limited(0, time.Minute, time.Minute)},
		Step{Abs: at(ny, 2026, 3, 9, 0, 0), Cost: 1, Want: ok(0, 24*h)},
	)
	add("calendar/day_dst_autumn", cal("d", ratelimit.Day, ny, 1),
		// 2026-11-01 in New York lasts 25 hours: 01:00 EDT is 05:00 UTC,
		// 24h before the day ends; 01:00 EST is 06:00 UTC.
		Step{Abs: utc(2026, 11, 1, 5, 0), Cost: 1, Want: ok(0, 24*h)},
		Step{Abs: utc(2026, 11, 1, 6, 0), Cost: 1, Want: limited(0, 23*h, 23*h)},
		Step{Abs: at(ny, 2026, 11, 2, 0, 0), Cost: 1, Want: ok(0, 24*h)},
	)
	add("calendar/hour_dst_spring", cal("h", ratelimit.Hour, ny, 1),
		Step{Abs: at(ny, 2026, 3, 8, 1, 30), Cost: 1, Want: ok(0, 30*time.Minute)},
		Step{Abs: at(ny, 2026, 3, 8, 3, 0), Cost: 1, Want: ok(0, h)}, // 02:00 does not exist
	)
	add("calendar/hour_kolkata", cal("h", ratelimit.Hour, kolkata, 2),
		// Local hours start at :30 UTC.
		Step{Abs: at(kolkata, 2026, 1, 1, 10, 15), Cost: 2, Want: ok(0, 45*time.Minute)},
		Step{Abs: utc(2026, 1, 1, 5, 0), Cost: 1, Want: limited(0, 30*time.Minute, 30*time.Minute)},
		Step{Abs: utc(2026, 1, 1, 5, 30), Cost: 2, Want: ok(0, h)},
	)
	add("calendar/minute_kolkata", cal("n", ratelimit.Minute, kolkata, 1),
		Step{Abs: at(kolkata, 2026, 1, 1, 10, 15).Add(20 * sec), Cost: 1, Want: ok(0, 40*sec)},
	)
	add("calendar/week_utc", cal("w", ratelimit.Week, nil, 1),
		// 2026-01-01 is a Thursday; weeks start on Monday.
		Step{Abs: Start, Cost: 1, Want: ok(0, 4*24*h)},
		Step{Abs: utc(2025, 12, 29, 0, 0), Cost: 1, Want: limited(0, 7*24*h, 7*24*h)}, // backwards: same week
		Step{Abs: utc(2026, 1, 4, 23, 0), Cost: 1, Want: limited(0, h, h)},
		Step{Abs: utc(2026, 1, 5, 0, 0), Cost: 1, Want: ok(0, 7*24*h)},
	)
	add("calendar/year_utc", cal("y", ratelimit.Year, nil, 1),
		Step{Abs: utc(2026, 12, 31, 23, 0), Cost: 1, Want: ok(0, h)},
		Step{Abs: utc(2027, 1, 1, 0, 0), Cost: 1, Want: ok(0, 365*24*h)},
	)

	// Limit 0, tiny rates and huge costs: no overflow may open a rule.
	for _, alg := range algorithms {
		add("edge/limit0_"+alg.String(), ratelimit.Rule{Name: "z", Algorithm: alg, Quota: 0, Block: true, Period: sec},
			Step{At: 0, Cost: 0, Want: ok(0, 0)},
			Step{At: 0, Cost: 1, Want: never(0, 0)},
			Step{At: year, Cost: 1, Want: never(0, 0)},
			Step{At: year, Cost: -1, Want: ok(0, 0)},
		)
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket} {
		add("edge/one_per_year_"+alg.String(), ratelimit.Rule{Name: "y", Algorithm: alg, Quota: 1, Period: year},
			Step{At: 0, Cost: 1, Want: ok(0, year)},
			Step{At: 0, Cost: 1, Want: limited(0, year, year)},
			Step{At: year - 1, Cost: 1, Want: limited(0, 1, 1)},
			Step{At: year, Cost: math.MaxInt64, Want: never(1, 0)},
			Step{At: year, Cost: 1, Want: ok(0, year)},
			Step{At: year, Cost: math.MinInt64, Want: ok(1, 0)},
		)
		add("edge/max_period_"+alg.String(), ratelimit.Rule{Name: "p", Algorithm: alg, Quota: 1, Period: ratelimit.MaxPeriod},
			Step{At: 0, Cost: 1, Want: ok(0, ratelimit.MaxPeriod)},
			Step{At: 0, Cost: 1, Want: limited(0, ratelimit.MaxPeriod, ratelimit.MaxPeriod)},
			Step{At: 0, Cost: math.MaxInt64, Want: never(0, ratelimit.MaxPeriod)},
		)
		// 2^40 per second: the interval rounds up to 1ns.
		add("edge/max_limit_"+alg.String(), ratelimit.Rule{Name: "m", Algorithm: alg, Quota: ratelimit.MaxQuota, Period: sec, Burst: ratelimit.MaxQuota},
			Step{At: 0, Cost: ratelimit.MaxQuota, Want: ok(0, ratelimit.MaxQuota)},
			Step{At: 0, Cost: 1, Want: limited(0, ratelimit.MaxQuota, 1)},
			Step{At: ratelimit.MaxQuota, Cost: ratelimit.MaxQuota + 1, Want: never(ratelimit.MaxQuota, 0)},
			Step{At: ratelimit.MaxQuota, Cost: ratelimit.MaxQuota, Want: ok(0, ratelimit.MaxQuota)},
		)
	}
	return tables
}

// location loads a time zone; time/tzdata makes it available everywhere.
func location(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
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

const ms = time.Millisecond

// testSteps decides every step table on one key of a new Store each.
func testSteps(t *testing.T, newStore NewStore) {
	for _, tb := range StepTables() {
		t.Run(tb.Name, func(t *testing.T) {
			e := newEnv(t, newStore)
			key := e.key("k")
			r := &tb.Rule
			for i, st := range tb.Steps {
				if st.Rule != nil {
					r = st.Rule
				}
				now := Start.Add(st.At)
				if !st.Abs.IsZero() {
					now = st.Abs
				}
				e.clock.Set(now)
				want := st.Want
				want.Capacity, want.Rule = r.Capacity(), r.Name
				if got := e.one(key, r, st.Cost); got != want {
					t.Fatalf("step %d (rule %s, at %v, cost %d):\n got %+v\nwant %+v", i, r.Name, now.Sub(Start), st.Cost, got, want)
				}
			}
		})
	}
}

// testEdgeRules covers what the step tables cannot: a sliding window of
// MaxPeriod, whose RetryAfter depends on the epoch.
func testEdgeRules(t *testing.T, newStore NewStore) {
	r := ratelimit.Rule{Name: "p", Algorithm: ratelimit.SlidingWindow, Quota: ratelimit.MaxQuota, Period: ratelimit.MaxPeriod}
	e := newEnv(t, newStore)
	key := e.key("k")
	if d := e.one(key, &r, ratelimit.MaxQuota); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost MaxLimit: %+v", d)
	}
	if d := e.one(key, &r, 1); d.Allowed || d.Reason != ratelimit.ReasonLimited || d.RetryAfter <= 0 || d.RetryAfter == ratelimit.Never {
		t.Fatalf("cost 1 after MaxLimit: %+v", d)
	}
}

// algorithms lists every algorithm.
var algorithms = []ratelimit.Algorithm{
	ratelimit.GCRA, ratelimit.FixedWindow, ratelimit.SlidingLog, ratelimit.SlidingWindow, ratelimit.LeakyBucket,
}
