package lease

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// A pacer is a Holder's window pacing: the token bucket the Limiter
// admits from, sized by pacing for the holder's rate and the downstream's
// window, and the guard (a windowLog) that holds the units admitted in
// any window within the capacity the holder had over it. Its methods take
// the instants they need; it never reads the clock. The Holder's mutex
// guards it (the bucket has its own lock, for the reservations WaitN
// keeps while it waits).
type pacer struct {
	lim    *ratelimit.Limiter
	window time.Duration // the downstream's window; 0 when not pacing to one
	guard  windowLog
	rate   float64 // the holder's rate, which the bucket is sized for
	limit  float64 // the bucket's limit; -1 until set sizes it again
}

// newPacer returns a pacer of no rate, pacing to window w (none when w ≤
// 0), at now.
func newPacer(now time.Time, w time.Duration) pacer {
	p := pacer{lim: ratelimit.NewLimiter(0, 0), window: max(0, w), limit: -1}
	p.guard.reset(p.window, now, 0)
	return p
}

// setWindow sets the window to w at now (none when w ≤ 0), and reports
// whether it changed: then the guard starts again at the rate, and the
// bucket is sized again by the next set.
func (p *pacer) setWindow(now time.Time, w time.Duration) bool {
	w = max(0, w)
	if w == p.window {
		return false
	}
	p.window = w
	p.guard.reset(w, now, p.rate)
	p.limit = -1
	return true
}

// unsized reports whether the bucket waits to be sized again by set.
func (p *pacer) unsized() bool { return p.limit < 0 }

// set sets the holder's rate at now and sizes the bucket for it; it
// returns the bucket's limit before, and whether the limit or the rate
// changed. New capacity starts empty: the tokens of a larger burst are
// earned at the new rate, not given at once.
func (p *pacer) set(now time.Time, rate float64) (old float64, changed bool) {
	limit, burst := pacing(rate, p.window)
	if limit == p.limit && rate == p.rate {
		return p.limit, false
	}
	old = p.limit
	if p.window > 0 {
		p.guard.setRate(now, rate)
	}
	p.rate, p.limit = rate, limit
	p.lim.SetLimitAt(now, ratelimit.Limit(limit))
	if prev := p.lim.Burst(); burst > prev {
		p.lim.SetBurstAt(now, burst)
		p.lim.ReserveN(now, burst-prev)
	} else {
		p.lim.SetBurstAt(now, burst)
	}
	return old, true
}

// wait returns how long after now n units fit in the window's share (see
// Limiter): 0 when they fit, or when not pacing to a window.
func (p *pacer) wait(now time.Time, n int) time.Duration {
	if p.window <= 0 || n <= 0 {
		return 0
	}
	return p.guard.wait(now, n, 1-paceSlack/2, int64(p.lim.Burst()))
}

// admit counts n units admitted at now in the window.
func (p *pacer) admit(now time.Time, n int) {
	if p.window > 0 {
		p.guard.add(now, n)
	}
}

// sent returns the units admitted in the window ending at now.
func (p *pacer) sent(now time.Time) float64 { return float64(p.guard.count(now)) }

// maxBurst returns the bucket's burst at rate, with the current window.
func (p *pacer) maxBurst(rate float64) int {
	_, b := pacing(rate, p.window)
	return b
}

// Window pacing: the Limiter's token bucket is ratelimit.WindowPacing's
// for the holder's rate, whose doc derives why the holders together keep
// any window within C·W; the guard holds what the callers return with to
// 1 − paceSlack/2 of the capacity over the window.
const (
	paceSlack = ratelimit.WindowSlack
	// guardSlots is the number of slots a window spans in a windowLog,
	// which keeps one more: the slot the window's start falls in.
	guardSlots = 128
	ringSlots  = guardSlots + 1
)

// pacing returns the token bucket's limit and burst for a holder's rate
// when it paces to a window of w, or, when w ≤ 0, at the rate with
// burstFor's burst.
func pacing(rate float64, w time.Duration) (limit float64, burst int) {
	if rate <= 0 {
		return 0, 0
	}
	if w <= 0 {
		return rate, burstFor(rate)
	}
	l, b := ratelimit.WindowPacing(rate, w)
	return float64(l), b
}

// burstFor is the Limiter's burst at rate without window pacing: a tenth
// of it, at least 1, or 0 when there is no rate.
func burstFor(rate float64) int {
	if rate <= 0 {
		return 0
	}
	return max(1, int(math.Ceil(rate/10)))
}

