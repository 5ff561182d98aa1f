package adaptive

import (
	"fmt"
	"math"
	"time"
)

// A Sample is what a Concurrency measured over one window, handed to its
// Controller when the window closes.
type Sample struct {
	// Window is how long the window lasted.
	Window time.Duration
	// Limit is the limit in force during the window.
	Limit float64
	// Latency is the window's latency quantile (ConcurrencyOptions.Quantile) over
	// the completions reported with Done, measured from the moment each
	// was admitted; 0 when there were none.
	Latency time.Duration
	// Completed and Dropped count the permits ended with Done and with
	// Dropped in the window. Ignored ones are in neither.
	Completed, Dropped int
	// InFlight is the time-weighted mean of the permits held during the
	// window, and MaxInFlight the most held at once.
	InFlight    float64
	MaxInFlight int
	// Throughput is Completed per second of Window.
	Throughput float64
	// Refused counts the requests the Concurrency refused in the window: a
	// window with refusals had more demand than its limit let in.
	Refused int
}

// A Controller turns a window's Sample into the next limit. The Concurrency
// calls it under its lock, once per window, and then bounds the answer to
// [ConcurrencyOptions.Min, ConcurrencyOptions.Max] and holds it from growing while the limiter
// is not the bottleneck (MaxInFlight below half the limit). A Controller
// belongs to one Concurrency; its methods need not be safe for concurrent use.
//
// Gradient and AIMD are the two supplied; NewConcurrency fills in their
// defaults and refuses invalid parameters. A Controller returning NaN
// leaves the limit as it was.
type Controller interface {
	// Update returns the limit for the next window.
	Update(s Sample) float64
}

// A validator is a Controller that fills in its defaults and checks its
// parameters when a Concurrency is built.
type validator interface{ validate() error }

// Gradient is a gradient controller in the manner of Netflix's Gradient2:
// each window it scales the limit by the ratio of the latency it aims for
// to the latency it observed, adds a small queue allowance, and smooths the
// result:
//
//	gradient = clamp(aim / observed, 0.5, MaxGrowth)
//	limit    = limit + f·Smoothing·(limit·gradient + Queue − limit)
//
// where f is 1 while the steps of the latest windows (about fifteen) went
// the same way, and falls to a fifth while they alternated: steps in one
// direction follow a change, steps back and forth are the noise of a
// window's quantile (about a hundred completions; a p90 varies by 8–12%
// from one to the next) around the limit that holds the aim, which a
// shorter step averages over more windows.
//
// The latency aimed for is Target when it is set: the limit then settles
// where the latency quantile equals Target (the queue allowance keeps it a
// little above). Without Target it is Tolerance times a baseline, the
// latency of the server without a queue: the mean of the first ten
// windows, then moved a quarter of the way to the mean of the latest five
// when that is 5% or more below it (a baseline pulled towards every lower
// mean would follow the noise down). It does not forget upwards — under a
// steady queue the latency sits above the baseline by design, and a
// baseline that followed it would chase its own queueing until the limit
// ran away. Instead it reads Little's law: a queue raises the latency at
// the same throughput, a slower server raises the latency and serves
// less. Two windows running above the aim with the throughput a quarter or
// more below its reference scale the baseline up by the fall in
// throughput; two below the aim with the throughput a quarter or more
// above it and the time in the system (InFlight / Throughput) a quarter
// or more below its reference — a faster server, not more work let in, as
// when the limit ramps up — scale it down by the rise. The references are
// means over ThroughputWindows windows in which the limiter refused
// requests (Sample.Refused): in the others the throughput is the
// demand's, not the server's; the new speed is measured over as many. A
// server whose workers each become 2× slower keeps its limit (the
// concurrency it can serve is the same), and gets back its baseline when
// it recovers. A window without completions leaves the limit as it is; a
// window whose drops are more than a tenth of its permits counts as the
// steepest decrease (gradient 0.5).
//
// Use Target when the latency a request may take is known (a share of the
// caller's deadline or of the latency objective) and the server's own
// latency will stay below it; a Target under the latency of a slowed
// server cuts the limit below its workers. Use the baseline when no
// target is known.
//
// The zero value is valid: Tolerance 1.5, Smoothing 0.1 (0.2 with a
// Target, which needs no baseline estimated from noisy windows), Queue 1,
// MaxGrowth 1.1, ThroughputWindows 20.
type Gradient struct {
	// Target is the latency aimed for; 0 means Tolerance × baseline.
	Target time.Duration
	// Tolerance is how much above the baseline the latency may be before
	// the limit shrinks (> 1; default 1.5). Unused with Target.
	Tolerance float64
	// Smoothing is the fraction of the way to the new limit moved each
	// window (0 < Smoothing <= 1; default 0.1, or 0.2 with Target).
	Smoothing float64
	// Queue is the allowance added each window (>= 0; default 1): it lets
	// the limit probe upwards and keeps it from sticking at its minimum.
	Queue float64
	// MaxGrowth bounds the gradient above (>= 1; default 1.1): how much
	// faster than the queue allowance the limit may grow in one window
	// when latency is well below its aim.
	MaxGrowth float64
	// ThroughputWindows is the number of windows over which the
	// reference throughput and time in the system are averaged, and over
	// which a change of speed is measured (>= 1; default 20).
	ThroughputWindows int

	baseline time.Duration
	refX     float64 // reference throughput, completions per second
	refW     float64 // reference time in the system, seconds: InFlight / Throughput
	agree    float64 // moving mean of the direction of the limit's moves, in [-1, 1]
	warm     int     // windows seen, up to warmWindows
	changing int     // consecutive windows that look like a change of speed
	measured int     // > 0: windows measured of a change of speed
	sumX     float64 // throughput summed over the measurement
	recent   [5]time.Duration
	next     int
	idle     int       // windows of the measurement left out for want of refusals
	past     [10]speed // the baseline and reference at the latest windows, next%10 the oldest
	before   speed     // at the start of the measurement of a change of speed
}

