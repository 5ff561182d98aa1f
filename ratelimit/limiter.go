package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// A Limit is a rate of events per second, as in golang.org/x/time/rate:
// Limit(10) is ten events a second and Every(100*time.Millisecond) the same.
//
// A Limiter does not count in float64. It turns a Limit once, when it is set,
// into the interval between two events in whole nanoseconds, rounded up so
// that it never admits more than the Limit says; an interval that the Limit
// carries exactly (Every(3*time.Millisecond) gives 3ms, not 3ms+1ns) is
// recognised despite float64 rounding. Rates above 1e9 per second are
// therefore counted as one event per nanosecond, and rates below one event
// in 73 years as no refill.
//
// Inf means no limit at all. Zero (or less, or NaN) means no refill: the
// bucket keeps the tokens it has and never gets more.
type Limit float64

// Inf is the infinite rate: a Limiter with it admits every request, whatever
// its burst.
const Inf = Limit(math.MaxFloat64)

// Every returns the Limit of one event every d. A d of zero or less gives
// Inf.
func Every(d time.Duration) Limit {
	if d <= 0 {
		return Inf
	}
	return 1 / Limit(d.Seconds())
}

// maxDebt bounds every time debt a Limiter keeps, so that sums of debts and
// instants cannot overflow int64 (pitfall: overflow opens the limiter).
const maxDebt = math.MaxInt64 / 4

// interval returns the nanoseconds between two events at rate l; 0 when l
// admits no refill, and inf when l is Inf.
func (l Limit) interval() (iv int64, inf bool) {
	f := float64(l)
	switch {
	case f >= float64(Inf) || math.IsInf(f, 1):
		return 0, true
	case !(f > 0): // zero, negative or NaN
		return 0, false
	}
	x := 1e9 / f
	if x >= maxDebt {
		return 0, false // one event in more than 73 years: no refill
	}
	if r := math.Round(x); r >= 1 && math.Abs(x-r) <= r*1e-12 {
		return int64(r), false // float rounding of an exact interval
	}
	return max(1, int64(math.Ceil(x))), false
}

var (
	// ErrExceedsBurst is returned by Limiter.WaitN when n exceeds the
	// burst: the bucket can never hold that many tokens.
	ErrExceedsBurst = errors.New("ratelimit: n exceeds the limiter's burst")
	// ErrWouldExceedDeadline is returned at once, without waiting, by
	// Limiter.WaitN and Shaper.WaitN when the wait needed is longer than
	// the time left before the context's deadline (or is endless: a
	// Limiter whose limit is 0 and whose bucket lacks the tokens).
	ErrWouldExceedDeadline = errors.New("ratelimit: wait would exceed the context deadline")
)

// A Limiter is an in-process token bucket for one key, in the manner of
// golang.org/x/time/rate.Limiter. The bucket holds at most Burst tokens and
// refills at Limit tokens per second; it starts full. An event of n tokens
// is admitted when the bucket holds n tokens. Burst is the capacity, exactly:
// a Limiter with burst 5 admits 5 events at once after an idle time, and
// with burst 0 admits nothing unless its limit is Inf, which admits
// everything.
//
// # State
//
// The bucket is kept in integer nanoseconds as in GCRA: a theoretical
// arrival time (the instant at which the bucket is full again) and the
// interval between events. There is no floating-point token count to drift.
// Changing the limit or the burst keeps the tokens already consumed (the
// debt), so a change applies at once against past consumption.
//
// # Time
//
// Every method has a form taking the instant explicitly (AllowN, ReserveN,
// SetLimitAt, TokensAt...); the others are one-line wrappers that pass
// time.Now(). Instants are measured against the first one the Limiter saw,
// with the monotonic clock when both carry it. Time never goes backwards for
// a Limiter: an instant earlier than the latest one it has seen is treated
// as that latest one. So a caller that read the clock before another caller
// updated the Limiter can never be credited the same interval twice — the
// flaw of golang.org/x/time/rate reported in golang/go issues 65508 and
// 71360.
//
// # Reservations
//
// A reservation that must wait is remembered (its instant, 8 bytes) until it
// is due or cancelled, so that Reservation.CancelAt can tell which tokens
// the reservations still waiting rely on; reservations that are due are
// forgotten when the memory would grow.
//
// # Zero value and concurrency
//
// The zero value is a valid Limiter with limit 0 and burst 0: it admits
// nothing but n == 0. A Limiter is safe for concurrent use; its methods take
// a mutex for a few nanoseconds. It must not be copied after first use.
type Limiter struct {
	mu    sync.Mutex
	limit Limit
	burst int
	// iv is the interval between events in ns; 0 means no refill, and
	// then tat holds the tokens owed rather than an instant.
	iv  int64
	inf bool
	// mono turns instants into offsets that never go back.
	mono monoClock
	// tat is the theoretical arrival time: the offset at which the bucket
	// is full again. The debt at offset t is max(0, tat-t).
	tat int64
	// waiting holds, in increasing order, the act offsets of the
	// reservations that took tokens and had to wait, until they are
	// cancelled; offsets already past may linger until the slice must
	// grow. Its last element is the latest reservation that CancelAt must
	// count as relying on earlier ones.
	waiting []int64
}

