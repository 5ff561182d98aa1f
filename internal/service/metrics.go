package service

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/topk"
)

// Metrics are the service's Prometheus metrics. The counters of every rule
// are resolved when a rule set is loaded, so a decision costs a pointer
// lookup and a few atomic adds, never a label lookup or a string.
//
// A rule whose descriptor has detailed_metric, or a descriptor of its path
// value_to_metric (rules.Spec.PerValueMetric), is also counted per
// descriptor value in sluice_detailed_decisions_total, its key label the
// stats key envoyproxy/ratelimit would give it (rules.Spec.AppendMetricKey:
// "edge.remote_address_10.0.0.1"). Cardinality is bounded: each rule has
// at most DetailedKeys keys (SetDetailedKeys), kept across reloads; the
// decisions of any further key, and of a key that is not valid UTF-8, are
// counted under the one key "_overflow". Such a decision costs building
// the key and a map lookup under the rule's lock; a new key, its series.
// Rules without the flags pay nothing for it.
type Metrics struct {
	decisions *prometheus.CounterVec
	nearLimit *prometheus.CounterVec
	used      *prometheus.HistogramVec
	latency   prometheus.Histogram
	storeErrs atomic.Uint64                 // requests answered with a store error
	backend   atomic.Pointer[func() uint64] // the store's own count of failed calls
	reloads   *prometheus.CounterVec
	ruleCount prometheus.Gauge
	detailed  *prometheus.CounterVec
	settles   *prometheus.CounterVec // settlements by outcome
	units     *prometheus.CounterVec // units settled, by direction
	// detailedKeys bounds the keys per rule of detailed; set before use.
	detailedKeys int
	// details are the per-value counters of every rule that has had
	// them, by domain and rule name, kept across reloads so that the
	// bound holds for the life of the process; guarded by mu.
	details map[[2]string]*detailCounters

	mu     sync.Mutex // serialises prepare
	byRule specMap[*ruleCounters]
	// byDomain holds the counters of inline limits, by domain, resolved
	// on first use.
	byDomain sync.Map // domain → *ruleCounters
}

// Outcomes of a decision, the "outcome" label of sluice_decisions_total.
var outcomes = [...]string{"ok", "over_limit", "shadow_would_deny", "unlimited", "fail_open", "fail_closed", "local", "quota_exceeded"}

const (
	outOK = iota
	outOver
	outShadowDeny
	outUnlimited
	outFailOpen
	outFailClosed
	outLocal
	outQuotaExceeded // a quota-mode limit over its quota in a request it did not refuse
	numOutcomes
)

// DefaultDetailedKeys is the bound on the keys of one rule in
// sluice_detailed_decisions_total unless SetDetailedKeys changes it.
const DefaultDetailedKeys = 100

// OverflowKey is the key label under which sluice_detailed_decisions_total
// counts the decisions of a rule's keys past its bound.
const OverflowKey = "_overflow"

type ruleCounters struct {
	outcome   [numOutcomes]prometheus.Counter
	nearLimit prometheus.Counter
	used      prometheus.Observer
	detail    *detailCounters // nil unless the rule's metrics are per value
}

// detailCounters are a rule's per-value counters, at most max keys.
type detailCounters struct {
	domain, rule string
	vec          *prometheus.CounterVec
	max          int
	mu           sync.RWMutex
	keys         map[string]*[numOutcomes]prometheus.Counter
	overflow     *[numOutcomes]prometheus.Counter
}

