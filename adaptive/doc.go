// Package adaptive protects a service from overload: an adaptive
// concurrency limit, SLO-driven shedding by priority, a computed retry
// hint, and features switched off under load. It depends on the standard
// library and package priority (itself standard library only) alone.
//
// Overload is not quota. A rate limit (package ratelimit) refuses a
// principal what is over its share; this package refuses work because the
// server cannot do it in time, whoever sends it. An edge answers its
// refusals as overload — HTTP 503, gRPC UNAVAILABLE, with the Refusal's
// RetryAfter — never as 429.
//
// # The concurrency limit
//
// A Concurrency, an adaptive concurrency limit, admits a request while
// fewer than its limit are in flight
// (TryAcquireAt, or Acquire, which may wait in a bounded queue) and is told
// how each ended: Permit.Done (completed; its latency from grant is a
// sample), Permit.Dropped (timed out, or the work below said it is
// overloaded) or Permit.Ignore (cancelled by the caller, or not
// representative: health checks, fast failures, cache hits — none of them
// may poison the latency baseline). Once per window (ConcurrencyOptions.Window,
// default 100ms, and at least ConcurrencyOptions.MinSamples, default 10, completions)
// the window's Sample — its latency quantile (ConcurrencyOptions.Quantile, default
// p90), completions, drops, mean and peak in-flight, throughput — goes to
// a Controller, which returns the next limit. The Concurrency bounds it to
// [ConcurrencyOptions.Min, ConcurrencyOptions.Max], where Max is fixed and never exceeded, and
// does not let it grow while the peak in-flight is below half the limit:
// a limiter that is not the bottleneck learns nothing from flat latency,
// and growing then is how limits run away (a server whose latency is a
// constant timeout looks healthy at any limit).
//
// By default (ConcurrencyOptions.Initial 0) a Concurrency starts with a warm-up at Max,
// so that healthy traffic is not refused while nothing is measured: after
// about a second without refusals the limit falls to twice the most held
// and the Controller takes over; a refusal or a drop in the warm-up
// (overloaded from the start) ends it at once at a tenth of Max, and the
// Controller starts once every request let in during the warm-up has
// ended.
//
// Requests have a priority.Priority (carried in the context:
// priority.NewContext, priority.FromContext; at the edges the header
// priority.Header and the gRPC key priority.Metadata). A priority may fill only its share of the limit
// (ConcurrencyOptions.Shares, default 80% for Sheddable rising to 100% for
// Critical), so the top of the limit is kept for the work that matters; the
// queue serves the highest priority first, and when full lets a higher
// priority in by refusing its lowest-priority waiter.
//
// A request's latency is the server's own: the time it waited on
// something outside the server (a store across the network) is no sign
// that the server is overloaded, and counted it would shrink the limit and
// shed while the server idles. An edge gives each request a wait account
// (WithWaitAccount) before Guard.Acquire or Concurrency.Acquire, the code
// calling the dependency adds each wait to it (AddWait), and the permit's
// latency sample is its duration less the waits; the permit holds its
// slot while it waits, and Max bounds what the server holds.
//
// # The controllers
//
// Gradient (the default) scales the limit by aim/observed latency, bounded
// to [0.5, MaxGrowth], adds a queue allowance and smooths, with full steps
// while the windows agree on the direction and shorter ones while they
// alternate (noise): with Target set it holds the latency quantile at
// Target; without, at Tolerance (1.5) times a baseline, the latency
// without a queue, which it tells from a slower server by Little's law (a
// queue raises latency at the same throughput; a slower server raises it
// and serves less; a faster one serves more in less time each) and
// rescales by the change in throughput, measured over two seconds of
// windows in which the limiter refused requests (in the others the
// throughput is the demand's, not the server's), when the server slows
// down or recovers. In the simulator, a server 2× slower for ten seconds
// has its limit back within 10% of the best static one within 2s of the
// slowdown and 5s of the recovery on 79 of 80 seeds. Use it when latency is the signal, with Target when you know
// the latency a request may take. AIMD adds Increase (1) after a good window and
// multiplies by Backoff (0.9) after a congested one — a drop, a latency
// above its Target, or, without Target, in-flight rising while throughput
// stays flat (queueing); use it when overload shows as errors and
// timeouts. Their parameters and defaults are documented on each type;
// NewConcurrency fills the defaults in and refuses invalid values with an
// error naming them.
//
// # Shedding by objective
//
// A Shedder is given a latency Objective (p99 ≤ 250ms) and sheds a
// fraction of arrivals that grows as the measured quantile nears it,
// holding it at Setpoint (80%) of the objective. Above the setpoint the
// server is saturated and what it completes is its capacity, so the
// Shedder lets through that rate less a margin that grows with the error
// (ShedderOptions.Kp), which drains the backlog at once instead of by
// integrating; at or below the setpoint it raises the rate it lets through
// slowly (Ki), faster the further below, and so stops short of the rate
// that saturated the server: a saturating server's latency gives no
// warning before the cliff, and a PI controller on latency alone swings
// across it. It is told too when what it let through was refused below
// (OverloadedAt), and then moves its fraction half way towards what would
// have let through 15% more than the layer below admits (enough to keep
// it busy through the lulls of random arrivals), a gain independent of how deep the
// overload is, so the rejection ratio is steady under steady
// overload and falls back to zero when it ends. The fraction is taken from
// the lowest priorities up, each tier whole before the next, and the tier
// at the boundary is thinned at random (ShedderOptions.Float64), not cut
// off at once.
//
// # The Guard
//
// A Guard is what an edge uses: its Shedder in front of its Concurrency, the
// Concurrency's refusals fed back to the Shedder, a load level (Level: the
// share of the limit in use, above 1 while refusing, or the quantile over
// the objective plus the fraction shed, whichever is larger) and named
// Features that it switches off at their Off level and on again at their
// On level (Enabled). Stats is the snapshot the edges export as metrics:
// limit, in flight, queued, latency quantile, throughput, refusals by
// priority, shed fraction, load level, features off.
//
// # Retry hints
//
// Every Refusal carries a RetryAfter computed from the controller's
// state: the demand refused in the latest window (plus the callers
// queued) divided by the throughput measured, that is how long the excess
// takes to drain, bounded to [MinRetryAfter, MaxRetryAfter]. It grows with
// the depth of the overload; it is never a constant.
//
// # Time, zero values and concurrency
//
// The *At forms take the instant, so tests run the controllers on a
// virtual clock; Acquire, Done and Dropped read the monotonic clock once
// each (the time since the Concurrency was built: no wall-clock read), which
// is most of their cost, and Guard.Acquire reads it once for its Shedder
// and Concurrency both. Time never goes backwards for a Concurrency or a Shedder.
// The decision path (Acquire when admitted at once, TryAcquireAt, Done,
// DoneAt, Shedder.AllowAt) does not allocate; Acquire allocates only to
// wait, and an error return boxes its Refusal.
// Concurrency, Shedder and Guard are safe for concurrent use (a mutex each,
// held for tens of nanoseconds) and must not be copied; their zero values
// admit nothing (the Shedder's sheds nothing); build them with NewConcurrency,
// NewShedder and NewGuard.
package adaptive
