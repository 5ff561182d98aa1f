package main

// The reference model of the model-checked test (model_test.go): the
// decided semantics of ARCHITECTURE.md ("Model and decided semantics")
// and of the service's package docs, written plainly and on their own —
// it calls nothing of internal/rules, internal/service or ratelimit.
//
//   - Matching (internal/rules' doc): a descriptor of N entries matches
//     only a path N deep; at each level an exact value beats the first
//     wildcard in file order, which beats the key-only descriptor; no
//     backtracking. `replaces` drops, across the whole request, every
//     limit named by any matched limit's replaces.
//   - A limit is counted on a key made of its descriptor path, the
//     request's values where the path does not fix them, and its algorithm
//     and window (never its name or quota, so an override applies against
//     what was consumed).
//   - An inline limit (a descriptor's own, RLS only) replaces the
//     descriptor's limits: one fixed window per descriptor, counted on a
//     key of the descriptor and the window (not the quota), never shadow
//     (it takes none of the modes of what it replaces); on a descriptor
//     that matched nothing it still limits it (the domain must exist).
//   - Unlimited limits are reported and never counted.
//   - The real limits of a request are decided all or nothing (or one by
//     one with --independent); shadow limits one by one, apart, and never
//     deny. A denial consumes nothing.
//   - Cost: 0 checks, negative refunds (never below nothing); a cost above
//     the capacity is denied for good (exceeds_capacity, retry never).
//   - Fixed windows are aligned to the Unix epoch; GCRA is a bucket of
//     capacity burst (else the quota) refilling one unit per
//     ceil(period/quota).
//   - Each descriptor reports the first real denial, else a real limit
//     before a shadow one, else the least remaining (first on ties).
//   - An unknown domain limits nothing.

import (
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"
)

// never is the retry of a request that can never succeed.
const never = time.Duration(math.MaxInt64)

// A refRule is a limit as the model decides it.
type refRule struct {
	Name      string
	Algorithm string
	Quota     int64
	Burst     int64
	Period    time.Duration
	Unit      int
}

func (r *refRule) capacity() int64 {
	if r.Quota <= 0 {
		return 0
	}
	if r.Algorithm == algGCRA && r.Burst > 0 {
		return r.Burst
	}
	return r.Quota
}

// interval is GCRA's emission interval, rounded up.
func (r *refRule) interval() int64 {
	if r.Quota <= 0 {
		return math.MaxInt64
	}
	return (int64(r.Period) + r.Quota - 1) / r.Quota
}

// window is the w of RateLimit-Policy: the time a full quota takes, in
// whole seconds rounded up, at least 1.
func (r *refRule) window() int64 {
	var w *big.Rat
	if r.Algorithm == algGCRA {
		if r.Quota <= 0 {
			return 1
		}
		w = big.NewRat(r.capacity()*int64(r.Period), r.Quota)
	} else {
		w = big.NewRat(int64(r.Period), 1)
	}
	w.Quo(w, big.NewRat(int64(time.Second), 1))
	n := new(big.Int).Quo(w.Num(), w.Denom())
	if new(big.Rat).SetInt(n).Cmp(w) < 0 {
		n.Add(n, big.NewInt(1))
	}
	return max(1, n.Int64())
}

var unitDurations = [...]time.Duration{1: time.Second, 2: time.Minute, 3: time.Hour}

// refState is what the model keeps per key.
type refState struct {
	// fixed window: the window's start and its count
	start, count int64
	// gcra: the instant the bucket is full again, and the interval it was
	// written with
	tat, iv int64
}

// refDecision is the answer for one limit.
type refDecision struct {
	Allowed    bool
	Reason     string
	Capacity   int64
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	Rule       string
}

// decide decides cost on s at now; it changes s only when commit and the
// cost is admitted.
func (r *refRule) decide(s *refState, now, cost int64, commit bool) refDecision {
	c := r.capacity()
	d := refDecision{Capacity: c, Rule: r.Name}
	if cost > c {
		d = r.run(s, now, 0, false)
		d.Allowed, d.Reason, d.RetryAfter = false, "exceeds_capacity", never
		return d
	}
	cost = max(cost, -c)
	d = r.run(s, now, cost, commit)
	if !d.Allowed {
		d.Reason = "limited"
		d.RetryAfter = max(d.RetryAfter, 1)
	}
	return d
}

