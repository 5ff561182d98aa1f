package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/topk"
)

// A Policy is one limit the middleware applies: a Rule counted per bucket,
// the Keys that pick the bucket, and the cost of a request.
type Policy struct {
	// Rule is the limit; its Name names the policy in the RateLimit fields
	// and must be unique within an Options value.
	Rule ratelimit.Rule
	// Keys pick the bucket; none means one bucket for every request. If
	// any Key does not apply to a request, neither does the Policy.
	Keys []Key
	// Cost is the cost of a request; nil means 1.
	Cost CostFunc
}

// Options configure the middleware. Its zero values are the defaults
// documented on each field; Store and at least one Policy are required.
type Options struct {
	// Store decides the limits; ratelimit.Store implementations include
	// memstore (one process) and redisstore (shared).
	Store ratelimit.Store
	// Policies are decided all or nothing: a request passes when every policy
	// that applies admits it, and then consumes from each; a denied
	// request consumes nothing.
	Policies []Policy
	// Shadow decides and reports (headers, OnDecision) but never blocks:
	// every request reaches the handler.
	Shadow bool
	// OmitAllowedHeaders leaves the RateLimit and RateLimit-Policy fields
	// off the responses of admitted requests; by default they carry them.
	OmitAllowedHeaders bool
	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the reset) for the most constrained
	// limit, for clients that predate the RateLimit fields.
	LegacyHeaders bool
	// OnDecision, if set, is called once per request that any policy
	// applies to (or that Shed sheds), after the decision and before the
	// response, for metrics and logs. The Event is valid only during the
	// call. It must be safe for concurrent use.
	OnDecision func(*Event)
	// Shed, if set, is asked first whether the server is overloaded; if
	// it says so the request is answered 503 with Retry-After set to the
	// duration it returns (at least one second), without deciding.
	Shed func(r *http.Request) (retryAfter time.Duration, shed bool)
	// ErrorRetryAfter is the Retry-After of the 503 answered when the
	// Store returns an error; default one second.
	ErrorRetryAfter time.Duration
	// Top, if not nil, keeps for every policy its hottest, most denied and
	// near-limit keys (package topk; fixed memory per policy, no
	// allocation per request), for a dashboard (TopLimits). The keys of a
	// policy with a secret Key are shown hashed. With a Store that decides
	// at an instant read from its clock (memstore), the trackers record
	// the decisions at that instant and read no clock of their own: give
	// them the same clock (Top.Now) if the store's is not time.Now.
	Top *topk.Options
}

// An Event reports one decision to Options.OnDecision.
type Event struct {
	Request *http.Request
	// Policies are the policies that applied, Keys their store keys and
	// Decisions their decisions, index for index.
	Policies  []*Policy
	Keys      []string
	Decisions []ratelimit.Decision
	// Status is the status the middleware answered (429 or 503), or 0 when
	// the request went on to the handler — always 0 in shadow mode.
	Status int
	// Shadow reports shadow mode; Denied then says what would have been
	// answered.
	Shadow bool
	// Denied reports whether the request was (or in shadow mode would have
	// been) refused.
	Denied bool
	// Err is the Store's error, if any.
	Err error
}

// Middleware applies limits to HTTP requests. Create one with New; it is
// safe for concurrent use.
//
// A request that every applicable limit admits reaches the handler,
// carrying RateLimit-Policy and RateLimit fields (draft-ietf-httpapi-
// ratelimit-headers) unless Options.OmitAllowedHeaders. A request that some
// limit denies is answered at once, without reading its body:
//
//   - 429 Too Many Requests when a quota is spent, with Retry-After in
//     whole seconds rounded up (never 0), the RateLimit fields, and an RFC
//     9457 problem+json body of type quota-exceeded naming the violated
//     policies, their scope and key, and the rate that would succeed. A
//     request whose cost exceeds a limit's capacity can never succeed and
//     gets no Retry-After.
//   - 503 Service Unavailable, with Retry-After and a problem of type
//     temporary-reduced-capacity, when the server is overloaded: Options.Shed
//     says so, the Store failed closed (ratelimit.ReasonFailClosed), or the
//     Store returned an error.
type Middleware struct {
	store      ratelimit.Store
	policies   []Policy
	shadow     bool
	omit       bool
	legacy     bool
	onDecision func(*Event)
	shed       func(*http.Request) (time.Duration, bool)
	errRetry   time.Duration
	// policyItems[i] is policies[i]'s RateLimit-Policy member;
	// allPolicyItems the field value when every policy applies, shared by
	// every response.
	policyItems    [][]byte
	allPolicyItems []string
	// tops[i] is policies[i]'s tracker; nil without Options.Top.
	tops []*topk.Tracker
	pool sync.Pool // *reqState
}

