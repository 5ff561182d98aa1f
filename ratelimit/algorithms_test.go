package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// epoch0 is the start of every step table: a whole second, minute, hour, day
// and month in UTC, so epoch-aligned windows start there.
var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// A ruleStep decides cost at epoch0+at (or at the absolute instant abs,
// when set) and expects want. Rule, when set, replaces the table's rule
// from this step on. Limit and Rule of want are filled in from the rule.
type ruleStep struct {
	at   time.Duration
	abs  time.Time
	rule *Rule
	cost int64
	want Decision
}

// ok, limited and never build the expected decision of a step.
func ok(rem int64, reset time.Duration) Decision {
	return Decision{Allowed: true, Reason: ReasonOK, Remaining: rem, ResetAfter: reset}
}

func limited(rem int64, reset, retry time.Duration) Decision {
	return Decision{Reason: ReasonLimited, Remaining: rem, ResetAfter: reset, RetryAfter: retry}
}

func never(rem int64, reset time.Duration) Decision {
	return Decision{Reason: ReasonExceedsCapacity, Remaining: rem, ResetAfter: reset, RetryAfter: Never}
}

// runRuleSteps decides the steps in order on one State and stops the test at
// the first decision that differs from the table.
func runRuleSteps(t *testing.T, r *Rule, steps []ruleStep) {
	t.Helper()
	if err := ruleStepsErr(r, steps); err != nil {
		t.Fatal(err)
	}
}

// ruleStepsErr decides the steps in order on one State, checking that Peek
// and denials change nothing (TestPeek compares Peek's decisions with
// Decide's), and reports the first difference from the table.
func ruleStepsErr(r *Rule, steps []ruleStep) error {
	s := State{Algorithm: r.Algorithm}
	for i, st := range steps {
		if st.rule != nil {
			r = st.rule
		}
		now := epoch0.Add(st.at)
		if !st.abs.IsZero() {
			now = st.abs
		}
		want := st.want
		want.Capacity, want.Rule = r.Capacity(), r.Name
		before := s.clone()
		r.Peek(&s, now, st.cost)
		if !statesEqual(before, s) {
			return fmt.Errorf("step %d: Peek changed the state from %+v to %+v", i, before, s)
		}
		got := r.Decide(&s, now, st.cost)
		if got != want {
			return fmt.Errorf("step %d (%s, at %v, cost %d):\n got %+v\nwant %+v", i, r.Name, now.Sub(epoch0), st.cost, got, want)
		}
		if !got.Allowed && !statesEqual(before, s) {
			return fmt.Errorf("step %d: denial changed the state from %+v to %+v", i, before, s)
		}
	}
	return nil
}

func statesEqual(a, b State) bool {
	if a.Algorithm != b.Algorithm || a.T != b.T || a.N != b.N || a.Prev != b.Prev || a.Seen != b.Seen || len(a.Log) != len(b.Log) {
		return false
	}
	for i := range a.Log {
		if a.Log[i] != b.Log[i] {
			return false
		}
	}
	return true
}

// gcraSteps is the step table of GCRA and LeakyBucket: 10 per second
// (one unit every 100ms), capacity exactly Burst = 5.
func gcraSteps() []ruleStep {
	return []ruleStep{
		{at: 0, cost: 1, want: ok(4, 100*milli)},
		{at: 0, cost: 4, want: ok(0, 500*milli)}, // burst: exactly 5 at once
		{at: 0, cost: 1, want: limited(0, 500*milli, 100*milli)},
		{at: 50 * milli, cost: 1, want: limited(0, 450*milli, 50*milli)},  // denial consumed nothing
		{at: 100*milli - 1, cost: 1, want: limited(0, 400*milli+1, 1)},    // one ns early
		{at: 100 * milli, cost: 1, want: ok(0, 500*milli)},                // refilled one unit
		{at: 100 * milli, cost: 0, want: ok(0, 500*milli)},                // a check consumes nothing
		{at: 350 * milli, cost: 0, want: ok(2, 250*milli)},                // partial refill
		{at: 350 * milli, cost: 3, want: limited(2, 250*milli, 50*milli)}, // all or nothing
		{at: 400 * milli, cost: 3, want: ok(0, 500*milli)},                // RetryAfter was exact
		{at: 2 * time.Second, cost: 0, want: ok(5, 0)},                    // full again, never above Burst
		{at: 2 * time.Second, cost: 6, want: never(5, 0)},                 // cost > capacity
		{at: 2 * time.Second, cost: math.MaxInt64, want: never(5, 0)},
		{at: 2 * time.Second, cost: 5, want: ok(0, 500*milli)},
		{at: 2 * time.Second, cost: -2, want: ok(2, 300*milli)},    // refund
		{at: 2 * time.Second, cost: -10, want: ok(5, 0)},           // refund capped at capacity
		{at: 2 * time.Second, cost: math.MinInt64, want: ok(5, 0)}, // no overflow
		{at: 2 * time.Second, cost: 5, want: ok(0, 500*milli)},
		{at: 2 * time.Second, cost: 1, want: limited(0, 500*milli, 100*milli)},
	}
}

