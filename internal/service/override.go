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

// An Override replaces at run time, until Expires, the quota and burst of
// one configured rule, named by its domain and its Spec.Name. Only the
// quantities change: the algorithm and the window stay those of the rule
// file, so the rule keeps its storage keys and the override applies at once
// against what was already consumed, like any limit change. (A limit that
// a request carries is an InlineLimit, not an Override.)
type Override struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	// Quota replaces the rule's ratelimit.Rule.Quota (requests_per_unit);
	// the admin API calls it "limit".
	Quota int64 `json:"limit"`
	// Burst replaces Rule.Burst for gcra and leaky_bucket rules: 0 means
	// a capacity of Quota, as in a rule file (the file's burst is not
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
// unlimited, the quota and burst make a valid rule, and the expiry is after
// now and at most MaxOverrideTTL away. It returns the rule the override
// makes.
func (o *Override) Check(set *rules.Set, now time.Time) (*ratelimit.Rule, error) {
	_, r, err := o.apply(set)
	if err != nil {
		return nil, err
	}
	if ttl := o.Expires.Sub(now); ttl <= 0 || ttl > MaxOverrideTTL {
		return nil, fmt.Errorf("%w: expiry must be in (0, %v] from now, got %v", ErrInvalidOverride, MaxOverrideTTL, ttl.Round(time.Millisecond))
	}
	return r, nil
}

// apply finds the configured rule o names in set and returns it with a
// copy that has o's quota and burst, validated; whatever the expiry.
func (o *Override) apply(set *rules.Set) (base, r *ratelimit.Rule, err error) {
	d, ok := set.Domain(o.Domain)
	if !ok {
		return nil, nil, fmt.Errorf("%w: domain %q is not loaded", ErrNoSuchRule, o.Domain)
	}
	sp := d.Spec(o.Rule)
	if sp == nil {
		return nil, nil, fmt.Errorf("%w: domain %q has no rule named %q", ErrNoSuchRule, o.Domain, o.Rule)
	}
	if sp.Rule == nil {
		return nil, nil, fmt.Errorf("%w: rule %q of domain %q is unlimited; it has no limit to override", ErrInvalidOverride, o.Rule, o.Domain)
	}
	if o.Burst != 0 && sp.Rule.Algorithm != ratelimit.GCRA && sp.Rule.Algorithm != ratelimit.LeakyBucket {
		return nil, nil, fmt.Errorf("%w: rule %q uses %s, which has no burst", ErrInvalidOverride, o.Rule, sp.Rule.Algorithm)
	}
	c := *sp.Rule
	c.Quota, c.Burst, c.Block = o.Quota, o.Burst, o.Quota == 0
	if err := c.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidOverride, err)
	}
	return sp.Rule, &c, nil
}

// Overrides holds the runtime overrides in force; a Service given them in
// Options decides every limit of an overridden rule with the override's
// rule instead, and reports it. Rules are recognised by the address of
// their ratelimit.Rule, which is stable for the life of a rules.Set, so the
// cost of an empty table is one atomic load per limit, and of a non-empty
// one a map lookup.
//
// The override list (Replace) and the rule set (Service.SetRules) may
// change at any time; both rebuild the table, which Lookup reads without
// locks. Overrides that do not apply to the set are kept, and apply again
// once a reload brings their rule back.
//
// The zero value is not usable; call NewOverrides. Safe for concurrent use.
type Overrides struct {
	now   func() time.Time
	table atomic.Pointer[overrideTable]

	mu  sync.Mutex // serialises rebuilds
	set *rules.Set
	// prev is the set being replaced while Service.SetRules switches
	// sets, nil otherwise: its rules stay overridden meanwhile.
	prev *rules.Set
	list []Override
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

// Replace makes list the overrides in force. Entries that do not apply to
// the current rules are kept but not applied; their errors are returned
// joined, for the caller to log.
func (o *Overrides) Replace(list []Override) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.list = append([]Override(nil), list...)
	return o.rebuild()
}

// List returns the overrides in force (expired ones excluded).
func (o *Overrides) List() []Override {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	out := make([]Override, 0, len(o.list))
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

// setRules applies the overrides to the rule set next, for
// Service.SetRules, which switches sets in three steps: setRules(next,
// true) overrides the rules of both the current set and next, then the
// service switches, then setRules(next, false) drops the old set's rules.
// It returns the errors of the overrides that do not apply to next.
func (o *Overrides) setRules(next *rules.Set, switching bool) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.prev = nil
	if switching && o.set != next {
		o.prev = o.set
	}
	o.set = next
	return o.rebuild()
}

// rebuild builds the table from o.list against o.set and, during a
// switch, o.prev, and returns the errors of the unexpired overrides that
// do not apply to o.set. o.mu must be held.
func (o *Overrides) rebuild() error {
	t := overrideTable{}
	var errs []error
	now := o.now()
	for i := range o.list {
		ov := &o.list[i]
		if !ov.Expires.After(now) {
			continue // expired: it never applies again
		}
		if o.prev != nil {
			if base, r, err := ov.apply(o.prev); err == nil {
				t[base] = activeOverride{rule: r, expires: ov.Expires}
			}
		}
		base, r, err := ov.apply(o.set)
		if err != nil {
			errs = append(errs, fmt.Errorf("override of %s/%s: %w", ov.Domain, ov.Rule, err))
			continue
		}
		t[base] = activeOverride{rule: r, expires: ov.Expires}
	}
	o.table.Store(&t)
	return errors.Join(errs...)
}
