package lease

import (
	"math"
	"time"
)

// An estimator is a Holder's demand estimate: the arrival rate of units
// at the Limiter (an average that rises fast and decays over RateWindow)
// plus the backlog (SetBacklog, and units waiting in WaitN) ÷ DrainTime,
// and the partitions that demand fills. Callers blocked in WaitN are
// demand the estimate cannot see (it counts what was admitted): while
// they wait on an empty bucket the need is at least the holder's even
// share, and when over half a period they used all the Limiter offered
// while waiting, need and want are all the partitions.
//
// The Limiter's side counts (ask, enter, leave, block, admit); Run's side
// looks (estimate), at most once a round. Its methods take the instants
// they need; it never reads the clock. The Holder's mutex guards it.
type estimator struct {
	// Set by newEstimator, from the Options.
	rateWindow time.Duration // Options.RateWindow
	judgeEvery time.Duration // how far apart saturation is judged: half a period
	drainTime  time.Duration // Options.DrainTime
	headroom   float64       // Options.Headroom
	partitions int           // Options.Partitions
	partCap    float64       // C/P
	reserved   float64       // Options.Reserved

	requested int64 // units asked since the last look
	admitted  int64 // units admitted since the last look
	waiting   int64 // units waiting in WaitN
	backlog   int64
	// lastBacklog is the backlog at the last look.
	lastBacklog int64
	arrival     float64 // units/s
	used        float64 // units/s
	// blocked counts the WaitN calls that had to wait, satAdmitted the
	// units admitted, and offered the limiter's limit integrated up to
	// offeredAt (units), since saturated was last decided: whether
	// callers waited on a limiter they used to the full.
	blocked     int64
	satAdmitted int64
	offered     float64
	offeredAt   time.Time
	saturated   bool
	judged      time.Time // when saturated was decided
	demand      float64   // units/s
	need, want  int
	lastTick    time.Time // the last look; zero before the first
	// stated is set by setStated: the demand is the one a caller states
	// (Holder.SetDemand), its rate statedRate, not the Limiter's counts.
	stated     bool
	statedRate float64 // units/s
}

func newEstimator(cfg Options) estimator {
	return estimator{
		rateWindow: cfg.RateWindow,
		judgeEvery: cfg.RenewEvery / 2,
		drainTime:  cfg.DrainTime,
		headroom:   cfg.Headroom,
		partitions: cfg.Partitions,
		partCap:    cfg.Capacity / float64(cfg.Partitions),
		reserved:   cfg.Reserved,
	}
}

// A bucket is what a look at the demand reads of the Holder's Limiter and
// throttle controller at its instant.
type bucket struct {
	limit   float64       // the bucket's limit since the last offer
	burst   int           // its burst: what a limiter used to the full may leave
	empty   bool          // no rate, or less than a token: waiters wait
	window  time.Duration // the window it paces to (0: none)
	ceiling float64       // the throttle controller's ceiling (+Inf: none)
	even    float64       // the holder's even share of C, 0 before any view
}

// setBacklog sets the units waiting to be sent by the caller.
func (e *estimator) setBacklog(n int) { e.backlog = int64(max(0, n)) }

// setStated states the demand: rate units/s arrive and backlog units wait,
// held back for want of rate. From then on the estimate is this stated
// demand, not what the Limiter counts (see Holder.SetDemand).
func (e *estimator) setStated(rate float64, backlog int) {
	if !(rate >= 0) || math.IsInf(rate, 1) {
		rate = 0
	}
	e.stated, e.statedRate = true, rate
	e.setBacklog(backlog)
}

// ask counts n units asked for (admitted or not).
func (e *estimator) ask(n int) { e.requested += int64(max(0, n)) }

// enter counts n units asked for that wait in WaitN until leave.
func (e *estimator) enter(n int) {
	e.ask(n)
	e.waiting += int64(n)
}

// leave ends the wait of n units counted by enter.
func (e *estimator) leave(n int) { e.waiting -= int64(n) }

// block counts a WaitN call that had to wait.
func (e *estimator) block() { e.blocked++ }

// admit counts n units admitted.
func (e *estimator) admit(n int) {
	e.admitted += int64(n)
	e.satAdmitted += int64(n)
}

// waiters reports whether callers wait in WaitN.
func (e *estimator) waiters() bool { return e.waiting > 0 }

