package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// epoch0 is the instant the tests of this package start from: a whole
// second, minute, hour, day and month in UTC, so epoch-aligned windows start
// there (storetest.Start, for the step tables).
var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ok, limited and never build an expected decision.
func ok(rem int64, reset time.Duration) Decision {
	return Decision{Allowed: true, Reason: ReasonOK, Remaining: rem, ResetAfter: reset}
}

func limited(rem int64, reset, retry time.Duration) Decision {
	return Decision{Reason: ReasonLimited, Remaining: rem, ResetAfter: reset, RetryAfter: retry}
}

func never(rem int64, reset time.Duration) Decision {
	return Decision{Reason: ReasonExceedsCapacity, Remaining: rem, ResetAfter: reset, RetryAfter: Never}
}

// statesEqual reports whether a and b are the same state, Log included.
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

// TestEdgeRules covers what storetest.StepTables, which TestStepTables
// decides, leaves out of its edge tables: limit 0 with a burst, and huge
// costs on the window algorithms (no overflow may open a rule).
func TestEdgeRules(t *testing.T) {
	year := 365 * 24 * time.Hour
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
		{Counting: numCountings, Quota: 1, Period: sec},
		{Counting: Batched, Algorithm: SlidingLog, Quota: 1, Period: sec},
		{Counting: Batched, Algorithm: SlidingWindow, Quota: 1, Period: sec},
		{Counting: Approximate, Algorithm: SlidingLog, Quota: 1, Period: sec},
		{Counting: Approximate, Algorithm: FixedWindow, Quota: 1, Period: sec},
		{Counting: Approximate, Algorithm: SlidingWindow, Quota: 1, Period: sec},
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
		{Period: sec},                        // a forgotten Quota
		{Quota: 1, Period: sec, Block: true}, // a Block that admits
	}
	for i, r := range bad {
		r.Name = fmt.Sprintf("bad%d", i)
		err := r.Validate()
		if !errors.Is(err, ErrInvalidRule) {
			t.Errorf("%+v: Validate() = %v, want an error wrapping ErrInvalidRule", r, err)
		}
	}
	good := []Rule{
		{Quota: 0, Period: sec, Block: true},
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