// counters returns the counters of key (a key over the bound or not valid
// UTF-8 has the overflow's). It allocates only for a new key.
func (dc *detailCounters) counters(key []byte) *[numOutcomes]prometheus.Counter {
	dc.mu.RLock()
	c, ok := dc.keys[string(key)]
	if !ok && len(dc.keys) >= dc.max && dc.overflow != nil {
		c, ok = dc.overflow, true // full: no exclusive lock per decision
	}
	dc.mu.RUnlock()
	if ok {
		return c
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if c, ok := dc.keys[string(key)]; ok {
		return c
	}
	if len(dc.keys) < dc.max && utf8.Valid(key) {
		c := dc.series(string(key))
		dc.keys[string(key)] = c
		return c
	}
	if dc.overflow == nil {
		dc.overflow = dc.series(OverflowKey)
	}
	return dc.overflow
}

func (dc *detailCounters) series(key string) *[numOutcomes]prometheus.Counter {
	c := new([numOutcomes]prometheus.Counter)
	for i, o := range outcomes {
		c[i] = dc.vec.WithLabelValues(dc.domain, dc.rule, key, o)
	}
	return c
}

// utilisationBuckets are the buckets of sluice_utilisation_ratio.
var utilisationBuckets = []float64{0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.99, 1}

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Limits decided, by domain, rule and outcome (ok, over_limit, shadow_would_deny, unlimited, fail_open, fail_closed, local, quota_exceeded: a quota_mode limit over its quota in a request still allowed).",
		}, []string{"domain", "rule", "outcome"}),
		detailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_detailed_decisions_total",
			Help: "Limits decided for the rules with detailed_metric or value_to_metric, by domain, rule, key (the descriptor's values in envoyproxy/ratelimit's stats key, e.g. edge.remote_address_10.0.0.1) and outcome; at most --detailed-metric-keys keys per rule, the decisions of further keys counted under key \"_overflow\".",
		}, []string{"domain", "rule", "key", "outcome"}),
		detailedKeys: DefaultDetailedKeys,
		details:      make(map[[2]string]*detailCounters),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_near_limit_total",
			Help: "Admissions that left less than 20% of the limit's capacity.",
		}, []string{"domain", "rule"}),
		used: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_utilisation_ratio",
			Help:    "Used ÷ limit of the key after each decision, by domain and rule (not by key): the share of decisions that left their key above 80% is one query. Decisions by the fail_open or fail_closed failure mode are not observed.",
			Buckets: utilisationBuckets,
		}, []string{"domain", "rule"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_decision_duration_seconds",
			Help:    "Time to decide one request, from validation to answer.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3},
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rule_reloads_total",
			Help: "Rule loads by result (ok, error).",
		}, []string{"result"}),
		ruleCount: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_rules",
			Help: "Limits in the rule set in use.",
		}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_settlements_total",
			Help: "Settlements of reservations by outcome: settled, unknown (never kept, or expired), already_settled, invalid, lost (taken but not applied, or the ledger failed).",
		}, []string{"outcome"}),
		units: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_settled_units_total",
			Help: "Units of cost that settlements refunded (actual below the estimate) and charged (actual above it, even past the limit), by direction.",
		}, []string{"direction"}),
	}
	storeErrs := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_store_errors_total",
		Help: "Failed calls to the store: requests answered with an error, and calls the store answered by each rule's failure_mode (fail_open, fail_closed, local) because its backend failed.",
	}, func() float64 {
		n := m.storeErrs.Load()
		if f := m.backend.Load(); f != nil {
			n += (*f)()
		}
		return float64(n)
	})
	reg.MustRegister(m.decisions, m.nearLimit, m.used, m.latency, storeErrs, m.reloads, m.ruleCount, m.detailed, m.settles, m.units)
	return m
}

// SetDetailedKeys bounds the keys of each rule in
// sluice_detailed_decisions_total (DefaultDetailedKeys otherwise); n must
// be positive. It applies to the rules loaded after it: call it before
// the Service is made.
func (m *Metrics) SetDetailedKeys(n int) {
	m.mu.Lock()
	m.detailedKeys = max(n, 1)
	m.mu.Unlock()
}

// Reloaded counts a rule load that succeeded or failed.
func (m *Metrics) Reloaded(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
	} else {
		m.reloads.WithLabelValues("error").Inc()
	}
}

func (m *Metrics) counters(domain, rule string) *ruleCounters {
	rc := &ruleCounters{nearLimit: m.nearLimit.WithLabelValues(domain, rule), used: m.used.WithLabelValues(domain, rule)}
	for i, o := range outcomes {
		rc.outcome[i] = m.decisions.WithLabelValues(domain, rule, o)
	}
	return rc
}