// NewLimiter returns a Limiter that admits events at rate limit with a
// capacity of burst tokens, starting full. A negative burst counts as 0,
// and a burst whose refill would take more than 73 years counts as the
// largest one that does not.
func NewLimiter(limit Limit, burst int) *Limiter {
	l := &Limiter{}
	l.limit, l.burst = limit, max(0, burst)
	l.iv, l.inf = limit.interval()
	return l
}

// Limit returns the rate last set.
func (l *Limiter) Limit() Limit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// Burst returns the capacity of the bucket.
func (l *Limiter) Burst() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.burst
}

// A monoClock turns instants into offsets in nanoseconds from the first
// instant it is given, and never goes back: an instant earlier than the
// latest one it has seen is taken as that one. The zero value is ready for
// use; the Limiter's or Shaper's mutex guards it.
//
// adaptive/concurrency.go has the same type: the import rules (ARCHITECTURE.md,
// rule 1) leave ratelimit and adaptive no common package but the standard
// library, and exporting it would make a clock part of the API.
type monoClock struct {
	// base is the instant offsets are measured from, set on first use.
	base    time.Time
	started bool
	// last is the latest offset seen.
	last int64
}

// advance returns the offset of now, setting base on first use and
// clamping to the latest offset seen, which it advances.
func (c *monoClock) advance(now time.Time) int64 {
	if !c.started {
		c.base, c.started = now, true
		return c.last
	}
	c.last = max(c.last, int64(now.Sub(c.base)))
	return c.last
}

// peek is advance without changing c.
func (c *monoClock) peek(now time.Time) int64 {
	if !c.started {
		return 0
	}
	return max(c.last, int64(now.Sub(c.base)))
}

// unit is the debt one token costs: its interval, or 1 without refill.
func (l *Limiter) unit() int64 {
	if l.iv == 0 {
		return 1
	}
	return l.iv
}

// debt returns the debt at offset t, in units: the tokens missing from a
// full bucket times unit(). It is negative never.
func (l *Limiter) debt(t int64) int64 {
	if l.iv == 0 {
		return l.tat
	}
	return max(0, l.tat-t)
}

// setDebt sets the debt at offset t; d is at most maxDebt.
func (l *Limiter) setDebt(t, d int64) {
	d = max(0, d)
	if l.iv == 0 {
		l.tat = d
	} else {
		l.tat = satAdd(t, d)
	}
}

// satMul returns a*b for a, b >= 0, saturated to maxDebt.
func satMul(a, b int64) int64 {
	if a != 0 && b > maxDebt/a {
		return maxDebt
	}
	return min(a*b, maxDebt)
}

// Tokens returns the tokens in the bucket now.
func (l *Limiter) Tokens() float64 { return l.TokensAt(time.Now()) }

// TokensAt returns the tokens in the bucket at now; it changes nothing. The
// count is negative while reservations owe tokens not yet refilled, and is
// Burst when the limit is Inf.
func (l *Limiter) TokensAt(now time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inf {
		return float64(l.burst)
	}
	d := l.debt(l.mono.peek(now))
	u := l.unit()
	// Whole tokens exactly; only the fraction goes through float64.
	return float64(int64(l.burst)-d/u) - float64(d%u)/float64(u)
}

// SetLimit sets the rate now; see SetLimitAt.
func (l *Limiter) SetLimit(limit Limit) { l.SetLimitAt(time.Now(), limit) }

// SetLimitAt sets the rate at now. The tokens already consumed stay
// consumed: the debt is rescaled to the new interval (rounded up, never
// creating a token). Setting Inf forgets the debt; leaving Inf starts from a
// full bucket.
func (l *Limiter) SetLimitAt(now time.Time, limit Limit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.mono.advance(now)
	d, u := l.debt(t), l.unit()
	wasInf := l.inf
	l.limit = limit
	l.iv, l.inf = limit.interval()
	switch {
	case l.inf || wasInf:
		d = 0
	case l.unit() != u:
		d = min(ceilMulDiv(d, l.unit(), u), maxDebt)
	}
	l.setDebt(t, d)
}

// SetBurst sets the capacity now; see SetBurstAt.
func (l *Limiter) SetBurst(burst int) { l.SetBurstAt(time.Now(), burst) }