// reqState is the per-request scratch space, pooled.
type reqState struct {
	buf      []byte
	items    []ratelimit.Item
	ds       []ratelimit.Decision
	policies []*Policy
	keys     []string
	tops     []*topk.Tracker
	tmp      []byte
	ev       Event
}

// New returns a Middleware for cfg, or an error if a rule is invalid, a
// policy has no name or a zero Quota, two policies share a name, a Key has
// no Append function or was made wrong (ByHeader("")), or Store is nil.
func New(cfg Options) (*Middleware, error) {
	if cfg.Store == nil {
		return nil, errors.New("httplimit: Options.Store is nil")
	}
	if len(cfg.Policies) == 0 {
		return nil, errors.New("httplimit: Options.Policies is empty")
	}
	m := &Middleware{
		store:      cfg.Store,
		policies:   make([]Policy, len(cfg.Policies)),
		shadow:     cfg.Shadow,
		omit:       cfg.OmitAllowedHeaders,
		legacy:     cfg.LegacyHeaders,
		onDecision: cfg.OnDecision,
		shed:       cfg.Shed,
		errRetry:   cfg.ErrorRetryAfter,
	}
	if m.errRetry <= 0 {
		m.errRetry = time.Second
	}
	names := make(map[string]bool)
	var all []byte
	for i, l := range cfg.Policies {
		// A nameless policy would send RateLimit: "";r=0: almost surely a
		// forgotten field. (Validate refuses a forgotten Quota.)
		if l.Rule.Name == "" {
			return nil, fmt.Errorf("httplimit: policy %d: Policy.Rule.Name is empty; it names the policy in the RateLimit fields", i)
		}
		if err := l.Rule.Validate(); err != nil {
			return nil, fmt.Errorf("httplimit: policy %d: %w", i, err)
		}
		if names[l.Rule.Name] {
			return nil, fmt.Errorf("httplimit: two policies are named %q", l.Rule.Name)
		}
		names[l.Rule.Name] = true
		for j, k := range l.Keys {
			if k.err != nil {
				return nil, fmt.Errorf("httplimit: policy %q: Policy.Keys[%d]: %w", l.Rule.Name, j, k.err)
			}
			if k.Append == nil {
				return nil, fmt.Errorf("httplimit: policy %q: key %d (%q) has no Append function", l.Rule.Name, j, k.Scope)
			}
		}
		l.Keys = append([]Key(nil), l.Keys...)
		m.policies[i] = l
		if cfg.Top != nil {
			opts := *cfg.Top
			opts.Secret = opts.Secret || secret(&l)
			tr, err := topk.New(opts)
			if err != nil {
				return nil, fmt.Errorf("httplimit: Options.Top: %w", err)
			}
			m.tops = append(m.tops, tr)
		}
		p := limitheader.AppendPolicyItem(nil, m.policies[i].Rule.Name, m.policies[i].Rule.Capacity(), m.policies[i].Rule.QuotaWindow())
		m.policyItems = append(m.policyItems, p)
		if i > 0 {
			all = append(all, ", "...)
		}
		all = append(all, p...)
	}
	m.allPolicyItems = []string{string(all)}
	m.pool.New = func() any {
		n := len(m.policies)
		return &reqState{
			buf:      make([]byte, 0, 512),
			items:    make([]ratelimit.Item, 0, n),
			ds:       make([]ratelimit.Decision, 0, n),
			policies: make([]*Policy, 0, n),
			keys:     make([]string, 0, n),
			tops:     make([]*topk.Tracker, 0, n),
		}
	}
	return m, nil
}

// TopLimits returns every policy with its tracker (Options.Top), in the
// order of Options.Policies; none without Options.Top. A dashboard reads
// them (dashboard.Options.Limits).
func (m *Middleware) TopLimits() []topk.Limit {
	out := make([]topk.Limit, 0, len(m.tops))
	for i, tr := range m.tops {
		out = append(out, topk.Limit{Name: m.policies[i].Rule.Name, Rule: &m.policies[i].Rule, Tracker: tr})
	}
	return out
}

