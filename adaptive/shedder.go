package adaptive

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// An Objective is a latency service-level objective: the Quantile of
// request latencies must stay at or below Latency (p99 ≤ 250ms is
// Objective{Quantile: 0.99, Latency: 250 * time.Millisecond}).
type Objective struct {
	Quantile float64
	Latency  time.Duration
}

// ShedderOptions configure a Shedder. Only Objective.Latency is required.
type ShedderOptions struct {
	// Objective is the latency objective (Latency required; Quantile
	// default 0.99, in (0, 1]).
	Objective Objective
	// Setpoint is the fraction of Objective.Latency at which the
	// controller holds the measured quantile (in (0, 1]; default 0.8):
	// shedding starts as the quantile approaches the objective, before
	// it is missed.
	Setpoint float64
	// Interval is the control interval (default 500ms): the quantile is
	// measured and the shed fraction moved once per Interval.
	Interval time.Duration
	// MinSamples is the number of observations an interval needs to
	// measure a quantile (default 50); with fewer, only the capacity
	// signal (OverloadedAt) moves the shed fraction.
	MinSamples int
	// Kp and Ki are the gains of the latency term (defaults 1 and 0.25),
	// on the error log2(quantile / setpoint), bounded to [-3, 1]. Above
	// the setpoint the term lets through the rate the server completed,
	// less 5%, times 2^(−Kp·error): the margin that drains the
	// backlog. At or below, it raises that rate by 2^(−Ki·error) a second,
	// so the fraction relaxes faster the further the quantile is below
	// the setpoint.
	Kp, Ki float64
	// Float64 returns a uniform number in [0, 1): the coin that thins a
	// tier. Default math/rand/v2.Float64; tests inject a seeded one. It is
	// called under the Shedder's lock.
	Float64 func() float64
}

// A Shedder refuses a growing fraction of requests as a latency quantile
// approaches its objective, lowest priorities first. See the package
// documentation for the model.
//
// A Shedder is safe for concurrent use. The zero value sheds nothing; use
// NewShedder. It must not be copied after first use.
type Shedder struct {
	mu    sync.Mutex
	opt   ShedderOptions
	clock monoClock

	start   int64
	hist    histogram
	arrived [priority.Levels]float64
	over    int // overload signals (limiter refusals) in the interval
	passed  int // requests let through in the interval
	shedN   int // requests shed in the interval

	share    [priority.Levels]float64 // smoothed share of arrivals
	fraction float64                  // of all arrivals to shed
	prob     [priority.Levels]float64 // of shedding one request, by priority
	capacity float64                  // the latency term's estimate, per second; 0: none
	quantile time.Duration
	through  float64 // observations per second, latest interval
	lastShed int

	shed [priority.Levels]uint64
}

// NewShedder returns a Shedder with the given options, or an error naming
// the first invalid one.
func NewShedder(opt ShedderOptions) (*Shedder, error) {
	if opt.Objective.Latency <= 0 {
		return nil, fmt.Errorf("adaptive: ShedderOptions.Objective.Latency %v must be positive", opt.Objective.Latency)
	}
	if opt.Objective.Quantile == 0 {
		opt.Objective.Quantile = 0.99
	}
	if !(opt.Objective.Quantile > 0 && opt.Objective.Quantile <= 1) {
		return nil, fmt.Errorf("adaptive: ShedderOptions.Objective.Quantile %v must be in (0, 1]", opt.Objective.Quantile)
	}
	if opt.Setpoint == 0 {
		opt.Setpoint = 0.8
	}
	if !(opt.Setpoint > 0 && opt.Setpoint <= 1) {
		return nil, fmt.Errorf("adaptive: ShedderOptions.Setpoint %v must be in (0, 1]", opt.Setpoint)
	}
	if opt.Interval == 0 {
		opt.Interval = 500 * time.Millisecond
	}
	if opt.Interval < 0 {
		return nil, fmt.Errorf("adaptive: ShedderOptions.Interval %v is negative", opt.Interval)
	}
	if opt.MinSamples == 0 {
		opt.MinSamples = 50
	}
	if opt.MinSamples < 0 {
		return nil, fmt.Errorf("adaptive: ShedderOptions.MinSamples %d is negative", opt.MinSamples)
	}
	if opt.Kp == 0 {
		opt.Kp = 1
	}
	if opt.Ki == 0 {
		opt.Ki = 0.25
	}
	if !(opt.Kp >= 0) || math.IsInf(opt.Kp, 0) || !(opt.Ki > 0) || math.IsInf(opt.Ki, 0) {
		return nil, fmt.Errorf("adaptive: ShedderOptions gains Kp %v and Ki %v must be finite, Kp >= 0 and Ki > 0", opt.Kp, opt.Ki)
	}
	if opt.Float64 == nil {
		opt.Float64 = rand.Float64
	}
	return &Shedder{opt: opt}, nil
}

