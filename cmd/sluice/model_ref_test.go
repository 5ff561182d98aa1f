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
//   - quota_mode (internal/service's package doc, "Quota mode"): a
//     descriptor's limits are soft (unless shadow, or replaced by an
//     inline limit): decided after the real ones, each on its own (only
//     looked at, cost 0, when the real ones denied, unless independent);
//     over one, the descriptor is OVER_LIMIT with quota_exceeded and the
//     request OK, unless every quota descriptor is over: then the request
//     is OVER_LIMIT and what the real limits took is given back.
//   - Store down (redisstore's fallback): each item by its rule's
//     failure_mode, local when it states none (--failure-default):
//     fail_open admits (nothing known of the key),
//     fail_closed denies (retry the breaker's cooldown, 1 s; a request
//     denied by nothing else is 503 on HTTP, OVER_LIMIT on gRPC), local
//     decides in process at the replica's share, limit/replicas.
//   - Metrics: one sluice_decisions_total count per decided limit, by
//     rule ("inline" for inline limits) and outcome, and per stats key
//     (at most --detailed-metric-keys per rule, then "_overflow") for
//     rules with detailed_metric or value_to_metric.
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
	Failure   string // "" (fail_open), fail_open, fail_closed or local
	CostUnit  string // what it counts; "" the descriptor's cost
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
	domain      string
	independent bool
	// down: the store cannot reach its backend; every decision is its
	// rule's failure mode (fail_open admits, fail_closed denies, local
	// decides here at the replica's share, limit/replicas).
	down      bool
	replicas  int64
	states    map[string]*refState
	overrides map[string]int64 // rule name → quota
	rules     map[string]*mLimit
	// Metrics: the counts of sluice_decisions_total ("rule|outcome") and
	// sluice_detailed_decisions_total ("rule|key|outcome") for the
	// case's domain, and the keys of each rule's detailed series (at
	// most detailMax; further keys count under "_overflow").
	counts     map[string]int64
	detailed   map[string]int64
	detailKeys map[string]map[string]bool
	detailMax  int
	// seen counts what the case exercised, for the test's log.
	seen map[string]int
}

func newRefModel(mc *mCase, domain string, cfg modelConfig) *refModel {
	m := &refModel{mc: mc, domain: domain, independent: cfg.independent, down: cfg.down, replicas: int64(max(cfg.replicas, 1)),
		states: map[string]*refState{}, overrides: map[string]int64{}, rules: map[string]*mLimit{},
		seen: map[string]int{}, counts: map[string]int64{}, detailed: map[string]int64{}, detailKeys: map[string]map[string]bool{}, detailMax: cfg.detailKeys}
	if m.detailMax <= 0 {
		m.detailMax = 100 // service.DefaultDetailedKeys
	}
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
	// Quota: a quota_mode limit decided; QuotaExceeded: it denied (the
	// descriptor is over, the request maybe not).
	Quota, QuotaExceeded bool
	D                    refDecision
}

type refResponse struct {
	Domain string // the domain asked (quota_mode's metadata)
	Over   bool
	// Unavailable: every limit that denies failed closed (the store is
	// down): HTTP answers 503, gRPC OVER_LIMIT.
	Unavailable bool
	Statuses    []refStatus
}

// quotaMeta returns whether the RLS answer carries quota_mode's
// dynamic_metadata (a quota-mode limit decided a descriptor) and the
// indexes of the descriptors over their quota.
func (r *refResponse) quotaMeta() (bool, []int) {
	on := false
	var over []int
	for i, s := range r.Statuses {
		on = on || s.Quota
		if s.QuotaExceeded {
			over = append(over, i)
		}
	}
	return on, over
}

// A refCheck is one limit to decide for one descriptor.
type refCheck struct {
	desc      int
	rule      *refRule // nil: unlimited
	unlimName string
	key       string
	shadow    bool
	quota     bool // a quota_mode limit (never shadow, never inline)
	inline    bool
	path      []*mNode // the matched descriptor, root first (nil for a bare inline limit)
	cost      int64
	d         refDecision
}

