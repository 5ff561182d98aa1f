package service

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
)

// MaxOverrideTTL bounds how long a runtime override may last. An override
// is a temporary measure (an incident, a tenant's trial); a lasting change
// belongs in the rule files.
const MaxOverrideTTL = 30 * 24 * time.Hour

// ErrNoSuchRule is wrapped by the errors of overrides naming a domain or a
// rule that the loaded rules do not define.
var ErrNoSuchRule = errors.New("no such rule")

// ErrInvalidOverride is wrapped by the errors of overrides that are out of
// bounds (a limit, burst or expiry the rule cannot take).
var ErrInvalidOverride = errors.New("invalid override")

// A RuleOverride replaces, until Expires, the limit and burst of one
// configured rule, named by its domain and its Spec.Name. Only the
// quantities change: the algorithm and the window stay those of the rule
// file, so the rule keeps its storage keys and the override applies at once
// against what was already consumed, like any limit change.
type RuleOverride struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	// Limit replaces Rule.Limit (requests_per_unit).
	Limit int64 `json:"limit"`
	// Burst replaces Rule.Burst for gcra and leaky_bucket rules: 0 means
	// a capacity of Limit, as in a rule file (the file's burst is not
	// kept). It must be 0 for the window algorithms.
	Burst int64 `json:"burst,omitempty"`
	// Expires is when the override stops applying. Compare it with a
	// clock reading of this process only.
	Expires time.Time `json:"expires"`
	// By and Reason record who set it and why, for the admin API and logs.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Check validates o against set: the domain and rule exist and are not
// unlimited, the limit and burst make a valid rule, and the expiry is after
// now and at most MaxOverrideTTL away. It returns the rule the override
// makes.
func (o *RuleOverride) Check(set *rules.Set, now time.Time) (*ratelimit.Rule, error) {
	d, ok := set.Domain(o.Domain)
	if !ok {
		return nil, fmt.Errorf("%w: domain %q is not loaded", ErrNoSuchRule, o.Domain)
	}
	sp := d.Spec(o.Rule)
	if sp == nil {
		return nil, fmt.Errorf("%w: domain %q has no rule named %q", ErrNoSuchRule, o.Domain, o.Rule)
	}
	if sp.Rule == nil {
		return nil, fmt.Errorf("%w: rule %q of domain %q is unlimited; it has no limit to override", ErrInvalidOverride, o.Rule, o.Domain)
	}
	if ttl := o.Expires.Sub(now); ttl <= 0 || ttl > MaxOverrideTTL {
		return nil, fmt.Errorf("%w: expiry must be in (0, %v] from now, got %v", ErrInvalidOverride, MaxOverrideTTL, ttl.Round(time.Millisecond))
	}
	if o.Burst != 0 && sp.Rule.Algorithm != ratelimit.GCRA && sp.Rule.Algorithm != ratelimit.LeakyBucket {
		return nil, fmt.Errorf("%w: rule %q uses %s, which has no burst", ErrInvalidOverride, o.Rule, sp.Rule.Algorithm)
	}
	r, err := o.apply(sp.Rule)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOverride, err)
	}
	return r, nil
}

// apply returns a copy of the configured rule base with the override's
// limit and burst, validated.
func (o *RuleOverride) apply(base *ratelimit.Rule) (*ratelimit.Rule, error) {
	r := *base
	r.Quota, r.Burst = o.Limit, o.Burst
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Overrides holds the runtime overrides in force; a Service given them in
// Options decides every limit of an overridden rule with the override's
// rule instead, and reports it. Rules are recognised by the address of
// their ratelimit.Rule, which is stable for the life of a rules.Set, so the
// cost of an empty table is one atomic load per limit, and of a non-empty
// one a map lookup.
//
// The override list (Replace) and the rule set (SetRules) may change at
// any time; both rebuild the table, which Decide reads without locks.
// Overrides that name a rule the set does not hold are kept and apply again
// once a reload brings the rule back.
//
// The zero value is not usable; call NewOverrides. Safe for concurrent use.
type Overrides struct {
	now   func() time.Time
	table atomic.Pointer[overrideTable]

	mu   sync.Mutex // serialises rebuilds
	set  *rules.Set
	list []RuleOverride
}

// overrideTable maps a configured rule to its override.
type overrideTable map[*ratelimit.Rule]activeOverride

type activeOverride struct {
	rule    *ratelimit.Rule
	expires time.Time
}

// NewOverrides returns an empty Overrides for the rules of set. now is the
// clock overrides expire by; nil means time.Now.
func NewOverrides(set *rules.Set, now func() time.Time) *Overrides {
	if now == nil {
		now = time.Now
	}
	o := &Overrides{now: now, set: set}
	o.table.Store(&overrideTable{})
	return o
}

// Replace makes list the overrides in force. Entries that do not check
// against the current rules are kept but not applied; their errors are
// returned joined, for the caller to log.
func (o *Overrides) Replace(list []RuleOverride) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.list = append([]RuleOverride(nil), list...)
	return o.rebuild(o.set, nil)
}

// List returns the overrides in force (expired ones excluded).
func (o *Overrides) List() []RuleOverride {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	out := make([]RuleOverride, 0, len(o.list))
	for _, ov := range o.list {
		if ov.Expires.After(now) {
			out = append(out, ov)
		}
	}
	return out
}

// Lookup returns the override of one configured rule that is in force
// now, and when it expires. o may be nil (no overrides).
func (o *Overrides) Lookup(r *ratelimit.Rule) (*ratelimit.Rule, time.Time, bool) {
	if o == nil {
		return nil, time.Time{}, false
	}
	a, ok := (*o.table.Load())[r]
	if !ok || !o.now().Before(a.expires) {
		return nil, time.Time{}, false
	}
	return a.rule, a.expires, true
}

// SetRules applies the overrides to a new rule set. To switch a service
// without a moment where a request sees the new rules but not the
// overrides, call SetRules(next, true) before Service.SetRules(next) and
// SetRules(next, false) after it: the first call keeps the current set's
// rules in the table alongside next's.
func (o *Overrides) SetRules(next *rules.Set, keepCurrent bool) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var also *rules.Set
	if keepCurrent {
		also = o.set
	}
	o.set = next
	return o.rebuild(next, also)
}

// rebuild builds the table from o.list against set (and also, when not
// nil). o.mu must be held.
func (o *Overrides) rebuild(set, also *rules.Set) error {
	t := overrideTable{}
	var errs []error
	for i := range o.list {
		ov := &o.list[i]
		for _, s := range [...]*rules.Set{set, also} {
			if s == nil {
				continue
			}
			d, ok := s.Domain(ov.Domain)
			if !ok {
				continue
			}
			sp := d.Spec(ov.Rule)
			if sp == nil || sp.Rule == nil {
				continue
			}
			r, err := ov.apply(sp.Rule)
			if err != nil {
				errs = append(errs, fmt.Errorf("override of %s/%s: %w", ov.Domain, ov.Rule, err))
				continue
			}
			t[sp.Rule] = activeOverride{rule: r, expires: ov.Expires}
		}
	}
	o.table.Store(&t)
	return errors.Join(errs...)
}
