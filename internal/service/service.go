// Package service is Sluice's transport-agnostic decision service: it
// matches a request's descriptors against the loaded rules, decides their
// limits in a ratelimit.Store, and answers with a status per descriptor.
// It speaks Sluice's terms (a signed cost per descriptor, as package
// ratelimit); the gRPC (internal/rls) and HTTP (internal/httpapi) adapters
// translate to and from their protocols, and Request.Validate is the one
// check of a request for all of them.
//
// Semantics, where they differ from envoyproxy/ratelimit:
//
//   - By default the limits of one request are decided all or nothing: a
//     denied request consumes nothing from any of its limits. With
//     Options.Independent every limit counts on its own, as
//     envoyproxy/ratelimit does (though a denied limit still consumes
//     nothing).
//   - Several limits may apply to one descriptor; its status reports the
//     one that denied or, when all admitted, the one with least remaining.
//   - Shadow-mode limits are decided apart from the others, so a shadow
//     denial never blocks or un-counts a real limit.
//   - A descriptor's inline limit (the proxy's own, envoyproxy/ratelimit's
//     "limit override") replaces every limit its rules give it, and takes
//     none of their modes: it is never shadow nor quota mode, as in
//     envoyproxy/ratelimit, so a proxy's explicit limit is always enforced.
//   - quota_mode (a descriptor's soft limit, as envoyproxy/ratelimit
//     since 2026): a quota-mode limit over its quota makes its
//     descriptor's status OverLimit with QuotaExceeded, but the request
//     stays OK unless every quota-mode descriptor of the request is over
//     (or a limit without quota_mode denies). See "Quota mode" below.
//   - A request denied only because the store could not reach its backend
//     and its limits fail closed is an *UnavailableError, not a request
//     over the limit (see Decide).
//   - Several dimensions in one decision: a limit of a rule file may
//     count a named cost unit (cost_unit: input_tokens), and a
//     descriptor may give a cost per unit (Descriptor.Costs); its limits
//     of requests, input tokens and output tokens are then each charged
//     their own cost, all or nothing like any limits of one request.
//   - Reserve decides a request as reservations, "how long must I wait to
//     send this?", on gcra and leaky_bucket limits (reserve.go).
//
// # Quota mode
//
// A limit of a descriptor with quota_mode is a quota limit, unless it is
// a shadow-mode limit (shadow wins: it never denies) or an inline limit
// replaced it (inline limits have no mode). A descriptor is over quota
// when one of its quota limits denies. The request is OverLimit when a
// limit without quota_mode denies or when the request has quota
// descriptors and every one of them is over quota; otherwise it is OK,
// and the descriptors over quota are OverLimit with QuotaExceeded. What
// is consumed, with the store's rule that a denied limit consumes
// nothing:
//
//   - All or nothing (the default): the other limits are decided first,
//     together. If they deny, the request is OverLimit and the quota
//     limits are only looked at (cost 0: nothing consumed). If they
//     admit, each quota limit is decided on its own: one within its
//     quota consumes its cost even when another descriptor is over its
//     own (the request goes through). If then every quota descriptor is
//     over, the request is OverLimit and what the other limits consumed
//     is given back (a second call with the negated positive costs; the
//     statuses report the first), so a refused request keeps nothing it
//     took. A refund among its costs stands: undoing it would be a
//     consumption the store may deny, and the give-back is all or
//     nothing.
//   - Independent: every limit is decided on its own and consumes its
//     cost when within its limit, whatever the request's answer.
//
// A refund is not atomic with the decision: between the two calls,
// another request can find those units taken.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
)

// Options configure a Service.
type Options struct {
	// Store keeps the counters. Required.
	Store ratelimit.Store
	// Rules is the initial rule set; nil means none (every request OK).
	Rules *rules.Set
	// Independent counts every limit of a request on its own, as
	// envoyproxy/ratelimit does, instead of all or nothing.
	Independent bool
	// Overrides, if not nil, holds runtime overrides of configured rules;
	// an overridden rule is decided, and reported, with its override.
	// SetRules keeps them in step with the rules.
	Overrides *Overrides
	// Metrics, if not nil, receives every decision.
	Metrics *Metrics
	// Top, if not nil, tracks the hottest, most denied and near-limit
	// keys of every rule.
	Top *Top
	// Logger logs rule changes and store errors; nil discards.
	Logger *slog.Logger
	// MaxReserveWait bounds the wait a reservation may ask for
	// (Reserve); 0 means DefaultMaxReserveWait.
	MaxReserveWait time.Duration
	// Ledger, if not nil, keeps the reservations of requests that ask for
	// one (Request.Reservation), which Settle settles; both memstore's and
	// redisstore's Stores are Ledgers. Nil: such requests are invalid.
	Ledger ratelimit.Ledger
}