// ObserveAt reports a request that ended at now after latency (from its
// arrival, as its caller saw it, queueing included). Requests that were
// cancelled or are not representative should not be observed.
func (s *Shedder) ObserveAt(now time.Time, latency time.Duration) {
	s.mu.Lock()
	t := s.clock.advance(now)
	s.hist.record(latency)
	s.maybeClose(t)
	s.mu.Unlock()
}

// OverloadedAt reports that a request the Shedder let through at now was
// then refused for lack of capacity (a Guard calls it when its Concurrency
// refuses). The controller treats refusals of more than overShare (15%)
// of what it let through as overload, as it treats a quantile above the
// setpoint, so that the load is shed here, by priority, rather than there,
// by arrival.
func (s *Shedder) OverloadedAt(now time.Time) {
	s.mu.Lock()
	s.clock.advance(now)
	s.over++
	s.mu.Unlock()
}

// minRelax is the least a falling shed fraction falls in an interval
// (unless it reaches its target first).
const minRelax = 0.05

// overShare is the fraction of the requests let through that may be
// refused below before the Shedder counts it as overload. The excess
// keeps the layer below full: arrivals thinned to a twentieth above its
// capacity leave it idle whenever they bunch less than usual, which cost
// 1–2% of goodput in the simulator and made the throughput the Gradient
// reads noisy.
const overShare = 0.15

// drainShare is how much less than the rate the server completed the
// latency term lets through above the setpoint, before its proportional
// margin.
const drainShare = 0.05

// AllowAt decides at now whether to let a request of priority p through.
// It returns the zero Refusal, or a Refusal with ReasonShed and its retry
// hint. It does not allocate.
func (s *Shedder) AllowAt(now time.Time, p priority.Priority) Refusal {
	if !p.Valid() {
		p = priority.Normal
	}
	i := p.Index()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opt.Float64 == nil {
		return Refusal{} // the zero Shedder
	}
	t := s.clock.advance(now)
	s.maybeClose(t)
	s.arrived[i]++
	if pr := s.prob[i]; pr > 0 && (pr >= 1 || s.opt.Float64() < pr) {
		s.shed[i]++
		s.shedN++
		return Refusal{Reason: ReasonShed, Priority: p, RetryAfter: s.retryAfter()}
	}
	s.passed++
	return Refusal{}
}

// retryAfter returns how long the latest interval's shed demand takes to
// drain at the throughput observed. Called with s.mu held.
func (s *Shedder) retryAfter() time.Duration {
	x := s.through
	if !(x > 0) {
		return boundRetry(s.opt.Interval.Seconds())
	}
	return boundRetry(float64(max(s.lastShed, s.shedN)+1) / x)
}