// gcraStaleSteps follow gcraSteps: time goes back 500ms, the debt looks
// larger and nothing is created.
func gcraStaleSteps() []ruleStep {
	return []ruleStep{
		{at: 1500 * milli, cost: 1, want: limited(0, time.Second, 600*milli)},
		{at: 1500 * milli, cost: 0, want: ok(0, time.Second)}, // decided at the state's instant, 2s
		{at: 2500 * milli, cost: 5, want: ok(0, 500*milli)},
	}
}

func fixedWindowSteps() []ruleStep {
	return []ruleStep{
		{at: 0, cost: 2, want: ok(1, time.Second)},
		{at: 500 * milli, cost: 2, want: limited(1, 500*milli, 500*milli)},
		{at: 500 * milli, cost: 1, want: ok(0, 500*milli)},
		{at: 999 * milli, cost: 0, want: ok(0, milli)},
		{at: time.Second - 1, cost: 1, want: limited(0, 1, 1)},
		{at: time.Second, cost: 3, want: ok(0, time.Second)}, // new window, full quota
		{at: 1500 * milli, cost: 4, want: never(0, 500*milli)},
		{at: 1500 * milli, cost: -1, want: ok(1, 500*milli)},
		// Time goes back into the previous window: the newest window
		// seen is kept, so its count still applies.
		{at: 900 * milli, cost: 1, want: ok(0, 1100*milli)},
		{at: 900 * milli, cost: 1, want: limited(0, 1100*milli, 1100*milli)},
		{at: 3200 * milli, cost: 0, want: ok(3, 0)},
		{at: 3200 * milli, cost: -5, want: ok(3, 0)}, // refund capped
		{at: 3200 * milli, cost: 3, want: ok(0, 800*milli)},
		{at: 3200 * milli, cost: 1, want: limited(0, 800*milli, 800*milli)},
	}
}

func slidingLogSteps() []ruleStep {
	return []ruleStep{
		{at: 0, cost: 1, want: ok(2, time.Second)},
		{at: 300 * milli, cost: 1, want: ok(1, time.Second)},
		{at: 600 * milli, cost: 1, want: ok(0, time.Second)},
		{at: 900 * milli, cost: 1, want: limited(0, 700*milli, 100*milli)},
		{at: time.Second - 1, cost: 1, want: limited(0, 600*milli+1, 1)},
		{at: time.Second, cost: 1, want: ok(0, time.Second)}, // the entry at 0 left
		{at: time.Second, cost: 2, want: limited(0, time.Second, 600*milli)},
		{at: 1600 * milli, cost: 2, want: ok(0, time.Second)},
		{at: 1600 * milli, cost: -1, want: ok(1, time.Second)}, // refund the newest
		{at: 1600 * milli, cost: 4, want: never(1, time.Second)},
		{at: 1600 * milli, cost: -3, want: ok(3, 0)}, // refund capped, log emptied
		{at: 1600 * milli, cost: 3, want: ok(0, time.Second)},
		// Time goes back: decided at the newest instant seen (1.6s), and
		// the times are told from the caller's clock.
		{at: 1 * time.Second, cost: 1, want: limited(0, 1600*milli, 1600*milli)},
		{at: 2600 * milli, cost: 3, want: ok(0, time.Second)},
	}
}

// slidingWindowSteps: 10 per second, weighted by the overlap of the
// previous window rounded up.
func slidingWindowSteps() []ruleStep {
	return []ruleStep{
		{at: 0, cost: 6, want: ok(4, 2*time.Second)},
		{at: 500 * milli, cost: 4, want: ok(0, 1500*milli)},
		// [1s,2s): prev 10 weighs ceil(10×0.8) = 8 at 1.2s.
		{at: 1200 * milli, cost: 3, want: limited(2, 800*milli, 100*milli)},
		{at: 1300*milli - 1, cost: 3, want: limited(2, 700*milli+1, 1)},
		{at: 1300 * milli, cost: 3, want: ok(0, 1700*milli)},
		{at: 1500 * milli, cost: 2, want: ok(0, 1500*milli)},
		{at: 1500 * milli, cost: 1, want: limited(0, 1500*milli, 100*milli)},
		// [2s,3s): prev 5 weighs ceil(5×0.5) = 3 at 2.5s.
		{at: 2500 * milli, cost: 8, want: limited(7, 500*milli, 100*milli)},
		{at: 2600 * milli, cost: 8, want: ok(0, 1400*milli)},
		// Only in the next window: at 3.875s prev 8 weighs ceil(8×0.125) = 1.
		{at: 2600 * milli, cost: 9, want: limited(0, 1400*milli, 1275*milli)},
		{at: 3875*milli - 1, cost: 9, want: limited(8, 125*milli+1, 1)}, // a denial: back to 2.6s next
		{at: 2600 * milli, cost: 11, want: never(0, 1400*milli)},
		// Refund: the current window first (8), then the previous (5-2).
		{at: 2600 * milli, cost: -10, want: ok(8, 400*milli)},
		{at: 2600 * milli, cost: -100, want: ok(10, 0)},
		{at: 2600 * milli, cost: 10, want: ok(0, 1400*milli)},
		// Time goes back into [1s,2s): the newest window is kept.
		{at: 1900 * milli, cost: 0, want: ok(0, 2100*milli)},
		{at: 1900 * milli, cost: 1, want: limited(0, 2100*milli, 1200*milli)},
	}
}