// prepare resolves the counters of every rule of set.
func (m *Metrics) prepare(set *rules.Set) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	next := make(map[*rules.Spec]*ruleCounters)
	n := 0
	for _, name := range set.Domains() {
		d, _ := set.Domain(name)
		for _, sp := range d.Specs() {
			n++
			rc := m.counters(name, sp.Name)
			if sp.PerValueMetric() {
				k := [2]string{name, sp.Name}
				if m.details[k] == nil {
					m.details[k] = &detailCounters{domain: name, rule: sp.Name, vec: m.detailed, max: m.detailedKeys, keys: make(map[string]*[numOutcomes]prometheus.Counter)}
				}
				rc.detail = m.details[k]
			}
			next[sp] = rc
		}
	}
	m.byRule.publish(next)
	m.ruleCount.Set(float64(n))
}

func (m *Metrics) storeError() {
	if m != nil {
		m.storeErrs.Add(1)
	}
}

// CountStoreErrors adds to sluice_store_errors_total the failed calls that
// a store counts itself, through errors (a counter that only grows): a
// Redis store answers a failed call by each rule's failure_mode, not with
// an error, so the service alone would not see it.
func (m *Metrics) CountStoreErrors(errors func() uint64) {
	m.backend.Store(&errors)
}

// observe counts the decisions of one request.
func (m *Metrics) observe(req *Request, sc *scratch, resp *Response, took time.Duration) {
	if m == nil {
		return
	}
	domain := req.Domain
	m.latency.Observe(took.Seconds())
	byRule := m.byRule.load()
	for _, c := range sc.checks {
		rc, ok := byRule[c.spec]
		if !ok { // an inline limit: its rule comes with the request
			rc = m.inlineCounters(domain)
		}
		if c.rule == nil {
			rc.outcome[outUnlimited].Inc()
			m.observeDetail(rc, sc, &c, req, outUnlimited)
			continue
		}
		d := sc.decision(&c)
		o := outcome(d, c.shadow)
		if o == outOver && sc.overQuota(&c, d) {
			o = outQuotaExceeded
		}
		rc.outcome[o].Inc()
		m.observeDetail(rc, sc, &c, req, o)
		if d.Allowed && d.Remaining*5 < d.Capacity {
			rc.nearLimit.Inc()
		}
		if u, ok := topk.Used(d); ok {
			rc.used.Observe(u)
		}
	}
}

// observeDetail counts outcome o of check c in its rule's per-value
// counters, if it has them.
func (m *Metrics) observeDetail(rc *ruleCounters, sc *scratch, c *check, req *Request, o int) {
	if rc.detail == nil || c.spec == nil {
		return
	}
	sc.mkey = c.spec.AppendMetricKey(sc.mkey[:0], req.Descriptors[c.desc].Entries)
	rc.detail.counters(sc.mkey)[o].Inc()
}

// inlineCounters returns the counters of the inline limits of a domain;
// they share the rule label "inline". (A rule under a runtime override
// keeps its own label.)
func (m *Metrics) inlineCounters(domain string) *ruleCounters {
	if rc, ok := m.byDomain.Load(domain); ok {
		return rc.(*ruleCounters)
	}
	rc, _ := m.byDomain.LoadOrStore(domain, m.counters(domain, "inline"))
	return rc.(*ruleCounters)
}

func outcome(d *ratelimit.Decision, shadow bool) int {
	switch d.Reason {
	case ratelimit.ReasonFailOpen:
		return outFailOpen
	case ratelimit.ReasonFailClosed:
		return outFailClosed
	case ratelimit.ReasonLocal:
		return outLocal
	}
	switch {
	case d.Allowed:
		return outOK
	case shadow:
		return outShadowDeny
	}
	return outOver
}

// countSettle counts a settlement that ended with err.
func (m *Metrics) countSettle(err error, out Settlement) {
	if m == nil {
		return
	}
	outcome := "lost"
	switch {
	case err == nil:
		outcome = "settled"
		m.units.WithLabelValues("refunded").Add(float64(out.Refunded))
		m.units.WithLabelValues("charged").Add(float64(out.Charged))
	case errors.Is(err, ratelimit.ErrUnknownReservation):
		outcome = "unknown"
	case errors.Is(err, ratelimit.ErrAlreadySettled):
		outcome = "already_settled"
	case errors.Is(err, ErrInvalidRequest):
		outcome = "invalid"
	}
	m.settles.WithLabelValues(outcome).Inc()
}