// maybeClose ends the control interval if it is due at t. Called with
// s.mu held.
func (s *Shedder) maybeClose(t int64) {
	dur := t - s.start
	if dur < int64(s.opt.Interval) {
		return
	}
	sec := time.Duration(dur).Seconds()
	var arrivals float64
	for _, a := range s.arrived {
		arrivals += a
	}
	// The latency term. Above the setpoint the server is saturated, and
	// what it completes is what it can do: the term takes that rate, less
	// drainShare and less a proportional margin 2^(−Kp·err), as the
	// capacity it lets through. At or below the setpoint it raises that
	// capacity by 2^(−Ki·err) a second (faster the further below), so
	// that the fraction relaxes at a pace set by the evidence and stops
	// short of the rate that saturated the server last; the latency of a
	// saturating server gives no warning before the cliff, so a
	// controller on latency alone swings across it. The error is
	// log2(quantile / setpoint), bounded to [-3, 1]. An interval with too
	// few samples to measure the quantile has no evidence, unless even its
	// slowest sample is below the setpoint: evidence to relax (as when
	// most is shed), never to shed more.
	aim := s.opt.Setpoint * float64(s.opt.Objective.Latency)
	var err float64
	evidence := true
	switch {
	case int(s.hist.n) >= s.opt.MinSamples:
		s.quantile = s.hist.quantile(s.opt.Objective.Quantile)
		err = min(max(math.Log2(max(float64(s.quantile), 1)/aim), -3), 1)
	case s.hist.n > 0 && s.fraction > 0 && float64(s.hist.quantile(1)) < aim:
		s.quantile = s.hist.quantile(1)
		err = max(math.Log2(max(float64(s.quantile), 1)/aim), -3)
	default:
		evidence = false
	}
	rate, done := arrivals/sec, float64(s.hist.n)/sec
	switch {
	case !evidence || arrivals == 0:
	case err > 0:
		s.capacity = (1 - drainShare) * done * math.Exp2(-s.opt.Kp*err)
	case s.capacity > 0:
		s.capacity *= math.Exp2(-s.opt.Ki * err * min(sec, 10*s.opt.Interval.Seconds()))
		if s.capacity > 2*rate {
			s.capacity = 0 // far above the demand: no constraint
		}
	}
	target := 0.0
	if s.capacity > 0 && rate > 0 {
		target = 1 - min(s.capacity/rate, 1)
	}
	// The capacity term: the fraction that would have let through just
	// enough for the layer below to refuse overShare of it. Its gain does
	// not depend on how deep the overload is, so it is as damped at 10×
	// as at 2×. Without refusals below it probes for more: a quarter
	// more than was let through. The fraction moves half way to the
	// larger target each interval if either is above it (shed more when
	// either term says so), else to the smaller (relax as fast as the
	// faster allows), and when it falls, by at least minRelax (so that
	// it reaches 0).
	if arrivals > 0 {
		c := 1 - 1.25*(1-s.fraction)
		if s.over > 0 {
			accepted := float64(s.passed - min(s.over, s.passed))
			c = 1 - accepted/((1-overShare)*arrivals)
		}
		if target > s.fraction || c > s.fraction {
			target = max(target, c)
		} else {
			target = min(target, c)
		}
	}
	step := 0.5 * (target - s.fraction)
	if step < 0 {
		step = min(step, max(target-s.fraction, -minRelax))
	}
	if s.over == 0 && s.capacity == 0 && rate <= s.through {
		// The whole demand fits in what the server completed in the
		// previous interval, and nothing below refused: the overload
		// is over, stop shedding at once.
		step = -s.fraction
	}
	s.fraction = min(max(s.fraction+step, 0), 0.99)
	s.through = float64(s.hist.n) / sec
	s.lastShed = s.shedN
	// Share of arrivals by priority, smoothed over a few intervals.
	if arrivals > 0 {
		for i := range s.share {
			s.share[i] = 0.5*s.share[i] + 0.5*s.arrived[i]/arrivals
		}
	}
	// Take the fraction from the lowest priorities up: each tier is shed
	// whole before the next is touched, and the tier at the boundary is
	// thinned at random.
	left := s.fraction
	for i := range s.prob {
		switch {
		case left <= 0:
			s.prob[i] = 0
		case s.share[i] <= left:
			s.prob[i] = 1 // a tier with no recent arrivals is shed whole too
			left -= s.share[i]
		default:
			s.prob[i] = left / s.share[i]
			left = 0
		}
	}
	s.start = t
	s.hist.reset()
	s.arrived = [priority.Levels]float64{}
	s.over, s.passed, s.shedN = 0, 0, 0
}

// ShedderStats is a snapshot of a Shedder.
type ShedderStats struct {
	// Quantile is the latest interval's latency quantile of the objective.
	Quantile time.Duration
	// Fraction is the fraction of arrivals the controller sheds, and
	// Probability the chance of shedding a request of each priority,
	// Sheddable first.
	Fraction    float64
	Probability [priority.Levels]float64
	// Shed counts the requests shed since the start, by priority.
	Shed [priority.Levels]uint64
}

// Stats returns a snapshot of s. It does not allocate.
func (s *Shedder) Stats() ShedderStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ShedderStats{Quantile: s.quantile, Fraction: s.fraction, Probability: s.prob, Shed: s.shed}
}

// Level returns the load level the Shedder sees: the latest quantile over
// the objective's latency, plus the fraction shed.
func (s *Shedder) Level() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opt.Objective.Latency <= 0 {
		return 0
	}
	return float64(s.quantile)/float64(s.opt.Objective.Latency) + s.fraction
}