func TestSteps(t *testing.T) {
	sec := time.Second
	tests := []struct {
		name  string
		rule  Rule
		steps []ruleStep
	}{
		{"gcra", Rule{Name: "g", Quota: 10, Period: sec, Burst: 5}, append(gcraSteps(), gcraStaleSteps()...)},
		{"leaky_bucket", Rule{Name: "l", Algorithm: LeakyBucket, Quota: 10, Period: sec, Burst: 5}, gcraSteps()},
		{"fixed_window", Rule{Name: "f", Algorithm: FixedWindow, Quota: 3, Period: sec}, fixedWindowSteps()},
		{"sliding_log", Rule{Name: "s", Algorithm: SlidingLog, Quota: 3, Period: sec}, slidingLogSteps()},
		{"sliding_window", Rule{Name: "w", Algorithm: SlidingWindow, Quota: 10, Period: sec}, slidingWindowSteps()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.rule.Validate(); err != nil {
				t.Fatal(err)
			}
			runRuleSteps(t, &tt.rule, tt.steps)
		})
	}
	t.Run("leaky_bucket_stale_clock", func(t *testing.T) {
		// LeakyBucket promises to decide exactly as GCRA.
		r := Rule{Name: "g", Algorithm: LeakyBucket, Quota: 10, Period: sec, Burst: 5}
		if err := ruleStepsErr(&r, append(gcraSteps(), gcraStaleSteps()...)); err != nil {
			t.Fatalf("leaky bucket differs from GCRA when time goes back: %v", err)
		}
	})
}

// TestLimitChange changes the rule of a key mid-window: the cost already
// consumed carries over.
func TestLimitChange(t *testing.T) {
	sec := time.Second
	for _, alg := range []Algorithm{GCRA, LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			r10 := Rule{Name: "r", Algorithm: alg, Quota: 10, Period: sec}
			r20 := Rule{Name: "r", Algorithm: alg, Quota: 20, Period: sec}
			r5 := Rule{Name: "r", Algorithm: alg, Quota: 5, Period: sec}
			runRuleSteps(t, &r10, []ruleStep{
				{at: 0, cost: 6, want: ok(4, 600*milli)},
				// 6 consumed of 20: the debt is rescaled to 6 × 50ms.
				{at: 0, rule: &r20, cost: 0, want: ok(14, 300*milli)},
				// 6 consumed of 5: over capacity until one unit (200ms) refills.
				{at: 0, rule: &r5, cost: 0, want: limited(0, 1200*milli, 200*milli)},
				{at: 0, rule: &r20, cost: 14, want: ok(0, time.Second)},
				{at: 0, rule: &r20, cost: 1, want: limited(0, time.Second, 50*milli)},
				{at: 0, rule: &r10, cost: 0, want: limited(0, 2*time.Second, time.Second)},
			})
		})
	}
	t.Run("fixed_window", func(t *testing.T) {
		r5 := Rule{Name: "r", Algorithm: FixedWindow, Quota: 5, Period: sec}
		r3 := Rule{Name: "r", Algorithm: FixedWindow, Quota: 3, Period: sec}
		r6 := Rule{Name: "r", Algorithm: FixedWindow, Quota: 6, Period: sec}
		runRuleSteps(t, &r5, []ruleStep{
			{at: 100 * milli, cost: 4, want: ok(1, 900*milli)},
			{at: 200 * milli, rule: &r3, cost: 0, want: limited(0, 800*milli, 800*milli)},
			{at: 200 * milli, rule: &r6, cost: 2, want: ok(0, 800*milli)},
			{at: 200 * milli, rule: &r6, cost: 1, want: limited(0, 800*milli, 800*milli)},
			{at: sec, rule: &r3, cost: 3, want: ok(0, sec)},
		})
	})
	t.Run("sliding_log", func(t *testing.T) {
		r5 := Rule{Name: "r", Algorithm: SlidingLog, Quota: 5, Period: sec}
		r3 := Rule{Name: "r", Algorithm: SlidingLog, Quota: 3, Period: sec}
		r6 := Rule{Name: "r", Algorithm: SlidingLog, Quota: 6, Period: sec}
		runRuleSteps(t, &r5, []ruleStep{
			{at: 100 * milli, cost: 4, want: ok(1, sec)},
			{at: 200 * milli, rule: &r3, cost: 1, want: limited(0, 900*milli, 900*milli)},
			{at: 200 * milli, rule: &r6, cost: 2, want: ok(0, sec)},
			{at: 1100 * milli, rule: &r3, cost: 1, want: ok(0, sec)}, // the 4 left; 2+1
		})
	})
	t.Run("sliding_window", func(t *testing.T) {
		r10 := Rule{Name: "r", Algorithm: SlidingWindow, Quota: 10, Period: sec}
		r5 := Rule{Name: "r", Algorithm: SlidingWindow, Quota: 5, Period: sec}
		runRuleSteps(t, &r10, []ruleStep{
			{at: 100 * milli, cost: 6, want: ok(4, 1900*milli)},
			// 6 > 5: only in the next window, once 6 × (1-e) ≤ 5: e = 1/6 s rounded up.
			{at: 100 * milli, rule: &r5, cost: 0, want: limited(0, 1900*milli, 900*milli+166666667)},
			{at: 100 * milli, rule: &r10, cost: 4, want: ok(0, 1900*milli)},
		})
	})
}