// offer adds the units the limiter offered since the last offer, at pace
// (its limit since then), up to now.
func (e *estimator) offer(now time.Time, pace float64) {
	if e.offeredAt.IsZero() {
		e.offeredAt = now
		return
	}
	if dt := now.Sub(e.offeredAt); dt > 0 {
		e.offered += max(0, pace) * dt.Seconds()
		e.offeredAt = now
	}
}

// estimate updates the estimate at now, from what was counted since the
// last look and the Limiter's bucket b, and returns the partitions the
// demand fills and those with the headroom.
func (e *estimator) estimate(now time.Time, b bucket) (need, want int) {
	if dt := now.Sub(e.lastTick).Seconds(); !e.lastTick.IsZero() && dt > 0 {
		win := e.rateWindow.Seconds()
		ewma := func(avg, sample float64) float64 {
			tau := win
			if sample > avg {
				tau = win / 4
			}
			a := 1 - math.Exp(-dt/tau)
			return avg + a*(sample-avg)
		}
		// Units arrive when they are asked for, or when the backlog
		// grows (a queue that fills faster than its drainer asks).
		grown := max(0, e.backlog-e.lastBacklog)
		e.arrival = ewma(e.arrival, float64(e.requested+grown)/dt)
		e.used = ewma(e.used, float64(e.admitted)/dt)
		e.requested, e.admitted = 0, 0
		// Callers that had to wait on a limiter they used to the full
		// (or that found no capacity at all) show that the demand is
		// at least the rate, by how much nobody knows: want the whole
		// fair share at once, rather than grow by the headroom every
		// period. Decided on looks at least half a period apart, so
		// that looks between periods (notifications, waiters) do not
		// judge on a few milliseconds.
		e.offer(now, b.limit)
		if now.Sub(e.judged) >= e.judgeEvery {
			e.judged = now
			waited := e.blocked > 0 || e.waiting > 0
			// A limiter used to the full admits all it offered but
			// the tokens left at the end (a burst at most).
			slack := float64(b.burst)
			e.saturated = waited && float64(e.satAdmitted)+slack >= 0.995*e.offered
			e.satAdmitted, e.blocked, e.offered = 0, 0, 0
		}
	}
	if e.lastTick.IsZero() {
		e.judged = now
	}
	e.lastTick = now
	e.lastBacklog = e.backlog
	if e.stated {
		return e.estimateStated(b)
	}
	e.demand = e.arrival + float64(e.backlog+e.waiting)/e.drainTime.Seconds()
	e.need = e.partitionsFor(e.demand, b)
	e.want = e.partitionsFor(e.demand*(1+e.headroom), b)
	switch {
	case e.saturated:
		e.need, e.want = e.partitions, e.partitions
	case e.waiting > 0 && b.empty:
		// Callers wait now on an empty bucket: at least the even
		// share, at once (the estimate has not seen them yet).
		even := e.partitions
		if b.even > 0 {
			even = min(even, int(math.Ceil(b.even/e.partCap-1e-9)))
		}
		e.need = max(e.need, even)
		e.want = max(e.want, e.need)
	}
	return e.need, e.want
}

// estimateStated is estimate's end for a stated demand: the demand is
// the stated rate plus the backlog ÷ DrainTime, and need and want follow
// from it as from a counted one, except that a backlog is units held back
// for want of rate (the caller that states it paces itself at the rate it
// is given, and holds back only what that rate does not let through):
// like callers blocked in WaitN on a limiter they use to the full, it
// makes need and want all the partitions (those under the ceiling), and
// water-filling gives the holder its fair share at once.
func (e *estimator) estimateStated(b bucket) (need, want int) {
	e.arrival = e.statedRate
	e.demand = e.statedRate + float64(e.backlog)/e.drainTime.Seconds()
	e.need = e.partitionsFor(e.demand, b)
	e.want = e.partitionsFor(e.demand*(1+e.headroom), b)
	if e.backlog > 0 {
		// All, or what the throttle controller's ceiling lets through.
		e.need = e.partitionsFor(math.Inf(1), b)
		e.want = e.need
	}
	return e.need, e.want
}

// partitionsFor returns the fewest partitions whose rate, as the Limiter
// paces it to b's window, covers the demand d (units/s) capped by b's
// ceiling.
func (e *estimator) partitionsFor(d float64, b bucket) int {
	d = min(d, b.ceiling)
	if math.IsInf(d, 1) {
		return e.partitions
	}
	for k := 0; k < e.partitions; k++ {
		if pace, _ := pacing(e.reserved+float64(k)*e.partCap, b.window); pace >= d-1e-9 {
			return k
		}
	}
	return e.partitions
}
