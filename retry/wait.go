package retry

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// A DeadlineError is Wait's refusal to start a wait that would outlast the
// context's deadline. It matches both ratelimit.ErrWouldExceedDeadline (the
// error every Sluice limiter returns for the same reason) and
// context.DeadlineExceeded (the call would have failed with it anyway) under
// errors.Is.
type DeadlineError struct {
	// Wait is the wait that was asked for, Left the time that was left
	// before the deadline.
	Wait, Left time.Duration
}

func (e *DeadlineError) Error() string {
	return fmt.Sprintf("a wait of %v, with %v left: %v", e.Wait, e.Left, ratelimit.ErrWouldExceedDeadline)
}

// Unwrap returns ratelimit.ErrWouldExceedDeadline and
// context.DeadlineExceeded.
func (e *DeadlineError) Unwrap() []error {
	return []error{ratelimit.ErrWouldExceedDeadline, context.DeadlineExceeded}
}

// Wait waits for d from now, or until ctx is done. If ctx's deadline comes
// before now+d it returns a *DeadlineError at once, without waiting; if
// ctx is done during the wait it returns ctx.Err(). A d of zero or less
// returns nil at once, without looking at ctx.
//
// now is the caller's reading of its clock, against which the deadline is
// compared; the wait itself is a timer of the runtime's clock.
func Wait(ctx context.Context, now time.Time, d time.Duration) error {
	return WaitOrWake(ctx, now, d, nil)
}

// WaitOrWake is Wait that also ends early, returning nil, when wake is
// closed (a nil wake never is): for a waiter that something other than
// time may let through sooner.
func WaitOrWake(ctx context.Context, now time.Time, d time.Duration, wake <-chan struct{}) error {
	if d <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
		return &DeadlineError{Wait: d, Left: dl.Sub(now)}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Sleep waits for d, or until ctx is done, and then returns ctx.Err(). It
// does not look at ctx's deadline first, as Wait does: it is for loops
// that poll or wait out a pause for as long as ctx lasts. A d of zero or
// less returns nil at once, without looking at ctx.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