// TestCalendar checks calendar windows in time zones: real months, days of
// 23 and 25 hours across DST changes and half-hour offsets.
func TestCalendar(t *testing.T) {
	ny := loadLocation(t, "America/New_York")
	kolkata := loadLocation(t, "Asia/Kolkata")
	at := func(loc *time.Location, y int, m time.Month, d, h, min int) time.Time {
		return time.Date(y, m, d, h, min, 0, 0, loc)
	}
	h := time.Hour
	tests := []struct {
		name  string
		rule  Rule
		steps []ruleStep
	}{
		{"month_new_york", Rule{Name: "m", Algorithm: FixedWindow, Calendar: Month, Location: ny, Quota: 3}, []ruleStep{
			// 19:00 on Jan 31 in New York is already Feb 1 in UTC.
			{abs: at(ny, 2026, 1, 31, 19, 0), cost: 2, want: ok(1, 5*h)},
			{abs: at(ny, 2026, 1, 31, 23, 0), cost: 1, want: ok(0, h)},
			{abs: at(ny, 2026, 2, 1, 0, 0).Add(-1), cost: 1, want: limited(0, 1, 1)},
			{abs: at(ny, 2026, 2, 1, 0, 0), cost: 3, want: ok(0, 28*24*h)},
			{abs: at(ny, 2026, 2, 28, 23, 0), cost: 1, want: limited(0, h, h)},
			{abs: at(ny, 2026, 3, 1, 0, 0), cost: 3, want: ok(0, 31*24*h-h)}, // March loses an hour to DST
		}},
		{"day_dst_spring", Rule{Name: "d", Algorithm: FixedWindow, Calendar: Day, Location: ny, Quota: 1}, []ruleStep{
			// 2026-03-08 in New York lasts 23 hours.
			{abs: at(ny, 2026, 3, 8, 1, 0), cost: 1, want: ok(0, 22*h)},
			{abs: at(ny, 2026, 3, 8, 23, 59), cost: 1, want: limited(0, time.Minute, time.Minute)},
			{abs: at(ny, 2026, 3, 9, 0, 0), cost: 1, want: ok(0, 24*h)},
		}},
		{"day_dst_autumn", Rule{Name: "d", Algorithm: FixedWindow, Calendar: Day, Location: ny, Quota: 1}, []ruleStep{
			// 2026-11-01 in New York lasts 25 hours; 01:00 EDT is 24h before its end.
			{abs: at(ny, 2026, 11, 1, 1, 0), cost: 1, want: ok(0, 24*h)},
			{abs: time.Date(2026, 11, 1, 6, 0, 0, 0, time.UTC), cost: 1, want: limited(0, 23*h, 23*h)}, // 01:00 EST
			{abs: at(ny, 2026, 11, 2, 0, 0), cost: 1, want: ok(0, 24*h)},
		}},
		{"hour_dst_spring", Rule{Name: "h", Algorithm: FixedWindow, Calendar: Hour, Location: ny, Quota: 1}, []ruleStep{
			{abs: at(ny, 2026, 3, 8, 1, 30), cost: 1, want: ok(0, 30*time.Minute)},
			{abs: at(ny, 2026, 3, 8, 3, 0), cost: 1, want: ok(0, h)}, // 02:00 does not exist
		}},
		{"hour_kolkata", Rule{Name: "h", Algorithm: FixedWindow, Calendar: Hour, Location: kolkata, Quota: 2}, []ruleStep{
			// Local hours start at :30 UTC.
			{abs: at(kolkata, 2026, 1, 1, 10, 15), cost: 2, want: ok(0, 45*time.Minute)},
			{abs: time.Date(2026, 1, 1, 5, 0, 0, 0, time.UTC), cost: 1, want: limited(0, 30*time.Minute, 30*time.Minute)},
			{abs: time.Date(2026, 1, 1, 5, 30, 0, 0, time.UTC), cost: 2, want: ok(0, h)},
		}},
		{"minute_kolkata", Rule{Name: "n", Algorithm: FixedWindow, Calendar: Minute, Location: kolkata, Quota: 1}, []ruleStep{
			{abs: at(kolkata, 2026, 1, 1, 10, 15).Add(20 * time.Second), cost: 1, want: ok(0, 40*time.Second)},
		}},
		{"week_utc", Rule{Name: "w", Algorithm: FixedWindow, Calendar: Week, Quota: 1}, []ruleStep{
			// 2026-01-01 is a Thursday; the week ends on Monday 2026-01-05.
			{abs: epoch0, cost: 1, want: ok(0, 4*24*h)},
			{abs: time.Date(2025, 12, 29, 0, 0, 0, 0, time.UTC), cost: 1, want: limited(0, 7*24*h, 7*24*h)}, // backwards: same week
			{abs: time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC), cost: 1, want: ok(0, 7*24*h)},
		}},
		{"year_utc", Rule{Name: "y", Algorithm: FixedWindow, Calendar: Year, Quota: 1}, []ruleStep{
			{abs: time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC), cost: 1, want: ok(0, h)},
			{abs: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), cost: 1, want: ok(0, 365*24*h)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.rule.Validate(); err != nil {
				t.Fatal(err)
			}
			runRuleSteps(t, &tt.rule, tt.steps)
		})
	}
}

