package lease

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// A Limiter admits units at the rate of its Holder's valid leases: the
// reserved capacity plus C/P per partition, capped by the AIMD ceiling. It
// has the Allow/Wait methods of ratelimit.Limiter, whose token bucket it
// uses, with a burst of a tenth of the rate (at least 1), so that the
// output is smooth below a second: 100 units/s leave as 10 every 100 ms at
// most, and one at a time when the caller waits for each.
//
// A unit is admitted only at an instant when the capacity it uses is
// valid: the Limiter drops a lease's capacity by itself at the lease's
// deadline, whatever its Holder's goroutine is doing, and a WaitN whose
// turn would come after the earliest deadline waits for the renewal (or
// the deadline) and asks again.
//
// Every unit asked for counts in the Holder's demand, and units waiting in
// WaitN count as backlog. A Limiter is safe for concurrent use. Get one
// from Holder.Limiter.
type Limiter struct {
	h *Holder
}

// Limit returns the rate now.
func (l *Limiter) Limit() ratelimit.Limit { return l.LimitAt(time.Now()) }

// LimitAt returns the rate at now: the leases whose deadline has passed
// no longer count.
func (l *Limiter) LimitAt(now time.Time) ratelimit.Limit {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshDueLocked(now)
	return h.lim.Limit()
}

// Burst returns the burst now.
func (l *Limiter) Burst() int {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshDueLocked(time.Now())
	return h.lim.Burst()
}

// Allow is AllowN(time.Now(), 1).
func (l *Limiter) Allow() bool { return l.AllowN(time.Now(), 1) }

// AllowN reports whether n units may be used at now, and takes them if so.
// A refusal takes nothing (but counts in the demand).
func (l *Limiter) AllowN(now time.Time, n int) bool {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requested += int64(max(0, n))
	h.refreshDueLocked(now)
	ok := h.lim.AllowN(now, n)
	if ok {
		h.admitted += int64(n)
	}
	return ok
}

// refreshDueLocked refreshes the rate when a deadline has passed. h.mu is
// held.
func (h *Holder) refreshDueLocked(now time.Time) {
	if !h.horizon.IsZero() && !now.Before(h.horizon) && !now.Before(h.latest) {
		h.refreshLocked(now)
	}
}

// burstFor is the Limiter's burst at rate: a tenth of it, at least 1, or 0
// when there is no rate.
func burstFor(rate float64) int {
	if rate <= 0 {
		return 0
	}
	return max(1, int(math.Ceil(rate/10)))
}

// maxBurst is the burst at the largest rate the holder can have.
func (h *Holder) maxBurst() int {
	return burstFor(h.cfg.Capacity + h.cfg.Reserved)
}

// Wait is WaitN(ctx, 1).
func (l *Limiter) Wait(ctx context.Context) error { return l.WaitN(ctx, 1) }

// WaitN blocks until n units may be used, or ctx is done. While the holder
// has no capacity (or a burst too small for n) it waits for more, asking
// the holder to look for leases early; keep n well below a tenth of the
// rate. It fails at once when n is
// negative, when n exceeds the burst at the holder's largest possible rate
// (ratelimit.ErrExceedsBurst), or when the wait would end after ctx's
// deadline (ratelimit.ErrWouldExceedDeadline).
func (l *Limiter) WaitN(ctx context.Context, n int) error {
	h := l.h
	if n < 0 {
		return fmt.Errorf("lease: Wait(n=%d): n is negative", n)
	}
	if mb := h.maxBurst(); n > mb {
		return fmt.Errorf("%w: Wait(n=%d) with largest burst %d", ratelimit.ErrExceedsBurst, n, mb)
	}
	h.mu.Lock()
	h.requested += int64(n)
	h.waiting += int64(n)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.waiting -= int64(n)
		h.mu.Unlock()
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := time.Now()
		h.mu.Lock()
		h.refreshDueLocked(now)
		changed, horizon, rate := h.changed, h.horizon, h.rate
		var r *ratelimit.Reservation
		if rate > 0 && n <= h.lim.Burst() {
			r = h.lim.ReserveN(now, n)
		}
		h.mu.Unlock()
		if r == nil || !r.OK() {
			select {
			case h.wake <- struct{}{}:
			default:
			}
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		delay := r.DelayFrom(now)
		act := now.Add(delay)
		if dl, ok := ctx.Deadline(); ok && act.After(dl) {
			r.CancelAt(now)
			return fmt.Errorf("%w: Wait(n=%d) needs %v", ratelimit.ErrWouldExceedDeadline, n, delay)
		}
		if !horizon.IsZero() && !act.Before(horizon) {
			// The turn comes after a lease's deadline: wait for the
			// renewal, or for the deadline, and ask again.
			r.CancelAt(now)
			if err := sleepUntil(ctx, horizon.Sub(now), changed); err != nil {
				return err
			}
			continue
		}
		if delay == 0 {
			l.admit(n)
			return nil
		}
		retry, err := l.await(ctx, r, delay, rate, changed)
		if err != nil {
			return err
		}
		if !retry {
			l.admit(n)
			return nil
		}
	}
}

func (l *Limiter) admit(n int) {
	l.h.mu.Lock()
	l.h.admitted += int64(n)
	l.h.mu.Unlock()
}

// await waits delay for reservation r made at rate; when the rate drops
// meanwhile it cancels r and reports that the caller must ask again.
func (l *Limiter) await(ctx context.Context, r *ratelimit.Reservation, delay time.Duration, rate float64, changed chan struct{}) (retry bool, err error) {
	h := l.h
	tm := time.NewTimer(delay)
	defer tm.Stop()
	for {
		select {
		case <-tm.C:
			return false, nil
		case <-ctx.Done():
			now := time.Now()
			if r.DelayFrom(now) > 0 {
				r.CancelAt(now)
				return false, ctx.Err()
			}
			return false, nil
		case <-changed:
			now := time.Now()
			h.mu.Lock()
			changed = h.changed
			lower := h.rate < rate
			h.mu.Unlock()
			if lower && r.DelayFrom(now) > 0 {
				r.CancelAt(now)
				return true, nil
			}
		}
	}
}

func sleepUntil(ctx context.Context, d time.Duration, changed chan struct{}) error {
	tm := time.NewTimer(max(0, d))
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-changed:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
