package ratelimit

import (
	"context"
	"fmt"
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
// refusal. A StoreLimiter holds no state of its own and is safe for
// concurrent use; its fields must not change after first use.
type StoreLimiter struct {
	// Store decides; required.
	Store Store
	// Key is the shared counter's key; Rule its limit. Both required.
	Key  string
	Rule *Rule
}

// WaitN blocks until n units of the Rule are granted on the Key, and
// consumes them. It fails at once when n exceeds the Rule's capacity (the
// Store answers ReasonExceedsCapacity), when the next try would come after
// ctx's deadline (ErrWouldExceedDeadline), or with the Store's error.
func (l *StoreLimiter) WaitN(ctx context.Context, n int) error {
	items := []Item{{Key: l.Key, Rule: l.Rule, Cost: int64(n)}}
	var ds []Decision
	for {
		var err error
		ds, err = l.Store.Decide(ctx, ds[:0], items)
		if err != nil {
			return fmt.Errorf("ratelimit: StoreLimiter %q: %w", l.Key, err)
		}
		d := ds[0]
		if d.Allowed {
			return nil
		}
		if d.RetryAfter == Never {
			return fmt.Errorf("%w: WaitN(n=%d) above the capacity of rule %q", ErrExceedsBurst, n, d.Rule)
		}
		wait := max(d.RetryAfter, time.Millisecond)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("%w: WaitN(n=%d) needs %v", ErrWouldExceedDeadline, n, wait)
		}
		tm := time.NewTimer(wait)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		}
	}
}