func loadLocation(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Skipf("time zone database: %v", err)
	}
	return loc
}

// TestEdgeRules covers limit 0, tiny rates and huge costs (no overflow
// may open the limiter).
func TestEdgeRules(t *testing.T) {
	year := 365 * 24 * time.Hour
	for alg := range numAlgorithms {
		t.Run("limit0_"+alg.String(), func(t *testing.T) {
			r := Rule{Name: "z", Algorithm: alg, Quota: 0, Period: time.Second}
			runRuleSteps(t, &r, []ruleStep{
				{at: 0, cost: 0, want: ok(0, 0)},
				{at: 0, cost: 1, want: never(0, 0)},
				{at: year, cost: 1, want: never(0, 0)},
				{at: year, cost: -1, want: ok(0, 0)},
			})
		})
	}
	for _, alg := range []Algorithm{GCRA, LeakyBucket} {
		t.Run("limit0_burst_"+alg.String(), func(t *testing.T) {
			// Limit 0 admits nothing but cost-0 checks, whatever the burst.
			r := Rule{Name: "z", Algorithm: alg, Quota: 0, Period: time.Second, Burst: 4}
			var s State
			for _, cost := range []int64{1, 2, 3, 4} {
				if d := r.Decide(&s, epoch0, cost); d.Allowed {
					t.Fatalf("limit 0 with burst 4 admits cost %d: %+v", cost, d)
				}
			}
		})
		t.Run("one_per_year_"+alg.String(), func(t *testing.T) {
			r := Rule{Name: "y", Algorithm: alg, Quota: 1, Period: year}
			runRuleSteps(t, &r, []ruleStep{
				{at: 0, cost: 1, want: ok(0, year)},
				{at: 0, cost: 1, want: limited(0, year, year)},
				{at: year - 1, cost: 1, want: limited(0, 1, 1)},
				{at: year, cost: math.MaxInt64, want: never(1, 0)},
				{at: year, cost: 1, want: ok(0, year)},
				{at: year, cost: math.MinInt64, want: ok(1, 0)},
			})
		})
		t.Run("max_period_"+alg.String(), func(t *testing.T) {
			r := Rule{Name: "p", Algorithm: alg, Quota: 1, Period: MaxPeriod}
			runRuleSteps(t, &r, []ruleStep{
				{at: 0, cost: 1, want: ok(0, MaxPeriod)},
				{at: 0, cost: 1, want: limited(0, MaxPeriod, MaxPeriod)},
				{at: 0, cost: math.MaxInt64, want: never(0, MaxPeriod)},
			})
		})
		t.Run("max_limit_"+alg.String(), func(t *testing.T) {
			// 2^40 per second: the interval rounds up to 1ns.
			r := Rule{Name: "m", Algorithm: alg, Quota: MaxQuota, Period: time.Second, Burst: MaxQuota}
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			runRuleSteps(t, &r, []ruleStep{
				{at: 0, cost: MaxQuota, want: ok(0, MaxQuota)},
				{at: 0, cost: 1, want: limited(0, MaxQuota, 1)},
				{at: MaxQuota, cost: MaxQuota + 1, want: never(MaxQuota, 0)},
				{at: MaxQuota, cost: MaxQuota, want: ok(0, MaxQuota)},
			})
		})
	}
	t.Run("huge_cost_windows", func(t *testing.T) {
		for _, alg := range []Algorithm{FixedWindow, SlidingLog, SlidingWindow} {
			r := Rule{Name: "h", Algorithm: alg, Quota: 2, Period: year}
			var s State
			for _, cost := range []int64{math.MaxInt64, math.MaxInt64 / 2, 3, MaxQuota} {
				if d := r.Decide(&s, epoch0, cost); d.Allowed || d.Reason != ReasonExceedsCapacity || d.RetryAfter != Never {
					t.Errorf("%s: cost %d: got %+v, want exceeds capacity", alg, cost, d)
				}
			}
			if d := r.Decide(&s, epoch0, math.MinInt64); !d.Allowed || d.Remaining != 2 {
				t.Errorf("%s: refund MinInt64: got %+v", alg, d)
			}
		}
	})
}

