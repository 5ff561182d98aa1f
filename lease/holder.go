package lease

import (
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/retry"
)

// Stats are a Holder's figures at one instant. Rates are in units per
// second.
type Stats struct {
	// Granted is the capacity of the valid leases plus the reserved one.
	Granted float64
	// Rate is the limiter's rate: Granted, or the outage fallback, capped
	// by the ceiling.
	Rate float64
	// Used is the recent rate of units admitted by the limiter, and Idle
	// is max(0, Rate − Used).
	Used, Idle float64
	// Demand is the estimated demand; Need the partitions it fills and
	// Want those with the headroom.
	Demand     float64
	Need, Want int
	// Leases is the number of valid leases held.
	Leases int
	// Acquisitions, Renewals, Losses and Releases count leases granted,
	// renewed, lost (refused renewal: expired in the store, or taken by
	// another member) and released.
	Acquisitions, Renewals, Losses, Releases uint64
	// Throttled counts the throttled responses reported; Ceiling is the
	// ceiling on Rate, +Inf when there is none; Cuts counts the times
	// the ceiling was lowered, Pauses the retry hints that paused the
	// Limiter, and Paused is the pause left now.
	Throttled, Cuts, Pauses uint64
	Ceiling                 float64
	Paused                  time.Duration
	// Window is the downstream's window the Limiter paces to; 0 when it
	// does not.
	Window time.Duration
	// Outage reports whether the store is unreachable now; Outages counts
	// the store calls that failed.
	Outage  bool
	Outages uint64
	// StoreCalls counts the store round trips.
	StoreCalls uint64
}

// A Holder takes capacity leases on a shared service for one process and
// exposes the capacity as a Limiter.
//
// # Model
//
// The service's capacity C is cut into P partitions of C/P units per
// second. Every process that calls the service runs one Holder per
// service, all sharing one Store. A Holder's rate is its reserved
// capacity plus C/P for every partition it holds a valid lease on. Run,
// the Holder's one goroutine, wakes every RenewEvery (jittered) and
//
//   - estimates the demand: the arrival rate of units at the limiter
//     (an average that rises fast and decays over RateWindow) plus the
//     backlog (SetBacklog, and units waiting in WaitN) ÷ DrainTime, or
//     the demand its caller states (SetDemand) when it paces itself; the
//     partitions it needs are the fewest whose rate, as the Limiter paces
//     it, covers the demand, and it wants those that cover demand ×
//     (1 + Headroom), at most P and never above the throttle ceiling.
//     Callers blocked in WaitN are demand the estimate cannot see (it
//     counts what was admitted): while they wait on an empty bucket the
//     need is at least the holder's even share, and when over half a
//     period they used all the Limiter offered while waiting, need and
//     want are all P — water-filling then gives the holder its fair share
//     at once, not a headroom's worth more per period;
//   - publishes its presence, weight, need and want (Heartbeat), and
//     reads the members and the partitions in the same call;
//   - computes every member's share: P divided by weight among the needs
//     (water-filling, so what a member does not need goes to the others),
//     then what is left among the headrooms, rounded up;
//   - releases partitions above want + Hysteresis, and yields partitions
//     above its share while other members are below theirs and there are
//     no free partitions for them;
//   - renews the leases it keeps, in one call;
//   - acquires free partitions, chosen from the view from a random offset
//     (no blind attempts), up to its want — up to its share while others
//     wait.
//
// During its first period it looks every tenth of a period: members that
// start together cannot see one another on their first look, and the one
// that took the idle capacity yields within that, notified or not.
// Between periods it looks again at once (at most every fiftieth of a
// period) when callers wait with no capacity, and when the Store, a
// Notifier, tells it that another member joined, raised its need,
// released partitions or left: a holder above its share yields as soon
// as a newcomer asks, and freed partitions are taken within a round trip
// or two. Periods are shortened at random by up to Jitter, never
// lengthened, so without notifications freed capacity is seen within a
// period. While it is below its share and partitions could come to it, it
// looks again after a tenth of the period. While it wants
// more, and a partition has missed a renewal (its TTL left, a duration the
// store reports, is below the store's lifetime less a period), it looks
// again just after that TTL ends: a dead member's capacity is taken over
// as soon as the store frees it. When partitions it saw free were taken
// by another member before its acquire (members that look at the same
// instant collide), it looks again after a few hundredths of a period.
//
// # Validity
//
// A lease is valid until the instant the acquire or renew call that gave
// it was sent, plus TTL, less TTL × Drift and Margin, on the monotonic
// clock; the store expires it TTL − Margin/2 after it received the call,
// by its own clock (presences too). So a holder has stopped using a
// partition, and its last admitted units have had Margin/2 to be used,
// before anyone else can be given it; and a dead member's partitions are
// free, and taken by the others, within TTL of its last renewal. The
// Limiter never admits a unit past a deadline, even while the renewal is
// in flight or Run is stuck in a slow call: it drops capacity by itself
// at the deadline.
//
// # Feedback and outages
//
// A throttled response (Throttled, ThrottledAfter, Observe) feeds the
// throttle controller of ThrottledAfterAt: a retry hint pauses the
// Limiter for as long, the 429s of one episode cut nothing, a repeat cuts
// the ceiling in proportion to the overshoot (never below Backoff of the
// rate), and the ceiling climbs back to the rate it was cut from in
// Recovery. A lowered ceiling lowers the need, so partitions it leaves
// unused go back to the pool. When the store fails, the leases run out at
// their deadlines and the rate falls to what Options.Outage says.
//
// A Holder is safe for concurrent use; Run must be called once. The zero
// value is not usable: call NewHolder.
type Holder struct {
	c       Store
	cfg     Options
	partCap float64
	limiter *Limiter
	wake    chan struct{} // WaitN callers with no capacity ask Run to look

	mu sync.Mutex
	// The concerns, each a type whose methods take the instant.
	table table         // the lease table (table.go)
	dem   estimator     // demand estimation (demand.go)
	pace  pacer         // window pacing: the Limiter's bucket (pace.go)
	thr   retry.Ceiling // the throttle controller (feedback.go)
	// What refreshLocked derives from them: the capacity of the valid
	// leases plus the reserved one; the instant the rate falls next (the
	// earliest deadline of the valid leases, zero if none); and changed,
	// closed and made again whenever the rate or that instant changes.
	granted float64
	horizon time.Time
	changed chan struct{}
	// Run's: whether it runs, whether the store is out, the even share
	// C × weight / total weight last seen (0 before any view).
	running bool
	outage  bool
	even    float64
	st      Stats
}

