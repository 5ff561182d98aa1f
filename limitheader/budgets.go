package limitheader

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Unknown is the value of a count (Budget.Limit, Budget.Remaining,
// Announcement.Charge) and, as a time.Duration, of a duration
// (Budget.Reset, Budget.Window, Announcement.RetryAfter) that a response did
// not announce, or announced in a form that means "not known" or that could
// not be read. A caller tests for it with a comparison (< 0): no announced
// value is negative.
const Unknown = -1

// A Dialect is a family of header fields in which services announce
// budgets.
type Dialect uint8

const (
	// DialectIETF is RateLimit-Policy and RateLimit (draft-11 syntax).
	DialectIETF Dialect = iota + 1
	// DialectIETFOld is the older drafts' RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset.
	DialectIETFOld
	// DialectXRateLimit is X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (delay seconds, Unix seconds or an HTTP-date).
	DialectXRateLimit
	// DialectOpenAI is x-ratelimit-{limit,remaining,reset}-{requests,tokens},
	// whose resets are Go-style durations (6m0s, 20ms): the time until
	// the budget is full again. Services that copy OpenAI's API copy
	// these names.
	DialectOpenAI
	// DialectAnthropic is
	// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset},
	// whose resets are RFC 3339 instants at which the budget is full again.
	DialectAnthropic
)

func (d Dialect) String() string {
	switch d {
	case DialectIETF:
		return "ietf"
	case DialectIETFOld:
		return "ietf-old"
	case DialectXRateLimit:
		return "x-ratelimit"
	case DialectOpenAI:
		return "openai"
	case DialectAnthropic:
		return "anthropic"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// A Budget is what a response announced about one dimension of its
// client's quota: how much the service allows, how much is left and when
// it is whole again. Every field but Dialect, Name and Unit may be Unknown.
type Budget struct {
	// Dialect is the family of fields the budget was read from.
	Dialect Dialect
	// Name is the dimension: "requests", "tokens", "input-tokens" or
	// "output-tokens" for the vendor dialects, the policy's name for
	// DialectIETF, "" for the older forms, which name none.
	Name string
	// Unit is what the budget counts: "requests" or "tokens" for the
	// vendor dialects, the policy's qu for DialectIETF ("requests" when
	// absent, as for the older forms).
	Unit string
	// Limit is the quota: the most the budget can hold.
	Limit int64
	// Remaining is what is left of it now. A service in debt announces 0.
	Remaining int64
	// Reset is the time from the response until Remaining is back to
	// Limit: a token bucket's full refill (OpenAI, Anthropic) or the end
	// of the window (the IETF fields).
	Reset time.Duration
	// Window is the length of the quota's window (the IETF policy's w);
	// Unknown for the dialects that do not say.
	Window time.Duration
}

// An Announcement is everything a response said about its client's
// budgets: the budgets of every dialect present, what the service asks
// its client to wait, and what the call cost.
type Announcement struct {
	// Budgets holds one Budget per dimension announced, in this order:
	// OpenAI's (requests, tokens), Anthropic's (requests, tokens,
	// input-tokens, output-tokens), the IETF policies in the order of
	// RateLimit-Policy and then those only RateLimit names, the older
	// draft's, X-RateLimit's. A dimension of which nothing is known (no
	// field, or only sentinels) has no Budget.
	Budgets []Budget
	// RetryAfter is the wait the response asks for, from Retry-After-Ms,
	// X-Ms-Retry-After-Ms or Retry-After, whichever comes first and is
	// well formed, as RetryDelay reads them (an HTTP-date is taken
	// relative to Date; a value too large for a time.Duration saturates,
	// and callers cap it). Unknown when none is present. Unlike
	// RetryDelay, it derives no wait from an exhausted budget: Budgets
	// hold those.
	RetryAfter time.Duration
	// Charge is what the call cost, as Azure Cosmos DB announces it in
	// x-ms-request-charge (request units, a decimal). Unknown when
	// absent.
	Charge float64
}

// Budget returns the first budget named name.
func (a Announcement) Budget(name string) (Budget, bool) {
	for _, b := range a.Budgets {
		if b.Name == name {
			return b, true
		}
	}
	return Budget{}, false
}

// ErrMalformedValue is wrapped by the errors of ParseAnnouncement for a
// field that is not a structured field (those give ErrMalformedField).
var ErrMalformedValue = errors.New("limitheader: malformed field value")

// maxValueLen bounds the fields of one number, duration or instant that
// ParseAnnouncement reads: a longer value is malformed. Real values are
// under 40 bytes.
const maxValueLen = 256

// ParseAnnouncement reads the budgets a response announces in its header
// h, in every dialect (see Dialect), with what it asks its client to wait
// and what the call cost (see Announcement). now is when the response
// arrived; an instant in a reset (Anthropic's, X-RateLimit-Reset's) is
// taken relative to the response's Date field, or to now when Date is
// absent or malformed, as RetryDelay takes Retry-After (Date has whole
// seconds, so such a reset may be read up to a second long: on the safe
// side for a client that paces to it). h is keyed by
// canonical field names, as an http.Header is; a field of several lines
// is read from its first, but for RateLimit and RateLimit-Policy, whose
// lines are joined.
//
// Values that mean "not known" give Unknown without an error: an absent or
// empty field, -1 (Azure OpenAI answers a limit of -1 and a remaining of 0
// for what it does not enforce: a dimension whose limit is -1 is unknown
// as a whole), a budget without a reset. A value that is malformed —
// not a number, negative, beyond int64 or time.Duration, longer than 256
// bytes, a duration with a sign — gives Unknown too, and an error that
// wraps ErrMalformedValue and names the field; a malformed RateLimit or
// RateLimit-Policy is ignored as a whole, as the draft asks, with
// ParseRateLimit's error. The Announcement is usable whatever the error:
// it holds everything that was well formed, so that a client paces on the
// dimensions it can read and logs the rest. The errors of several fields
// are joined (errors.Join).
func ParseAnnouncement(h map[string][]string, now time.Time) (Announcement, error) {
	p := announcementParser{h: h, now: now}
	a := Announcement{RetryAfter: Unknown, Charge: Unknown}
	seen := families(h)
	if seen&seenXRateLimit != 0 {
		for _, d := range openAIDims {
			p.vendor(&a, DialectOpenAI, d)
		}
	}
	if seen&seenAnthropic != 0 {
		for _, d := range anthropicDims {
			p.vendor(&a, DialectAnthropic, d)
		}
	}
	if seen&seenRateLimit != 0 {
		p.ietf(&a)
		p.old(&a, DialectIETFOld, "Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset")
	}
	if seen&seenXRateLimit != 0 {
		p.old(&a, DialectXRateLimit, "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset")
	}
	if seen&seenRetry != 0 {
		if d, ok, bad := retryAfterFields(h, now); ok {
			a.RetryAfter = d
		} else if bad != "" {
			p.fail(bad, "neither milliseconds, delay-seconds nor an HTTP-date")
		}
	}
	if v, ok := p.value("X-Ms-Request-Charge"); ok {
		if c, ok := parseCharge(v); ok {
			a.Charge = c
		} else {
			p.fail("X-Ms-Request-Charge", "not a non-negative decimal")
		}
	}
	return a, errors.Join(p.errs...)
}

// The families of fields that families finds in a header.
const (
	seenXRateLimit = 1 << iota // OpenAI's and X-RateLimit-*
	seenAnthropic
	seenRateLimit // the IETF fields, new and old
	seenRetry
)

// families returns the families of fields present in h, so that
// ParseAnnouncement looks up only the fields of those: one pass over a
// response's fields costs less than looking up the thirty-odd names that
// are absent from most responses.
func families(h map[string][]string) int {
	seen := 0
	for k := range h {
		switch {
		case strings.HasPrefix(k, "X-Ratelimit-"):
			seen |= seenXRateLimit
		case strings.HasPrefix(k, "Anthropic-Ratelimit-"):
			seen |= seenAnthropic
		case strings.HasPrefix(k, "Ratelimit"):
			seen |= seenRateLimit
		case strings.HasPrefix(k, "Retry-After") || k == "X-Ms-Retry-After-Ms":
			seen |= seenRetry
		}
	}
	return seen
}

// A vendorDim is one dimension of a vendor dialect: its name and unit and
// the canonical names of its three fields.
type vendorDim struct {
	name, unit              string
	limit, remaining, reset string
}

var openAIDims = [...]vendorDim{
	{"requests", "requests", "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
	{"tokens", "tokens", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
}

var anthropicDims = [...]vendorDim{
	{"requests", "requests", "Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
	{"tokens", "tokens", "Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
	{"input-tokens", "tokens", "Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"},
	{"output-tokens", "tokens", "Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"},
}

// announcementParser holds one call of ParseAnnouncement: the header, the
// reference instant for resets given as instants (parsed once, when first
// needed) and the errors met.
type announcementParser struct {
	h       map[string][]string
	now     time.Time
	ref     time.Time
	refDone bool
	errs    []error
}

// value returns the first line of the field name, trimmed, and whether it
// is present and not empty.
func (p *announcementParser) value(name string) (string, bool) {
	v := strings.TrimSpace(first(p.h, name))
	return v, v != ""
}

// reference returns the instant resets given as instants are relative to:
// the response's Date, else now.
func (p *announcementParser) reference() time.Time {
	if !p.refDone {
		p.ref, p.refDone = p.now, true
		if d := first(p.h, "Date"); d != "" {
			if t, err := parseHTTPDate(d); err == nil {
				p.ref = t
			}
		}
	}
	return p.ref
}

func (p *announcementParser) fail(field, why string) {
	v := first(p.h, field)
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	p.errs = append(p.errs, fmt.Errorf("%w: %s: %q: %s", ErrMalformedValue, field, v, why))
}

// count reads a count field: Unknown when absent, empty, -1 (then
// sentinel is true) or malformed (then with an error).
func (p *announcementParser) count(field string) (n int64, sentinel bool) {
	v, ok := p.value(field)
	if !ok || v == "-1" {
		return Unknown, ok
	}
	if n, ok := parseCount(v); ok {
		return n, false
	}
	p.fail(field, "not a non-negative integer")
	return Unknown, false
}

// vendor reads one dimension of OpenAI's or Anthropic's dialect.
func (p *announcementParser) vendor(a *Announcement, dialect Dialect, d vendorDim) {
	limit, notEnforced := p.count(d.limit)
	b := Budget{Dialect: dialect, Name: d.name, Unit: d.unit, Window: Unknown,
		Limit: limit, Reset: Unknown}
	b.Remaining, _ = p.count(d.remaining)
	if v, ok := p.value(d.reset); ok {
		var r time.Duration
		var ok bool
		if dialect == DialectOpenAI {
			r, ok = parseGoDuration(v)
		} else {
			r, ok = p.parseInstant(v)
		}
		if ok {
			b.Reset = r
		} else if v != "-1" && dialect == DialectOpenAI {
			p.fail(d.reset, "not a Go duration")
		} else if v != "-1" {
			p.fail(d.reset, "not an RFC 3339 instant")
		}
	}
	if notEnforced {
		// The service does not enforce this dimension: what it says of
		// the rest means nothing.
		b.Remaining, b.Reset = Unknown, Unknown
	}
	add(a, b)
}

// add appends b to a's budgets unless nothing of it is known.
func add(a *Announcement, b Budget) {
	if b.Limit < 0 && b.Remaining < 0 && b.Reset < 0 && b.Window < 0 {
		return
	}
	if a.Budgets == nil {
		a.Budgets = make([]Budget, 0, 4)
	}
	a.Budgets = append(a.Budgets, b)
}

// parseInstant reads an RFC 3339 instant as the time from the response to
// it (0 for an instant past).
func (p *announcementParser) parseInstant(v string) (time.Duration, bool) {
	if len(v) > maxValueLen {
		return 0, false
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0, false
	}
	return max(0, t.Sub(p.reference())), true
}

// ietf reads RateLimit-Policy and RateLimit, joined by policy name; the
// first member of a name is read, later ones of the same name ignored.
func (p *announcementParser) ietf(a *Announcement) {
	var policies []PolicyItem
	var limits []LimitItem
	if vs := p.h["Ratelimit-Policy"]; len(vs) > 0 {
		var err error
		if policies, err = ParseRateLimitPolicy(joinLines(vs)); err != nil {
			p.errs = append(p.errs, fmt.Errorf("RateLimit-Policy: %w", err))
		}
	}
	if vs := p.h["Ratelimit"]; len(vs) > 0 {
		var err error
		if limits, err = ParseRateLimit(joinLines(vs)); err != nil {
			p.errs = append(p.errs, fmt.Errorf("RateLimit: %w", err))
		}
	}
	start := len(a.Budgets)
	find := func(name string) int {
		for i := start; i < len(a.Budgets); i++ {
			if a.Budgets[i].Name == name {
				return i
			}
		}
		return -1
	}
	for _, pi := range policies {
		if find(pi.Name) >= 0 {
			continue
		}
		b := Budget{Dialect: DialectIETF, Name: pi.Name, Unit: pi.QuotaUnit, Limit: pi.Quota,
			Remaining: Unknown, Reset: Unknown, Window: Unknown}
		if pi.Window > 0 {
			b.Window = secondsDuration(pi.Window)
		}
		if a.Budgets == nil {
			a.Budgets = make([]Budget, 0, len(policies))
		}
		a.Budgets = append(a.Budgets, b)
	}
	for _, li := range limits {
		// Every member of RateLimit has an r: a budget whose Remaining is
		// known was joined already.
		i := find(li.Name)
		if i < 0 {
			add(a, Budget{Dialect: DialectIETF, Name: li.Name, Unit: "requests", Limit: Unknown,
				Remaining: li.Remaining, Reset: Unknown, Window: Unknown})
			i = len(a.Budgets) - 1
		} else if a.Budgets[i].Remaining >= 0 {
			continue
		}
		a.Budgets[i].Remaining = li.Remaining
		if li.Reset >= 0 {
			a.Budgets[i].Reset = secondsDuration(li.Reset)
		}
	}
}

func joinLines(vs []string) string {
	if len(vs) == 1 {
		return vs[0]
	}
	return strings.Join(vs, ", ")
}

// old reads the older forms: a limit, a remaining and a reset, which
// servers send as delay seconds, Unix seconds (10^9 and more) or an
// HTTP-date, as RetryDelay reads X-RateLimit-Reset (early drafts allowed
// RateLimit-Reset an instant too). The
// older drafts' RateLimit-Limit may carry a quota policy ("100, 100;w=60"):
// the first member's number is the limit, its w the window.
func (p *announcementParser) old(a *Announcement, dialect Dialect, limit, remaining, reset string) {
	b := Budget{Dialect: dialect, Unit: "requests", Limit: Unknown, Window: Unknown, Reset: Unknown}
	b.Remaining, _ = p.count(remaining)
	if v, ok := p.value(limit); ok && v != "-1" {
		if n, w, ok := parseOldLimit(v); ok {
			b.Limit, b.Window = n, w
		} else {
			p.fail(limit, "not a non-negative integer, optionally with ;w=seconds")
		}
	}
	if v, ok := p.value(reset); ok && v != "-1" {
		var r time.Duration
		var ok bool
		if len(v) <= maxValueLen {
			r, ok = parseLegacyReset(v, first(p.h, "Date"), p.now)
		}
		if ok && r < 1<<63-1 {
			b.Reset = r
		} else {
			p.fail(reset, "neither delay-seconds, Unix seconds nor an HTTP-date")
		}
	}
	add(a, b)
}

// maxSeconds is the most seconds a time.Duration holds.
const maxSeconds = int64(1<<63-1) / int64(time.Second)

// parseOldLimit reads RateLimit-Limit of the older drafts: "100", or the
// limit followed by quota policies, "100, 100;w=60, 1000;w=3600". The
// window is the first member's w, else that of the first policy whose
// quota is the limit.
func parseOldLimit(v string) (limit int64, window time.Duration, ok bool) {
	if len(v) > maxValueLen {
		return 0, 0, false
	}
	window = Unknown
	for i := 0; v != ""; i++ {
		var member string
		member, v, _ = strings.Cut(v, ",")
		n, w, ok := parseOldMember(member)
		if !ok {
			return 0, 0, false
		}
		if i == 0 {
			limit = n
		}
		if window < 0 && n == limit {
			window = w
		}
	}
	return limit, window, true
}

// parseOldMember reads one member of the older RateLimit-Limit: a count
// with an optional w parameter (window Unknown without it); other
// parameters are ignored.
func parseOldMember(m string) (n int64, window time.Duration, ok bool) {
	num, params, _ := strings.Cut(strings.TrimSpace(m), ";")
	n, ok = parseCount(strings.TrimSpace(num))
	if !ok {
		return 0, 0, false
	}
	window = Unknown
	for params != "" {
		var param string
		param, params, _ = strings.Cut(params, ";")
		if k, val, _ := strings.Cut(strings.TrimSpace(param), "="); k == "w" {
			w, okW := parseCount(val)
			if !okW || w > maxSeconds {
				return 0, 0, false
			}
			window = secondsDuration(w)
		}
	}
	return n, window, true
}

// parseCount reads a non-negative decimal integer that fits an int64.
func parseCount(v string) (int64, bool) {
	if len(v) > 19 || !isDigits(v) {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// parseGoDuration reads a duration as time.ParseDuration does ("6m0s",
// "20ms", "1h2m3.5s"), but without a sign: a reset is never negative.
func parseGoDuration(v string) (time.Duration, bool) {
	if len(v) > maxValueLen || v == "" || v[0] == '-' || v[0] == '+' {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	return d, err == nil
}

// parseCharge reads x-ms-request-charge: a non-negative decimal ("5.71",
// "1"), digits and at most one point.
func parseCharge(v string) (float64, bool) {
	if len(v) > 64 {
		return 0, false
	}
	whole, frac, dot := strings.Cut(v, ".")
	if !isDigits(whole) || (dot && !isDigits(frac)) {
		return 0, false
	}
	c, err := strconv.ParseFloat(v, 64)
	return c, err == nil
}

// retryAfterFields returns the wait asked for by the first of
// Retry-After-Ms, X-Ms-Retry-After-Ms and Retry-After that is present and
// well formed; when none is, bad names the first one present.
func retryAfterFields(h map[string][]string, now time.Time) (d time.Duration, ok bool, bad string) {
	for _, name := range [...]string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} {
		if v := first(h, name); v != "" {
			if d, ok := parseMillis(v); ok {
				return d, true, ""
			}
			if bad == "" && strings.TrimSpace(v) != "" {
				bad = name
			}
		}
	}
	if v := first(h, "Retry-After"); v != "" {
		if d, ok := parseRetryAfter(v, first(h, "Date"), now); ok {
			return d, true, ""
		}
		if bad == "" && strings.TrimSpace(v) != "" {
			bad = "Retry-After"
		}
	}
	return 0, false, bad
}