func TestValidate(t *testing.T) {
	sec := time.Second
	bad := []Rule{
		{Algorithm: numAlgorithms, Quota: 1, Period: sec},
		{Failure: numFailureModes, Quota: 1, Period: sec},
		{Quota: -1, Period: sec},
		{Quota: MaxQuota + 1, Period: sec},
		{Quota: 1, Period: sec, Burst: -1},
		{Quota: 1, Period: sec, Burst: MaxQuota + 1},
		{Quota: 1},
		{Quota: 1, Period: -sec},
		{Quota: 1, Period: MaxPeriod + 1},
		{Algorithm: FixedWindow, Quota: 1, Calendar: numCalendars},
		{Algorithm: GCRA, Quota: 1, Calendar: Day},
		{Algorithm: SlidingWindow, Quota: 1, Calendar: Day},
		{Algorithm: FixedWindow, Quota: 1, Period: sec, Calendar: Day},
		{Algorithm: FixedWindow, Quota: 1, Period: sec, Burst: 1},
		{Algorithm: SlidingLog, Quota: 1, Period: sec, Burst: 1},
		{Algorithm: SlidingWindow, Quota: 1, Period: sec, Burst: 1},
		{Algorithm: SlidingLog, Quota: MaxSlidingLogQuota + 1, Period: sec},
		{Algorithm: GCRA, Quota: 1, Period: MaxPeriod, Burst: 2},        // burst × interval overflows
		{Algorithm: LeakyBucket, Quota: 1, Period: MaxPeriod, Burst: 2}, // idem
	}
	for i, r := range bad {
		r.Name = fmt.Sprintf("bad%d", i)
		err := r.Validate()
		if !errors.Is(err, ErrInvalidRule) {
			t.Errorf("%+v: Validate() = %v, want an error wrapping ErrInvalidRule", r, err)
		}
	}
	good := []Rule{
		{Quota: 0, Period: sec},
		{Quota: 1, Period: 1},
		{Quota: MaxQuota, Period: sec, Burst: MaxQuota},
		{Quota: 1, Period: MaxPeriod},
		{Algorithm: LeakyBucket, Quota: 3, Period: sec, Burst: 10},
		{Algorithm: FixedWindow, Quota: 1, Calendar: Month, Location: time.UTC},
		{Algorithm: FixedWindow, Quota: 1, Calendar: Year},
		{Algorithm: SlidingLog, Quota: MaxSlidingLogQuota, Period: sec},
		{Algorithm: SlidingWindow, Quota: MaxQuota, Period: MaxPeriod},
	}
	for _, r := range good {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v: Validate() = %v, want nil", r, err)
		}
	}
}

// randomRule returns a valid rule of algorithm alg with small numbers, so
// that random sequences reach its limits.
func randomRule(rng *rand.Rand, alg Algorithm) Rule {
	periods := []time.Duration{7, time.Millisecond, time.Second, 3 * time.Second, time.Minute}
	r := Rule{Name: "rand", Algorithm: alg, Quota: 1 + rng.Int64N(20), Period: periods[rng.IntN(len(periods))]}
	if (alg == GCRA || alg == LeakyBucket) && rng.IntN(2) == 0 {
		r.Burst = 1 + rng.Int64N(30)
	}
	return r
}

// randomStep returns a time step in [0, 2×Period) biased towards small
// steps, and a cost in [-cap-1, cap+1] biased towards admissible ones.
func randomStep(rng *rand.Rand, r *Rule) (time.Duration, int64) {
	var dt time.Duration
	switch rng.IntN(4) {
	case 0:
	case 1:
		dt = time.Duration(rng.Int64N(int64(r.Period)/int64(r.Quota) + 1))
	default:
		dt = time.Duration(rng.Int64N(2 * int64(r.Period)))
	}
	c := r.Capacity()
	cost := 1 + rng.Int64N(c)
	switch rng.IntN(10) {
	case 0:
		cost = -rng.Int64N(c + 2)
	case 1:
		cost = 0
	case 2:
		cost = c + 1
	}
	return dt, cost
}

// TestRetryAfter checks RetryAfter on random states of every algorithm:
// after waiting RetryAfter the same cost is admitted, and one nanosecond
// earlier it is not.
func TestRetryAfter(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for alg := range numAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			checked := 0
			for range 300 {
				r := randomRule(rng, alg)
				var s State
				now := epoch0.Add(time.Duration(rng.Int64N(int64(time.Hour))))
				for range 40 {
					dt, cost := randomStep(rng, &r)
					now = now.Add(dt)
					d := r.Decide(&s, now, cost)
					checkRetryAfter(t, &r, &s, now, cost, d)
					if !d.Allowed && d.Reason == ReasonLimited {
						checked++
					}
				}
			}
			if checked < 100 {
				t.Errorf("only %d denials checked", checked)
			}
		})
	}
}

// checkRetryAfter checks decision d of cost at now, decided on a state
// that is now s (a denial left it as it was).
func checkRetryAfter(t *testing.T, r *Rule, s *State, now time.Time, cost int64, d Decision) {
	t.Helper()
	switch {
	case d.Allowed:
		if d.RetryAfter != 0 || d.Reason != ReasonOK {
			t.Fatalf("%+v cost %d: allowed with %+v", r, cost, d)
		}
	case cost > r.Capacity():
		if d.Reason != ReasonExceedsCapacity || d.RetryAfter != Never {
			t.Fatalf("%+v cost %d: got %+v, want exceeds capacity", r, cost, d)
		}
	default:
		if d.Reason != ReasonLimited || d.RetryAfter <= 0 {
			t.Fatalf("%+v cost %d: denied with %+v", r, cost, d)
		}
		if later := r.Peek(s, now.Add(d.RetryAfter), cost); !later.Allowed {
			t.Fatalf("%+v state %+v: cost %d denied at %v with RetryAfter %v, and again after it: %+v",
				r, *s, cost, now.Sub(epoch0), d.RetryAfter, later)
		}
		if early := r.Peek(s, now.Add(d.RetryAfter-1), cost); early.Allowed {
			t.Fatalf("%+v state %+v: cost %d denied at %v with RetryAfter %v, but admitted 1ns earlier: %+v",
				r, *s, cost, now.Sub(epoch0), d.RetryAfter, early)
		}
	}
}