// SetBurstAt sets the capacity at now (a negative burst counts as 0). The
// tokens already consumed stay consumed: a bucket that lacked 2 tokens of 5
// lacks 2 tokens of the new capacity, so raising the burst adds tokens at
// once and lowering it may leave the bucket owing tokens.
func (l *Limiter) SetBurstAt(now time.Time, burst int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mono.advance(now)
	l.burst = max(0, burst)
}

// Allow reports whether one event may happen now; see AllowN.
func (l *Limiter) Allow() bool { return l.AllowN(time.Now(), 1) }

// AllowN reports whether n events may happen at now, and takes their tokens
// if so. A refusal takes nothing. Use it to drop or skip events that exceed
// the rate. n == 0 takes nothing and succeeds unless reservations have left
// the bucket owing tokens; a negative n is refused.
func (l *Limiter) AllowN(now time.Time, n int) bool {
	l.mu.Lock()
	_, _, why := l.take(l.mono.advance(now), n, 0)
	l.mu.Unlock()
	return why == reserveOK
}

// Reserve is ReserveN(time.Now(), 1).
func (l *Limiter) Reserve() *Reservation { return l.ReserveN(time.Now(), 1) }

// ReserveN takes n tokens at now, possibly from the future, and returns a
// Reservation that tells how long the caller must wait before its n events
// happen. The reservation is not OK, and takes nothing, when n exceeds the
// burst (and the limit is not Inf), when n is negative, or when the limit is
// 0 and the bucket lacks the tokens. A caller that decides not to wait must
// call Cancel to give the tokens back.
func (l *Limiter) ReserveN(now time.Time, n int) *Reservation {
	r, _ := l.reserve(now, n, Never)
	return &r
}

// Wait is WaitN(ctx, 1).
func (l *Limiter) Wait(ctx context.Context) error { return l.WaitN(ctx, 1) }

// WaitN blocks until n events may happen, or ctx is done. It fails at once,
// taking nothing, when n exceeds the burst (ErrExceedsBurst), when the wait
// needed is longer than the time left until ctx's deadline
// (ErrWouldExceedDeadline), or when ctx is already done (ctx.Err()). When
// ctx is done during the wait, the tokens are given back as CancelAt
// describes and ctx.Err() is returned.
func (l *Limiter) WaitN(ctx context.Context, n int) error { return l.waitN(ctx, n, time.Now) }

// timeLeft is the time from now to ctx's deadline, or Never without one.
func timeLeft(ctx context.Context, now time.Time) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(0, dl.Sub(now))
	}
	return Never
}

func (l *Limiter) waitN(ctx context.Context, n int, clock func() time.Time) error {
	if n < 0 {
		return fmt.Errorf("ratelimit: Wait(n=%d): n is negative", n)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := clock()
	maxWait := timeLeft(ctx, now)
	r, why := l.reserve(now, n, maxWait)
	switch why {
	case reserveExceedsBurst:
		return fmt.Errorf("%w: Wait(n=%d) with burst %d", ErrExceedsBurst, n, r.burst)
	case reserveNever:
		return fmt.Errorf("%w: Wait(n=%d) would wait forever at limit 0", ErrWouldExceedDeadline, n)
	case reserveTooLong:
		return fmt.Errorf("%w: Wait(n=%d) needs %v, %v left", ErrWouldExceedDeadline, n, r.wait, maxWait)
	}
	delay := r.DelayFrom(now)
	if delay <= 0 {
		return nil
	}
	tm := time.NewTimer(delay)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		// The turn may have come at the very instant ctx was done; then
		// the tokens are the caller's.
		if now := clock(); r.DelayFrom(now) > 0 {
			r.CancelAt(now)
			return ctx.Err()
		}
		return nil
	}
}

type reserveResult uint8

const (
	reserveOK reserveResult = iota
	reserveInvalid
	reserveExceedsBurst
	reserveNever
	reserveTooLong
)

// reserve takes n tokens at now if the wait needed is at most maxWait. The
// Reservation it returns is not OK otherwise; its burst and wait fields
// then describe the refusal.
func (l *Limiter) reserve(now time.Time, n int, maxWait time.Duration) (Reservation, reserveResult) {
	l.mu.Lock()
	t := l.mono.advance(now)
	act, unit, why := l.take(t, n, maxWait)
	r := Reservation{lim: l, base: l.mono.base, burst: l.burst}
	if why == reserveOK {
		r.ok, r.unit, r.act = true, unit, act
		if unit != 0 { // at Inf nothing was taken
			r.n = int64(n)
		}
		if r.waits = r.n > 0 && act > t; r.waits {
			l.addWaiting(t, act)
		}
	}
	l.mu.Unlock()
	if why == reserveTooLong {
		r.wait = time.Duration(act - t)
	}
	return r, why
}