// A windowLog counts the units a Limiter admitted in the last window, in
// guardSlots slots, and the capacity the holder had over that window (the
// integral of its rate, its credit): the guard that keeps any window of
// admission instants, as the callers see them, within the capacity the
// holder held in it, even when waiters that were delayed (a stalled
// process) all return at once. Because the holders' rates never add up
// to more than C at any instant, their credits over any window add up to
// at most C·W; and a holder whose rate falls (it yields partitions to
// another) goes on at its new rate at once, rather than waiting for the
// units it sent at the old rate to leave the window. The count may exceed
// the true one by one slot's worth, never fall short of it; the credit of
// the slot the window's start falls in is counted pro rata.
//
// The zero value is empty; reset sets the window. Its pacer's owner
// guards it.
type windowLog struct {
	w, width time.Duration
	base     time.Time
	head     int64 // the slot number of the latest slot written
	counts   [ringSlots]int64
	sum      int64
	// credit holds each slot's capacity in units, accrued up to the
	// instant accrued at rate.
	credit  [ringSlots]float64
	rate    float64
	accrued time.Time
}

// reset sets the window to w at now, forgetting what was admitted, with
// the credit of a whole window at rate (as if the holder had had it
// throughout, which is what a guard on the rate alone would allow). The
// slots are numbered from a window before now, so that the window's
// slots never have a negative number.
func (g *windowLog) reset(w time.Duration, now time.Time, rate float64) {
	width := max(time.Nanosecond, w/guardSlots)
	*g = windowLog{w: w, width: width, base: now.Add(-guardSlots * width), head: guardSlots, rate: rate, accrued: now}
	per := rate * width.Seconds()
	for i := range g.credit {
		g.credit[i] = per
	}
	g.credit[g.head%ringSlots] = 0
}

// setRate accrues the credit up to now at the old rate and sets the new.
func (g *windowLog) setRate(now time.Time, rate float64) {
	g.advance(now)
	g.rate = rate
}

// slot returns the slot number of now.
func (g *windowLog) slot(now time.Time) int64 {
	return int64(max(0, now.Sub(g.base)) / g.width)
}

// start returns the instant slot s begins.
func (g *windowLog) start(s int64) time.Time {
	return g.base.Add(time.Duration(s) * g.width)
}

// advance forgets the slots that have left the window ending at now and
// accrues the credit up to now.
func (g *windowLog) advance(now time.Time) {
	if !now.After(g.accrued) {
		return
	}
	s := g.slot(now)
	if s > g.head {
		// The rest of the head slot, then the new slots.
		g.credit[g.head%ringSlots] += g.rate * g.start(g.head+1).Sub(g.accrued).Seconds()
		per := g.rate * g.width.Seconds()
		for k := max(g.head+1, s-ringSlots+1); k <= s; k++ {
			i := k % ringSlots
			g.sum -= g.counts[i]
			g.counts[i] = 0
			g.credit[i] = per
		}
		g.credit[s%ringSlots] = 0
		g.head = s
		g.accrued = g.start(s)
	}
	g.credit[s%ringSlots] += g.rate * now.Sub(g.accrued).Seconds()
	g.accrued = now
}

// add counts n units admitted at now.
func (g *windowLog) add(now time.Time, n int) {
	g.advance(now)
	g.counts[g.head%ringSlots] += int64(n)
	g.sum += int64(n)
}

// count returns the units admitted in the window ending at now.
func (g *windowLog) count(now time.Time) int64 {
	g.advance(now)
	return g.sum
}

// capacity returns the credit of the window ending at now, advanced to
// it: the whole slots after the oldest, and the oldest's share that lies
// in the window.
func (g *windowLog) capacity(now time.Time) float64 {
	g.advance(now)
	var c float64
	for k := g.head - guardSlots + 1; k <= g.head; k++ {
		c += g.credit[k%ringSlots]
	}
	old := g.head - guardSlots
	in := g.start(old + 1).Sub(now.Add(-g.w))
	return c + g.credit[old%ringSlots]*max(0, min(1, in.Seconds()/g.width.Seconds()))
}

// wait returns how long after now n more units fit under the window's
// credit × share, at least floor units: 0 if they fit now. When they do
// not fit within a window, it returns the window.
func (g *windowLog) wait(now time.Time, n int, share float64, floor int64) time.Duration {
	limit := func(c float64) int64 { return max(floor, int64(math.Floor(share*c))) }
	if g.sum+int64(n) <= limit(g.capacity(now)) {
		return 0
	}
	// At the start of slot head+k the window holds the slots from
	// head+k−guardSlots, whole: the older ones (ring index (head+k) mod
	// ringSlots at step k) are gone from the count and the credit, and
	// the time since now has earned the rate.
	sum := g.sum
	var kept float64 // the credit of slots head−guardSlots+k … head
	for k := g.head - guardSlots + 1; k <= g.head; k++ {
		kept += g.credit[k%ringSlots]
	}
	for k := int64(1); k <= ringSlots; k++ {
		at := g.start(g.head + k)
		i := (g.head + k) % ringSlots
		sum -= g.counts[i]
		if k > 1 {
			kept -= g.credit[i]
		}
		c := kept + g.rate*at.Sub(now).Seconds()
		if k > guardSlots {
			c = g.rate * g.w.Seconds()
		}
		if sum+int64(n) <= limit(c) {
			return max(time.Nanosecond, at.Sub(now))
		}
	}
	return g.w
}