func (r *refRule) run(s *refState, now, cost int64, commit bool) refDecision {
	d := refDecision{Capacity: r.capacity(), Rule: r.Name, Reason: "ok"}
	if r.Algorithm == algGCRA {
		iv := r.interval()
		capT := r.capacity() * iv
		var debt int64
		if s.tat > now {
			debt = s.tat - now
			if s.iv != 0 && s.iv != iv {
				// the bucket's fill, as a share, carries over to a new rate
				q := new(big.Int).Mul(big.NewInt(debt), big.NewInt(iv))
				q.Quo(q, big.NewInt(s.iv))
				if q.IsInt64() {
					debt = min(q.Int64(), math.MaxInt64/4)
				} else {
					debt = math.MaxInt64 / 4
				}
			}
		}
		if cost >= 0 {
			next := debt + cost*iv
			if next > capT {
				d.RetryAfter = time.Duration(next - capT)
				d.Remaining = max(0, (capT-debt)/iv)
				d.ResetAfter = time.Duration(debt)
				return d
			}
			debt = next
		} else {
			debt = max(0, debt+cost*iv)
		}
		d.Allowed = true
		d.Remaining = max(0, (capT-debt)/iv)
		d.ResetAfter = time.Duration(debt)
		if commit && cost != 0 {
			s.tat, s.iv = now+debt, iv
		}
		return d
	}
	p := int64(r.Period)
	start := now - ((now%p)+p)%p
	end := start + p
	var count int64
	if s.start == start {
		count = s.count
	}
	d.ResetAfter = time.Duration(end - now)
	if cost >= 0 && count+cost > r.Quota {
		d.RetryAfter = time.Duration(end - now)
		d.Remaining = max(0, r.Quota-count)
		return d
	}
	count = max(0, count+cost)
	d.Allowed = true
	d.Remaining = max(0, r.Quota-count)
	if count == 0 {
		d.ResetAfter = 0
	}
	if commit && cost != 0 {
		s.start, s.count = start, count
	}
	return d
}

// refModel is the state of one case.
type refModel struct {
	mc          *mCase
	independent bool
	states      map[string]*refState
	overrides   map[string]int64 // rule name → quota
	rules       map[string]*mLimit
}

func newRefModel(mc *mCase, independent bool) *refModel {
	m := &refModel{mc: mc, independent: independent, states: map[string]*refState{}, overrides: map[string]int64{}, rules: map[string]*mLimit{}}
	for _, p := range paths(mc.Nodes, nil, nil) {
		for _, l := range p[len(p)-1].Limits {
			m.rules[l.Name] = l
		}
	}
	return m
}

// refStatus is the answer for one descriptor.
type refStatus struct {
	Over      bool
	Matched   bool // a limit applies (Rule set) or the descriptor matched an unlimited rule
	Unlimited bool
	UnlimName string
	Rule      *refRule // nil: none, or unlimited
	Shadow    bool
	D         refDecision
}

type refResponse struct {
	Over     bool
	Statuses []refStatus
}

// A refCheck is one limit to decide for one descriptor.
type refCheck struct {
	desc      int
	rule      *refRule // nil: unlimited
	unlimName string
	key       string
	shadow    bool
	cost      int64
	d         refDecision
}

// match finds the node the entries match, or nil.
func refMatch(nodes []*mNode, entries []mEntry) *mNode {
	level := nodes
	for i, e := range entries {
		var exact, wild, any *mNode
		for _, n := range level {
			if n.Key != e.Key {
				continue
			}
			switch {
			case n.Value == "":
				if any == nil {
					any = n
				}
			case strings.HasSuffix(n.Value, "*"):
				if wild == nil && strings.HasPrefix(e.Value, strings.TrimSuffix(n.Value, "*")) {
					wild = n
				}
			case n.Value == e.Value:
				exact = n
			}
		}
		n := exact
		if n == nil {
			n = wild
		}
		if n == nil {
			n = any
		}
		if n == nil {
			return nil
		}
		if i == len(entries)-1 {
			return n
		}
		level = n.Children
	}
	return nil
}

// pathKey names what a matched descriptor counts on: the node and the
// request's values at every level (a node fixes only exact values, but
// the values are the same for the same node and entries anyway).
func pathKey(n *mNode, entries []mEntry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node%d", n.ID)
	for _, e := range entries {
		fmt.Fprintf(&b, "|%q", e.Value)
	}
	return b.String()
}

func (m *refModel) rule(l *mLimit) *refRule {
	r := &refRule{Name: l.Name, Algorithm: l.Algorithm, Quota: l.Quota, Burst: l.Burst, Period: unitDurations[l.Unit], Unit: l.Unit}
	if q, ok := m.overrides[l.Name]; ok {
		r.Quota, r.Burst = q, 0
	}
	return r
}

// cost is descriptor i's cost as the step's transport says it.
func (st *mStep) cost(i int) int64 {
	d := &st.Descs[i]
	if st.Transport == tCheck {
		switch {
		case d.HasCost:
			return d.Cost
		case st.HasCost:
			return st.Cost
		}
		return 1
	}
	c := max(st.Cost, 1)
	if !st.HasCost {
		c = 1
	}
	if d.HasCost {
		c = d.Cost
	}
	if d.Negative {
		c = -c
	}
	return c
}

