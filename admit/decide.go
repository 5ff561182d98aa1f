package admit

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// An Outcome is the answer an edge gives a request.
type Outcome uint8

const (
	// Admitted: every policy that applies admitted the request (or none
	// applies); it goes on.
	Admitted Outcome = iota
	// OverQuota: a quota refused the request; the edge answers 429 Too
	// Many Requests or RESOURCE_EXHAUSTED.
	OverQuota
	// Unavailable: the store could not decide — an error, or a decision
	// failed closed; the edge answers 503 Service Unavailable or
	// UNAVAILABLE, never a quota refusal.
	Unavailable
)

var outcomeNames = [...]string{"admitted", "over_quota", "unavailable"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// A Verdict is what Decide makes of a Store's decisions. The zero value is
// an admission.
type Verdict struct {
	Outcome Outcome
	// RetryAfter is when to come back. For OverQuota it is the longest
	// RetryAfter of the denials that a later request can pass (see
	// Retryable), or 0 when none can: every denial is of a cost above the
	// rule's capacity. For Unavailable it is the RetryAfter
	// of the first decision that failed closed, or 0 after an error, when
	// the edge applies its own default.
	RetryAfter time.Duration
	// Err is the Store's error, or the error of a Store that returned a
	// decision count other than one per item; the Outcome is then
	// Unavailable.
	Err error
}

// Decide decides items all or nothing in store, appending the decisions to
// dst (see ratelimit.Store), and returns them with their Verdict. With no
// items it returns dst and an admission without asking the store.
func Decide(ctx context.Context, store ratelimit.Store, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, Verdict) {
	if len(items) == 0 {
		return dst, Verdict{}
	}
	n := len(dst)
	ds, err := store.Decide(ctx, dst, items)
	return ds, check(ds, n, items, err)
}

// A clockStore decides at an instant its caller reads from the store's own
// clock (memstore.Store).
type clockStore interface {
	Now() time.Time
	DecideAt(ctx context.Context, now time.Time, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error)
}

// DecideTimed is Decide that also returns the instant of the decisions when
// the store decides at an instant read from its clock by its caller, as
// memstore does, and the zero time otherwise: an edge that records its
// decisions with their time (topk.Tracker.ObserveAt) then reads no clock
// of its own.
func DecideTimed(ctx context.Context, store ratelimit.Store, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, Verdict, time.Time) {
	cs, ok := store.(clockStore)
	if !ok || len(items) == 0 {
		ds, v := Decide(ctx, store, dst, items)
		return ds, v, time.Time{}
	}
	now := cs.Now()
	n := len(dst)
	ds, err := cs.DecideAt(ctx, now, dst, items)
	return ds, check(ds, n, items, err), now
}

// check returns the Verdict of the decisions a store appended after the
// first n of ds for items, or of its error.
func check(ds []ratelimit.Decision, n int, items []ratelimit.Item, err error) Verdict {
	if err == nil && len(ds)-n != len(items) {
		err = fmt.Errorf("admit: the store returned %d decisions for %d items", len(ds)-n, len(items))
	}
	if err != nil {
		return Verdict{Outcome: Unavailable, Err: err}
	}
	return verdict(ds[n:])
}

// verdict returns the Verdict of ds, the decisions of one request's items.
func verdict(ds []ratelimit.Decision) Verdict {
	v := Verdict{}
	for i := range ds {
		switch d := &ds[i]; {
		case d.Allowed:
		case d.Reason == ratelimit.ReasonFailClosed:
			return Verdict{Outcome: Unavailable, RetryAfter: d.RetryAfter}
		case Retryable(d):
			v.Outcome, v.RetryAfter = OverQuota, max(v.RetryAfter, d.RetryAfter)
		default:
			v.Outcome = OverQuota
		}
	}
	return v
}

// Retryable reports whether d is a quota's denial that the same request
// can pass later, after d.RetryAfter: one of ratelimit.ReasonLimited, or of
// ratelimit.ReasonLocal (the store is out and a rule that fails locally
// decided at this replica's share, which is still a quota) unless its cost
// exceeds the capacity. A denial that failed closed is not a quota's.
func Retryable(d *ratelimit.Decision) bool {
	if d.Allowed {
		return false
	}
	switch d.Reason {
	case ratelimit.ReasonLimited:
		return true
	case ratelimit.ReasonLocal:
		return d.RetryAfter != ratelimit.Never
	}
	return false
}