// TestRetryAfterStaleClock asks with an instant older than the state's:
// waiting RetryAfter from that instant must still be enough.
func TestRetryAfterStaleClock(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for alg := range numAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			for range 300 {
				r := randomRule(rng, alg)
				var s State
				now := epoch0
				for range 40 {
					dt, cost := randomStep(rng, &r)
					now = now.Add(dt)
					r.Decide(&s, now, cost)
				}
				stale := now.Add(-time.Duration(rng.Int64N(int64(r.Period))))
				cost := 1 + rng.Int64N(r.Capacity())
				d := r.Peek(&s, stale, cost)
				if d.Allowed || d.Reason != ReasonLimited {
					continue
				}
				if later := r.Peek(&s, stale.Add(d.RetryAfter), cost); !later.Allowed {
					t.Fatalf("%+v state %+v: cost %d at stale instant now-%v: RetryAfter %v is not enough: %+v",
						r, s, cost, now.Sub(stale), d.RetryAfter, later)
				}
			}
		})
	}
}

// TestLeakyBucketIsGCRA decides random sequences with both algorithms and
// the same rule: every decision must be the same, also with instants that
// sometimes go backwards (stale_clock).
func TestLeakyBucketIsGCRA(t *testing.T) {
	tests := []struct {
		name       string
		seed1      uint64
		seed2      uint64
		staleClock bool
	}{
		{"monotonic", 5, 6, false},
		{"stale_clock", 7, 8, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tt.seed1, tt.seed2))
			for range 500 {
				g := randomRule(rng, GCRA)
				l := g
				l.Algorithm = LeakyBucket
				var gs, ls State
				now := epoch0
				for i := range 60 {
					dt, cost := randomStep(rng, &g)
					if tt.staleClock && rng.IntN(5) == 0 {
						dt = -dt / 2
					}
					now = now.Add(dt)
					dg, dl := g.Decide(&gs, now, cost), l.Decide(&ls, now, cost)
					if dg != dl {
						t.Fatalf("rule %+v step %d (at %v, cost %d):\n gcra  %+v\n leaky %+v", g, i, now.Sub(epoch0), cost, dg, dl)
					}
				}
			}
		})
	}
}

// TestSlidingLogExact checks that a sliding log never admits more than
// Limit in any window of Period, and that it admits every request that
// fits, against a brute-force count of the admitted requests.
func TestSlidingLogExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	type adm struct {
		at   time.Time
		cost int64
	}
	for range 200 {
		r := randomRule(rng, SlidingLog)
		var s State
		var log []adm
		now := epoch0
		for range 80 {
			dt, cost := randomStep(rng, &r)
			cost = max(0, cost) // no refunds: the brute force counts admissions
			now = now.Add(dt)
			var used int64
			for _, a := range log {
				if now.Sub(a.at) < r.Period {
					used += a.cost
				}
			}
			d := r.Decide(&s, now, cost)
			want := cost <= r.Quota && used+cost <= r.Quota
			if d.Allowed != want {
				t.Fatalf("%+v at %v: cost %d with %d used in the last period: got %+v", r, now.Sub(epoch0), cost, used, d)
			}
			if d.Allowed {
				log = append(log, adm{now, cost})
				if d.Remaining != r.Quota-used-cost {
					t.Fatalf("%+v at %v: Remaining %d, want %d", r, now.Sub(epoch0), d.Remaining, r.Quota-used-cost)
				}
			}
		}
	}
}

// TestSlidingWindowWeighting checks the sliding window counter against a
// direct computation of the Cloudflare estimate.
func TestSlidingWindowWeighting(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for range 200 {
		r := randomRule(rng, SlidingWindow)
		p := int64(r.Period)
		var s State
		counts := map[int64]int64{} // window index → admitted cost
		now := epoch0
		for range 80 {
			dt, cost := randomStep(rng, &r)
			cost = max(0, cost)
			now = now.Add(dt)
			n := now.UnixNano()
			k := n / p
			elapsed := n - k*p
			prev := counts[k-1]
			weighted := (prev*(p-elapsed) + p - 1) / p // small numbers: no overflow
			used := counts[k] + weighted
			d := r.Decide(&s, now, cost)
			want := cost <= r.Quota && used+cost <= r.Quota
			if d.Allowed != want {
				t.Fatalf("%+v at %v: cost %d, estimate %d+%d: got %+v", r, now.Sub(epoch0), cost, counts[k], weighted, d)
			}
			if d.Allowed {
				counts[k] += cost
				if d.Remaining != r.Quota-used-cost {
					t.Fatalf("%+v at %v: Remaining %d, want %d", r, now.Sub(epoch0), d.Remaining, r.Quota-used-cost)
				}
			}
		}
	}
}