// NewHolder returns a Holder of the service coordinated by c.
func NewHolder(c Store, cfg Options) (*Holder, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil Store", ErrBadArgument)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	h := &Holder{
		c:       c,
		cfg:     cfg,
		partCap: cfg.Capacity / float64(cfg.Partitions),
		wake:    make(chan struct{}, 1),
		dem:     newEstimator(cfg),
		pace:    newPacer(now, cfg.Window),
		thr:     retry.Ceiling{Backoff: cfg.Backoff, Recovery: cfg.Recovery, MaxPause: cfg.MaxPause},
		changed: make(chan struct{}),
	}
	h.limiter = &Limiter{h: h}
	h.mu.Lock()
	h.refreshLocked(now)
	h.mu.Unlock()
	return h, nil
}

// ID returns the holder's member id.
func (h *Holder) ID() string { return h.cfg.ID }

// Options returns the holder's options, with NewHolder's defaults
// filled in.
func (h *Holder) Options() Options { return h.cfg }

// Limiter returns the limiter whose rate follows the holder's leases.
func (h *Holder) Limiter() *Limiter { return h.limiter }

// SetBacklog reports n units waiting to be sent by the caller (a queue's
// length), which counts in the demand besides the arrival rate.
func (h *Holder) SetBacklog(n int) {
	h.mu.Lock()
	h.dem.setBacklog(n)
	h.mu.Unlock()
}

// SetDemand states the holder's demand, for a caller that paces itself
// rather than through the Limiter (sluice serve holds a Holder for a
// program in another process, which states its demand over the network):
// rate units a second arrive, and backlog units wait, held back for want
// of rate. From the first call on, the demand estimate is the demand
// stated last instead of what the Limiter counted: the arrival rate is
// rate, the demand rate + backlog ÷ DrainTime, and a backlog above 0
// counts as callers blocked on a limiter they use to the full (need and
// want all P, within the ceiling), so that water-filling gives the holder
// its fair share at once. A negative, NaN or infinite rate counts as 0, a
// negative backlog as 0. Run's next round publishes it; call Wake to
// make that round start now.
func (h *Holder) SetDemand(rate float64, backlog int) {
	h.mu.Lock()
	h.dem.setStated(rate, backlog)
	h.mu.Unlock()
}

