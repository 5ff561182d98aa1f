// Package service is Sluice's transport-agnostic decision service: it
// matches a request's descriptors against the loaded rules, decides their
// limits in a ratelimit.Store, and answers in the terms of Envoy's rate
// limit service. The gRPC (internal/rls) and HTTP (internal/httpapi)
// adapters translate to and from it.
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
//   - A descriptor's hits_addend of 0 checks without counting; the
//     request's hits_addend of 0 counts as 1 (both as in Envoy's API).
//   - quota_mode is not acted on: such limits are decided like the others.
package service

import (
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
	Overrides *Overrides
	// Metrics, if not nil, receives every decision.
	Metrics *Metrics
	// Logger logs rule changes and store errors; nil discards.
	Logger *slog.Logger
}

// Service decides requests. It is safe for concurrent use.
type Service struct {
	store       ratelimit.Store
	independent bool
	metrics     *Metrics
	log         *slog.Logger
	rules       atomic.Pointer[rules.Set]
	ruleOver    *Overrides
	overrides   overrideRules
	scratch     sync.Pool // of *scratch
}

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Store == nil {
		return nil, errors.New("service: a store is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{store: opts.Store, independent: opts.Independent, metrics: opts.Metrics, log: opts.Logger, ruleOver: opts.Overrides}
	s.scratch.New = func() any { return new(scratch) }
	s.SetRules(opts.Rules)
	return s, nil
}

// SetRules replaces the rule set at once: requests already being decided
// finish with the old set, the next ones use the new one.
func (s *Service) SetRules(set *rules.Set) {
	if set == nil {
		set = &rules.Set{}
	}
	s.metrics.prepare(set)
	s.rules.Store(set)
}

// Rules returns the rule set in use.
func (s *Service) Rules() *rules.Set { return s.rules.Load() }

// A Request asks whether a request may go: Envoy's RateLimitRequest.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// Hits is the cost of every descriptor that does not carry its own;
	// 0 counts as 1.
	Hits uint32
}

// A Descriptor is one list of entries of a Request.
type Descriptor struct {
	Entries []rules.Entry
	// Override, if not nil, replaces the limits the descriptor matches
	// with a fixed window of RequestsPerUnit per Unit.
	Override *Override
	// Hits, when HasHits, is this descriptor's cost; 0 checks only.
	Hits    uint64
	HasHits bool
	// Refund gives Hits back instead of taking them (is_negative_hits).
	Refund bool
}

// An Override is a limit carried in a request descriptor.
type Override struct {
	RequestsPerUnit uint32
	Unit            rules.Unit
	// Multiplier multiplies the window (Envoy's unit_multiplier); 0 means 1.
	Multiplier uint32
}

// period is the override's window.
func (o *Override) period() time.Duration {
	return o.Unit.Duration() * time.Duration(max(o.Multiplier, 1))
}

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
}

// A Status is the answer for one descriptor.
type Status struct {
	Code Code
	// Spec is the configured rule that decided; nil when none matched or
	// the limit came from an override.
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
	// Decision is the store's answer for Rule.
	Decision ratelimit.Decision
}

// ErrInvalidRequest is wrapped by the errors of requests beyond a bound
// or malformed; adapters answer them with INVALID_ARGUMENT or 400.
var ErrInvalidRequest = errors.New("invalid request")

// scratch holds the per-request buffers a Service reuses.
type scratch struct {
	limits []rules.Match
	checks []check
	items  []ratelimit.Item
	shadow []ratelimit.Item
	ds     []ratelimit.Decision
	sds    []ratelimit.Decision
	key    []byte
}

// A check is one limit to decide for descriptor i.
type check struct {
	desc   int
	spec   *rules.Spec
	rule   *ratelimit.Rule
	unit   rules.Unit
	shadow bool
	result int // index into scratch.ds (or sds when shadow)
}

