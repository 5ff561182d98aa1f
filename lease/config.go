package lease

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
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
	// flowing, and is within C only while the store is out for every
	// member and the members seen last are the ones still running: when
	// the store is out for this holder alone
	// (a partition), the others take its partitions once its leases
	// expire, and the service receives up to C plus this share (measured
	// between hosts: 264–278 a second of 200 with three holders,
	// docs/faults.md).
	OutageEvenShare
)

// Defaults of Options.
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

// Options configure a Holder. Capacity and Partitions are required, and
// must be the same for every member of a service (they share the
// partitions' numbering); TTL should be too.
type Options struct {
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

// withDefaults checks the configuration and returns it with NewHolder's
// defaults filled in.
func (cfg Options) withDefaults() (Options, error) {
	if !(cfg.Capacity > 0) || math.IsInf(cfg.Capacity, 0) || cfg.Partitions <= 0 {
		return cfg, fmt.Errorf("%w: capacity %v in %d partitions", ErrBadArgument, cfg.Capacity, cfg.Partitions)
	}
	if cfg.Reserved < 0 || math.IsNaN(cfg.Reserved) || math.IsInf(cfg.Reserved, 0) {
		return cfg, fmt.Errorf("%w: reserved capacity %v", ErrBadArgument, cfg.Reserved)
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
	if v := cfg.validity(); v <= cfg.RenewEvery {
		return cfg, fmt.Errorf("%w: a lease valid for %v does not outlive the renewal period %v", ErrBadArgument, v, cfg.RenewEvery)
	}
	return cfg, nil
}

// validity is how long after sending a call a lease it grants is used.
func (cfg Options) validity() time.Duration {
	return cfg.TTL - time.Duration(float64(cfg.TTL)*cfg.Drift) - cfg.Margin
}

// storeTTL is the lifetime the store gives a lease or a presence, from
// when it receives the call, by its clock: TTL − Margin/2. It exceeds the
// validity by TTL × Drift + Margin/2, so that however the clocks' rates
// differ (up to Drift) a unit admitted before the deadline has Margin/2 to
// be used before the store can lease the partition to another member; and
// it is below TTL, so that the others take a dead member's partitions
// within TTL of its last renewal, round trips included.
func (cfg Options) storeTTL() time.Duration {
	return cfg.TTL - cfg.Margin/2
}

// orDefault returns def for 0 (unset), 0 for a negative v (none), and v
// otherwise: the rule of Options.Jitter, Headroom and Hysteresis.
func orDefault[T int | float64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}