// Wake asks Run to look at once (at most every fiftieth of a period), as
// a caller waiting with no capacity does: after SetDemand, so that a
// demand that grew is published without waiting for the period's end.
func (h *Holder) Wake() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// An Allowance is what a caller that paces itself (see SetDemand) needs
// of a Holder at one instant: the rate it may use, the token bucket that
// paces it to the downstream's window as the Limiter would, and until
// when.
type Allowance struct {
	// Rate is the holder's rate (Stats.Rate): the capacity of its valid
	// leases and its reserved capacity, under the ceiling.
	Rate float64
	// Limit and Burst are the token bucket the Limiter admits from at
	// Rate: a caller that admits units from a bucket of this rate and
	// burst (new capacity starting empty: tokens are earned, not given)
	// sends no window of Window more than Rate's share (see "Pacing to
	// the service's window" in the package documentation).
	Limit float64
	Burst int
	// Window is the downstream's window the bucket paces to; 0 when it
	// does not.
	Window time.Duration
	// Deadline is when the rate falls next unless the leases are renewed
	// first: the earliest deadline of the valid leases, on this process's
	// monotonic clock; zero when no lease is held.
	Deadline time.Time
	// Changed is closed when any of the above changes: after a round that
	// acquired, renewed, released or lost leases, and, once Deadline has
	// passed without a renewal, at the first call that sees it (a caller
	// waiting on Changed calls AllowanceAt again at Deadline).
	Changed <-chan struct{}
}

// AllowanceAt returns the holder's allowance at now.
func (h *Holder) AllowanceAt(now time.Time) Allowance {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshDueLocked(now)
	return Allowance{Rate: h.pace.rate, Limit: max(0, h.pace.limit), Burst: h.pace.lim.Burst(),
		Window: h.pace.window, Deadline: h.horizon, Changed: h.changed}
}

// Stats returns the holder's figures now.
func (h *Holder) Stats() Stats { return h.StatsAt(time.Now()) }

// StatsAt returns the holder's figures at now.
func (h *Holder) StatsAt(now time.Time) Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.st
	s.Leases = h.refreshLocked(now)
	s.Granted, s.Rate, s.Used = h.granted, h.pace.rate, h.dem.used
	s.Idle = max(0, s.Rate-s.Used)
	s.Demand, s.Need, s.Want = h.dem.demand, h.dem.need, h.dem.want
	s.Ceiling, s.Outage = h.thr.At(now), h.outage
	s.Paused = max(0, h.thr.PausedUntil().Sub(now))
	s.Window = h.pace.window
	return s
}

// A Lease is a valid lease of a Holder.
type Lease struct {
	Grant
	// Deadline is the instant, on this process's monotonic clock, after
	// which the holder no longer uses the lease.
	Deadline time.Time
}

// LeasesAt returns the leases valid at now, by partition.
func (h *Holder) LeasesAt(now time.Time) []Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.table.at(now)
}

// refreshLocked recomputes the rate at now from the leases valid then, the
// outage policy and the ceiling, and sets the limiter's rate when it
// changed, waking WaitN callers. An instant earlier than the latest one
// seen counts as that one: a caller holding a stale instant cannot bring
// back a lease that has ended. It returns the number of leases valid at
// that instant. h.mu is held.
func (h *Holder) refreshLocked(now time.Time) (valid int) {
	now, n, horizon := h.table.valid(now)
	leased := float64(n) * h.partCap
	h.granted = h.cfg.Reserved + leased
	rate := h.granted
	if h.outage && h.cfg.Outage == OutageEvenShare && h.even > leased {
		rate = h.cfg.Reserved + h.even
		horizon = time.Time{}
	}
	rate = min(rate, h.thr.At(now))
	if rate == h.pace.rate && horizon.Equal(h.horizon) && !h.pace.unsized() {
		return n
	}
	h.horizon = horizon
	if old, ok := h.pace.set(now, rate); ok {
		// What the bucket offered until now counts at its old limit.
		h.dem.offer(now, old)
	}
	close(h.changed)
	h.changed = make(chan struct{})
	return n
}
