package limitheader

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// A PolicyItem is one member of a RateLimit-Policy field: a quota policy the
// server announces.
type PolicyItem struct {
	// Name identifies the policy (the item's value).
	Name string
	// Quota is the q parameter: the quota units the policy allows per
	// window. Required.
	Quota int64
	// Window is the w parameter in seconds; 0 when absent.
	Window int64
	// QuotaUnit is the qu parameter; "requests" when absent.
	QuotaUnit string
	// PartitionKey is the pk parameter; nil when absent.
	PartitionKey []byte
}

// A LimitItem is one member of a RateLimit field: what remains of a policy's
// quota now.
type LimitItem struct {
	// Name identifies the policy (the item's value).
	Name string
	// Remaining is the r parameter: the quota units left. Required.
	Remaining int64
	// Reset is the t parameter: seconds until the quota resets; -1 when
	// absent.
	Reset int64
	// PartitionKey is the pk parameter; nil when absent.
	PartitionKey []byte
}

// ErrMalformedField is wrapped by the errors of ParseRateLimit and
// ParseRateLimitPolicy. The draft asks clients to ignore a malformed field
// as a whole.
var ErrMalformedField = errors.New("limitheader: malformed structured field")

// ParseRateLimitPolicy parses the value of a RateLimit-Policy field (the
// members of several field lines joined by ", "). Parameters it does not
// know are ignored, as RFC 9651 requires; a member without q, a negative q
// or w, or a syntax error makes the whole field malformed, and so does a
// value over 16 KiB, of more than 256 members or with a member of more
// than 32 parameters.
func ParseRateLimitPolicy(v string) ([]PolicyItem, error) {
	members, err := parseSFList(v)
	if err != nil || len(members) == 0 {
		return nil, err
	}
	items := make([]PolicyItem, 0, len(members))
	for _, m := range members {
		p := PolicyItem{Name: m.name, QuotaUnit: "requests"}
		hasQ := false
		for _, pr := range m.params {
			switch pr.key {
			case "q":
				if p.Quota, err = pr.count("policy", m.name); err != nil {
					return nil, err
				}
				hasQ = true
			case "w":
				if p.Window, err = pr.count("policy", m.name); err != nil {
					return nil, err
				}
			case "qu":
				if pr.kind != sfString && pr.kind != sfToken {
					return nil, fmt.Errorf("%w: policy %q: qu must be a string", ErrMalformedField, m.name)
				}
				p.QuotaUnit = pr.s
			case "pk":
				if p.PartitionKey, err = pr.bytes("policy", m.name); err != nil {
					return nil, err
				}
			}
		}
		if !hasQ {
			return nil, fmt.Errorf("%w: policy %q has no q", ErrMalformedField, m.name)
		}
		items = append(items, p)
	}
	return items, nil
}

// ParseRateLimit parses the value of a RateLimit field. A member without r,
// a negative r or t, or a syntax error makes the whole field malformed, as
// do the bounds of ParseRateLimitPolicy.
func ParseRateLimit(v string) ([]LimitItem, error) {
	members, err := parseSFList(v)
	if err != nil || len(members) == 0 {
		return nil, err
	}
	items := make([]LimitItem, 0, len(members))
	for _, m := range members {
		l := LimitItem{Name: m.name, Reset: -1}
		hasR := false
		for _, pr := range m.params {
			switch pr.key {
			case "r":
				if l.Remaining, err = pr.count("limit", m.name); err != nil {
					return nil, err
				}
				hasR = true
			case "t":
				if l.Reset, err = pr.count("limit", m.name); err != nil {
					return nil, err
				}
			case "pk":
				if l.PartitionKey, err = pr.bytes("limit", m.name); err != nil {
					return nil, err
				}
			}
		}
		if !hasR {
			return nil, fmt.Errorf("%w: limit %q has no r", ErrMalformedField, m.name)
		}
		items = append(items, l)
	}
	return items, nil
}

// RetryDelay returns how long a response asks its client to wait before
// trying again, from the first of these header fields that is present and
// well formed:
//
//   - Retry-After-Ms and X-Ms-Retry-After-Ms (milliseconds, as integer or
//     decimal; Azure services send the latter);
//   - Retry-After, as delay-seconds or as an HTTP-date, which is taken
//     relative to the response's Date field (or to now when Date is absent
//     or malformed), never to the local clock alone;
//   - RateLimit: the longest t of the policies whose r is 0;
//   - X-RateLimit-Reset, when X-RateLimit-Remaining is 0: delay seconds,
//     Unix seconds (a value of 10^9 or more) or an HTTP-date, as servers
//     variously send it.
//
// A date in the past gives 0. Values that overflow a time.Duration saturate;
// callers cap the result. It reports false when no field gives a delay.
//
// h is a response's header, an http.Header (or any map keyed by canonical
// field names, as net/http and net/textproto key theirs); the type is
// spelled out so that this package need not import net/http.
func RetryDelay(h map[string][]string, now time.Time) (time.Duration, bool) {
	if d, ok, _ := retryAfterFields(h, now); ok {
		return d, true
	}
	if vs := h["Ratelimit"]; len(vs) > 0 {
		items, err := ParseRateLimit(strings.Join(vs, ", "))
		if err != nil {
			return 0, false
		}
		best := int64(-1)
		for _, it := range items {
			if it.Remaining == 0 && it.Reset > best {
				best = it.Reset
			}
		}
		if best >= 0 {
			return secondsDuration(best), true
		}
	}
	if strings.TrimSpace(first(h, "X-Ratelimit-Remaining")) == "0" {
		if v := strings.TrimSpace(first(h, "X-Ratelimit-Reset")); v != "" {
			return parseLegacyReset(v, first(h, "Date"), now)
		}
	}
	return 0, false
}

