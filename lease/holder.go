package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
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
	DefaultWindow     = time.Second
	DefaultMaxPause   = 30 * time.Second
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
	// acquire, release); TTL/3 when 0. Each period is shortened at
	// random by up to Jitter of it, so that no period is longer.
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
	// Backoff is the lowest factor by which one cut lowers the ceiling
	// on the rate when throttled responses repeat (a cut is in
	// proportion to the overshoot, and never deeper than this);
	// DefaultBackoff when 0 or not below 1.
	Backoff float64
	// Recovery is the time in which a lowered ceiling climbs back to the
	// rate it was cut from, once throttled responses stop; 2 × RenewEvery
	// when 0.
	Recovery time.Duration
	// MaxPause bounds the pause a throttled response's retry hint asks
	// for; DefaultMaxPause when 0.
	MaxPause time.Duration
	// Window is the length of the downstream's counting window: the
	// Limiter paces so that no window of this length, wherever it
	// starts, receives more than the leased capacity (see Limiter).
	// DefaultWindow (one second) when 0; a RateLimit-Policy field's w
	// replaces it (Observe). Negative: no window pacing, a burst of a
	// tenth of the rate instead.
	Window time.Duration
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
// their deadlines and the rate falls to what Config.Outage says.
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
	outage  bool
	// pacing: the window and the guard on it; pace is the limiter's
	// limit, -1 to force setting it again.
	window time.Duration
	guard  windowLog
	pace   float64
	// the throttle controller (see ThrottledAfterAt)
	thr  retry.Ceiling
	even float64 // C × weight / total weight, last seen; 0 before any view
	// demand estimation
	requested int64 // units asked since the last tick
	admitted  int64 // units admitted since the last tick
	waiting   int64 // units waiting in WaitN
	backlog   int64
	// lastBacklog is the backlog at the last tick.
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
	if cfg.Recovery <= 0 {
		cfg.Recovery = 2 * cfg.RenewEvery
	}
	if cfg.MaxPause <= 0 {
		cfg.MaxPause = DefaultMaxPause
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
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
		window:  max(0, cfg.Window),
		pace:    -1,
	}
	h.thr = retry.Ceiling{Backoff: cfg.Backoff, Recovery: cfg.Recovery, MaxPause: cfg.MaxPause}
	if v := h.validity(); v <= cfg.RenewEvery {
		return nil, fmt.Errorf("%w: a lease valid for %v does not outlive the renewal period %v", ErrBadArgument, v, cfg.RenewEvery)
	}
	h.lim = ratelimit.NewLimiter(0, 0)
	h.limiter = &Limiter{h: h}
	now := time.Now()
	h.mu.Lock()
	h.guard.reset(h.window, now, h.rate)
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

// Throttled reports a throttled (429) response from the service that
// gave no retry hint; see ThrottledAfterAt.
func (h *Holder) Throttled() { h.ThrottledAfterAt(time.Now(), 0) }

// ThrottledAt is Throttled at now.
func (h *Holder) ThrottledAt(now time.Time) { h.ThrottledAfterAt(now, 0) }

// ThrottledAfter reports a throttled (429) response from the service that
// asked to wait d before trying again; see ThrottledAfterAt.
func (h *Holder) ThrottledAfter(d time.Duration) { h.ThrottledAfterAt(time.Now(), d) }

// ThrottledAfterAt reports, at now, a throttled (429) response from the
// service whose retry hint asked to wait d (none when d ≤ 0): the input of
// the throttle controller.
//
//   - A hint pauses the Limiter until now + d (at most MaxPause): it
//     admits nothing until then, and the capacity is not cut.
//   - The 429s that come back until the pause has ended and the requests
//     in flight at the first one have been answered (a tenth of a period
//     later) are one episode: they were sent before the holder could
//     react, and cut nothing.
//   - A 429 after an episode, within two periods (or two windows) of its
//     end, is a repeat: the pause did not suffice, and the ceiling on the
//     rate is cut in proportion to the overshoot seen, the last episode's
//     429s over the units admitted in the last window, never below
//     Backoff times the rate. It starts a new episode.
//   - Once cut, the ceiling climbs back linearly to the rate it was cut
//     from in Recovery (two periods), and is then gone.
//
// So a lone 429, or one window that overshot, costs the pause it asks
// for; a downstream whose real limit is below the leased capacity sees
// its 429s repeat and the ceiling settle in a step or two at what it
// accepts.
func (h *Holder) ThrottledAfterAt(now time.Time, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.st.Throttled++
	paused := h.thr.PausedUntil()
	grace, repeat := h.cfg.RenewEvery/10, max(2*h.cfg.RenewEvery, 2*h.window)
	if h.thr.Throttled(now, d, grace, repeat, h.rate, func() float64 { return float64(h.guard.count(now)) }) {
		h.st.Cuts++
	}
	if h.thr.PausedUntil().After(paused) {
		h.st.Pauses++
	}
	h.refreshLocked(now)
}

