package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Reservations: paced waiting on a bucket.
//
// A caller that may wait up to maxWait before it sends asks, instead of
// "may cost n go now?", "when may cost n go?". For GCRA (and LeakyBucket,
// which decides as GCRA does) the answer is the same decision on the same
// key's state under a copy of the rule whose capacity is raised by what
// refills in maxWait, maxWait/Interval units (rounded down): its burst
// tolerance extended into the future. Admitted, the units are taken now,
// at once and atomically like any cost, and the caller must wait until
// the key's debt has fallen back to the rule's own capacity time:
//
//	wait = max(0, ResetAfter − Capacity × Interval)
//
// At that instant the original rule would have admitted the same cost on
// the state the reservation found, so sends made at the told instants
// conform to the rule whatever their order of arrival. Denied, the
// reservation consumes nothing, and its RetryAfter is the time until a
// reservation of that cost within maxWait would be admitted.
//
// The capacity is whole units, so maxWait counts in whole intervals: a
// reservation is admitted when its wait is at most maxWait rounded down to
// a multiple of Interval (exactly maxWait when it is such a multiple), and
// is never told to wait longer than maxWait. Window algorithms have no
// debt that falls at a rate, so no wait can be computed for them:
// Reserving refuses them with ErrNotReservable.

// ErrNotReservable is wrapped by the error of Reserving for a rule whose
// algorithm has no reservation (the window algorithms) or for a negative
// wait.
var ErrNotReservable = errors.New("ratelimit: rule cannot be reserved")

// Reserving returns the rule under which a reservation that may wait up to
// maxWait is decided: r with its capacity raised by maxWait/Interval units
// (rounded down, and bounded so that the rule stays valid) and Counting
// Strict, so that a shared store decides it at the shared counter, never
// on a replica's share. It returns r itself when nothing would change.
// Decide the reservation's item with the returned rule, on the key the
// rule is decided on otherwise, and read its Decision with
// r.ReserveOutcome.
//
// A cost above r's capacity can never be sent within r, whatever the
// wait: Reserving's rule would admit it, so callers decide such a cost
// with r itself (ReservingFor does), which denies it with
// ReasonExceedsCapacity and RetryAfter Never.
//
// A Rule is a value that stores cache by pointer (redisstore validates
// and formats a rule once): a caller that reserves often keeps the
// returned rule for the next reservation of the same rule and maxWait.
func (r *Rule) Reserving(maxWait time.Duration) (*Rule, error) {
	if r.Algorithm != GCRA && r.Algorithm != LeakyBucket {
		return nil, fmt.Errorf("%w: rule %q counts with %s, whose capacity comes back all at once at a window's end rather than at a rate: only gcra and leaky_bucket rules can be reserved ahead", ErrNotReservable, r.Name, r.Algorithm)
	}
	if maxWait < 0 {
		return nil, fmt.Errorf("%w: rule %q: negative wait %v", ErrNotReservable, r.Name, maxWait)
	}
	extra := r.reserveExtra(maxWait)
	if extra == 0 && r.Counting == Strict {
		return r, nil
	}
	rr := *r
	if extra > 0 {
		rr.Burst = r.Capacity() + extra
	}
	rr.Counting = Strict
	return &rr, nil
}

// ReservingFor is Reserving for an item of the given cost: r itself when
// cost is above r's capacity (denied, never to succeed) or not positive
// (a check or a refund, which waits for nothing).
func (r *Rule) ReservingFor(cost int64, maxWait time.Duration) (*Rule, error) {
	rr, err := r.Reserving(maxWait)
	if err != nil {
		return nil, err
	}
	if cost <= 0 || cost > r.Capacity() {
		return r, nil
	}
	return rr, nil
}

// ReserveWait is what Reserving reads of maxWait: maxWait in whole
// intervals of r. Callers that keep reserving rules key them by it.
func (r *Rule) ReserveWait(maxWait time.Duration) time.Duration {
	if iv := r.Interval(); iv > 0 {
		return maxWait / iv * iv
	}
	return maxWait
}

// reserveExtra is the capacity Reserving adds: maxWait in whole intervals,
// bounded by MaxQuota and by Validate's bound on capacity × interval.
func (r *Rule) reserveExtra(maxWait time.Duration) int64 {
	if r.Quota <= 0 || maxWait <= 0 {
		return 0
	}
	iv := r.interval()
	c := r.Capacity()
	most := min(int64(MaxQuota), (math.MaxInt64/2)/iv)
	return max(0, min(int64(maxWait)/iv, most-c))
}

// ReserveOutcome reads d, the Decision of a reservation decided under a
// rule that Reserving (or ReservingFor) derived from r, and returns how
// long its holder must wait before it sends: 0 when d denied it (nothing
// was taken) or when nothing is known of the key (ReasonFailOpen: the
// store could not be asked), otherwise max(0, d.ResetAfter − r's capacity
// time). It rewrites d in r's own terms: Capacity is r's, and Remaining
// what r could still admit now (0 while a reservation waits); Allowed,
// Reason, ResetAfter, RetryAfter and Rule stand as decided.
func (r *Rule) ReserveOutcome(d *Decision) time.Duration {
	d.Capacity = r.Capacity()
	if r.Quota <= 0 {
		return 0
	}
	if d.Reason == ReasonFailOpen || d.Reason == ReasonFailClosed {
		d.Remaining = min(d.Remaining, d.Capacity)
		return 0
	}
	capT := d.Capacity * r.interval()
	debt := int64(d.ResetAfter)
	d.Remaining = max(0, (capT-debt)/r.interval())
	if !d.Allowed {
		return 0
	}
	return time.Duration(max(0, debt-capT))
}