// Handler returns next wrapped by the middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.serve(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// serve decides r and answers it if it is refused; it reports whether r
// should go on to the handler.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request) bool {
	st := m.pool.Get().(*reqState)
	defer m.release(st)
	st.items, st.ds, st.policies, st.keys, st.tops = st.items[:0], st.ds[:0], st.policies[:0], st.keys[:0], st.tops[:0]
	st.ev = Event{Request: r, Shadow: m.shadow}

	if m.shed != nil {
		if d, shed := m.shed(r); shed {
			st.ev.Denied = true
			return m.refuseOverload(w, st, d)
		}
	}
	for i := range m.policies {
		l := &m.policies[i]
		b, ok := admit.AppendKey(st.buf[:0], l.Rule.Name, len(l.Keys), func(dst []byte, j int) ([]byte, bool) {
			return l.Keys[j].Append(dst, r)
		})
		st.buf = b
		if !ok {
			continue
		}
		cost := int64(1)
		if l.Cost != nil {
			cost = max(0, l.Cost(r))
		}
		key := string(b)
		st.items = append(st.items, ratelimit.Item{Key: key, Rule: &l.Rule, Cost: cost})
		st.policies = append(st.policies, l)
		st.keys = append(st.keys, key)
		if m.tops != nil {
			st.tops = append(st.tops, m.tops[i])
		}
	}
	if len(st.items) == 0 {
		return true
	}
	ds, v, now := admit.DecideTimed(r.Context(), m.store, st.ds, st.items)
	st.ds = ds
	if m.tops != nil && v.Err == nil {
		for i := range ds {
			st.tops[i].ObserveAt(now, keyValue(st.policies[i], st.keys[i]), &ds[i])
		}
	}
	st.ev.Policies, st.ev.Keys, st.ev.Decisions, st.ev.Err = st.policies, st.keys, ds, v.Err
	h := w.Header()
	switch v.Outcome {
	case admit.Admitted:
		if !m.omit {
			m.setFields(h, st)
		}
		m.report(st)
		return true
	case admit.Unavailable:
		st.ev.Denied = true
		if v.Err != nil {
			return m.refuseOverload(w, st, m.errRetry)
		}
		return m.refuseOverload(w, st, v.RetryAfter)
	}
	st.ev.Denied = true
	retry := v.RetryAfter
	m.setFields(h, st)
	if m.shadow {
		m.report(st)
		return true
	}
	if retry > 0 {
		h["Retry-After"] = fieldValue(appendInt(st.buf[:0], limitheader.RetryAfterSeconds(retry)))
	}
	st.ev.Status = http.StatusTooManyRequests
	m.report(st)
	st.buf = m.appendQuotaProblem(st.buf[:0], st, retry)
	writeProblem(w, http.StatusTooManyRequests, st.buf)
	return false
}

// release returns st to the pool, dropping what it should not keep alive:
// the request, and buffers grown by an unusual request.
func (m *Middleware) release(st *reqState) {
	st.ev = Event{}
	if cap(st.buf) > 64<<10 || cap(st.tmp) > 64<<10 {
		return
	}
	clear(st.keys[:cap(st.keys)])
	clear(st.tops[:cap(st.tops)])
	clear(st.items[:cap(st.items)])
	m.pool.Put(st)
}

// refuseOverload answers 503 with Retry-After d (at least one second),
// unless in shadow mode; it reports whether the request goes on.
func (m *Middleware) refuseOverload(w http.ResponseWriter, st *reqState, d time.Duration) bool {
	if m.shadow {
		m.report(st)
		return true
	}
	st.ev.Status = http.StatusServiceUnavailable
	m.report(st)
	secs := limitheader.RetryAfterSeconds(d)
	w.Header()["Retry-After"] = fieldValue(appendInt(st.buf[:0], secs))
	detail := "The server is shedding load; try again later."
	if st.ev.Err != nil {
		detail = "The rate limiter could not decide; try again later."
	}
	st.buf = appendOverloadProblem(st.buf[:0], detail, secs, nil)
	writeProblem(w, http.StatusServiceUnavailable, st.buf)
	return false
}

func (m *Middleware) report(st *reqState) {
	if m.onDecision != nil {
		m.onDecision(&st.ev)
	}
}