// pauseLocked pauses the Limiter until now + d, at most MaxPause; d ≤ 0
// does nothing. h.mu is held.
func (h *Holder) pauseLocked(now time.Time, d time.Duration) {
	if h.thr.Pause(now, d) {
		h.st.Pauses++
	}
}

// ceilingLocked returns the ceiling at now, climbing back after a cut.
// h.mu is held.
func (h *Holder) ceilingLocked(now time.Time) float64 { return h.thr.At(now) }

// Observe reports a response of the service; see ObserveAt.
func (h *Holder) Observe(status int, header map[string][]string) {
	h.ObserveAt(time.Now(), status, header)
}

// ObserveAt reports, at now, a response of the service with its status
// code and header fields (an http.Header): a 429 is ThrottledAfterAt with
// the retry hint that limitheader.RetryDelay finds (Retry-After,
// Retry-After-Ms, X-Ms-Retry-After-Ms, RateLimit's t, ...); a 503 with a
// hint pauses the Limiter as long, and counts as no throttling (overload
// is not quota); and a RateLimit-Policy field sets the window the Limiter
// paces to, from the w of its policy of lowest quota per second.
func (h *Holder) ObserveAt(now time.Time, status int, header map[string][]string) {
	if vs := header["Ratelimit-Policy"]; len(vs) > 0 {
		if w := policyWindow(strings.Join(vs, ", ")); w > 0 {
			h.SetWindowAt(now, w)
		}
	}
	const tooMany, unavailable = 429, 503
	if status != tooMany && status != unavailable {
		return
	}
	d, _ := limitheader.RetryDelay(header, now)
	if status == tooMany {
		h.ThrottledAfterAt(now, d)
		return
	}
	h.mu.Lock()
	h.pauseLocked(now, d)
	h.mu.Unlock()
}

// maxWindow bounds the window a RateLimit-Policy field may set.
const maxWindow = 24 * time.Hour

// policyWindow returns the window of the policy of lowest quota per
// second in a RateLimit-Policy value, 0 if none has one (or it is
// malformed).
func policyWindow(v string) time.Duration {
	items, err := limitheader.ParseRateLimitPolicy(v)
	if err != nil {
		return 0
	}
	var w time.Duration
	best := math.Inf(1)
	for _, it := range items {
		if it.Window <= 0 {
			continue
		}
		if r := float64(it.Quota) / float64(it.Window); r < best {
			best = r
			w = time.Duration(min(it.Window, int64(maxWindow/time.Second))) * time.Second
		}
	}
	return w
}

// SetWindow sets the downstream's window that the Limiter paces to (see
// Config.Window); d ≤ 0 stops window pacing.
func (h *Holder) SetWindow(d time.Duration) { h.SetWindowAt(time.Now(), d) }