// take takes n tokens at offset t if the wait needed is at most maxWait,
// and returns the offset at which the events may happen and the debt unit
// of a token. When the wait is too long, act still tells when the events
// could happen. l.mu is held.
func (l *Limiter) take(t int64, n int, maxWait time.Duration) (act, unit int64, why reserveResult) {
	if n < 0 {
		return 0, 0, reserveInvalid
	}
	if l.inf {
		return t, 0, reserveOK
	}
	u := l.unit()
	// The capacity in debt; a burst whose debt would not fit in maxDebt
	// counts as the largest one that does.
	capTokens := min(int64(l.burst), maxDebt/u)
	if int64(n) > capTokens {
		return 0, 0, reserveExceedsBurst
	}
	next := l.debt(t) + int64(n)*u // both <= maxDebt: no overflow
	var wait int64
	if capacity := capTokens * u; next > capacity {
		if l.iv == 0 || next > maxDebt {
			return 0, 0, reserveNever
		}
		wait = next - capacity
	}
	if wait > int64(maxWait) {
		return t + wait, u, reserveTooLong
	}
	l.setDebt(t, next)
	return t + wait, u, reserveOK
}

// addWaiting records a reservation at offset t that waits until act. When
// the slice is full, it first drops the offsets before t: no reservation
// due then can give anything back. l.mu is held.
func (l *Limiter) addWaiting(t, act int64) {
	w := l.waiting
	if len(w) == cap(w) {
		past, _ := slices.BinarySearch(w, t)
		w = w[:copy(w, w[past:])]
	}
	i := len(w)
	if i > 0 && w[i-1] > act { // after a cancel, act may precede others
		i, _ = slices.BinarySearch(w, act)
	}
	l.waiting = slices.Insert(w, i, act)
}

// dropWaiting forgets one waiting reservation at offset act. Reservations
// at one offset are alike, so any of them will do. l.mu is held.
func (l *Limiter) dropWaiting(act int64) {
	if i, found := slices.BinarySearch(l.waiting, act); found {
		l.waiting = slices.Delete(l.waiting, i, i+1)
	}
}

// A Reservation holds tokens taken by Limiter.ReserveN for events that may
// happen after a delay. Its methods are safe for concurrent use; the zero
// value is a Reservation that is not OK.
type Reservation struct {
	lim  *Limiter
	base time.Time
	ok   bool
	// n tokens of unit debt each were taken; the events may happen at
	// offset act. waits tells that act is in the Limiter's waiting list.
	n, unit, act int64
	waits        bool
	cancelled    bool
	// burst and wait describe a refusal.
	burst int
	wait  time.Duration
}

// OK reports whether the limiter can provide the tokens asked for. When it
// is false, Delay returns Never and Cancel does nothing.
func (r *Reservation) OK() bool { return r.ok }

// Delay is DelayFrom(time.Now()).
func (r *Reservation) Delay() time.Duration { return r.DelayFrom(time.Now()) }

// DelayFrom returns how long after now the reserved events may happen: zero
// means at once, and Never means the reservation is not OK.
func (r *Reservation) DelayFrom(now time.Time) time.Duration {
	if !r.ok {
		return Never
	}
	return time.Duration(max(0, r.act-int64(now.Sub(r.base))))
}

// Cancel is CancelAt(time.Now()).
func (r *Reservation) Cancel() { r.CancelAt(time.Now()) }

// CancelAt tells the limiter, at now, that the reserved events will not
// happen, and gives back as many tokens as it safely can:
//
//   - nothing when the reservation's events were due before now (they are
//     taken to have happened), when it is not OK, or when it was cancelled
//     before: a reservation is given back at most once;
//   - otherwise its n tokens less those that later reservations rely on,
//     counted as the time between this reservation's instant and the
//     latest instant of a reservation still waiting, so the schedule
//     already promised to them stays within the rate; a reservation
//     cancelled before is not one that others rely on;
//   - and never more than fills the bucket to its burst.
//
// Cancelling at the same instant as the reservation gives everything back
// when no later reservation waits behind it.
func (r *Reservation) CancelAt(now time.Time) {
	if !r.ok || r.lim == nil {
		return
	}
	l := r.lim
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.cancelled {
		return
	}
	r.cancelled = true
	t := l.mono.advance(now)
	if r.act < t {
		return
	}
	if r.waits {
		l.dropWaiting(r.act)
	}
	if l.inf || r.n == 0 {
		return
	}
	give := satMul(r.n, r.unit)
	if w := l.waiting; len(w) > 0 && w[len(w)-1] > r.act {
		give -= w[len(w)-1] - r.act
	}
	if give <= 0 {
		return
	}
	if u := l.unit(); u != r.unit {
		give = mulDiv(give, u, r.unit) // rounded down: never a token too many
	}
	l.setDebt(t, l.debt(t)-give)
}
