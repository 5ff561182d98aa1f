package ratelimit

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Never is the RetryAfter of a request that can never succeed: its cost is
// larger than the rule's capacity.
const Never time.Duration = math.MaxInt64

// Reason says why a Decision came out as it did.
type Reason uint8

const (
	// ReasonOK: admitted by the rule.
	ReasonOK Reason = iota
	// ReasonLimited: denied because the cost exceeds what remains now;
	// RetryAfter says when the same cost would be admitted.
	ReasonLimited
	// ReasonExceedsCapacity: denied because the cost exceeds the rule's
	// capacity; it can never be admitted, and RetryAfter is Never.
	ReasonExceedsCapacity
	// ReasonFailOpen: the store could not decide; admitted by FailOpen.
	ReasonFailOpen
	// ReasonFailClosed: the store could not decide; denied by FailClosed.
	ReasonFailClosed
	// ReasonLocal: the store could not decide; decided by an in-process
	// limiter at this replica's share of the limit (FailLocal).
	ReasonLocal

	numReasons
)

var reasonNames = [numReasons]string{"ok", "limited", "exceeds_capacity", "fail_open", "fail_closed", "local"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// A Decision is the answer for one (key, rule, cost) item.
type Decision struct {
	// Allowed reports whether this item's cost was admitted. In a request
	// of several items that another item denied, Allowed still says what
	// this item alone would have got, but nothing was consumed.
	Allowed bool
	// Reason says why.
	Reason Reason
	// Capacity is the rule's capacity (see Rule.Capacity).
	Capacity int64
	// Remaining is the cost that could still be admitted now, after this
	// decision.
	Remaining int64
	// ResetAfter is the time until the key is back to its full capacity
	// (for window algorithms: until the current window ends).
	ResetAfter time.Duration
	// RetryAfter is zero when Allowed; otherwise the time until the same
	// cost would be admitted, or Never.
	RetryAfter time.Duration
	// Rule is the name of the rule that decided.
	Rule string
}

// An Item asks for Cost units of Rule on Key. Cost 0 checks without
// consuming; a negative Cost refunds, never above the rule's capacity.
type Item struct {
	Key  string
	Rule *Rule
	Cost int64
}

// A Store keeps the state of many keys and decides requests against it.
//
// Decide decides items all or nothing: either every item is admitted and
// consumed, or none is consumed. It appends one Decision per item, in order,
// to dst and returns the extended slice. An error means the store could not
// decide (an invalid rule, a cancelled context, an unreachable backend with no
// failure policy); a denial is not an error.
type Store interface {
	Decide(ctx context.Context, dst []Decision, items []Item) ([]Decision, error)
}

// Allowed reports whether every decision in ds admitted its item.
func Allowed(ds []Decision) bool {
	for i := range ds {
		if !ds[i].Allowed {
			return false
		}
	}
	return true
}
