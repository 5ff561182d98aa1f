package service

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/topk"
)

// Top keeps a topk.Tracker per configured rule: its hottest, most denied
// and near-limit keys. A rule keeps its tracker across reloads while its
// domain and name stay; a rule a reload removes loses it. Inline limits
// (a descriptor's own limit) are not tracked. Memory is one tracker's
// Footprint per rule, whatever the number of keys.
type Top struct {
	opts   topk.Options
	secret []string

	mu     sync.Mutex // serialises prepare
	byName map[[2]string]tracked
	byRule specMap[*topk.Tracker]
}

// NewTop returns a Top whose trackers have opts; the storage keys of the
// rules whose descriptor path has one of secretKeys (such as
// remote_address) are shown hashed.
func NewTop(opts topk.Options, secretKeys []string) (*Top, error) {
	if _, err := topk.New(opts); err != nil {
		return nil, err
	}
	t := &Top{opts: opts, secret: slices.Clone(secretKeys), byName: map[[2]string]tracked{}}
	return t, nil
}

// prepare resolves the tracker of every limited rule of set.
func (t *Top) prepare(set *rules.Set) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := map[*rules.Spec]*topk.Tracker{}
	names := map[[2]string]tracked{}
	for _, dn := range set.Domains() {
		d, _ := set.Domain(dn)
		for _, sp := range d.Specs() {
			if sp.Rule == nil {
				continue
			}
			opts := t.opts
			opts.Secret = opts.Secret || slices.ContainsFunc(t.secret, sp.HasKey)
			name := [2]string{dn, sp.Name}
			tr := t.byName[name]
			if tr.Tracker == nil || tr.secret != opts.Secret {
				tr.Tracker, _ = topk.New(opts) // opts were checked by NewTop
				tr.secret = opts.Secret
			}
			tr.rule, tr.unit = sp.Rule, sp.CostUnit
			names[name], next[sp] = tr, tr.Tracker
		}
	}
	t.byName = names
	t.byRule.publish(next)
}

// observe records the decisions of one request, made at now (zero: the
// trackers read the clock if they need it).
func (t *Top) observe(sc *scratch, now time.Time) {
	byRule := t.byRule.load()
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.rule == nil || c.spec == nil {
			continue
		}
		if tr, ok := byRule[c.spec]; ok {
			tr.ObserveAt(now, c.spec.ShortKey(sc.item(c).Key), sc.decision(c))
		}
	}
}

// TopLimits returns the rules tracked, by domain and rule name, each with
// its configured rule (not its override).
func (t *Top) TopLimits() []topk.Limit {
	t.mu.Lock()
	out := make([]topk.Limit, 0, len(t.byName))
	for n, tr := range t.byName {
		out = append(out, topk.Limit{Domain: n[0], Name: n[1], Rule: tr.rule, CostUnit: tr.unit, Tracker: tr.Tracker})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b topk.Limit) int { return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Name, b.Name)) })
	return out
}

// tracked is a rule's tracker, the rule, and whether it hides the keys.
type tracked struct {
	*topk.Tracker
	rule   *ratelimit.Rule
	unit   string // the rule's cost unit
	secret bool
}