// apply applies a step to the model; for a request, it returns the answer.
func (m *refModel) apply(st *mStep, now int64) *refResponse {
	switch st.Kind {
	case sOverride:
		m.overrides[st.Rule] = st.Quota
		return nil
	case sDeleteOverride:
		delete(m.overrides, st.Rule)
		return nil
	}
	resp := &refResponse{Statuses: make([]refStatus, len(st.Descs))}
	if st.Unknown {
		return resp
	}
	type match struct {
		desc int
		node *mNode
		l    *mLimit
	}
	var matches []match
	replaced := map[string]bool{}
	for i := range st.Descs {
		n := refMatch(m.mc.Nodes, st.Descs[i].Entries)
		if n == nil {
			continue
		}
		for _, l := range n.Limits {
			matches = append(matches, match{i, n, l})
			for _, r := range l.Replaces {
				replaced[r] = true
			}
		}
	}
	var checks []refCheck
	inlined := map[int]bool{}
	for _, mt := range matches {
		if replaced[mt.l.Name] {
			continue
		}
		d := &st.Descs[mt.desc]
		c := refCheck{desc: mt.desc, shadow: mt.node.Shadow, cost: st.cost(mt.desc)}
		switch {
		case d.Inline != nil:
			if inlined[mt.desc] {
				continue
			}
			inlined[mt.desc] = true
			c.rule, c.shadow = inlineRule(d.Inline), false
			c.key = "inline|" + pathKey(mt.node, d.Entries) + "|" + c.rule.Period.String()
		case mt.l.Unlimited:
			c.unlimName = mt.l.Name
		default:
			c.rule = m.rule(mt.l)
			c.key = pathKey(mt.node, d.Entries) + "|" + mt.l.Algorithm + "|" + c.rule.Period.String()
		}
		checks = append(checks, c)
	}
	for i := range st.Descs {
		d := &st.Descs[i]
		if d.Inline == nil || inlined[i] || hasRefCheck(checks, i) {
			continue
		}
		r := inlineRule(d.Inline)
		key := "bare-inline"
		for _, e := range d.Entries {
			key += fmt.Sprintf("|%q=%q", e.Key, e.Value)
		}
		checks = append(checks, refCheck{desc: i, rule: r, key: key + "|" + r.Period.String(), cost: st.cost(i)})
	}
	m.decideAll(checks, now, false, !m.independent)
	m.decideAll(checks, now, true, false)
	for i := range checks {
		c := &checks[i]
		s := &resp.Statuses[c.desc]
		if c.rule == nil {
			if s.Rule == nil {
				s.Matched, s.Unlimited, s.UnlimName = true, true, c.unlimName
			}
			continue
		}
		realDenial := !c.d.Allowed && !c.shadow
		take := false
		switch {
		case s.Rule == nil:
			take = true
		case s.Over:
		case realDenial:
			take = true
		case s.Shadow != c.shadow:
			take = !c.shadow
		default:
			take = c.d.Remaining < s.D.Remaining
		}
		if !take {
			continue
		}
		*s = refStatus{Matched: true, Rule: c.rule, Shadow: c.shadow, D: c.d, Over: realDenial}
		if realDenial {
			resp.Over = true
		}
	}
	return resp
}

func hasRefCheck(cs []refCheck, desc int) bool {
	for _, c := range cs {
		if c.desc == desc {
			return true
		}
	}
	return false
}

func inlineRule(l *mInline) *refRule {
	mult := max(l.Mult, 1)
	return &refRule{
		Name:      fmt.Sprintf("inline_%d_per_%dx%s", l.RPU, mult, unitNamesYAML[l.Unit]),
		Algorithm: algFixed, Quota: int64(l.RPU), Period: unitDurations[l.Unit] * time.Duration(mult), Unit: l.Unit,
	}
}

// decideAll decides the checks of one kind (shadow or real): together,
// all or nothing, or one by one.
func (m *refModel) decideAll(checks []refCheck, now int64, shadow, together bool) {
	var idx []int
	for i := range checks {
		if checks[i].rule != nil && checks[i].shadow == shadow {
			idx = append(idx, i)
		}
	}
	if !together {
		for _, i := range idx {
			c := &checks[i]
			c.d = c.rule.decide(m.state(c.key), now, c.cost, true)
		}
		return
	}
	// All or nothing: decide in order on working copies, stop at the
	// first denial; keep the copies only if every limit admitted.
	work := map[string]refState{}
	denied := -1
	for _, i := range idx {
		c := &checks[i]
		s, ok := work[c.key]
		if !ok {
			s = *m.state(c.key)
		}
		c.d = c.rule.decide(&s, now, c.cost, true)
		work[c.key] = s
		if !c.d.Allowed {
			denied = i
			break
		}
	}
	if denied < 0 {
		for k, s := range work {
			*m.state(k) = s
		}
		return
	}
	// The others are reported as they stand: what they alone would get,
	// and a check (cost 0) when that is an admission, since nothing was
	// taken.
	for _, i := range idx {
		if i == denied {
			continue
		}
		c := &checks[i]
		s := *m.state(c.key)
		c.d = c.rule.decide(&s, now, c.cost, false)
		if c.d.Allowed {
			c.d = c.rule.decide(&s, now, 0, false)
		}
	}
}

func (m *refModel) state(key string) *refState {
	s := m.states[key]
	if s == nil {
		s = &refState{}
		m.states[key] = s
	}
	return s
}
