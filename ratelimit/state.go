package ratelimit

import (
	"math"
	"math/bits"
	"slices"
	"time"
)

// State is what a Store keeps for one key. The meaning of its fields depends
// on the algorithm; the zero value is a key that has never been seen. A State
// whose Algorithm differs from the rule's is treated as fresh, so a rule
// that changes algorithm starts from zero.
//
// A State is not safe for concurrent use; a Store guards each one.
type State struct {
	Algorithm Algorithm
	// T is a time in Unix nanoseconds: the theoretical arrival time (GCRA),
	// the start of the current window (FixedWindow, SlidingWindow) or the
	// time of the last leak (LeakyBucket).
	T int64
	// N is the interval T was computed with (GCRA), the cost counted in the
	// current window (FixedWindow, SlidingWindow), the sum of Log's costs
	// (SlidingLog) or the level (LeakyBucket).
	N int64
	// Prev is the cost counted in the previous window (SlidingWindow).
	Prev int64
	// Seen is the latest instant (Unix nanoseconds) at which the state
	// changed. Decisions are taken at no earlier instant, so a caller whose
	// clock lags cannot create capacity.
	Seen int64
	// Log holds the admitted requests, oldest first (SlidingLog).
	Log []LogEntry
}

// clone returns a copy of s with a Log of its own: Decide changes the
// entries of a Log in place.
func (s State) clone() State {
	s.Log = slices.Clone(s.Log)
	return s
}

// A LogEntry is one admitted request of a SlidingLog.
type LogEntry struct {
	At   int64 // Unix nanoseconds
	Cost int64
}

// Decide decides cost against the state s of one key at the instant now and
// updates s when the cost is admitted (or refunded). A denial leaves s
// untouched. It is a pure function of (s, now, cost): it reads no clock.
//
// Time that goes backwards never creates capacity: an instant earlier than
// s.Seen is decided as s.Seen, and the difference is added to RetryAfter and
// ResetAfter, so they stay true for the caller's own clock.
func (r *Rule) Decide(s *State, now time.Time, cost int64) Decision {
	var d Decision
	r.decide(&d, s, now.UnixNano(), cost, true)
	return d
}

// DecideInto is Decide writing the Decision into *d, which it overwrites.
// Stores use it on their hot path: it spares the copies of a returned
// Decision, which cost more than the decision itself.
func (r *Rule) DecideInto(d *Decision, s *State, now time.Time, cost int64) {
	r.decide(d, s, now.UnixNano(), cost, true)
}

// Peek returns the Decision that Decide would return, without changing s.
func (r *Rule) Peek(s *State, now time.Time, cost int64) Decision {
	var d Decision
	r.decide(&d, s, now.UnixNano(), cost, false)
	return d
}

func (r *Rule) decide(d *Decision, s *State, now, cost int64, commit bool) {
	*d = Decision{}
	orig := s
	var fresh State
	if s.Algorithm != r.Algorithm {
		// State of another algorithm means nothing here: decide on a fresh
		// one, and replace s only if the decision changes it.
		fresh.Algorithm = r.Algorithm
		s = &fresh
	}
	// A caller whose clock lags the state's is answered as at the state's
	// instant; the lag is added to the times it is told to wait.
	var lag int64
	if s.Seen > now {
		lag, now = s.Seen-now, s.Seen
	}
	c := r.Capacity()
	if cost > c {
		r.run(s, now, 0, false, d)
		d.Allowed, d.Reason, d.RetryAfter = false, ReasonExceedsCapacity, Never
	} else {
		cost = max(cost, -c)
		r.run(s, now, cost, commit, d)
		if !d.Allowed {
			d.Reason = ReasonLimited
			d.RetryAfter = time.Duration(lag) + max(d.RetryAfter, 1)
		} else if commit && cost != 0 { // the algorithm changed s
			s.Seen = now
			if s != orig {
				*orig = fresh
			}
		}
	}
	if d.ResetAfter > 0 {
		d.ResetAfter += time.Duration(lag)
	}
	d.Capacity = c
	d.Rule = r.Name
}

// run decides with the rule's algorithm at now, which is no earlier than
// s.Seen, for a cost within [-capacity, capacity].
func (r *Rule) run(s *State, now, cost int64, commit bool, d *Decision) {
	switch r.Algorithm {
	case GCRA:
		r.gcra(s, now, cost, commit, d)
	case FixedWindow:
		r.fixedWindow(s, now, cost, commit, d)
	case SlidingLog:
		r.slidingLog(s, now, cost, commit, d)
	case SlidingWindow:
		r.slidingWindow(s, now, cost, commit, d)
	case LeakyBucket:
		r.leakyBucket(s, now, cost, commit, d)
	}
}

// satAdd returns a+b, saturated to the int64 range.
func satAdd(a, b int64) int64 {
	s := a + b
	if (s > a) != (b > 0) {
		if b > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// mulDiv returns a*b/c rounded down for a, b >= 0 and c > 0, saturated to
// MaxInt64, with a 128-bit intermediate product.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// floorMod returns a mod m in [0, m) for m > 0.
func floorMod(a, m int64) int64 {
	x := a % m
	if x < 0 {
		x += m
	}
	return x
}
