package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
)

// A Limiter admits units at the rate of its Holder's valid leases: the
// reserved capacity plus C/P per partition, capped by the throttle
// controller's ceiling. It has the Allow/Wait methods of
// ratelimit.Limiter, whose token bucket it uses.
//
// # Pacing to the downstream's window
//
// A service that counts in fixed windows (500 a second, counted from each
// second's start) refuses whatever one of its windows receives beyond its
// limit, even if the rate averaged over time is below it: a token bucket
// at exactly the rate, with a burst, puts the burst and a window's worth
// of rate into one window. By default (Options.Window) the Limiter paces
// so that no window of the downstream's length W, wherever it starts,
// receives more than the leased capacity: its bucket has a burst of a
// hundredth of a window's worth (at least 1) and a rate lowered by that
// burst over W and by another hundredth (490/s for 500/s over one
// second), so a bucket lets at most 99 % of a window's capacity through
// in any W; and because every holder's burst is a part of its rate at
// the window's start and the valid leases never add up to more than C at
// any instant, the holders together stay within C × W. A guard counts the
// units admitted in the last W by the instants at which the callers
// return (a stalled process whose waiters wake together would otherwise
// bunch them) and holds back any that would exceed the capacity the
// holder had over that window — its rate integrated over it, so that a
// holder whose rate falls (it yielded partitions) is not held until what
// it sent at the old rate has left the window.
// With Options.Window negative, the bucket runs at the rate with a burst of
// a tenth of it (smooth below a second, but a fixed window can then see
// up to 10 % more).
//
// A unit is admitted only at an instant when the capacity it uses is
// valid: the Limiter drops a lease's capacity by itself at the lease's
// deadline, whatever its Holder's goroutine is doing, and a WaitN whose
// turn would come after the earliest deadline waits for the renewal (or
// the deadline) and asks again. While a retry hint's pause lasts
// (Holder.ThrottledAfter, Observe) nothing is admitted.
//
// Every unit asked for counts in the Holder's demand, and units waiting in
// WaitN count as backlog; callers that keep waiting on a limiter they use
// to the full make the Holder ask for its whole fair share at once. A
// Limiter is safe for concurrent use. Get one from Holder.Limiter.
type Limiter struct {
	h gate // its Holder
}

// A gate is what a Limiter needs of its Holder. Each method takes the
// Holder's lock once, and none is held while a caller waits; the Limiter
// has no state of its own but the reservations its callers wait on.
type gate interface {
	// limitAt returns the bucket's limit and burst at now.
	limitAt(now time.Time) (ratelimit.Limit, int)
	// allowN is AllowN.
	allowN(now time.Time, n int) bool
	// maxBurst returns the burst at the holder's largest possible rate.
	maxBurst() int
	// enter counts n units that wait in WaitN, until leave; block counts
	// a WaitN call that had to wait.
	enter(n int)
	leave(n int)
	block()
	// reserve is a WaitN caller's look at now for n units: a reservation
	// when there is capacity (and no pause), and what to wait for
	// otherwise. Without capacity it asks Run to look for leases at once.
	reserve(now time.Time, n int) turn
	// take admits, at now, n units whose turn has come, reserved at rate.
	// It refuses them (again) when a pause has begun or the rate has
	// fallen since, and holds them (wait) while the window's guard
	// does.
	take(now time.Time, n int, rate float64) (again bool, wait time.Duration)
	// current returns the rate, the bucket's limit and the channel
	// closed when either (or the horizon) changes next.
	current() (rate, pace float64, changed chan struct{})
}

// A turn is what a WaitN caller learns at one look (gate.reserve).
type turn struct {
	r           ratelimit.Reservation // not OK: no capacity, or paused
	rate, limit float64               // the holder's rate and the bucket's limit
	horizon     time.Time             // when the rate falls next (a lease's deadline); zero if not
	pause       time.Time             // the end of a retry hint's pause
	changed     chan struct{}         // closed when the rate or the horizon changes
}