// refMatch finds the path of nodes the entries match, or nil.
func refMatch(nodes []*mNode, entries []mEntry) []*mNode {
	level := nodes
	var path []*mNode
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
		path = append(path, n)
		if i == len(entries)-1 {
			return path
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

// metricKey is the stats key envoyproxy/ratelimit gives a limit of the
// descriptor path for entries (internal/rules, Spec.AppendMetricKey): the
// domain, then per level "." and the key, and "_" and a value where there
// is one: the request's with detailed_metric (even empty), the request's
// (when not empty) on a level with value_to_metric, else the rule file's
// (the exact value, "prefix*" for a wildcard, nothing for key only).
func (m *refModel) metricKey(path []*mNode, entries []mEntry) string {
	var b strings.Builder
	b.WriteString(m.domain)
	detailed := path[len(path)-1].Detailed
	for i, n := range path {
		b.WriteString("." + n.Key)
		switch {
		case detailed:
			b.WriteString("_" + entries[i].Value)
		case n.ToMetric:
			if entries[i].Value != "" {
				b.WriteString("_" + entries[i].Value)
			}
		case n.Value != "":
			b.WriteString("_" + n.Value)
		}
	}
	return b.String()
}

// perValue reports whether a limit of path has per-value metrics.
func perValue(path []*mNode) bool {
	if path[len(path)-1].Detailed {
		return true
	}
	for _, n := range path {
		if n.ToMetric {
			return true
		}
	}
	return false
}

func (m *refModel) rule(l *mLimit) *refRule {
	r := &refRule{Name: l.Name, Algorithm: l.Algorithm, Quota: l.Quota, Burst: l.Burst, Period: unitDurations[l.Unit], Unit: l.Unit, Failure: l.Failure, CostUnit: l.CostUnit}
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

// costOf is what descriptor i takes from a limit that counts unit ("":
// none). With costs per unit (v1/check's "costs": the descriptor's, else
// the request's), a limit with a unit takes its unit's, or nothing when
// they name none; any other limit, and any limit without costs, takes
// cost(i).
func (st *mStep) costOf(i int, unit string) int64 {
	costs := st.Descs[i].Costs
	if len(costs) == 0 {
		costs = st.Costs
	}
	if unit == "" || len(costs) == 0 {
		return st.cost(i)
	}
	return costs[unit]
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
	resp := &refResponse{Domain: m.domain, Statuses: make([]refStatus, len(st.Descs))}
	if st.Unknown {
		return resp
	}
	type match struct {
		desc int
		path []*mNode
		l    *mLimit
	}
	var matches []match
	replaced := map[string]bool{}
	for i := range st.Descs {
		p := refMatch(m.mc.Nodes, st.Descs[i].Entries)
		if p == nil {
			continue
		}
		for _, l := range p[len(p)-1].Limits {
			matches = append(matches, match{i, p, l})
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
		node := mt.path[len(mt.path)-1]
		c := refCheck{desc: mt.desc, shadow: node.Shadow, quota: node.Quota && !node.Shadow, path: mt.path, cost: st.cost(mt.desc)}
		switch {
		case d.Inline != nil:
			if inlined[mt.desc] {
				continue
			}
			inlined[mt.desc] = true
			c.rule, c.inline, c.quota, c.shadow = inlineRule(d.Inline), true, false, false
			c.key = "inline|" + pathKey(node, d.Entries) + "|" + c.rule.Period.String()
		case mt.l.Unlimited:
			c.unlimName = mt.l.Name
		default:
			c.rule, c.cost = m.rule(mt.l), st.costOf(mt.desc, mt.l.CostUnit)
			c.key = pathKey(node, d.Entries) + "|" + mt.l.Algorithm + "|" + c.rule.Period.String() + "|" + mt.l.CostUnit
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
		checks = append(checks, refCheck{desc: i, rule: r, inline: true, key: key + "|" + r.Period.String(), cost: st.cost(i)})
	}
	allOver := m.decide(checks, now)
	// The answer.
	limited, closed := false, false
	for i := range checks {
		c := &checks[i]
		s := &resp.Statuses[c.desc]
		if c.rule == nil {
			if s.Rule == nil {
				s.Matched, s.Unlimited, s.UnlimName = true, true, c.unlimName
			}
			continue
		}
		denies := !c.d.Allowed && !c.shadow && (!c.quota || allOver)
		if denies {
			resp.Over = true
			if c.d.Reason == "fail_closed" {
				closed = true
			} else {
				limited = true
			}
		}
		overHere := !c.d.Allowed && !c.shadow
		take := false
		switch {
		case s.Rule == nil:
			take = true
		case s.Over:
		case overHere:
			take = true
		case s.Shadow != c.shadow:
			take = !c.shadow
		case (c.d.Reason == "fail_open") != (s.D.Reason == "fail_open"):
			take = s.D.Reason == "fail_open" // a known remaining beats an unknown one
		default:
			take = c.d.Remaining < s.D.Remaining
		}
		if !take {
			continue
		}
		*s = refStatus{Matched: true, Rule: c.rule, Shadow: c.shadow, Quota: c.quota, D: c.d, Over: overHere, QuotaExceeded: overHere && c.quota}
	}
	resp.Unavailable = resp.Over && closed && !limited
	m.count(checks, st, allOver)
	for _, s := range resp.Statuses {
		switch {
		case s.QuotaExceeded && !resp.Over:
			m.seen["quota exceeded, request allowed"]++
		case s.QuotaExceeded:
			m.seen["quota exceeded, request refused"]++
		case s.Quota:
			m.seen["quota within"]++
		}
		if s.Rule != nil && s.Rule.Quota == 0 {
			m.seen["block rule decided"]++
		}
	}
	if resp.Unavailable {
		m.seen["denied by fail_closed only"]++
	}
	return resp
}

// decide decides the checks as the service does ("Quota mode" in its
// package doc): the real limits together (one by one when independent),
// then each quota limit on its own (only looked at, cost 0, when the real
// ones denied, unless independent), then, when every quota descriptor is
// over, the real limits' costs given back in one call; the shadow limits
// one by one. It returns whether every quota descriptor is over.
func (m *refModel) decide(checks []refCheck, now int64) bool {
	var real, quota, shadow []int
	for i := range checks {
		switch c := &checks[i]; {
		case c.rule == nil:
		case c.shadow:
			shadow = append(shadow, i)
		case c.quota:
			quota = append(quota, i)
		default:
			real = append(real, i)
		}
	}
	m.decideItems(checks, real, now, !m.independent, nil)
	denied := false
	for _, i := range real {
		denied = denied || !checks[i].d.Allowed
	}
	allOver := false
	if len(quota) > 0 {
		var cost map[int]int64
		if denied && !m.independent {
			cost = map[int]int64{}
			for _, i := range quota {
				cost[i] = 0
			}
		}
		m.decideItems(checks, quota, now, false, cost)
		has, over := map[int]bool{}, map[int]bool{}
		for _, i := range quota {
			has[checks[i].desc] = true
			if !checks[i].d.Allowed {
				over[checks[i].desc] = true
			}
		}
		allOver = len(has) > 0 && len(has) == len(over)
		if allOver && !denied && !m.independent {
			// Refused by its quotas: what the real limits took (their
			// positive costs) is given back in one call; a refund
			// among them stands.
			var items []refItem
			for _, i := range real {
				if c := &checks[i]; c.cost > 0 {
					items = append(items, refItem{c.key, c.rule, -c.cost})
				}
			}
			if len(items) > 0 {
				m.call(items, now) // its answer is not reported
				m.seen["quota refusal refunded"]++
			}
		}
	}
	m.decideItems(checks, shadow, now, false, nil)
	return allOver
}

// decideItems decides the checks idx: in one store call when together,
// else one call each; cost, when set, replaces their costs.
func (m *refModel) decideItems(checks []refCheck, idx []int, now int64, together bool, cost map[int]int64) {
	item := func(i int) refItem {
		c := &checks[i]
		it := refItem{c.key, c.rule, c.cost}
		if v, ok := cost[i]; ok {
			it.cost = v
		}
		return it
	}
	if !together {
		for _, i := range idx {
			checks[i].d = m.call([]refItem{item(i)}, now)[0]
		}
		return
	}
	if len(idx) == 0 {
		return
	}
	items := make([]refItem, len(idx))
	for j, i := range idx {
		items[j] = item(i)
	}
	for j, d := range m.call(items, now) {
		checks[idx[j]].d = d
	}
}

// refItem is one item of a store call.
type refItem struct {
	key  string
	rule *refRule
	cost int64
}

// call is one call of the store: all or nothing, or, when it is down,
// each item by its rule's failure mode (redisstore's fallback: fail_open
// admits, fail_closed denies with the breaker's retry, 1 s; local decides
// the local items together in process at the replica's share, consuming
// nothing, refunds aside, when a fail_closed item denies the call).
func (m *refModel) call(items []refItem, now int64) []refDecision {
	if !m.down {
		return m.together(items, now, "")
	}
	anyClosed := false
	var local []refItem
	for _, it := range items {
		switch failureOf(it.rule) {
		case "fail_closed":
			anyClosed = true
		case "local":
			l := *it.rule
			if l.Quota > 0 {
				l.Quota = max(1, l.Quota/m.replicas)
			}
			if l.Burst > 0 {
				l.Burst = max(1, l.Burst/m.replicas)
			}
			local = append(local, refItem{it.key, &l, it.cost})
		}
	}
	if anyClosed {
		for i := range local {
			local[i].cost = min(local[i].cost, 0)
		}
	}
	var lds []refDecision
	if len(local) > 0 {
		lds = m.together(local, now, "local|")
	}
	out := make([]refDecision, len(items))
	j := 0
	for i, it := range items {
		r := it.rule
		d := refDecision{Capacity: r.capacity(), Rule: r.Name}
		switch failureOf(r) {
		case "fail_closed":
			d.Reason, d.RetryAfter = "fail_closed", time.Second
		case "local":
			d = lds[j]
			j++
			d.Reason, d.Rule = "local", r.Name
		default:
			d.Allowed, d.Reason = true, "fail_open"
		}
		out[i] = d
	}
	return out
}

// failureOf is r's failure_mode, serve's --failure-default (local) when
// it states none.
func failureOf(r *refRule) string {
	if r.Failure == "" {
		return "local"
	}
	return r.Failure
}

// together decides items all or nothing: in order on working copies,
// stopping at the first denial; the copies are kept only if every item
// was admitted. The states are under prefix+key.
func (m *refModel) together(items []refItem, now int64, prefix string) []refDecision {
	ds := make([]refDecision, len(items))
	work := map[string]refState{}
	denied := -1
	for i, it := range items {
		k := prefix + it.key
		s, ok := work[k]
		if !ok {
			s = *m.state(k)
		}
		ds[i] = it.rule.decide(&s, now, it.cost, true)
		work[k] = s
		if !ds[i].Allowed {
			denied = i
			break
		}
	}
	if denied < 0 {
		for k, s := range work {
			*m.state(k) = s
		}
		return ds
	}
	// The others are reported as they stand: what they alone would get,
	// and a check (cost 0) when that is an admission, since nothing was
	// taken.
	for i, it := range items {
		if i == denied {
			continue
		}
		s := *m.state(prefix + it.key)
		ds[i] = it.rule.decide(&s, now, it.cost, false)
		if ds[i].Allowed {
			ds[i] = it.rule.decide(&s, now, 0, false)
		}
	}
	return ds
}

// count adds a request's decisions to the model's metrics: one per
// limit decided, unlimited ones included (internal/service's Metrics).
func (m *refModel) count(checks []refCheck, st *mStep, allOver bool) {
	for i := range checks {
		c := &checks[i]
		name := c.unlimName
		if c.rule != nil {
			name = c.rule.Name
		}
		if c.inline {
			name = "inline"
		}
		var o string
		switch {
		case c.rule == nil:
			o = "unlimited"
		case c.d.Reason == "fail_open" || c.d.Reason == "fail_closed" || c.d.Reason == "local":
			o = c.d.Reason
		case c.d.Allowed:
			o = "ok"
		case c.shadow:
			o = "shadow_would_deny"
		case c.quota && !allOver:
			o = "quota_exceeded"
		default:
			o = "over_limit"
		}
		m.counts[name+"|"+o]++
		m.seen["outcome "+o]++
		if c.inline || !perValue(c.path) {
			continue
		}
		key := m.metricKey(c.path, st.Descs[c.desc].Entries)
		keys := m.detailKeys[name]
		if keys == nil {
			keys = map[string]bool{}
			m.detailKeys[name] = keys
		}
		if !keys[key] {
			if len(keys) < m.detailMax {
				keys[key] = true
			} else {
				key = "_overflow"
				m.seen["detailed _overflow"]++
			}
		}
		m.detailed[name+"|"+key+"|"+o]++
	}
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

func (m *refModel) state(key string) *refState {
	s := m.states[key]
	if s == nil {
		s = &refState{}
		m.states[key] = s
	}
	return s
}