// speed is what a Gradient knows of the server's speed: its baseline and
// the reference throughput.
type speed struct {
	baseline time.Duration
	x        float64
}

func (g *Gradient) validate() error {
	if g.Target < 0 {
		return fmt.Errorf("adaptive: Gradient.Target %v is negative", g.Target)
	}
	if g.Tolerance == 0 {
		g.Tolerance = 1.5
	}
	if g.Smoothing == 0 {
		g.Smoothing = 0.2
		if g.Target == 0 {
			g.Smoothing = 0.1 // the baseline is an estimate: damp its noise more
		}
	}
	if g.Queue == 0 {
		g.Queue = 1
	}
	if g.MaxGrowth == 0 {
		g.MaxGrowth = 1.1
	}
	if g.ThroughputWindows == 0 {
		g.ThroughputWindows = 20
	}
	g.agree = 1 // a new limit is expected to move: full steps at first
	switch {
	case !(g.Tolerance > 1) || math.IsInf(g.Tolerance, 0):
		return fmt.Errorf("adaptive: Gradient.Tolerance %v must be above 1", g.Tolerance)
	case !(g.Smoothing > 0 && g.Smoothing <= 1):
		return fmt.Errorf("adaptive: Gradient.Smoothing %v must be in (0, 1]", g.Smoothing)
	case !(g.Queue >= 0) || math.IsInf(g.Queue, 0):
		return fmt.Errorf("adaptive: Gradient.Queue %v must be a finite number >= 0", g.Queue)
	case !(g.MaxGrowth >= 1) || math.IsInf(g.MaxGrowth, 0):
		return fmt.Errorf("adaptive: Gradient.MaxGrowth %v must be a finite number >= 1", g.MaxGrowth)
	case g.ThroughputWindows < 0:
		return fmt.Errorf("adaptive: Gradient.ThroughputWindows %d is negative", g.ThroughputWindows)
	}
	return nil
}

// Update implements Controller.
func (g *Gradient) Update(s Sample) float64 {
	gradient := 0.0
	switch {
	case s.Dropped*10 > s.Completed+s.Dropped:
		gradient = 0.5
	case s.Latency <= 0:
		return s.Limit
	default:
		aim := g.Target
		if aim == 0 {
			if aim = g.rebase(s); aim == 0 {
				return s.Limit
			}
		}
		gradient = min(max(float64(aim)/float64(s.Latency), 0.5), g.MaxGrowth)
	}
	next := s.Limit*gradient + g.Queue
	return s.Limit + g.smoothing(next-s.Limit)*(next-s.Limit)
}

// smoothing returns the fraction of the way to move by a step of the
// given sign, and adds the step's direction to the moving mean: Smoothing
// while the earlier windows agreed on the direction, down to a fifth of it
// while they alternated. Windows that agree show a change to follow;
// windows that alternate show the noise of the latency quantile around
// the limit that holds the aim, which a smaller step averages over more
// windows.
func (g *Gradient) smoothing(step float64) float64 {
	dir := 0.0
	switch {
	case step > 0:
		dir = 1
	case step < 0:
		dir = -1
	}
	f := g.Smoothing * max(math.Abs(g.agree), minAgree)
	g.agree += (dir - g.agree) * agreeGain
	return f
}