// TestPeek checks on random sequences that Peek changes nothing and
// returns what Decide then returns.
func TestPeek(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for alg := range numAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			for range 200 {
				r := randomRule(rng, alg)
				s := State{Algorithm: alg}
				now := epoch0
				for i := range 40 {
					dt, cost := randomStep(rng, &r)
					now = now.Add(dt)
					before := s.clone()
					peek := r.Peek(&s, now, cost)
					if !statesEqual(before, s) {
						t.Fatalf("%+v step %d: Peek(cost %d) changed the state from %+v to %+v", r, i, cost, before, s)
					}
					if got := r.Decide(&s, now, cost); got != peek {
						if alg == SlidingLog && got.ResetAfter != peek.ResetAfter {
							same := peek
							same.ResetAfter = got.ResetAfter
							if got == same {
								t.Fatalf("sliding log Peek(cost %d) at %v mispredicts ResetAfter: Peek %v, Decide %v (state before %+v)",
									cost, now.Sub(epoch0), peek.ResetAfter, got.ResetAfter, before)
							}
						}
						t.Fatalf("%+v step %d (cost %d, state %+v):\n Peek   %+v\n Decide %+v", r, i, cost, before, peek, got)
					}
				}
			}
		})
	}
}

// TestRefundStaleClock refunds at an instant older than the state's: the
// debt still exceeds the capacity, and Remaining must not go below 0.
func TestRefundStaleClock(t *testing.T) {
	sec := time.Second
	for _, alg := range []Algorithm{GCRA, LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			r := Rule{Name: "g", Algorithm: alg, Quota: 10, Period: sec, Burst: 5}
			var s State
			r.Decide(&s, epoch0.Add(sec), 5)
			d := r.Decide(&s, epoch0, -1)
			if !d.Allowed || d.Remaining < 0 || d.Remaining > 5 {
				t.Fatalf("refund of 1 at an instant 1s older than the state's: %+v", d)
			}
		})
	}
}

// TestStaleRefundMintsNothing refunds at an instant older than one the
// state has seen: the refund may restore the capacity but must not bank the
// time between the two instants.
func TestStaleRefundMintsNothing(t *testing.T) {
	sec := time.Second
	for _, alg := range []Algorithm{GCRA, LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			// 8 per second, burst 48: one unit per 125ms.
			r := Rule{Name: "g", Algorithm: alg, Quota: 8, Period: sec, Burst: 48}
			var s State
			steps := []struct {
				at   time.Duration
				cost int64
			}{{6 * sec, 8}, {5 * sec, -48}, {5 * sec, 48}}
			for _, st := range steps {
				if d := r.Decide(&s, epoch0.Add(st.at), st.cost); !d.Allowed {
					t.Fatalf("cost %d at %v: %+v", st.cost, st.at, d)
				}
			}
			// Seen from 6s, the 48 were admitted no earlier than 6s; by
			// 11s only 40 have refilled.
			if d := r.Decide(&s, epoch0.Add(11*sec), 48); d.Allowed {
				t.Fatalf("a refund at an older instant banked time: 48 admitted again 5s later: %+v", d)
			}
		})
	}
	t.Run("sliding_log", func(t *testing.T) {
		r := Rule{Name: "s", Algorithm: SlidingLog, Quota: 3, Period: sec}
		var s State
		r.Decide(&s, epoch0.Add(6*sec), 3)
		r.Decide(&s, epoch0.Add(6*sec), -3) // the log is empty again
		if d := r.Decide(&s, epoch0.Add(4*sec), 3); !d.Allowed {
			t.Fatalf("cost 3 after a full refund: %+v", d)
		}
		// 4s is older than 6s, so those 3 count as admitted at 6s.
		if d := r.Decide(&s, epoch0.Add(5*sec), 3); d.Allowed {
			t.Fatalf("after a refund emptied the log, an older instant admitted 3 + 3 within one period: %+v", d)
		}
	})
}

// TestDecideInvalidRule decides with a rule that Validate rejects: Decide
// must not crash (a Store may validate only part of a rule).
func TestDecideInvalidRule(t *testing.T) {
	r := Rule{Name: "neg", Algorithm: FixedWindow, Quota: -1, Period: time.Second}
	var s State
	if d := r.Decide(&s, epoch0, 0); d.Allowed {
		t.Errorf("limit -1 admitted cost 0: %+v", d)
	}
}

// TestDecideIntoMatchesDecide checks that DecideInto overwrites its target
// with exactly what Decide returns, and changes the state the same way.
func TestDecideIntoMatchesDecide(t *testing.T) {
	r := Rule{Name: "r", Quota: 3, Period: time.Second}
	var a, b State
	now := epoch0
	for i, cost := range []int64{1, 2, 1, 0, -1, 5} {
		want := r.Decide(&a, now, cost)
		got := Decision{Allowed: true, Remaining: 99, Rule: "stale"} // overwritten
		r.DecideInto(&got, &b, now, cost)
		if got != want || !statesEqual(a, b) {
			t.Fatalf("step %d: DecideInto %+v state %+v, Decide %+v state %+v", i, got, b, want, a)
		}
		now = now.Add(100 * time.Millisecond)
	}
}
