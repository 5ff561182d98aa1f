package ratelimit

import (
	"testing"
	"time"
)

// fuzzPeriods are the periods a fuzzed rule may have.
var fuzzPeriods = [...]time.Duration{1, 7, time.Millisecond, time.Second, time.Minute, 365 * 24 * time.Hour}

// maxFuzzTime is the last instant a fuzzed sequence reaches: 2200-01-01,
// so that a window of MaxPeriod after it still fits in int64 nanoseconds.
var maxFuzzTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// fuzzRule decodes a rule from the first 4 bytes of data and returns the
// rest. ok is false when data is too short or the rule is invalid.
func fuzzRule(data []byte) (r Rule, rest []byte, ok bool) {
	if len(data) < 4 {
		return r, nil, false
	}
	r = Rule{
		Name:      "fuzz",
		Algorithm: Algorithm(data[0] % byte(numAlgorithms)),
		Quota:     int64(data[1] % 40),
		Period:    fuzzPeriods[int(data[2]>>4)%len(fuzzPeriods)],
	}
	if r.Algorithm == GCRA || r.Algorithm == LeakyBucket {
		r.Burst = int64(data[3] % 50)
	}
	if r.Algorithm == FixedWindow && data[2]&0xf >= 12 {
		r.Period, r.Calendar = 0, Calendar(1+int(data[2]&0xf-12)) // minute … week
	}
	if r.Validate() != nil {
		return r, nil, false
	}
	return r, data[4:], true
}

// fuzzEvent is one decision of a fuzzed sequence as the invariants see it:
// the instant the state's clock had reached (the later of now and the last
// instant that changed the state) and the cost counted (admitted cost,
// or a refund as a negative cost, capped at the capacity).
type fuzzEvent struct {
	at   int64
	cost int64
}

// FuzzAlgorithms decides a fuzzed sequence of (time step, cost) — time may
// go backwards, costs may be 0, negative or above capacity — and checks the
// invariants every algorithm promises after each decision.
func FuzzAlgorithms(f *testing.F) {
	f.Add([]byte{0, 10, 0x30, 5, 0, 1, 0, 5, 8, 1, 4, 250})
	f.Add([]byte{1, 3, 0x30, 0, 0, 2, 0, 2, 4, 1, 0xf0, 3})
	f.Add([]byte{1, 3, 0x3d, 0, 0, 2, 0, 2, 4, 1})
	f.Add([]byte{2, 3, 0x30, 0, 0, 1, 2, 1, 2, 1, 0x80, 1, 9, 0xfe})
	f.Add([]byte{3, 10, 0x30, 0, 0, 6, 4, 4, 7, 3, 1, 9, 8, 0xf6})
	f.Add([]byte{4, 10, 0x30, 5, 0, 5, 1, 1, 0xfc, 2})
	f.Add([]byte{0, 39, 0x50, 49, 0, 49, 0x7f, 30, 0x80, 30})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, data, ok := fuzzRule(data)
		if !ok {
			return
		}
		unit := max(1, int64(r.Period)/8)
		if r.Calendar != NoCalendar {
			unit = int64(time.Minute) / 8
		}
		c := r.Capacity()
		s := State{Algorithm: r.Algorithm}
		now := epoch0.UnixNano()
		var changed int64 // the last instant that changed the state
		var events []fuzzEvent
		for ; len(data) >= 2; data = data[2:] {
			now += int64(int8(data[0])) * unit
			if now < 0 || now > maxFuzzTime {
				// Instants near the end of int64 nanoseconds (year 2262)
				// are out of scope: stop there.
				return
			}
			cost := int64(int8(data[1]))
			before := s.clone()
			d := r.Decide(&s, time.Unix(0, now), cost)
			checkDecision(t, &r, cost, d)
			if !d.Allowed {
				if !statesEqual(before, s) {
					t.Fatalf("%+v: denial of cost %d changed the state from %+v to %+v", r, cost, before, s)
				}
				continue
			}
			if cost == 0 || statesEqual(before, s) {
				continue // the state has not seen now
			}
			changed = max(changed, now)
			events = append(events, fuzzEvent{at: changed, cost: max(cost, -c)})
			if cost > 0 {
				checkAdmitted(t, &r, events)
			}
		}
	})
}

// checkDecision checks the invariants of one decision alone.
func checkDecision(t *testing.T, r *Rule, cost int64, d Decision) {
	t.Helper()
	c := r.Capacity()
	bad := func(what string) {
		t.Helper()
		t.Fatalf("%+v cost %d: %s: %+v", r, cost, what, d)
	}
	if d.Capacity != c || d.Rule != r.Name {
		bad("wrong Limit or Rule")
	}
	if d.Remaining < 0 || d.Remaining > c {
		bad("Remaining out of [0, capacity]")
	}
	if d.ResetAfter < 0 {
		bad("negative ResetAfter")
	}
	switch {
	case d.Allowed:
		if d.Reason != ReasonOK || d.RetryAfter != 0 {
			bad("allowed with a reason or a RetryAfter")
		}
		if cost > 0 && d.Remaining > c-cost {
			bad("Remaining after admitting cost above capacity-cost")
		}
	case cost > c:
		if d.Reason != ReasonExceedsCapacity || d.RetryAfter != Never {
			bad("cost above capacity not denied as exceeding it")
		}
	default:
		if d.Reason != ReasonLimited || d.RetryAfter <= 0 || d.RetryAfter == Never {
			bad("denied without a finite positive RetryAfter")
		}
		if cost <= 0 {
			// Without a rule change a state never holds more than its
			// capacity, so a check or a refund always fits.
			bad("check or refund denied")
		}
	}
}

// checkAdmitted checks that the cost admitted up to the last event (an
// admission) is within what the algorithm promises, over every window that
// ends with it.
func checkAdmitted(t *testing.T, r *Rule, events []fuzzEvent) {
	t.Helper()
	last := events[len(events)-1]
	switch r.Algorithm {
	case GCRA, LeakyBucket:
		// From any admission on: at most capacity + the elapsed time
		// divided by the (rounded up) emission interval.
		iv, c := r.interval(), r.Capacity()
		var sum int64
		for i := len(events) - 1; i >= 0; i-- {
			e := events[i]
			sum += e.cost
			if e.cost > 0 && sum > c+(last.at-e.at)/iv {
				t.Fatalf("%+v: %d admitted in %v: more than capacity %d + %v/%v; events %v",
					r, sum, time.Duration(last.at-e.at), c, time.Duration(last.at-e.at), time.Duration(iv), events)
			}
		}
	case FixedWindow, SlidingWindow:
		// At most Limit in the window of the last admission (epoch-aligned
		// for SlidingWindow, which has no calendar).
		start, _ := r.window(last.at)
		var sum int64
		for i := len(events) - 1; i >= 0 && events[i].at >= start; i-- {
			sum += events[i].cost
		}
		if sum > r.Quota {
			t.Fatalf("%+v: %d admitted in the window from %d: more than %d; events %v", r, sum, start, r.Quota, events)
		}
	case SlidingLog:
		// At most Limit in the Period ending with the last admission.
		var sum int64
		for i := len(events) - 1; i >= 0 && events[i].at > last.at-int64(r.Period); i-- {
			sum += events[i].cost
		}
		if sum > r.Quota {
			t.Fatalf("%+v: %d admitted in the period up to %d: more than %d; events %v", r, sum, last.at, r.Quota, events)
		}
	}
}