// agreeGain is the weight of the latest window in the moving mean of the
// direction (about 15 windows), and minAgree the least fraction of
// Smoothing a step is taken with.
const (
	agreeGain = 0.07
	minAgree  = 0.2
)

// changeBy is how much the throughput must fall or rise for a window to
// count as evidence that the server's speed changed.
const changeBy = 1.25

// warmWindows is the number of windows whose mean sets the first
// baseline. A window's p90 of about a hundred completions varies by
// 8–12% from one window to the next; the mean of ten by about 3%.
const warmWindows = 10

// rebase moves the baseline with window s and returns the latency aimed
// for, Tolerance × baseline. Five windows whose mean is 5% or more below
// the baseline pull it a quarter of the way down. Two windows running
// that show a change of speed — the throughput a quarter or more below
// its reference with the latency above the aim (slower), or a quarter or
// more above it with the latency below the aim and the time in the
// system a quarter or more below its reference (faster) — start a
// measurement: over the next ThroughputWindows windows with refusals the
// baseline is the one before the change scaled by the reference
// throughput of ten windows before over the mean throughput since
// (Little's law: the same workers, each slower or faster), and the
// reference becomes that mean. The references are updated only by
// windows with refusals, the others showing the demand rather than the
// server. A queue raises the latency at the same throughput and does not
// move the baseline.
func (g *Gradient) rebase(s Sample) time.Duration {
	aim := func() time.Duration { return time.Duration(g.Tolerance * float64(g.baseline)) }
	if g.warm < warmWindows {
		// The first windows see the requests that finished first, the
		// faster ones: the baseline is the mean of a few windows.
		g.warm++
		g.baseline += (s.Latency - g.baseline) / time.Duration(g.warm)
		g.refX += (s.Throughput - g.refX) / float64(g.warm)
		g.refW += (s.InFlight/s.Throughput - g.refW) / float64(g.warm)
		g.remember()
		return aim()
	}
	if g.measured > 0 {
		g.measure(s)
		return aim()
	}
	slower := float64(s.Latency) > g.Tolerance*float64(g.baseline) && s.Throughput*changeBy <= g.refX
	faster := s.Latency < aim() && s.Throughput >= changeBy*g.refX && s.InFlight/s.Throughput*changeBy <= g.refW
	switch {
	case slower || faster:
		if g.changing++; g.changing < 2 {
			return 0 // hold the limit: one window does not tell a change of speed from noise
		}
		g.changing, g.measured, g.idle, g.sumX = 0, 0, 0, 0
		// The reference before the change is the one of ten windows
		// ago: the windows just before a change was told may have moved
		// it already. A server that sped up has pulled the baseline down
		// in those windows too, and must not be scaled down twice: the
		// baseline is then the highest since.
		g.before = speed{g.baseline, g.past[g.next%len(g.past)].x}
		if faster {
			for _, p := range g.past {
				g.before.baseline = max(g.before.baseline, p.baseline)
			}
		}
		g.measure(s)
		return aim()
	}
	g.past[g.next%len(g.past)] = speed{g.baseline, g.refX}
	g.recent[g.next%len(g.recent)] = s.Latency
	g.next++
	if g.next >= len(g.recent) {
		var sum time.Duration
		for _, l := range g.recent {
			sum += l
		}
		if m := sum / time.Duration(len(g.recent)); float64(m) < pullBelow*float64(g.baseline) {
			g.baseline -= (g.baseline - m) / 4
		}
	}
	g.changing = 0
	if s.Refused > 0 {
		// Only a window whose demand was more than the limit let in
		// shows what the server can do.
		g.refX += (s.Throughput - g.refX) / float64(g.ThroughputWindows)
	}
	g.followW(s)
	return aim()
}

// followW moves the reference time in the system with window s, if the
// limiter refused requests in it.
func (g *Gradient) followW(s Sample) {
	if s.Refused > 0 {
		g.refW += (s.InFlight/s.Throughput - g.refW) / float64(g.ThroughputWindows)
	}
}

// pullBelow is how far below the baseline the mean of the latest five
// windows must be to pull the baseline down: that mean varies by about
// 4%, and a baseline pulled towards every lower one would follow the
// noise down.
const pullBelow = 0.95