// ShouldRateLimit decides req into resp. An error means the request was
// invalid (wrapping ErrInvalidRequest) or the store could not decide.
func (s *Service) ShouldRateLimit(ctx context.Context, req *Request, resp *Response) error {
	var start time.Time
	if s.metrics != nil { // the clock read is only for the latency histogram
		start = time.Now()
	}
	if err := validate(req); err != nil {
		return err
	}
	resp.Code = OK
	resp.Statuses = append(resp.Statuses[:0], make([]Status, len(req.Descriptors))...)
	set := s.rules.Load()
	dom, ok := set.Domain(req.Domain)
	if !ok {
		return nil // an unknown domain limits nothing, as in envoyproxy/ratelimit
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	s.match(sc, dom, req)
	if err := s.decide(ctx, sc); err != nil {
		s.metrics.storeError()
		return err
	}
	s.answer(sc, resp)
	s.metrics.observe(req.Domain, sc, resp, time.Since(start))
	return nil
}

func validate(req *Request) error {
	if err := rules.CheckDomain(req.Domain); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err := rules.CheckDescriptorCount(len(req.Descriptors)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if err := rules.CheckDescriptor(i, d.Entries); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if len(d.Entries) == 0 {
			return fmt.Errorf("%w: descriptor %d has no entries", ErrInvalidRequest, i)
		}
		if d.HasHits && d.Hits > ratelimit.MaxQuota {
			return fmt.Errorf("%w: descriptor %d: hits_addend %d exceeds %d", ErrInvalidRequest, i, d.Hits, int64(ratelimit.MaxQuota))
		}
		if o := d.Override; o != nil {
			if o.Unit.Duration() == 0 {
				return fmt.Errorf("%w: descriptor %d: limit override has unknown unit %d", ErrInvalidRequest, i, o.Unit)
			}
			if p := o.period(); p <= 0 || p > ratelimit.MaxPeriod || p/o.Unit.Duration() != time.Duration(max(o.Multiplier, 1)) {
				return fmt.Errorf("%w: descriptor %d: limit override window %d × %s exceeds %v", ErrInvalidRequest, i, o.Multiplier, o.Unit, ratelimit.MaxPeriod)
			}
		}
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
	sc.checks, sc.items, sc.shadow = sc.checks[:0], sc.items[:0], sc.shadow[:0]
	overridden := -1
	for _, l := range sc.limits {
		d := &req.Descriptors[l.Descriptor]
		c := check{desc: l.Descriptor, spec: l.Spec, rule: l.Rule, unit: l.Unit, shadow: l.Shadow}
		sc.key = l.AppendKey(sc.key[:0], d.Entries)
		if d.Override != nil {
			if overridden == l.Descriptor {
				continue // one override limit replaces all the descriptor's limits
			}
			overridden = l.Descriptor
			c.rule, c.unit, c.spec = s.overrides.get(d.Override), d.Override.Unit, nil
			sc.key = appendOverrideKey(sc.key, d.Override)
		} else if l.Unlimited {
			c.rule = nil
		} else if r, _, ok := s.ruleOver.Lookup(c.rule); ok {
			c.rule = r
		}
		s.addCheck(sc, c, req, string(sc.key))
	}
	// An override on a descriptor that matched no rule still limits it,
	// as in envoyproxy/ratelimit (the domain must exist).
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if d.Override == nil || hasCheck(sc.checks, i) {
			continue
		}
		sc.key = appendOverrideKey(appendEntriesKey(sc.key[:0], dom.Name(), d.Entries), d.Override)
		s.addCheck(sc, check{desc: i, rule: s.overrides.get(d.Override), unit: d.Override.Unit}, req, string(sc.key))
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
	d := &req.Descriptors[c.desc]
	cost := int64(max(req.Hits, 1))
	if d.HasHits {
		cost = int64(d.Hits)
	}
	if d.Refund {
		cost = -cost
	}
	it := ratelimit.Item{Key: key, Rule: c.rule, Cost: cost}
	if c.shadow {
		c.result = len(sc.shadow)
		sc.shadow = append(sc.shadow, it)
	} else {
		c.result = len(sc.items)
		sc.items = append(sc.items, it)
	}
	sc.checks = append(sc.checks, c)
}

// decide asks the store: the real limits all or nothing (or one by one when
// independent), the shadow limits one by one.
func (s *Service) decide(ctx context.Context, sc *scratch) error {
	var err error
	sc.ds, err = s.decideItems(ctx, sc.ds[:0], sc.items, !s.independent)
	if err != nil {
		return err
	}
	sc.sds, err = s.decideItems(ctx, sc.sds[:0], sc.shadow, false)
	return err
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
func (s *Service) answer(sc *scratch, resp *Response) {
	for _, c := range sc.checks {
		st := &resp.Statuses[c.desc]
		if c.rule == nil {
			if st.Rule == nil {
				st.Spec, st.Unlimited, st.Unit = c.spec, true, rules.UnitUnknown
			}
			continue
		}
		d := sc.decision(&c)
		if !better(st, d, c.shadow) {
			continue
		}
		*st = Status{Spec: c.spec, Rule: c.rule, Unit: c.unit, Shadow: c.shadow, Decision: *d}
		if !d.Allowed && !c.shadow {
			st.Code = OverLimit
			resp.Code = OverLimit
		}
	}
}

// decision returns the store's decision for c.
func (sc *scratch) decision(c *check) *ratelimit.Decision {
	if c.shadow {
		return &sc.sds[c.result]
	}
	return &sc.ds[c.result]
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
	}
	return d.Remaining < st.Decision.Remaining
}

// appendEntriesKey appends a storage key for entries that matched no rule
// (a bare override): the domain and length-prefixed keys and values.
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

// appendOverrideKey marks a key as an override's, with its window; rule
// keys never contain "!o/" (their '/' is escaped).
func appendOverrideKey(b []byte, o *Override) []byte {
	return fmt.Appendf(b, "!o/%dx%s", max(o.Multiplier, 1), o.Unit)
}

// overrideRules caches the rules of descriptor overrides, so that the same
// override does not allocate a rule per request. Bounded: past maxOverrides
// distinct overrides, rules are made per request.
type overrideRules struct {
	mu sync.RWMutex
	m  map[Override]*ratelimit.Rule
}

const maxOverrides = 4096

func (o *overrideRules) get(ov *Override) *ratelimit.Rule {
	o.mu.RLock()
	r := o.m[*ov]
	o.mu.RUnlock()
	if r != nil {
		return r
	}
	r = &ratelimit.Rule{
		Name:      fmt.Sprintf("override_%d_per_%dx%s", ov.RequestsPerUnit, max(ov.Multiplier, 1), ov.Unit),
		Algorithm: ratelimit.FixedWindow,
		Quota:     int64(ov.RequestsPerUnit),
		Period:    ov.period(),
	}
	o.mu.Lock()
	if o.m == nil {
		o.m = make(map[Override]*ratelimit.Rule)
	}
	if len(o.m) < maxOverrides {
		o.m[*ov] = r
	}
	o.mu.Unlock()
	return r
}

// AppendFields appends to policy and limit the values of the
// RateLimit-Policy and RateLimit header fields for every decided limit of
// r, and returns them with the Retry-After seconds when r is over the limit
// and can succeed later (0 otherwise).
func (r *Response) AppendFields(policy, limit []byte) ([]byte, []byte, int64) {
	var retry time.Duration
	for i := range r.Statuses {
		st := &r.Statuses[i]
		if st.Rule == nil {
			continue
		}
		if len(limit) > 0 {
			policy, limit = append(policy, ", "...), append(limit, ", "...)
		}
		policy = limitheader.AppendPolicyItem(policy, st.Rule.Name, st.Rule.Capacity(), st.Rule.QuotaWindow())
		limit = limitheader.AppendLimitItem(limit, st.Decision.Rule, st.Decision.Remaining, st.Decision.ResetAfter)
		if st.Code == OverLimit {
			retry = max(retry, st.Decision.RetryAfter)
		}
	}
	if r.Code != OverLimit || retry <= 0 || retry == ratelimit.Never {
		return policy, limit, 0
	}
	return policy, limit, limitheader.RetryAfterSeconds(retry)
}
