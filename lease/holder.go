package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// OutagePolicy says what capacity a Holder uses while the store cannot be
// reached and its leases have run out.
type OutagePolicy int

const (
	// OutageReserved falls back to the reserved capacity only: safe, the
	// service is never overrun, but the pool is idle.
	OutageReserved OutagePolicy = iota
	// OutageEvenShare falls back to the holder's weighted share of the
	// capacity among the members it saw last, C × weight / total weight
	// (C/N with equal weights), plus its reserved capacity. It keeps work
	// flowing, and overruns the service only when the members seen last
	// are not the ones still running.
	OutageEvenShare
)

// Defaults of Config.
const (
	DefaultTTL        = 3 * time.Second
	DefaultDrift      = 0.01
	DefaultHeadroom   = 0.25
	DefaultHysteresis = 1
	DefaultDrainTime  = 10 * time.Second
	DefaultRateWindow = 2 * time.Second
	DefaultJitter     = 0.1
	DefaultBackoff    = 0.75
)

// Config configures a Holder. Capacity and Partitions are required, and
// must be the same for every member of a service (they share the
// partitions' numbering); TTL should be too.
type Config struct {
	// ID names this holder among the service's members; a random one
	// (not derived from Seed) when empty.
	ID string
	// Capacity is the service's limit C, in units per second, shared by
	// all the members through the leases.
	Capacity float64
	// Partitions is P: the capacity is leased in P partitions of C/P.
	Partitions int
	// Reserved is capacity of this holder's own, in units per second,
	// used at once without leases and through outages. It is not part of
	// Capacity: set Capacity to the service's limit less every member's
	// reserved capacity.
	Reserved float64
	// Weight is this holder's relative share; 1 when 0 or less.
	Weight float64
	// TTL bounds the life of a lease or a presence that is no longer
	// renewed: the store keeps them TTL − Margin/2 after the call that
	// made or renewed them, so a dead member's capacity is free, and
	// taken by the others, within TTL of its death. DefaultTTL when 0.
	TTL time.Duration
	// RenewEvery is the period of the holder's work (heartbeat, renew,
	// acquire, release); TTL/3 when 0. Each period is jittered by
	// ±Jitter.
	RenewEvery time.Duration
	// Jitter is the fraction of RenewEvery by which periods vary at
	// random; DefaultJitter when 0, none when negative.
	Jitter float64
	// Drift is the largest relative difference assumed between the rates
	// of the holder's and the store's clocks; DefaultDrift when 0.
	Drift float64
	// Margin is subtracted from every lease's validity besides the drift:
	// half of it is the time for the caller to use a unit after the
	// limiter admits it, the other half the time by which the store
	// frees a lease before TTL has passed, for the others to take it;
	// TTL/10 when 0.
	Margin time.Duration
	// Headroom is the fraction added to the demand before turning it into
	// partitions, so that arrivals that vary do not wait;
	// DefaultHeadroom when 0, none when negative.
	Headroom float64
	// Hysteresis is how many partitions above its need a holder keeps
	// before releasing; DefaultHysteresis when 0, none when negative.
	Hysteresis int
	// DrainTime is the time in which the demand estimate aims to clear
	// the backlog: demand = arrival rate + backlog / DrainTime;
	// DefaultDrainTime when 0.
	DrainTime time.Duration
	// RateWindow is the time constant with which the arrival-rate
	// estimate decays; it rises four times faster. DefaultRateWindow when
	// 0.
	RateWindow time.Duration
	// Backoff is the factor by which a throttled response lowers the
	// ceiling on the rate (the multiplicative decrease of AIMD);
	// DefaultBackoff when 0 or not below 1.
	Backoff float64
	// Outage is the policy while the store is unreachable.
	Outage OutagePolicy
	// CallTimeout bounds each store call; RenewEvery/2 when 0.
	CallTimeout time.Duration
	// Seed seeds the holder's jitter and partition choice; random when 0.
	Seed uint64
}

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
	// AIMD ceiling on Rate, +Inf when there is none.
	Throttled uint64
	Ceiling   float64
	// Outage reports whether the store is unreachable now; Outages counts
	// the store calls that failed.
	Outage  bool
	Outages uint64
	// StoreCalls counts the store round trips.
	StoreCalls uint64
}