// SetWindowAt is SetWindow at now.
func (h *Holder) SetWindowAt(now time.Time, d time.Duration) {
	d = min(max(0, d), maxWindow)
	h.mu.Lock()
	defer h.mu.Unlock()
	if d == h.window {
		return
	}
	h.window = d
	h.guard.reset(d, now, h.rate)
	h.pace = -1
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
	s.Ceiling, s.Outage = h.ceilingLocked(now), h.outage
	s.Paused = max(0, h.thr.PausedUntil().Sub(now))
	s.Window = h.window
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
	rate = min(rate, h.ceilingLocked(now))
	if rate == h.rate && horizon.Equal(h.horizon) && h.pace >= 0 {
		return n
	}
	h.horizon = horizon
	if pace, burst := pacing(rate, h.window); pace != h.pace || rate != h.rate {
		h.offerLocked(now)
		if h.window > 0 {
			h.guard.setRate(now, rate)
		}
		h.rate, h.pace = rate, pace
		h.lim.SetLimitAt(now, ratelimit.Limit(pace))
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
	// Members that start together cannot see one another on their first
	// look: during its first period the holder looks every tenth of one,
	// so that the member that took the idle capacity yields to the
	// others within that, notified or not.
	firstPeriod := due.Add(h.cfg.RenewEvery)
	// soon asks for a look now, or a fiftieth of a period after the last
	// one (so that a burst of wake-ups is one look), unless tm fires
	// sooner; it reports whether that is later than now.
	soon := func() (later bool) {
		h.mu.Lock()
		at := h.lastTick.Add(h.cfg.RenewEvery / 50)
		h.mu.Unlock()
		d := time.Until(at)
		if d <= 0 {
			return false
		}
		if at.Before(due) {
			tm.Reset(d)
			due = at
		}
		return true
	}
	// The store's notifications, when it sends them (Notifier); nil
	// while not watching, and watched again after every look until a
	// watch succeeds. Watch runs in a goroutine of Run's, one at a time,
	// so that a store that does not answer never holds up the renewals;
	// it ends when Watch returns (at the latest when ctx is done).
	var notes <-chan string
	watched := make(chan (<-chan string), 1)
	watching := false
	watcher, canWatch := h.c.(Notifier)
	watch := func() {
		if !canWatch || notes != nil || watching || ctx.Err() != nil {
			return
		}
		watching = true
		go func() {
			c, err := watcher.Watch(ctx)
			if err != nil {
				c = nil
			}
			watched <- c
		}()
	}
	watch()
	for {
		select {
		case <-ctx.Done():
			return h.shutdown(ctx)
		case <-h.wake:
			// A caller waits with no capacity.
			if soon() {
				continue
			}
		case c := <-watched:
			// A watch begins: what happened before it was missed, so
			// look once it is in place.
			watching, notes = false, c
			if c == nil || soon() {
				continue
			}
		case id, ok := <-notes:
			// Another member released partitions, left, came or
			// needs more: look at once.
			if !ok {
				notes = nil
				continue
			}
			if id == h.cfg.ID || soon() {
				continue
			}
		case <-tm.C:
		}
		d := h.tick(ctx, rng)
		if d == 0 {
			d = h.cfg.RenewEvery
			d -= time.Duration(rng.Float64() * h.cfg.Jitter * float64(d))
		}
		if time.Now().Before(firstPeriod) {
			d = min(d, h.cfg.RenewEvery/10)
		}
		tm.Reset(d)
		due = time.Now().Add(d)
		watch()
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
		// Callers that had to wait on a limiter they used to the full
		// (or that found no capacity at all) show that the demand is
		// at least the rate, by how much nobody knows: want the whole
		// fair share at once, rather than grow by the headroom every
		// period. Decided on looks at least half a period apart, so
		// that looks between periods (notifications, waiters) do not
		// judge on a few milliseconds.
		h.offerLocked(now)
		if judged := now.Sub(h.judged); judged >= h.cfg.RenewEvery/2 {
			h.judged = now
			waited := h.blocked > 0 || h.waiting > 0
			// A limiter used to the full admits all it offered but
			// the tokens left at the end (a burst at most).
			slack := float64(h.lim.Burst())
			h.saturated = waited && float64(h.satAdmitted)+slack >= 0.995*h.offered
			h.satAdmitted, h.blocked, h.offered = 0, 0, 0
		}
	}
	if h.lastTick.IsZero() {
		h.judged = now
	}
	h.lastTick = now
	h.lastBacklog = h.backlog
	h.demand = h.arrival + float64(h.backlog+h.waiting)/h.cfg.DrainTime.Seconds()
	ceiling := h.ceilingLocked(now)
	// The partitions whose rate, as the Limiter paces it, covers d.
	parts := func(d float64) int {
		d = min(d, ceiling)
		if math.IsInf(d, 1) {
			return h.cfg.Partitions
		}
		for k := 0; k < h.cfg.Partitions; k++ {
			if pace, _ := pacing(h.cfg.Reserved+float64(k)*h.partCap, h.window); pace >= d-1e-9 {
				return k
			}
		}
		return h.cfg.Partitions
	}
	h.need, h.want = parts(h.demand), parts(h.demand*(1+h.cfg.Headroom))
	switch {
	case h.saturated:
		h.need, h.want = h.cfg.Partitions, h.cfg.Partitions
	case h.waiting > 0 && (h.rate <= 0 || h.lim.TokensAt(now) < 1):
		// Callers wait now on an empty bucket: at least the even
		// share, at once (the estimate has not seen them yet).
		even := h.cfg.Partitions
		if h.even > 0 {
			even = min(even, int(math.Ceil(h.even/h.partCap-1e-9)))
		}
		h.need = max(h.need, even)
		h.want = max(h.want, h.need)
	}
	return h.need, h.want
}

// offerLocked adds to offered the units the limiter offered since
// offeredAt, at its limit. h.mu is held.
func (h *Holder) offerLocked(now time.Time) {
	if h.offeredAt.IsZero() {
		h.offeredAt = now
		return
	}
	if dt := now.Sub(h.offeredAt); dt > 0 {
		h.offered += max(0, h.pace) * dt.Seconds()
		h.offeredAt = now
	}
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
		next = h.cfg.RenewEvery / 10
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
