package lease

import (
	"math"
	"time"
)

// Window pacing: the Limiter's token bucket is sized so that no window of
// the downstream's length W, wherever it starts, receives more than the
// leased capacity. A bucket of rate r' and burst b lets through at most
// b + r'·W units in any W; with b ≈ paceBurst·r·W and r' = r − b/W −
// paceSlack·r, that is (1 − paceSlack)·r·W. Summed over the holders: at an
// instant a, the bucket of holder i holds at most its burst, a fraction of
// its rate r_i(a), and in [a, a+W) it earns no more than the integral of
// its rate, so the window receives at most paceBurst·W·Σr_i(a) + (1 −
// paceBurst − paceSlack)·∫Σr_i ≤ C·W, because the valid leases never add
// up to more than C at any instant. paceSlack is left for the jitter
// between the limiter and the downstream's clock.
const (
	paceBurst = 0.01
	paceSlack = 0.01
	// guardSlots is the number of slots a window spans in a windowLog,
	// which keeps one more: the slot the window's start falls in.
	guardSlots = 128
	ringSlots  = guardSlots + 1
)

// pacing returns the token bucket's limit and burst for a holder's rate
// when it paces to a window of w (w > 0): see the constants above. The
// burst is at least 1; for rates below a few units a window, the limit
// never falls below half the rate, and a window may then see one unit
// more than its share.
func pacing(rate float64, w time.Duration) (limit float64, burst int) {
	if rate <= 0 {
		return 0, 0
	}
	if w <= 0 {
		return rate, burstFor(rate)
	}
	sec := w.Seconds()
	perWin := rate * sec
	burst = max(1, int(math.Floor(perWin*paceBurst)))
	limit = rate - (float64(burst)/sec + paceSlack*rate)
	return max(limit, rate/2), burst
}

// A windowLog counts the units a Limiter admitted in the last window, in
// guardSlots slots: the guard that keeps any window of admission instants,
// as the callers see them, within the window's capacity even when waiters
// that were delayed (a stalled process) all return at once. The count may
// exceed the true one by one slot's worth, never fall short of it.
//
// The zero value is empty; reset sets the window. It is guarded by the
// Holder's mutex.
type windowLog struct {
	w, width time.Duration
	base     time.Time
	head     int64 // the slot number of the latest slot written
	counts   [ringSlots]int64
	sum      int64
}

func (g *windowLog) reset(w time.Duration, now time.Time) {
	*g = windowLog{w: w, width: max(time.Nanosecond, w/guardSlots), base: now}
}

// slot returns the slot number of now.
func (g *windowLog) slot(now time.Time) int64 {
	return int64(max(0, now.Sub(g.base)) / g.width)
}

// advance forgets the slots that have left the window ending at now.
func (g *windowLog) advance(now time.Time) {
	s := g.slot(now)
	if s <= g.head {
		return
	}
	if s-g.head >= ringSlots {
		clear(g.counts[:])
		g.sum = 0
	} else {
		for k := g.head + 1; k <= s; k++ {
			i := k % ringSlots
			g.sum -= g.counts[i]
			g.counts[i] = 0
		}
	}
	g.head = s
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

// wait returns how long after now n more units fit under limit: 0 if they
// fit now. When they never fit (n > limit), it returns the window.
func (g *windowLog) wait(now time.Time, n int, limit int64) time.Duration {
	g.advance(now)
	over := g.sum + int64(n) - limit
	if over <= 0 {
		return 0
	}
	if int64(n) > limit {
		return g.w
	}
	// The oldest slot leaves when the head moves one slot on, and so on.
	for k := int64(1); k <= ringSlots; k++ {
		over -= g.counts[(g.head+k)%ringSlots]
		if over <= 0 {
			at := g.base.Add(time.Duration(g.head+k) * g.width)
			return max(time.Nanosecond, at.Sub(now))
		}
	}
	return g.w
}