// ErrRunning is returned by Run when the Holder already runs.
var ErrRunning = errors.New("lease: holder already running")

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
//     backlog (SetBacklog, and units waiting in WaitN) ÷ DrainTime; the
//     partitions it needs are ceil(demand / (C/P)), and it wants
//     ceil(demand × (1 + Headroom) / (C/P)), at most P and never above the
//     AIMD ceiling;
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
// While it is below its share and partitions could come to it, or callers
// wait and it has no capacity at all, it looks again after a quarter of the
// period, so a newcomer has its share within two periods. While it wants
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
// Throttled lowers a ceiling on the rate to Backoff (¾) of the current
// rate (at most once per period) and raises it again by one partition per
// period (AIMD); the lowered ceiling lowers the need, so the partitions go back
// to the pool. When the store fails, the leases run out at their
// deadlines and the rate falls to what Config.Outage says.
//
// A Holder is safe for concurrent use; Run must be called once. The zero
// value is not usable: call NewHolder.
type Holder struct {
	c       Store
	cfg     Config
	partCap float64
	lim     *ratelimit.Limiter
	limiter *Limiter
	wake    chan struct{}

	mu      sync.Mutex
	running bool
	leases  map[int]*held
	rate    float64
	granted float64
	horizon time.Time // earliest deadline of the valid leases; zero if none
	latest  time.Time // the latest instant refreshLocked saw
	changed chan struct{}
	ceiling float64
	lastCut time.Time
	outage  bool
	even    float64 // C × weight / total weight, last seen; 0 before any view
	// demand estimation
	requested int64 // units asked since the last tick
	admitted  int64 // units admitted since the last tick
	waiting   int64 // units waiting in WaitN
	backlog   int64
	// lastBacklog is the backlog at the last tick.
	lastBacklog int64
	arrival     float64 // units/s
	used        float64 // units/s
	demand      float64
	need        int
	want        int
	lastTick    time.Time
	st          Stats
}

type held struct {
	epoch    uint64
	deadline time.Time
}