// setFields sets RateLimit-Policy and RateLimit (and the legacy fields) for
// the policies that applied.
func (m *Middleware) setFields(h http.Header, st *reqState) {
	if len(st.policies) == len(m.policies) {
		h["Ratelimit-Policy"] = m.allPolicyItems
	} else {
		// st.policies is a subsequence of m.policies, in its order: one walk
		// finds each one's policy.
		b, i := st.buf[:0], 0
		for j, l := range st.policies {
			for &m.policies[i] != l {
				i++
			}
			if j > 0 {
				b = append(b, ", "...)
			}
			b = append(b, m.policyItems[i]...)
		}
		st.buf = b
		h["Ratelimit-Policy"] = fieldValue(b)
	}
	b := st.buf[:0]
	for i := range st.ds {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = limitheader.AppendLimitItem(b, st.ds[i].Rule, st.ds[i].Remaining, st.ds[i].ResetAfter)
	}
	st.buf = b
	h["Ratelimit"] = fieldValue(b)
	if m.legacy {
		// The most constrained limit: the least remaining.
		d := &st.ds[0]
		for i := range st.ds {
			if st.ds[i].Remaining < d.Remaining {
				d = &st.ds[i]
			}
		}
		h["X-Ratelimit-Limit"] = []string{strconv.FormatInt(d.Capacity, 10)}
		h["X-Ratelimit-Remaining"] = []string{strconv.FormatInt(max(0, d.Remaining), 10)}
		h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(limitheader.ResetSeconds(d.ResetAfter), 10)}
	}
}

// field is a header field's value slice and the bytes of its one value,
// allocated together.
type field struct {
	v   [1]string
	buf [112]byte
}

// fieldValue returns a header value slice holding a copy of b in a single
// allocation where the usual []string{string(b)} takes two: the string
// points into the same object as the slice. The bytes are written once,
// here, and never changed, which is what unsafe.String requires.
func fieldValue(b []byte) []string {
	if len(b) == 0 || len(b) > len(field{}.buf) {
		return []string{string(b)}
	}
	f := new(field)
	n := copy(f.buf[:], b)
	f.v[0] = unsafe.String(&f.buf[0], n)
	return f.v[:]
}