// Service decides requests. It is safe for concurrent use.
type Service struct {
	store       ratelimit.Store
	independent bool
	metrics     *Metrics
	top         *Top
	log         *slog.Logger
	rules       atomic.Pointer[rules.Set]
	setting     sync.Mutex // serialises SetRules
	overrides   *Overrides
	inline      inlineRules
	scratch     sync.Pool // of *scratch
	reserve     reserveRules
	rs          *ratelimit.Reservations // nil without a Ledger
}

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Store == nil {
		return nil, errors.New("service: a store is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{store: opts.Store, independent: opts.Independent, metrics: opts.Metrics, log: opts.Logger, overrides: opts.Overrides, top: opts.Top}
	s.reserve.max = cmp.Or(opts.MaxReserveWait, DefaultMaxReserveWait)
	if opts.Ledger != nil {
		s.rs = &ratelimit.Reservations{Store: opts.Store, Ledger: opts.Ledger}
		if c, ok := opts.Store.(storeClock); ok {
			s.rs.Now = c.Now
		}
	}
	s.scratch.New = func() any { return new(scratch) }
	// Overrides that do not apply to the first rules are kept; whoever
	// set them (Overrides.Replace) was told.
	_ = s.SetRules(opts.Rules)
	return s, nil
}

// SetRules replaces the rule set at once: requests already being decided
// finish with the old set, the next ones use the new one. The runtime
// overrides follow without a gap: while the sets change, the rules of both
// are overridden, so no request sees its set without its overrides. It
// returns, joined, an error for each override that does not apply to set
// (its rule is gone, unlimited, or cannot take its quota), for the caller
// to log; such overrides are kept, and apply again once a set brings their
// rule back.
func (s *Service) SetRules(set *rules.Set) error {
	if set == nil {
		set = &rules.Set{}
	}
	s.setting.Lock()
	defer s.setting.Unlock()
	s.metrics.prepare(set)
	s.top.prepare(set)
	if s.overrides == nil {
		s.rules.Store(set)
		return nil
	}
	_ = s.overrides.setRules(set, true) // the last step reports the same errors
	s.rules.Store(set)
	return s.overrides.setRules(set, false)
}

// Rules returns the rule set in use.
func (s *Service) Rules() *rules.Set { return s.rules.Load() }

// Code is the answer for a request or a descriptor.
type Code uint8

const (
	OK Code = iota
	OverLimit
)

// A Response is the answer to a Request: one Status per descriptor, in
// order. Reuse a Response across calls to avoid allocation.
type Response struct {
	Code     Code
	Statuses []Status
	// Reservation is the Request's Reservation when it was kept (the
	// request was admitted), for Settle; empty otherwise.
	Reservation string
}

// A Status is the answer for one descriptor.
type Status struct {
	Code Code
	// Spec is the configured rule that decided; nil when none matched or
	// the limit is an InlineLimit.
	Spec *rules.Spec
	// Rule is the limit that decided; nil when none applies or the
	// matched rule is unlimited.
	Rule *ratelimit.Rule
	// Unit is the Envoy unit of Rule, or UnitUnknown.
	Unit rules.Unit
	// Unlimited reports a match of an unlimited rule.
	Unlimited bool
	// Shadow reports that a shadow-mode rule decided: Code is OK whatever
	// Decision says.
	Shadow bool
	// Quota reports that a quota-mode rule decided (see "Quota mode" in
	// the package documentation); QuotaExceeded that it denied: Code is
	// then OverLimit though the request may be OK.
	Quota, QuotaExceeded bool
	// Decision is the store's answer for Rule.
	Decision ratelimit.Decision
}

// CostUnit is the cost unit of the limit that decided (rules.Spec's
// CostUnit): what its limit and remaining count; empty when the limit has
// none (it counts the descriptor's cost), and for inline limits.
func (st *Status) CostUnit() string {
	if st.Spec == nil || st.Rule == nil {
		return ""
	}
	return st.Spec.CostUnit
}

// RemainingKnown reports whether Decision.Remaining and ResetAfter say
// what the key has left. They do not for a limit admitted by its
// fail_open failure mode: the store could not be asked, so nothing is
// known of the key (its Remaining, 0, means nothing). The transports then
// leave remaining out where they can (/v1/check's "remaining" and
// "reset_after_ms", the RateLimit field's item) and state the rule's
// limit where they cannot (Envoy's limit_remaining).
func (st *Status) RemainingKnown() bool {
	return st.Decision.Reason != ratelimit.ReasonFailOpen
}

// scratch holds the per-request buffers a Service reuses.
type scratch struct {
	limits []rules.Match
	checks []check
	items  []ratelimit.Item
	shadow []ratelimit.Item
	quota  []ratelimit.Item
	ds     []ratelimit.Decision
	sds    []ratelimit.Decision
	qds    []ratelimit.Decision
	refund []ratelimit.Item     // what a request refused by its quotas gives back
	rds    []ratelimit.Decision // the store's answers to the refund
	kept   []ratelimit.Reserved // what a reservation keeps
	key    []byte
	mkey   []byte // a per-value metric key
	// allOver: the request has quota descriptors and every one is over
	// quota.
	allOver bool
}

// A check is one limit to decide for descriptor i.
type check struct {
	desc   int
	spec   *rules.Spec
	rule   *ratelimit.Rule
	unit   rules.Unit
	shadow bool
	quota  bool // a quota-mode limit (never with shadow)
	result int  // index into scratch.ds (sds when shadow, qds when quota)
}

// Decide decides req into resp. An error means the request was
// invalid (wrapping ErrInvalidRequest) or the store could not decide (an
// *UnavailableError). A request that is denied only by limits that failed
// closed is an *UnavailableError whose FailedClosed is true, and resp then
// holds its statuses (OverLimit), for a protocol that has no other way to
// deny it; when a limit denies the request by itself, it is over the limit
// and there is no error.
func (s *Service) Decide(ctx context.Context, req *Request, resp *Response) error {
	return s.decideRequest(ctx, req, resp, nil)
}

// decideRequest is Decide, and Reserve when rv is not nil (reserve.go).
func (s *Service) decideRequest(ctx context.Context, req *Request, resp *Response, rv *reservation) error {
	var start time.Time
	if s.metrics != nil { // the clock read is only for the latency histogram
		start = time.Now()
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if req.Reservation != "" && s.rs == nil {
		return invalid("this server keeps no reservations")
	}
	resp.Code = OK
	resp.Reservation = ""
	resp.Statuses = append(resp.Statuses[:0], make([]Status, len(req.Descriptors))...)
	set := s.rules.Load()
	dom, ok := set.Domain(req.Domain)
	if !ok {
		// An unknown domain limits nothing, as in envoyproxy/ratelimit;
		// a reservation of it is kept empty, so that its settlement is
		// answered like any other.
		if req.Reservation != "" {
			return s.keep(ctx, nil, req, resp)
		}
		return nil
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	s.match(sc, dom, req)
	if rv != nil {
		if err := s.reserving(sc, req, rv); err != nil {
			return err
		}
	}
	if err := s.decide(ctx, sc); err != nil {
		s.metrics.storeError()
		return &UnavailableError{Err: err}
	}
	if rv != nil {
		rv.outcome(sc)
	}
	closed := s.answer(sc, resp)
	s.metrics.observe(req, sc, resp, time.Since(start))
	if s.top != nil {
		s.top.observe(sc, start) // start is zero without metrics
	}
	if closed != nil {
		return &UnavailableError{Domain: req.Domain, Rule: closed.rule.Name, RetryAfter: sc.decision(closed).RetryAfter}
	}
	if req.Reservation != "" && resp.Code == OK {
		return s.keep(ctx, sc.reserved(req), req, resp)
	}
	return nil
}

// match turns the request's descriptors into the checks to decide, with
// their storage keys, replaces applied.
func (s *Service) match(sc *scratch, dom *rules.Domain, req *Request) {
	sc.limits = sc.limits[:0]
	for i := range req.Descriptors {
		sc.limits = dom.Match(i, req.Descriptors[i].Entries, sc.limits)
	}
	sc.limits = rules.ApplyReplaces(sc.limits)
	sc.checks, sc.items, sc.shadow, sc.quota = sc.checks[:0], sc.items[:0], sc.shadow[:0], sc.quota[:0]
	inlined := -1
	for _, l := range sc.limits {
		d := &req.Descriptors[l.Descriptor]
		c := check{desc: l.Descriptor, spec: l.Spec, rule: l.Rule, unit: l.Unit, shadow: l.Shadow, quota: l.QuotaMode && !l.Shadow}
		sc.key = l.AppendKey(sc.key[:0], d.Entries)
		if d.InlineLimit != nil {
			if inlined == l.Descriptor {
				continue // one inline limit replaces all the descriptor's limits
			}
			inlined = l.Descriptor
			c.rule, c.unit, c.spec, c.quota, c.shadow = s.inline.get(d.InlineLimit), d.InlineLimit.Unit, nil, false, false
			if l.Unlimited {
				// An unlimited rule has no storage key (AppendKey
				// appended nothing): count on the descriptor's own
				// entries, as when no rule matches, not on a key that
				// every such descriptor of every domain would share.
				sc.key = appendEntriesKey(sc.key[:0], dom.Name(), d.Entries)
			}
			sc.key = appendInlineKey(sc.key, d.InlineLimit)
		} else if l.Unlimited {
			c.rule = nil
		} else if r, _, ok := s.overrides.Lookup(c.rule); ok {
			c.rule = r
		}
		s.addCheck(sc, c, req, string(sc.key))
	}
	// An inline limit on a descriptor that matched no rule still limits
	// it, as in envoyproxy/ratelimit (the domain must exist).
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if d.InlineLimit == nil || hasCheck(sc.checks, i) {
			continue
		}
		sc.key = appendInlineKey(appendEntriesKey(sc.key[:0], dom.Name(), d.Entries), d.InlineLimit)
		s.addCheck(sc, check{desc: i, rule: s.inline.get(d.InlineLimit), unit: d.InlineLimit.Unit}, req, string(sc.key))
	}
}

func hasCheck(cs []check, desc int) bool {
	for i := range cs {
		if cs[i].desc == desc {
			return true
		}
	}
	return false
}

func (s *Service) addCheck(sc *scratch, c check, req *Request, key string) {
	if c.rule == nil { // unlimited: reported, never counted
		c.result = -1
		sc.checks = append(sc.checks, c)
		return
	}
	it := ratelimit.Item{Key: key, Rule: c.rule, Cost: req.Descriptors[c.desc].cost(c.spec)}
	switch {
	case c.shadow:
		c.result = len(sc.shadow)
		sc.shadow = append(sc.shadow, it)
	case c.quota:
		c.result = len(sc.quota)
		sc.quota = append(sc.quota, it)
	default:
		c.result = len(sc.items)
		sc.items = append(sc.items, it)
	}
	sc.checks = append(sc.checks, c)
}

// decide asks the store: the real limits all or nothing (or one by one when
// independent), then the quota limits and the shadow limits one by one
// (see "Quota mode" in the package documentation).
func (s *Service) decide(ctx context.Context, sc *scratch) error {
	var err error
	sc.ds, err = s.decideItems(ctx, sc.ds[:0], sc.items, !s.independent)
	if err != nil {
		return err
	}
	sc.allOver = false
	if len(sc.quota) > 0 {
		if err := s.decideQuota(ctx, sc); err != nil {
			return err
		}
	}
	sc.sds, err = s.decideItems(ctx, sc.sds[:0], sc.shadow, false)
	return err
}

// decideQuota decides the quota limits once the others are decided.
func (s *Service) decideQuota(ctx context.Context, sc *scratch) error {
	denied := false
	for i := range sc.ds {
		denied = denied || !sc.ds[i].Allowed
	}
	if denied && !s.independent {
		// The request is over the limit already: look, consume nothing.
		for i := range sc.quota {
			sc.quota[i].Cost = 0
		}
	}
	var err error
	if sc.qds, err = s.decideItems(ctx, sc.qds[:0], sc.quota, false); err != nil {
		return err
	}
	sc.allOver = sc.quotaAllOver()
	if !sc.allOver || denied || s.independent || len(sc.items) == 0 {
		return nil
	}
	// Refused by its quotas: give back what the other limits took. Only
	// positive costs: negating a refund would make it a consumption,
	// which the store may deny (more than the capacity, or units another
	// request took), and the give-back is one call, all or nothing, so
	// that denial would keep everything the request took.
	sc.refund = sc.refund[:0]
	for _, it := range sc.items {
		if it.Cost > 0 {
			it.Cost = -it.Cost
			sc.refund = append(sc.refund, it)
		}
	}
	if len(sc.refund) == 0 {
		return nil
	}
	if sc.rds, err = s.store.Decide(ctx, sc.rds[:0], sc.refund); err != nil {
		s.log.Warn("refunding a request refused by its quota-mode limits failed", "err", err)
	}
	return nil
}

// overQuota reports whether c's decision d is a quota-mode limit over its
// quota that does not deny the request (not every quota descriptor is
// over): the one rule of "over quota, allowed", for the answer and the
// metrics alike.
func (sc *scratch) overQuota(c *check, d *ratelimit.Decision) bool {
	return !d.Allowed && !c.shadow && c.quota && !sc.allOver
}

// quotaAllOver reports whether the request has quota descriptors and
// every one has a quota limit that denied. Descriptors number at most
// rules.MaxDescriptors (64), one bit each.
func (sc *scratch) quotaAllOver() bool {
	var has, over uint64
	for i := range sc.checks {
		c := &sc.checks[i]
		if !c.quota || c.rule == nil {
			continue
		}
		has |= 1 << c.desc
		if !sc.qds[c.result].Allowed {
			over |= 1 << c.desc
		}
	}
	return has != 0 && has == over
}

func (s *Service) decideItems(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item, together bool) ([]ratelimit.Decision, error) {
	if len(items) == 0 {
		return dst, nil
	}
	if together {
		return s.store.Decide(ctx, dst, items)
	}
	for i := range items {
		var err error
		if dst, err = s.store.Decide(ctx, dst, items[i:i+1]); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// answer fills one status per descriptor from the decisions: a denial
// (of a non-shadow limit) wins; otherwise the limit with least remaining.
// When the request is denied and every denial is a limit that failed
// closed, it returns the one that retries last.
func (s *Service) answer(sc *scratch, resp *Response) (closed *check) {
	limited := false // a limit denied by itself
	for i := range sc.checks {
		c := &sc.checks[i]
		st := &resp.Statuses[c.desc]
		if c.rule == nil {
			if st.Rule == nil {
				st.Spec, st.Unlimited, st.Unit = c.spec, true, rules.UnitUnknown
			}
			continue
		}
		d := sc.decision(c)
		denies := !d.Allowed && !c.shadow && !sc.overQuota(c, d)
		if denies {
			if d.Reason != ratelimit.ReasonFailClosed {
				limited = true
			} else if closed == nil || d.RetryAfter > sc.decision(closed).RetryAfter {
				closed = c
			}
		}
		if !better(st, d, c.shadow) {
			continue
		}
		*st = Status{Spec: c.spec, Rule: c.rule, Unit: c.unit, Shadow: c.shadow, Quota: c.quota, Decision: *d}
		if !d.Allowed && !c.shadow {
			st.Code = OverLimit
			st.QuotaExceeded = c.quota
		}
		if denies {
			resp.Code = OverLimit
		}
	}
	if limited {
		return nil
	}
	return closed
}

// decision returns the store's decision for c.
func (sc *scratch) decision(c *check) *ratelimit.Decision {
	switch {
	case c.shadow:
		return &sc.sds[c.result]
	case c.quota:
		return &sc.qds[c.result]
	}
	return &sc.ds[c.result]
}

// item returns the item decided for c; like decision, it looks at c.shadow
// before it indexes, since c.result indexes the shadow items for a shadow
// limit.
func (sc *scratch) item(c *check) *ratelimit.Item {
	switch {
	case c.shadow:
		return &sc.shadow[c.result]
	case c.quota:
		return &sc.quota[c.result]
	}
	return &sc.items[c.result]
}

// better reports whether decision d of a limit should replace status st as
// its descriptor's answer.
func better(st *Status, d *ratelimit.Decision, shadow bool) bool {
	switch {
	case st.Rule == nil:
		return true
	case st.Code == OverLimit:
		return false
	case !d.Allowed && !shadow:
		return true
	case st.Shadow != shadow:
		return !shadow // a real limit's answer beats a shadow one's
	case (d.Reason == ratelimit.ReasonFailOpen) != (st.Decision.Reason == ratelimit.ReasonFailOpen):
		return st.Decision.Reason == ratelimit.ReasonFailOpen // a known remaining beats an unknown one
	}
	return d.Remaining < st.Decision.Remaining
}

// appendEntriesKey appends a storage key for entries that matched no rule
// (a bare inline limit): the domain and length-prefixed keys and values.
func appendEntriesKey(b []byte, domain string, entries []rules.Entry) []byte {
	b = appendLenString(b, domain)
	for _, e := range entries {
		b = appendLenString(appendLenString(b, e.Key), e.Value)
	}
	return b
}

func appendLenString(b []byte, s string) []byte {
	b = fmt.Appendf(b, "|%d:", len(s))
	return append(b, s...)
}

// appendInlineKey marks a key as an inline limit's, with its window; rule
// keys never contain "!o/" (their '/' is escaped). The marker predates the
// name InlineLimit and stays: it is part of keys already stored.
func appendInlineKey(b []byte, l *InlineLimit) []byte {
	return fmt.Appendf(b, "!o/%dx%s", max(l.Multiplier, 1), l.Unit)
}

// inlineRules caches the rules of inline limits, so that the same inline
// limit does not allocate a rule per request. Bounded: past maxInlineRules
// distinct inline limits, rules are made per request.
type inlineRules struct {
	mu sync.RWMutex
	m  map[InlineLimit]*ratelimit.Rule
}

const maxInlineRules = 4096

func (c *inlineRules) get(l *InlineLimit) *ratelimit.Rule {
	c.mu.RLock()
	r := c.m[*l]
	c.mu.RUnlock()
	if r != nil {
		return r
	}
	r = &ratelimit.Rule{
		Name:      fmt.Sprintf("inline_%d_per_%dx%s", l.RequestsPerUnit, max(l.Multiplier, 1), l.Unit),
		Algorithm: ratelimit.FixedWindow,
		Quota:     int64(l.RequestsPerUnit),
		Block:     l.RequestsPerUnit == 0,
		Period:    l.period(),
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[InlineLimit]*ratelimit.Rule)
	}
	if len(c.m) < maxInlineRules {
		c.m[*l] = r
	}
	c.mu.Unlock()
	return r
}

// AppendFields appends to policy and limit the values of the
// RateLimit-Policy and RateLimit header fields for every decided limit of
// r (a policy item names its limit's cost unit as qu), and returns them
// with the Retry-After seconds when r is over the limit and can succeed
// later (0 otherwise).
func (r *Response) AppendFields(policy, limit []byte) ([]byte, []byte, int64) {
	var retry time.Duration
	p0, l0 := len(policy), len(limit)
	for i := range r.Statuses {
		st := &r.Statuses[i]
		if st.Rule == nil {
			continue
		}
		if len(policy) > p0 {
			policy = append(policy, ", "...)
		}
		policy = limitheader.AppendPolicyItem(policy, st.Rule.Name, st.Rule.Capacity(), st.Rule.QuotaWindow())
		if u := st.CostUnit(); u != "" {
			policy = limitheader.AppendQuotaUnit(policy, u)
		}
		if st.Code == OverLimit {
			retry = max(retry, st.Decision.RetryAfter)
		}
		if !st.RemainingKnown() { // fail_open: nothing is known of the key
			continue
		}
		if len(limit) > l0 {
			limit = append(limit, ", "...)
		}
		limit = limitheader.AppendLimitItem(limit, st.Decision.Rule, st.Decision.Remaining, st.Decision.ResetAfter)
	}
	if r.Code != OverLimit || retry <= 0 || retry == ratelimit.Never {
		return policy, limit, 0
	}
	return policy, limit, limitheader.RetryAfterSeconds(retry)
}