// measure adds window s to the measurement of a change of speed and
// scales the baseline by it: by the reference throughput before the
// change over the mean throughput since. The first windows of the
// measurement still see requests that began at the old speed, so once
// there are more, the mean leaves them out.
func (g *Gradient) measure(s Sample) {
	g.followW(s)
	if g.measured >= changeSkip && s.Refused == 0 {
		// The limiter refused nothing: the throughput is the demand's,
		// not the server's. Left out, up to 2·ThroughputWindows such
		// windows, so that a measurement always ends.
		if g.idle++; g.idle <= 2*g.ThroughputWindows {
			return
		}
	}
	g.measured++
	if g.measured == changeSkip+1 {
		g.sumX = 0 // the windows that straddle the change are left out
	}
	g.sumX += s.Throughput
	n := g.measured
	if n > changeSkip {
		n -= changeSkip
	}
	mean := g.sumX / float64(n)
	g.baseline = time.Duration(min(max(g.before.x/mean, 0.25), 4) * float64(g.before.baseline))
	if n >= g.ThroughputWindows {
		g.refX, g.measured = mean, 0
		g.remember()
	}
}

// remember sets every entry of the recent past to the current state:
// what came before it no longer describes the server.
func (g *Gradient) remember() {
	for i := range g.past {
		g.past[i] = speed{g.baseline, g.refX}
	}
}

// changeSkip is the number of windows at the start of the measurement of
// a change of speed that are left out once the measurement has more.
const changeSkip = 3

// Baseline returns the baseline latency the controller compares against:
// Target when set, else the recent lowest quantile (0 before the first
// window).
func (g *Gradient) Baseline() time.Duration {
	if g.Target > 0 {
		return g.Target
	}
	return g.baseline
}

// AIMD is an additive-increase, multiplicative-decrease controller, TCP's
// rule: a window with congestion multiplies the limit by Backoff, any other
// window adds Increase. Congestion is any of: a drop (a permit ended with
// Dropped), a latency quantile above Target when Target is set, and —
// when Target is not set — queueing seen in in-flight against throughput:
// the mean in-flight rose by more than a tenth since the previous window
// while throughput rose by less than a third as much, so the extra work
// waited instead of being served.
//
// AIMD reacts only to thresholds, so its limit saws around the point of
// congestion; it needs no latency baseline, which makes it the controller
// for a dependency whose overload shows as errors and timeouts rather than
// latency. Prefer Gradient when latency is the signal.
//
// The zero value is valid: Increase 1, Backoff 0.9, no Target.
type AIMD struct {
	// Target is the latency quantile above which a window is congested;
	// 0 detects queueing from in-flight and throughput instead.
	Target time.Duration
	// Increase is added to the limit after a window without congestion
	// (> 0; default 1).
	Increase float64
	// Backoff multiplies the limit after a congested window (in (0, 1);
	// default 0.9).
	Backoff float64

	prevInFlight, prevThroughput float64
}

func (a *AIMD) validate() error {
	if a.Target < 0 {
		return fmt.Errorf("adaptive: AIMD.Target %v is negative", a.Target)
	}
	if a.Increase == 0 {
		a.Increase = 1
	}
	if a.Backoff == 0 {
		a.Backoff = 0.9
	}
	switch {
	case !(a.Increase > 0) || math.IsInf(a.Increase, 0):
		return fmt.Errorf("adaptive: AIMD.Increase %v must be a finite number above 0", a.Increase)
	case !(a.Backoff > 0 && a.Backoff < 1):
		return fmt.Errorf("adaptive: AIMD.Backoff %v must be in (0, 1)", a.Backoff)
	}
	return nil
}

// Update implements Controller.
func (a *AIMD) Update(s Sample) float64 {
	congested := s.Dropped > 0
	if a.Target > 0 {
		congested = congested || s.Latency > a.Target
	} else if a.prevInFlight > 0 && a.prevThroughput > 0 {
		inflightGain := s.InFlight/a.prevInFlight - 1
		throughputGain := s.Throughput/a.prevThroughput - 1
		congested = congested || (inflightGain > 0.1 && throughputGain < inflightGain/3)
	}
	a.prevInFlight, a.prevThroughput = s.InFlight, s.Throughput
	if congested {
		return s.Limit * a.Backoff
	}
	if s.Completed == 0 {
		return s.Limit
	}
	return s.Limit + a.Increase
}