// first returns the first value of the field named name (canonical), as
// http.Header.Get does, or "".
func first(h map[string][]string, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// httpDateLayouts are the three forms of an HTTP-date that RFC 9110 §5.6.7
// requires a recipient to accept: IMF-fixdate, the obsolete RFC 850 form
// and asctime.
var httpDateLayouts = [...]string{
	"Mon, 02 Jan 2006 15:04:05 GMT",
	time.RFC850,
	time.ANSIC,
}

// parseHTTPDate parses an HTTP-date, as net/http.ParseTime does.
func parseHTTPDate(v string) (time.Time, error) {
	var err error
	for _, layout := range httpDateLayouts {
		var t time.Time
		if t, err = time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

// epochThreshold tells a legacy reset given in Unix seconds (an instant
// after September 2001) from one given as a delay in seconds (under 31
// years).
const epochThreshold = 1_000_000_000

// parseLegacyReset parses X-RateLimit-Reset, which servers send as delay
// seconds, as Unix seconds, or as an HTTP-date; instants are taken relative
// to the response's Date (or now).
func parseLegacyReset(v, date string, now time.Time) (time.Duration, bool) {
	if ref, err := parseHTTPDate(date); err == nil {
		now = ref
	}
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		if n < epochThreshold {
			return secondsDuration(n), true
		}
		return max(0, time.Unix(n, 0).Sub(now)), true
	}
	if at, err := parseHTTPDate(v); err == nil {
		return max(0, at.Sub(now)), true
	}
	return 0, false
}

// parseRetryAfter parses a Retry-After value: delay-seconds or an HTTP-date
// taken relative to the date of the response (date), else to now.
func parseRetryAfter(v, date string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil { // only overflow is left
			n = math.MaxInt64
		}
		return secondsDuration(n), true
	}
	at, err := parseHTTPDate(v)
	if err != nil {
		return 0, false
	}
	if ref, err := parseHTTPDate(date); err == nil {
		now = ref
	}
	return max(0, at.Sub(now)), true
}

// parseMillis parses a non-negative number of milliseconds, integer or
// decimal.
func parseMillis(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	whole, frac, _ := strings.Cut(v, ".")
	if whole == "" || !isDigits(whole) || (frac != "" && !isDigits(frac)) || strings.HasSuffix(v, ".") {
		return 0, false
	}
	n, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || n > int64(math.MaxInt64/time.Millisecond) {
		return math.MaxInt64, true
	}
	d := time.Duration(n) * time.Millisecond
	// Sub-millisecond digits, up to nanoseconds.
	scale := time.Duration(100 * time.Microsecond)
	for i := 0; i < len(frac) && scale > 0; i++ {
		d += time.Duration(frac[i]-'0') * scale
		scale /= 10
	}
	return d, true
}

// secondsDuration is n seconds, saturated.
func secondsDuration(n int64) time.Duration {
	if n > int64(math.MaxInt64/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Second
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// A Structured Field (RFC 9651) list, as far as the RateLimit fields need
// it: members are items whose value is a String or a Token (the policy
// name), with parameters whose values may be any bare item. Inner lists are
// not used by these fields and are rejected.

type sfKind uint8

const (
	sfInteger sfKind = iota + 1
	sfDecimal
	sfString
	sfToken
	sfBytes
	sfBoolean
)

type sfParam struct {
	key  string
	kind sfKind
	i    int64
	f    float64
	s    string
	b    []byte
}

// count returns the parameter's value when it is a non-negative integer;
// what and member name the field's item in the error.
func (pr *sfParam) count(what, member string) (int64, error) {
	if pr.kind != sfInteger || pr.i < 0 {
		return 0, fmt.Errorf("%w: %s %q: %s must be a non-negative integer", ErrMalformedField, what, member, pr.key)
	}
	return pr.i, nil
}

// bytes returns the parameter's value when it is a byte sequence.
func (pr *sfParam) bytes(what, member string) ([]byte, error) {
	if pr.kind != sfBytes {
		return nil, fmt.Errorf("%w: %s %q: %s must be a byte sequence", ErrMalformedField, what, member, pr.key)
	}
	return pr.b, nil
}

type sfMember struct {
	name   string
	params []sfParam
}

// Bounds on what the parsers accept, far above what any server sends: a
// field value of at most maxFieldLen bytes, at most maxMembers members and
// at most maxParams distinct parameters per member. They keep the work and
// the memory of parsing a hostile field small.
const (
	maxFieldLen = 16 << 10
	maxMembers  = 256
	maxParams   = 32
)

func parseSFList(v string) ([]sfMember, error) {
	if len(v) > maxFieldLen {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrMalformedField, len(v), maxFieldLen)
	}
	p := sfParser{s: v}
	p.skipSP()
	var members []sfMember
	if p.done() {
		return nil, nil
	}
	for {
		m, err := p.member()
		if err != nil {
			return nil, err
		}
		if len(members) == maxMembers {
			return nil, p.errorf("more than %d members", maxMembers)
		}
		members = append(members, m)
		p.skipOWS()
		if p.done() {
			return members, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.errorf("expected ',' after a member")
		}
		p.i++
		p.skipOWS()
		if p.done() {
			return nil, p.errorf("trailing ','")
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) errorf(format string, a ...any) error {
	return fmt.Errorf("%w at offset %d: %s", ErrMalformedField, p.i, fmt.Sprintf(format, a...))
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) member() (sfMember, error) {
	var m sfMember
	if p.done() {
		return m, p.errorf("expected a member")
	}
	var v sfParam
	if err := p.bareItem(&v); err != nil {
		return m, err
	}
	if v.kind != sfString && v.kind != sfToken {
		return m, p.errorf("a policy name must be a string or a token")
	}
	m.name = v.s
	for !p.done() && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return m, err
		}
		pr := sfParam{key: key, kind: sfBoolean, i: 1}
		if !p.done() && p.s[p.i] == '=' {
			p.i++
			if err := p.bareItem(&pr); err != nil {
				return m, err
			}
		}
		// A repeated key keeps its last value (RFC 9651 §4.2.3.2).
		replaced := false
		for j := range m.params {
			if m.params[j].key == key {
				m.params[j], replaced = pr, true
			}
		}
		if !replaced {
			if len(m.params) == maxParams {
				return m, p.errorf("more than %d parameters", maxParams)
			}
			m.params = append(m.params, pr)
		}
	}
	return m, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.done() || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", p.errorf("expected a parameter key")
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem(v *sfParam) error {
	if p.done() {
		return p.errorf("expected an item")
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		return p.number(v)
	case c == '"':
		return p.str(v)
	case c == ':':
		return p.bytes(v)
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			v.kind, v.i = sfBoolean, int64(p.s[p.i+1]-'0')
			p.i += 2
			return nil
		}
		return p.errorf("malformed boolean")
	case isAlpha(c) || c == '*':
		start := p.i
		p.i++
		for p.i < len(p.s) && isTokenChar(p.s[p.i]) {
			p.i++
		}
		v.kind, v.s = sfToken, p.s[start:p.i]
		return nil
	}
	return p.errorf("unexpected character %q", p.s[p.i])
}

func (p *sfParser) number(v *sfParam) error {
	start := p.i
	neg := p.s[p.i] == '-'
	if neg {
		p.i++
	}
	digits, dot := 0, -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		if isDigit(c) {
			digits++
		} else if c == '.' && dot < 0 {
			if digits > 12 {
				return p.errorf("decimal with more than 12 integer digits")
			}
			dot = digits
		} else {
			break
		}
		p.i++
		if dot < 0 && digits > 15 {
			return p.errorf("integer with more than 15 digits")
		}
	}
	if digits == 0 {
		return p.errorf("expected a digit")
	}
	text := p.s[start:p.i]
	if dot < 0 {
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return p.errorf("integer: %v", err)
		}
		v.kind, v.i = sfInteger, n
		return nil
	}
	if frac := digits - dot; frac == 0 || frac > 3 {
		return p.errorf("decimal needs 1 to 3 fractional digits")
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return p.errorf("decimal: %v", err)
	}
	v.kind, v.f = sfDecimal, f
	return nil
}

func (p *sfParser) str(v *sfParam) error {
	p.i++ // opening quote
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return p.errorf("bad escape in string")
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			v.kind, v.s = sfString, b.String()
			return nil
		case c < 0x20 || c > 0x7e:
			return p.errorf("character %q not allowed in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return p.errorf("unterminated string")
}

func (p *sfParser) bytes(v *sfParam) error {
	p.i++ // opening colon
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return p.errorf("unterminated byte sequence")
	}
	b, err := base64.StdEncoding.DecodeString(p.s[p.i : p.i+end])
	if err != nil {
		return p.errorf("byte sequence: %v", err)
	}
	p.i += end + 1
	v.kind, v.b = sfBytes, b
	return nil
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || ('A' <= c && c <= 'Z') }

// isTokenChar reports whether c may continue a Token: tchar, ':' or '/'.
func isTokenChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