// Limit returns the rate now.
func (l *Limiter) Limit() ratelimit.Limit { return l.LimitAt(time.Now()) }

// LimitAt returns the rate of the bucket at now (below the holder's rate
// when it paces to a window): the leases whose deadline has passed no
// longer count.
func (l *Limiter) LimitAt(now time.Time) ratelimit.Limit {
	limit, _ := l.h.limitAt(now)
	return limit
}

// Burst returns the burst now.
func (l *Limiter) Burst() int {
	_, burst := l.h.limitAt(time.Now())
	return burst
}

// Allow is AllowN(time.Now(), 1).
func (l *Limiter) Allow() bool { return l.AllowN(time.Now(), 1) }

// AllowN reports whether n units may be used at now, and takes them if so.
// A refusal takes nothing (but counts in the demand).
func (l *Limiter) AllowN(now time.Time, n int) bool { return l.h.allowN(now, n) }

// Wait is WaitN(ctx, 1).
func (l *Limiter) Wait(ctx context.Context) error { return l.WaitN(ctx, 1) }

// WaitN blocks until n units may be used, or ctx is done. While the holder
// has no capacity (or a burst too small for n) it waits for more, asking
// the holder to look for leases at once; keep n well below the burst (a
// hundredth of a window's capacity when pacing to a window). It fails at
// once when n is negative, when n exceeds the burst at the holder's
// largest possible rate (ratelimit.ErrExceedsBurst), or when the wait
// would end after ctx's deadline (ratelimit.ErrWouldExceedDeadline).
func (l *Limiter) WaitN(ctx context.Context, n int) error {
	h := l.h
	if n < 0 {
		return fmt.Errorf("lease: Wait(n=%d): n is negative", n)
	}
	if mb := h.maxBurst(); n > mb {
		return fmt.Errorf("%w: Wait(n=%d) with largest burst %d", ratelimit.ErrExceedsBurst, n, mb)
	}
	h.enter(n)
	defer h.leave(n)
	blocked := false
	block := func() {
		if !blocked {
			blocked = true
			h.block()
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := time.Now()
		t := h.reserve(now, n)
		if now.Before(t.pause) {
			// A retry hint's pause: wait it out, then ask again.
			block()
			if err := retry.Sleep(ctx, t.pause.Sub(now)); err != nil {
				return err
			}
			continue
		}
		r := &t.r
		if !r.OK() {
			// No capacity: reserve asked the holder to look.
			block()
			select {
			case <-t.changed:
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
		if !t.horizon.IsZero() && !act.Before(t.horizon) {
			// The turn comes after a lease's deadline: wait for the
			// renewal, or for the deadline, and ask again.
			r.CancelAt(now)
			block()
			tm := time.NewTimer(max(0, t.horizon.Sub(now)))
			select {
			case <-tm.C:
			case <-t.changed:
				tm.Stop()
			case <-ctx.Done():
				tm.Stop()
				return ctx.Err()
			}
			continue
		}
		rate := t.rate
		if delay > 0 {
			block()
			var retry bool
			var err error
			retry, rate, err = l.await(ctx, r, delay, t.rate, t.limit, t.changed)
			if err != nil {
				return err
			}
			if retry {
				continue
			}
		}
		again, err := l.admit(ctx, n, rate)
		if err != nil || !again {
			return err
		}
	}
}

// admit admits n units whose turn has come, reserved at rate: when the
// window's guard allows, and unless a pause has begun or the rate has
// fallen since (then the caller asks again).
func (l *Limiter) admit(ctx context.Context, n int, rate float64) (again bool, err error) {
	for {
		again, wait := l.h.take(time.Now(), n, rate)
		if again || wait == 0 {
			return again, nil
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return false, err
		}
	}
}

// await waits delay for reservation r made at rate, whose bucket ran at
// pace. When the rate drops meanwhile, the bucket's debt has been
// rescaled to the new pace (Limiter.SetLimitAt), and so is the wait:
// r's turn moves as far back as the debt before it did, and r is kept,
// so that the waiters' turns keep their order and no token is lost (a
// cancel and a new reservation each would give back less than they took,
// when others wait behind them). When the rate falls to nothing, await
// cancels r and reports that the caller must ask again. It returns the
// rate the turn was kept at.
func (l *Limiter) await(ctx context.Context, r *ratelimit.Reservation, delay time.Duration, rate, pace float64, changed chan struct{}) (retry bool, at float64, err error) {
	tm := time.NewTimer(delay)
	defer tm.Stop()
	for {
		select {
		case <-tm.C:
			return false, rate, nil
		case <-ctx.Done():
			now := time.Now()
			if r.DelayFrom(now) > 0 {
				r.CancelAt(now)
				return false, rate, ctx.Err()
			}
			return false, rate, nil
		case <-changed:
			now := time.Now()
			var newRate, newPace float64
			newRate, newPace, changed = l.h.current()
			if newRate >= rate {
				continue
			}
			left := r.DelayFrom(now)
			if left <= 0 {
				rate, pace = newRate, newPace
				continue
			}
			if newPace <= 0 || pace <= 0 {
				r.CancelAt(now)
				return true, rate, nil
			}
			tm.Reset(time.Duration(float64(left) * pace / newPace))
			rate, pace = newRate, newPace
		}
	}
}

// The Holder's side of gate: each method takes h.mu once.

func (h *Holder) limitAt(now time.Time) (ratelimit.Limit, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshDueLocked(now)
	return h.pace.lim.Limit(), h.pace.lim.Burst()
}

func (h *Holder) allowN(now time.Time, n int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dem.ask(n)
	h.refreshDueLocked(now)
	if now.Before(h.thr.PausedUntil()) || h.pace.wait(now, n) > 0 || !h.pace.lim.AllowN(now, n) {
		return false
	}
	h.admitLocked(now, n)
	return true
}

func (h *Holder) maxBurst() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pace.maxBurst(h.cfg.Capacity + h.cfg.Reserved)
}

func (h *Holder) enter(n int) {
	h.mu.Lock()
	h.dem.enter(n)
	h.mu.Unlock()
}

func (h *Holder) leave(n int) {
	h.mu.Lock()
	h.dem.leave(n)
	h.mu.Unlock()
}

func (h *Holder) block() {
	h.mu.Lock()
	h.dem.block()
	h.mu.Unlock()
}

func (h *Holder) reserve(now time.Time, n int) turn {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshDueLocked(now)
	t := turn{rate: h.pace.rate, limit: h.pace.limit, horizon: h.horizon, pause: h.thr.PausedUntil(), changed: h.changed}
	if now.Before(t.pause) {
		return t
	}
	if t.rate > 0 && n <= h.pace.lim.Burst() {
		t.r = *h.pace.lim.ReserveN(now, n) // a copy: nothing escapes
	}
	if !t.r.OK() {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	return t
}

func (h *Holder) take(now time.Time, n int, rate float64) (again bool, wait time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshDueLocked(now)
	if now.Before(h.thr.PausedUntil()) || h.pace.rate < rate {
		return true, 0
	}
	if wait = h.pace.wait(now, n); wait > 0 {
		h.dem.block()
		return false, wait
	}
	h.admitLocked(now, n)
	return false, 0
}

func (h *Holder) current() (rate, pace float64, changed chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pace.rate, h.pace.limit, h.changed
}

// admitLocked counts n units admitted at now. h.mu is held.
func (h *Holder) admitLocked(now time.Time, n int) {
	h.dem.admit(n)
	h.pace.admit(now, n)
}

// refreshDueLocked refreshes the rate when a deadline has passed, and
// every twentieth of a period while a lowered ceiling climbs back. h.mu is
// held.
func (h *Holder) refreshDueLocked(now time.Time) {
	latest := h.table.latest
	if now.Before(latest) {
		return
	}
	if (!h.horizon.IsZero() && !now.Before(h.horizon)) ||
		(h.thr.Lowered() && now.Sub(latest) >= h.cfg.RenewEvery/20) {
		h.refreshLocked(now)
	}
}
