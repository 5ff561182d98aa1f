package ratelimit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// A StoreLimiter paces a caller on one key of a Store — a counter that
// other processes share when the Store is redisstore.Store — with the
// WaitN method of Limiter, so that it can stand wherever a Limiter does
// (httplimit.Client, drain.Drainer). Each WaitN asks the Store for n units
// of Rule on Key; a denial consumes nothing, and WaitN waits the
// decision's RetryAfter and asks again.
//
// Its pacing is only as smooth as the Rule lets it be: a GCRA rule with a
// small burst spaces the units evenly; callers in many processes contend
// for the same key, so under contention each pays one round trip per
// refusal. With MaxWait set on a GCRA or LeakyBucket Rule it polls no
// more: each WaitN reserves (Rule.Reserving) and waits the one wait it is
// told. A StoreLimiter holds no state of its own but a cached reserving
// rule, and is safe for concurrent use; its fields must not change after
// first use.
type StoreLimiter struct {
	// Store decides; required.
	Store Store
	// Key is the shared counter's key; Rule its limit. Both required.
	Key  string
	Rule *Rule
	// MaxWait, if positive and the Rule is GCRA or LeakyBucket, makes
	// WaitN reserve: one decision of the units under the Rule with its
	// burst extended by MaxWait (bounded by the context's deadline), then
	// a wait of exactly what it was told, in place of asking again after
	// each refusal. The units are taken when reserved: a WaitN whose
	// context ends while it waits returns the context's error and keeps
	// them taken (given back, they could let a later reservation land on
	// an earlier one's instant). Refused (the queue is longer than the
	// wait), it waits the RetryAfter and reserves again.
	MaxWait time.Duration

	reserving atomic.Pointer[reservingRule] // the last reserving rule made
}

// reservingRule is a reserving rule of StoreLimiter.Rule and the wait,
// in whole intervals, it was made for.
type reservingRule struct {
	wait time.Duration
	rule *Rule
}

// reservingFor returns the rule a reservation of n that may wait up to
// maxWait is decided under, reusing the last one made for the same wait
// (a Store caches its work per rule).
func (l *StoreLimiter) reservingFor(n int64, maxWait time.Duration) (*Rule, error) {
	maxWait = l.Rule.ReserveWait(maxWait)
	if n <= 0 || n > l.Rule.Capacity() {
		return l.Rule, nil
	}
	if rr := l.reserving.Load(); rr != nil && rr.wait == maxWait {
		return rr.rule, nil
	}
	r, err := l.Rule.Reserving(maxWait)
	if err != nil {
		return nil, err
	}
	l.reserving.Store(&reservingRule{maxWait, r})
	return r, nil
}

// WaitN blocks until n units of the Rule are granted on the Key, and
// consumes them. It fails at once when n exceeds the Rule's capacity (the
// Store answers ReasonExceedsCapacity), when the next try would come after
// ctx's deadline (ErrWouldExceedDeadline), or with the Store's error.
func (l *StoreLimiter) WaitN(ctx context.Context, n int) error {
	items := []Item{{Key: l.Key, Rule: l.Rule, Cost: int64(n)}}
	reserve := l.MaxWait > 0 && (l.Rule.Algorithm == GCRA || l.Rule.Algorithm == LeakyBucket)
	var ds []Decision
	for {
		if reserve {
			maxWait := l.MaxWait
			if dl, ok := ctx.Deadline(); ok {
				maxWait = max(0, min(maxWait, time.Until(dl)))
			}
			r, err := l.reservingFor(int64(n), maxWait)
			if err != nil {
				return fmt.Errorf("ratelimit: StoreLimiter %q: %w", l.Key, err)
			}
			items[0].Rule = r
		}
		var err error
		ds, err = l.Store.Decide(ctx, ds[:0], items)
		if err != nil {
			return fmt.Errorf("ratelimit: StoreLimiter %q: %w", l.Key, err)
		}
		d := ds[0]
		if d.Allowed {
			if !reserve {
				return nil
			}
			return sleep(ctx, l.Rule.ReserveOutcome(&d))
		}
		if d.RetryAfter == Never {
			return fmt.Errorf("%w: WaitN(n=%d) above the capacity of rule %q", ErrExceedsBurst, n, d.Rule)
		}
		wait := max(d.RetryAfter, time.Millisecond)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("%w: WaitN(n=%d) needs %v", ErrWouldExceedDeadline, n, wait)
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// sleep waits d, or until ctx ends (its error).
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