var (
	problemType  = []string{"application/problem+json"}
	noStore      = []string{"no-store"}
	quotaTypeURI = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	overloadURI  = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

func writeProblem(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = problemType
	h["Cache-Control"] = noStore
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// appendQuotaProblem appends the problem details of a 429: the violated
// policies, and for each a member of "limits" with its scope, key (unless
// secret), quota, window, the request's cost, what remains and when to
// retry, and a detail sentence saying the same for people.
func (m *Middleware) appendQuotaProblem(b []byte, st *reqState, retry time.Duration) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, quotaTypeURI...)
	b = append(b, `","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":`...)
	// The first violated limit speaks in the detail.
	first := -1
	for i := range st.ds {
		if !st.ds[i].Allowed {
			first = i
			break
		}
	}
	st.tmp = appendDetail(st.tmp[:0], st, first, retry)
	b = appendJSON(b, st.tmp)
	b = append(b, `,"violated-policies":[`...)
	n := 0
	for i := range st.ds {
		if st.ds[i].Allowed {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = appendJSON(b, st.ds[i].Rule)
	}
	b = append(b, `],"limits":[`...)
	n = 0
	for i := range st.ds {
		d, l, it := &st.ds[i], st.policies[i], &st.items[i]
		if d.Allowed {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, `{"policy":`...)
		b = appendJSON(b, d.Rule)
		b = append(b, `,"scope":`...)
		st.tmp = appendScope(st.tmp[:0], l)
		b = appendJSON(b, st.tmp)
		if !secret(l) && len(l.Keys) > 0 {
			b = append(b, `,"key":`...)
			b = appendJSON(b, keyValue(l, st.keys[i]))
		}
		b = append(b, `,"quota":`...)
		b = appendInt(b, l.Rule.Capacity())
		b = append(b, `,"window":`...)
		b = appendInt(b, limitheader.PolicyWindow(l.Rule.QuotaWindow()))
		b = append(b, `,"cost":`...)
		b = appendInt(b, it.Cost)
		b = append(b, `,"remaining":`...)
		b = appendInt(b, max(0, d.Remaining))
		if admit.Retryable(d) {
			b = append(b, `,"retry-after":`...)
			b = appendInt(b, limitheader.RetryAfterSeconds(d.RetryAfter))
		}
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

// appendDetail appends the problem's detail sentence for the i-th
// decision, unescaped.
func appendDetail(b []byte, st *reqState, i int, retry time.Duration) []byte {
	d, l, cost := &st.ds[i], st.policies[i], st.items[i].Cost
	q, w := l.Rule.Capacity(), limitheader.PolicyWindow(l.Rule.QuotaWindow())
	b = append(b, "Quota "...)
	b = limitheader.AppendPolicyName(b, d.Rule)
	if len(l.Keys) > 0 {
		b = append(b, " for "...)
		b = appendScope(b, l)
		if !secret(l) {
			b = append(b, ' ')
			b = append(b, keyValue(l, st.keys[i])...)
		}
	}
	b = append(b, " allows "...)
	b = appendInt(b, q)
	b = append(b, " units per "...)
	b = appendInt(b, w)
	b = append(b, " s; this request costs "...)
	b = appendInt(b, cost)
	b = append(b, " and "...)
	b = appendInt(b, max(0, d.Remaining))
	b = append(b, " remain."...)
	if d.Reason == ratelimit.ReasonExceedsCapacity {
		return append(b, " It costs more than the whole quota and can never succeed."...)
	}
	if cost > 0 {
		b = append(b, " At most "...)
		b = appendInt(b, q/cost)
		b = append(b, " such requests per "...)
		b = appendInt(b, w)
		b = append(b, " s succeed."...)
	}
	b = append(b, " Retry in "...)
	b = appendInt(b, limitheader.RetryAfterSeconds(retry))
	return append(b, " s."...)
}

// appendOverloadProblem appends the problem details of a 503 answered
// because the server cannot take the request now (type
// temporary-reduced-capacity): the detail sentence, "retry-after" in
// seconds, and the members more appends (each led by a comma), if more is
// not nil. Both the rate-limit middleware and Protect write their 503s
// with it.
func appendOverloadProblem[S ~string | ~[]byte](b []byte, detail S, retrySeconds int64, more func([]byte) []byte) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, overloadURI...)
	b = append(b, `","title":"Temporary reduced capacity","status":503,"detail":`...)
	b = appendJSON(b, detail)
	b = append(b, `,"retry-after":`...)
	b = appendInt(b, retrySeconds)
	if more != nil {
		b = more(b)
	}
	return append(b, "}\n"...)
}

// appendScope appends the scopes of l's keys joined by '|', or "global".
func appendScope(b []byte, l *Policy) []byte {
	if len(l.Keys) == 0 {
		return append(b, "global"...)
	}
	for i, k := range l.Keys {
		if i > 0 {
			b = append(b, '|')
		}
		b = append(b, k.Scope...)
	}
	return b
}

func secret(l *Policy) bool {
	for _, k := range l.Keys {
		if k.Secret {
			return true
		}
	}
	return false
}

// keyValue is the key's value without the rule name that prefixes it.
func keyValue(l *Policy, key string) string { return key[min(len(key), len(l.Rule.Name)+1):] }

// appendJSON appends s as a JSON string, escaping what JSON requires and
// the HTML-sensitive <, > and &; invalid UTF-8 becomes U+FFFD. Runs of
// bytes that need no escape, valid UTF-8 among them, are copied whole.
func appendJSON[S ~string | ~[]byte](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	run := 0 // the start of the bytes not yet copied
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case jsonSafe[c]:
			i++
		case c < utf8.RuneSelf:
			b = append(b, s[run:i]...)
			if c == '"' || c == '\\' {
				b = append(b, '\\', c)
			} else {
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			run = i
		default:
			r, n := utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
			if r == utf8.RuneError && n == 1 {
				b = append(b, s[run:i]...)
				b = append(b, `\ufffd`...)
				run = i + 1
			}
			i += n
		}
	}
	b = append(b, s[run:]...)
	return append(b, '"')
}

// jsonSafe reports the bytes appendJSON copies without looking further:
// ASCII but the control characters, DEL, '"', '\' and <, > and &.
var jsonSafe = func() (t [256]bool) {
	for c := range utf8.RuneSelf {
		t[c] = c >= 0x20 && c != 0x7f && !strings.ContainsRune(`"\<>&`, rune(c))
	}
	return t
}()
