package adaptive

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// A Feature is a named optional feature that a Guard switches off under
// load: off once the load level reaches Off, on again once it falls to On
// or below (On < Off; the gap is the hysteresis that keeps a feature from
// flapping).
type Feature struct {
	Name    string
	Off, On float64
}

// GuardOptions configure a Guard.
type GuardOptions struct {
	// Concurrency configures the concurrency limiter (required: Max).
	Concurrency ConcurrencyOptions
	// Shedder configures SLO-driven shedding; nil means none.
	Shedder *ShedderOptions
	// Features are the features the load level switches (names unique
	// and non-empty, 0 <= On < Off).
	Features []Feature
}

// A Guard is the entry point an edge uses: an SLO Shedder (optional) in
// front of a Concurrency, and named features switched by the load level.
// A request is first offered to the Shedder, which refuses a fraction of
// the lowest priorities as the latency quantile approaches its objective;
// what it lets through takes a slot of the Concurrency, whose refusals the
// Shedder counts as overload, so that under sustained overload the load is
// shed by priority in front rather than by arrival order at the limit.
//
// A Guard is safe for concurrent use; it must not be copied. The zero
// value admits nothing; use NewGuard.
type Guard struct {
	l        *Concurrency
	s        *Shedder
	features map[string]*featureState
	names    []string
}

type featureState struct {
	f  Feature
	on atomic.Bool
}

// NewGuard returns a Guard with the given options, or an error naming the
// first invalid one.
func NewGuard(opt GuardOptions) (*Guard, error) {
	l, err := NewConcurrency(opt.Concurrency)
	if err != nil {
		return nil, err
	}
	g := &Guard{l: l, features: make(map[string]*featureState, len(opt.Features))}
	if opt.Shedder != nil {
		if g.s, err = NewShedder(*opt.Shedder); err != nil {
			return nil, err
		}
	}
	for _, f := range opt.Features {
		switch {
		case f.Name == "":
			return nil, fmt.Errorf("adaptive: a Feature has no name")
		case g.features[f.Name] != nil:
			return nil, fmt.Errorf("adaptive: Feature %q is given twice", f.Name)
		case !(f.On >= 0 && f.On < f.Off) || math.IsInf(f.Off, 0):
			return nil, fmt.Errorf("adaptive: Feature %q: want 0 <= On < Off, finite; have On %v, Off %v", f.Name, f.On, f.Off)
		}
		st := &featureState{f: f}
		st.on.Store(true)
		g.features[f.Name] = st
		g.names = append(g.names, f.Name)
	}
	return g, nil
}

// Concurrency returns the Guard's Concurrency.
func (g *Guard) Concurrency() *Concurrency { return g.l }

// Shedder returns the Guard's Shedder, or nil.
func (g *Guard) Shedder() *Shedder { return g.s }

// TryAcquireAt admits a request of priority p at now, or refuses it
// (ReasonShed or ReasonLimit); it never waits and does not allocate.
func (g *Guard) TryAcquireAt(now time.Time, p priority.Priority) (Permit, Refusal) {
	if g.l == nil {
		return Permit{}, Refusal{Reason: ReasonLimit, Priority: p, RetryAfter: MaxRetryAfter}
	}
	if g.s != nil {
		if r := g.s.AllowAt(now, p); r.Refused() {
			return Permit{}, r
		}
	}
	pm, r := g.l.TryAcquireAt(now, p)
	if r.Refused() {
		if g.s != nil {
			g.s.OverloadedAt(now)
		}
		return pm, r
	}
	pm.s = g.s
	return pm, r
}

// Acquire admits a request of the priority ctx carries, waiting in the
// Concurrency's queue if it has one; see Concurrency.Acquire. A refusal is a
// Refusal error (ReasonShed from the Shedder, or the Concurrency's).
func (g *Guard) Acquire(ctx context.Context) (Permit, error) {
	if g.l == nil {
		return Permit{}, Refusal{Reason: ReasonLimit, Priority: priority.FromContext(ctx), RetryAfter: MaxRetryAfter}
	}
	p, d := priority.FromContext(ctx), time.Since(g.l.epoch)
	if g.s != nil {
		if r := g.s.AllowAt(g.l.epoch.Add(d), p); r.Refused() {
			return Permit{}, r
		}
	}
	pm, err := g.l.acquire(ctx, p, d)
	if err != nil {
		if _, ok := err.(Refusal); ok && g.s != nil {
			g.s.OverloadedAt(time.Now())
		}
		return pm, err
	}
	pm.s = g.s
	return pm, nil
}

// Level returns the load level: the larger of the Concurrency's (the share of
// the limit in use, above 1 while it refuses) and the Shedder's (the
// latency quantile over the objective, plus the fraction shed).
func (g *Guard) Level() float64 {
	if g.l == nil {
		return 0
	}
	lv := g.l.Stats().Level
	if g.s != nil {
		lv = max(lv, g.s.Level())
	}
	return lv
}

// Enabled reports whether the named feature is on at the current load
// level, switching it as its thresholds say. A name that is not one of
// GuardOptions.Features is always enabled. It does not allocate.
func (g *Guard) Enabled(name string) bool {
	st := g.features[name]
	if st == nil {
		return true
	}
	return st.update(g.Level())
}

// update switches the feature at level lv and returns whether it is on.
func (st *featureState) update(lv float64) bool {
	on := st.on.Load()
	switch {
	case on && lv >= st.f.Off:
		st.on.CompareAndSwap(true, false)
		return false
	case !on && lv <= st.f.On:
		st.on.CompareAndSwap(false, true)
		return true
	}
	return on
}

// Stats is a snapshot of a Guard: what the edges export as metrics.
type Stats struct {
	ConcurrencyStats
	// Shedder is the Shedder's snapshot (zero without one).
	Shedder ShedderStats
	// Shed counts every refusal since the start, by priority (Sheddable
	// first): the Concurrency's and the Shedder's.
	Shed [priority.Levels]uint64
	// Level is the Guard's load level (Guard.Level).
	Level float64
	// FeaturesOff is the number of features off.
	FeaturesOff int
}

// Stats returns a snapshot of g, switching features by the current level
// as Enabled does. It does not allocate.
func (g *Guard) Stats() Stats {
	if g.l == nil {
		return Stats{}
	}
	st := Stats{ConcurrencyStats: g.l.Stats()}
	st.Level = st.ConcurrencyStats.Level
	if g.s != nil {
		st.Shedder = g.s.Stats()
		st.Level = max(st.Level, g.s.Level())
	}
	for i := range st.Shed {
		st.Shed[i] = st.Refused[i] + st.Shedder.Shed[i]
	}
	for _, n := range g.names {
		if !g.features[n].update(st.Level) {
			st.FeaturesOff++
		}
	}
	return st
}

// FeaturesOff appends to dst the names of the features that are off, in
// the order of GuardOptions.Features, and returns the extended slice.
func (g *Guard) FeaturesOff(dst []string) []string {
	for _, n := range g.names {
		if !g.features[n].on.Load() {
			dst = append(dst, n)
		}
	}
	return dst
}