// NewHolder returns a Holder of the service coordinated by c.
func NewHolder(c Store, cfg Config) (*Holder, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil Store", ErrBadArgument)
	}
	if !(cfg.Capacity > 0) || math.IsInf(cfg.Capacity, 0) || cfg.Partitions <= 0 {
		return nil, fmt.Errorf("%w: capacity %v in %d partitions", ErrBadArgument, cfg.Capacity, cfg.Partitions)
	}
	if cfg.Reserved < 0 || math.IsNaN(cfg.Reserved) || math.IsInf(cfg.Reserved, 0) {
		return nil, fmt.Errorf("%w: reserved capacity %v", ErrBadArgument, cfg.Reserved)
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	if cfg.ID == "" {
		cfg.ID = "h-" + strconv.FormatUint(rand.Uint64(), 36)
	}
	if !(cfg.Weight > 0) || math.IsInf(cfg.Weight, 0) {
		cfg.Weight = 1
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.RenewEvery <= 0 {
		cfg.RenewEvery = cfg.TTL / 3
	}
	cfg.Jitter = min(orDefault(cfg.Jitter, DefaultJitter), 0.5)
	if cfg.Drift <= 0 {
		cfg.Drift = DefaultDrift
	}
	if cfg.Margin <= 0 {
		cfg.Margin = cfg.TTL / 10
	}
	cfg.Headroom = orDefault(cfg.Headroom, DefaultHeadroom)
	cfg.Hysteresis = orDefault(cfg.Hysteresis, DefaultHysteresis)
	if cfg.DrainTime <= 0 {
		cfg.DrainTime = DefaultDrainTime
	}
	if cfg.RateWindow <= 0 {
		cfg.RateWindow = DefaultRateWindow
	}
	if !(cfg.Backoff > 0 && cfg.Backoff < 1) {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = cfg.RenewEvery / 2
	}
	h := &Holder{
		c:       c,
		cfg:     cfg,
		partCap: cfg.Capacity / float64(cfg.Partitions),
		wake:    make(chan struct{}, 1),
		leases:  map[int]*held{},
		changed: make(chan struct{}),
		ceiling: math.Inf(1),
	}
	if v := h.validity(); v <= cfg.RenewEvery {
		return nil, fmt.Errorf("%w: a lease valid for %v does not outlive the renewal period %v", ErrBadArgument, v, cfg.RenewEvery)
	}
	h.lim = ratelimit.NewLimiter(0, 0)
	h.limiter = &Limiter{h: h}
	now := time.Now()
	h.mu.Lock()
	h.refreshLocked(now)
	h.mu.Unlock()
	return h, nil
}

// orDefault returns def for 0 (unset), 0 for a negative v (none), and v
// otherwise: the rule of Config's Jitter, Headroom and Hysteresis.
func orDefault[T int | float64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// ID returns the holder's member id.
func (h *Holder) ID() string { return h.cfg.ID }

// Config returns the holder's configuration, with NewHolder's defaults
// filled in.
func (h *Holder) Config() Config { return h.cfg }

// Limiter returns the limiter whose rate follows the holder's leases.
func (h *Holder) Limiter() *Limiter { return h.limiter }

// SetBacklog reports n units waiting to be sent by the caller (a queue's
// length), which counts in the demand besides the arrival rate.
func (h *Holder) SetBacklog(n int) {
	h.mu.Lock()
	h.backlog = int64(max(0, n))
	h.mu.Unlock()
}

// Throttled reports a throttled (429) response from the service; see
// ThrottledAt.
func (h *Holder) Throttled() { h.ThrottledAt(time.Now()) }

// ThrottledAt reports, at now, a throttled response from the service. The
// first one in a renewal period lowers the ceiling of the holder's rate to
// Backoff times the current rate (multiplicative decrease); each period
// then raises it by one partition (additive increase), until the ceiling
// is gone.
func (h *Holder) ThrottledAt(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.st.Throttled++
	if h.rate <= 0 || (!h.lastCut.IsZero() && now.Sub(h.lastCut) < h.cfg.RenewEvery) {
		return
	}
	h.lastCut = now
	h.ceiling = max(1, min(h.ceiling, h.rate)*h.cfg.Backoff)
	h.refreshLocked(now)
}

// Stats returns the holder's figures now.
func (h *Holder) Stats() Stats { return h.StatsAt(time.Now()) }

// StatsAt returns the holder's figures at now.
func (h *Holder) StatsAt(now time.Time) Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.st
	s.Leases = h.refreshLocked(now)
	s.Granted, s.Rate, s.Used = h.granted, h.rate, h.used
	s.Idle = max(0, h.rate-h.used)
	s.Demand, s.Need, s.Want = h.demand, h.need, h.want
	s.Ceiling, s.Outage = h.ceiling, h.outage
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
	var out []Lease
	for p, l := range h.leases {
		if l.deadline.After(now) {
			out = append(out, Lease{Grant: Grant{Partition: p, Epoch: l.epoch}, Deadline: l.deadline})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out
}

// validity is how long after sending a call a lease it grants is used.
func (h *Holder) validity() time.Duration {
	return h.cfg.TTL - time.Duration(float64(h.cfg.TTL)*h.cfg.Drift) - h.cfg.Margin
}

// storeTTL is the lifetime the store gives a lease or a presence, from
// when it receives the call, by its clock: TTL − Margin/2. It exceeds the
// validity by TTL × Drift + Margin/2, so that however the clocks' rates
// differ (up to Drift) a unit admitted before the deadline has Margin/2 to
// be used before the store can lease the partition to another member; and
// it is below TTL, so that the others take a dead member's partitions
// within TTL of its last renewal, round trips included.
func (h *Holder) storeTTL() time.Duration {
	return h.cfg.TTL - h.cfg.Margin/2
}

// refreshLocked recomputes the rate at now from the leases valid then, the
// outage policy and the ceiling, and sets the limiter's rate when it
// changed, waking WaitN callers. An instant earlier than the latest one
// seen counts as that one: a caller holding a stale instant cannot bring
// back a lease that has ended. It returns the number of leases valid at
// that instant. h.mu is held.
func (h *Holder) refreshLocked(now time.Time) (valid int) {
	if now.Before(h.latest) {
		now = h.latest
	}
	h.latest = now
	n := 0
	var horizon time.Time
	for _, l := range h.leases {
		if !l.deadline.After(now) {
			continue
		}
		n++
		if horizon.IsZero() || l.deadline.Before(horizon) {
			horizon = l.deadline
		}
	}
	leased := float64(n) * h.partCap
	h.granted = h.cfg.Reserved + leased
	rate := h.granted
	if h.outage && h.cfg.Outage == OutageEvenShare && h.even > leased {
		rate = h.cfg.Reserved + h.even
		horizon = time.Time{}
	}
	rate = min(rate, h.ceiling)
	if rate == h.rate && horizon.Equal(h.horizon) {
		return n
	}
	h.horizon = horizon
	if rate != h.rate {
		h.rate = rate
		burst := burstFor(rate)
		h.lim.SetLimitAt(now, ratelimit.Limit(rate))
		if old := h.lim.Burst(); burst > old {
			// New capacity starts empty: the tokens of a larger burst
			// are earned at the new rate, not given at once.
			h.lim.SetBurstAt(now, burst)
			h.lim.ReserveN(now, burst-old)
		} else {
			h.lim.SetBurstAt(now, burst)
		}
	}
	close(h.changed)
	h.changed = make(chan struct{})
	return n
}

// Run works for the holder until ctx is done, then releases every lease
// and leaves; it returns the error of that last release, if any. Store
// errors while running are counted (Stats.Outages), not returned.
func (h *Holder) Run(ctx context.Context) error {
	h.mu.Lock()
	if h.running {
		h.mu.Unlock()
		return ErrRunning
	}
	h.running = true
	h.mu.Unlock()
	rng := rand.New(rand.NewPCG(h.cfg.Seed, 2))
	tm := time.NewTimer(0)
	defer tm.Stop()
	due := time.Now() // when tm fires
	for {
		select {
		case <-ctx.Done():
			return h.shutdown(ctx)
		case <-h.wake:
			// A caller waits with no capacity: tick now, or a quarter
			// period after the last tick, unless tm fires sooner.
			h.mu.Lock()
			at := h.lastTick.Add(h.cfg.RenewEvery / 4)
			h.mu.Unlock()
			if d := time.Until(at); d > 0 {
				if at.Before(due) {
					tm.Reset(d)
					due = at
				}
				continue
			}
		case <-tm.C:
		}
		d := h.tick(ctx, rng)
		if d == 0 {
			d = h.cfg.RenewEvery
			d += time.Duration((rng.Float64()*2 - 1) * h.cfg.Jitter * float64(d))
		}
		tm.Reset(d)
		due = time.Now().Add(d)
	}
}

// shutdown ends Run: it stops using every lease, then releases them all
// and leaves, within one CallTimeout counted after ctx is done.
func (h *Holder) shutdown(ctx context.Context) error {
	h.mu.Lock()
	all := h.grantsLocked()
	clear(h.leases)
	h.refreshLocked(time.Now())
	h.st.Releases += uint64(len(all))
	h.running = false
	h.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.CallTimeout)
	defer cancel()
	var errs []error
	if len(all) > 0 {
		if err := h.c.Release(cctx, h.cfg.ID, all); err != nil {
			errs = append(errs, fmt.Errorf("lease: release on shutdown: %w", err))
		}
	}
	if err := h.c.Leave(cctx, h.cfg.ID); err != nil {
		errs = append(errs, fmt.Errorf("lease: leave on shutdown: %w", err))
	}
	return errors.Join(errs...)
}

// estimateLocked updates the demand estimate at now, and the ceiling, and
// returns the partitions the demand fills and those with the headroom.
// h.mu is held.
func (h *Holder) estimateLocked(now time.Time) (need, want int) {
	if dt := now.Sub(h.lastTick).Seconds(); !h.lastTick.IsZero() && dt > 0 {
		win := h.cfg.RateWindow.Seconds()
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
		grown := max(0, h.backlog-h.lastBacklog)
		h.arrival = ewma(h.arrival, float64(h.requested+grown)/dt)
		h.used = ewma(h.used, float64(h.admitted)/dt)
		h.requested, h.admitted = 0, 0
		// Additive increase of the ceiling: one partition a period.
		if !math.IsInf(h.ceiling, 1) {
			h.ceiling += h.partCap * dt / h.cfg.RenewEvery.Seconds()
			if h.ceiling >= h.cfg.Capacity+h.cfg.Reserved {
				h.ceiling = math.Inf(1)
			}
		}
	}
	h.lastTick = now
	h.lastBacklog = h.backlog
	h.demand = h.arrival + float64(h.backlog+h.waiting)/h.cfg.DrainTime.Seconds()
	parts := func(d float64) int {
		d = min(d, h.ceiling) - h.cfg.Reserved
		if d <= 0 {
			return 0
		}
		return min(h.cfg.Partitions, int(math.Ceil(d/h.partCap-1e-9)))
	}
	h.need, h.want = parts(h.demand), parts(h.demand*(1+h.cfg.Headroom))
	return h.need, h.want
}

// tick does one period's work, a round, and returns how long to wait for
// the next one: 0 for a normal period.
//
// A round sends up to four store calls, in this order and never with h.mu
// held: the heartbeat, which publishes the demand and reads the view; the
// release of the leases the plan gives up; the renewal of those it keeps;
// the acquisition of free partitions. h.mu is taken once before the
// heartbeat, to estimate the demand it publishes, and once after each
// call, to apply what the call returned as soon as it returns:
//
//   - after the heartbeat, to plan from the view and the holder's leases,
//     and to stop using the leases the plan releases before the release is
//     sent: the store may lease them to another member as soon as the
//     release reaches it;
//   - after the release, only to count it: when it fails the outage takes
//     effect at once, as after any call that fails (Config.Outage);
//   - after the renewal, so that the new deadlines, and the lost leases,
//     take effect before the acquisition is sent: capacity does not lapse,
//     nor a lost lease stay in use, while that call is in flight;
//   - after the acquisition, to use what it granted.
func (h *Holder) tick(ctx context.Context, rng *rand.Rand) time.Duration {
	me := h.startRound()
	p, recv, ok := h.heartbeat(ctx, me, rng)
	if !ok {
		return 0
	}
	if len(p.release) > 0 {
		h.release(ctx, p.release)
	}
	if len(p.renew) > 0 {
		h.renew(ctx, p.renew)
	}
	contended := false
	if len(p.acquire) > 0 {
		contended = h.acquire(ctx, p.acquire)
	}
	return h.nextLook(p, contended, recv, rng)
}

// startRound estimates the demand at the start of a round and returns the
// entry the heartbeat publishes for the holder.
func (h *Holder) startRound() Member {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	need, want := h.estimateLocked(now)
	h.refreshLocked(now)
	return Member{ID: h.cfg.ID, Weight: h.cfg.Weight, Need: need, Want: want}
}

// heartbeat publishes me and reads the view; then it plans the round from
// the view and stops using the leases the plan releases. It returns the
// plan and when the view arrived, or false when the call failed (the
// round ends there).
func (h *Holder) heartbeat(ctx context.Context, me Member, rng *rand.Rand) (p plan, recv time.Time, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	view, err := h.c.Heartbeat(cctx, me, h.storeTTL(), h.cfg.Partitions)
	cancel()
	recv = time.Now()

	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.recordLocked(ctx, err) {
		return plan{}, recv, false
	}
	h.outage = false
	members := withSelf(view.Members, me)
	p = h.planLocked(me, members, view.Partitions, rng)
	// The even share of the capacity among the members seen, for
	// OutageEvenShare.
	var totalW float64
	for _, m := range members {
		totalW += max(0, m.Weight)
	}
	if totalW > 0 {
		h.even = h.cfg.Capacity * h.cfg.Weight / totalW
	}
	// Stop using what is released before the store frees it.
	for _, g := range p.release {
		delete(h.leases, g.Partition)
	}
	h.st.Releases += uint64(len(p.release))
	h.refreshLocked(time.Now())
	return p, recv, true
}

// release gives leases, no longer used, back to the store. Its outcome
// counts only in the stats and the outage: if it fails, the leases expire
// in the store by themselves.
func (h *Holder) release(ctx context.Context, leases []Grant) {
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	err := h.c.Release(cctx, h.cfg.ID, leases)
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	h.recordLocked(ctx, err)
}

// renew renews leases. Each one renewed is valid for validity from when
// the call was sent; each one refused is lost, and dropped. When the call
// fails, nothing changes: the leases run out at their deadlines.
func (h *Holder) renew(ctx context.Context, leases []Grant) {
	sent := time.Now()
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	ok, err := h.c.Renew(cctx, h.cfg.ID, leases, h.storeTTL())
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.recordLocked(ctx, err) {
		return
	}
	dl := sent.Add(h.validity())
	for i, g := range leases {
		// Only Run's goroutine changes h.leases, so every lease sent is
		// still there; the check keeps an answer from ever applying to
		// another epoch of the partition.
		l := h.leases[g.Partition]
		if l == nil || l.epoch != g.Epoch {
			continue
		}
		if ok[i] {
			l.deadline = dl
			h.st.Renewals++
		} else {
			delete(h.leases, g.Partition)
			h.st.Losses++
		}
	}
	h.refreshLocked(time.Now())
}

// acquire asks the store for the free partitions parts; each one granted
// is valid for validity from when the call was sent. It reports whether
// some were not granted: other members took them since the view.
func (h *Holder) acquire(ctx context.Context, parts []int) (contended bool) {
	sent := time.Now()
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	gs, err := h.c.Acquire(cctx, h.cfg.ID, parts, h.storeTTL())
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.recordLocked(ctx, err) {
		return false
	}
	dl := sent.Add(h.validity())
	for _, g := range gs {
		h.leases[g.Partition] = &held{epoch: g.Epoch, deadline: dl}
	}
	h.st.Acquisitions += uint64(len(gs))
	h.refreshLocked(time.Now())
	return len(gs) < len(parts)
}

// recordLocked counts a store call that returned err. A call that failed
// while the holder runs (not because ctx is done) marks an outage, and the
// rate is refreshed at once for the outage policy to apply. It reports
// whether the call succeeded. h.mu is held.
func (h *Holder) recordLocked(ctx context.Context, err error) (ok bool) {
	h.st.StoreCalls++
	if err == nil {
		return true
	}
	if ctx.Err() == nil {
		h.st.Outages++
		h.outage = true
		h.refreshLocked(time.Now())
	}
	return false
}

// nextLook returns how long after a round of plan p to look again: 0 for
// a normal period. contended reports that partitions seen free were taken
// by another member before the acquisition; recv is when the view
// arrived.
func (h *Holder) nextLook(p plan, contended bool, recv time.Time, rng *rand.Rand) time.Duration {
	var next time.Duration
	if p.starving {
		next = h.cfg.RenewEvery / 4
	}
	if contended {
		// Partitions seen free were taken by another member since the
		// view: often one that looked at the same instant, as holders
		// do when a dead member's leases expire. Look again at once,
		// after a random pause so that those who collided do not look
		// in step: the view shows who won, and any partition still
		// free. Each such look follows a partition taken by another, so
		// they are few.
		d := time.Duration((0.01 + 0.04*rng.Float64()) * float64(h.cfg.RenewEvery))
		if next == 0 || d < next {
			next = max(time.Millisecond, d)
		}
	}
	if p.stale > 0 {
		// A partition whose owner missed a renewal frees at the latest
		// stale after the view was made, by the store's clock; allow for
		// the drift and the store's millisecond rounding.
		at := recv.Add(p.stale + time.Duration(float64(p.stale)*h.cfg.Drift) + 2*time.Millisecond)
		if d := max(time.Millisecond, time.Until(at)); next == 0 || d < next {
			next = d
		}
	}
	return next
}

// A plan is what a round does after the heartbeat.
type plan struct {
	// release and renew share the holder's leases: those given up and
	// those kept.
	release, renew []Grant
	// acquire lists free partitions to ask for.
	acquire []int
	// starving says to look again after a quarter of a period.
	starving bool
	// stale is, when the holder wants more partitions, the shortest TTL
	// left of a partition whose owner has missed a renewal; 0 if none.
	stale time.Duration
}

// withSelf returns the members of a view with the holder's own entry as it
// has just published it, me: in the place of the store's copy, or
// appended if the view lacks it. It may overwrite elements of members.
func withSelf(members []Member, me Member) []Member {
	found := false
	for i := range members {
		if members[i].ID == me.ID {
			members[i], found = me, true
		}
	}
	if !found {
		members = append(members, me)
	}
	return members
}

// planLocked decides, from the view (members, with the holder's own entry
// me, and the partitions' states), what the holder releases, renews and
// acquires. h.mu is held.
func (h *Holder) planLocked(me Member, members []Member, parts []PartitionState, rng *rand.Rand) plan {
	want := me.Want
	c := h.censusLocked(me.ID, members, parts)
	var out plan
	// Release above need + hysteresis, and yield above the aim while
	// others lack partitions that are not free; the leases released are
	// those that run out first.
	mine := h.grantsLocked()
	keep := min(len(mine), want+h.cfg.Hysteresis)
	if short := c.deficit - len(c.free); short > 0 && keep > c.aim {
		keep = max(c.aim, keep-short)
	}
	out.release, out.renew = mine[:len(mine)-keep], mine[len(mine)-keep:]
	// Acquire free partitions up to the need, or the aim while others
	// lack theirs, starting at a random offset among the free ones.
	limit := want
	if c.deficit > 0 {
		limit = min(want, c.aim)
	}
	if k := min(limit-keep, len(c.free)); k > 0 {
		off := rng.IntN(len(c.free))
		for i := range k {
			out.acquire = append(out.acquire, c.free[(off+i)%len(c.free)])
		}
	}
	myDeficit := min(want, c.aim) - keep - len(out.acquire)
	out.starving = myDeficit > 0 && (c.above || len(c.free) > len(out.acquire))
	// Callers wait with no capacity at all: look again soon, whatever
	// the estimate said (it may not have seen them yet).
	if h.waiting > 0 && keep+len(out.acquire) == 0 && h.cfg.Reserved == 0 {
		out.starving = true
	}
	if want > keep+len(out.acquire) {
		out.stale = h.staleTTL(me.ID, parts)
	}
	return out
}

// A census is what a plan needs to know of the view besides the holder's
// own leases.
type census struct {
	free    []int // the free partitions, in order
	aim     int   // the holder's share, in partitions
	deficit int   // the partitions the other members lack to reach theirs
	above   bool  // whether another member holds more than its share
}

// censusLocked counts, in the view, the free partitions and every member's
// share and holdings. A partition the holder leases counts as its own
// whatever the view says (until a renewal says otherwise). h.mu is held.
func (h *Holder) censusLocked(id string, members []Member, parts []PartitionState) census {
	var c census
	heldBy := map[string]int{}
	for i, ps := range parts {
		_, ours := h.leases[i]
		switch {
		case ours:
		case ps.Owner == "":
			c.free = append(c.free, i)
		case ps.Owner != id:
			heldBy[ps.Owner]++
		}
	}
	aims := shares(members, h.cfg.Partitions)
	for i, m := range members {
		if m.ID == id {
			c.aim = aims[i]
			continue
		}
		c.deficit += max(0, aims[i]-heldBy[m.ID])
		if heldBy[m.ID] > aims[i] {
			c.above = true
		}
	}
	return c
}

// grantsLocked returns the holder's leases, valid or not, in the order of
// their deadlines (then of their partitions). h.mu is held.
func (h *Holder) grantsLocked() []Grant {
	gs := make([]Grant, 0, len(h.leases))
	for p, l := range h.leases {
		gs = append(gs, Grant{Partition: p, Epoch: l.epoch})
	}
	sort.Slice(gs, func(i, j int) bool {
		a, b := h.leases[gs[i].Partition], h.leases[gs[j].Partition]
		if !a.deadline.Equal(b.deadline) {
			return a.deadline.Before(b.deadline)
		}
		return gs[i].Partition < gs[j].Partition
	})
	return gs
}

// staleTTL returns the shortest TTL left of a partition held by another
// member than id that has missed a renewal, 0 if none.
func (h *Holder) staleTTL(id string, parts []PartitionState) time.Duration {
	// A lease renewed on time has more than the store's TTL less a
	// period (and a call) left.
	fresh := h.storeTTL() - time.Duration(float64(h.cfg.RenewEvery)*(1+h.cfg.Jitter)) - h.cfg.CallTimeout
	var stale time.Duration
	for _, ps := range parts {
		if ps.Owner != "" && ps.Owner != id && ps.TTL > 0 && ps.TTL < fresh && (stale == 0 || ps.TTL < stale) {
			stale = ps.TTL
		}
	}
	return stale
}
