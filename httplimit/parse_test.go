package httplimit

import (
	"errors"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

func TestParseRateLimitPolicy(t *testing.T) {
	tests := []struct {
		in   string
		want []PolicyItem
		err  bool
	}{
		{in: ``, want: nil},
		{in: `"burst";q=100;w=60, "daily";q=1000;w=86400`, want: []PolicyItem{
			{Name: "burst", Quota: 100, Window: 60, QuotaUnit: "requests"},
			{Name: "daily", Quota: 1000, Window: 86400, QuotaUnit: "requests"},
		}},
		{in: `"b";q=5;qu="content-bytes";pk=:AQID:;x=?1;y=1.5`, want: []PolicyItem{
			{Name: "b", Quota: 5, QuotaUnit: "content-bytes", PartitionKey: []byte{1, 2, 3}},
		}},
		{in: `tok;q=1;q=2`, want: []PolicyItem{{Name: "tok", Quota: 2, QuotaUnit: "requests"}}},
		{in: `"e\"s\\c";q=0`, want: []PolicyItem{{Name: `e"s\c`, Quota: 0, QuotaUnit: "requests"}}},
		{in: `"a";w=1`, err: true},
		{in: `"a";q=-1`, err: true},
		{in: `"a";q=1.5`, err: true},
		{in: `"a";q=1,`, err: true},
		{in: `"a";q=1 "b";q=2`, err: true},
		{in: `("a" "b");q=1`, err: true},
		{in: `7;q=1`, err: true},
		{in: `"a";Q=1`, err: true},
		{in: `"a";q=1234567890123456`, err: true},
		{in: `"unterminated;q=1`, err: true},
	}
	for _, tt := range tests {
		got, err := ParseRateLimitPolicy(tt.in)
		if (err != nil) != tt.err || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseRateLimitPolicy(%q) = %+v, %v; want %+v (error %v)", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !errors.Is(err, ErrMalformedField) {
			t.Errorf("error %v does not wrap ErrMalformedField", err)
		}
	}
}

func TestParseRateLimit(t *testing.T) {
	tests := []struct {
		in   string
		want []LimitItem
		err  bool
	}{
		{in: `"burst";r=50;t=30`, want: []LimitItem{{Name: "burst", Remaining: 50, Reset: 30}}},
		{in: `"a";r=0,	"b";r=3;t=0;pk=:cGs=:`, want: []LimitItem{{Name: "a", Remaining: 0, Reset: -1}, {Name: "b", Remaining: 3, Reset: 0, PartitionKey: []byte("pk")}}},
		{in: `"a";t=1`, err: true},
		{in: `"a";r=1;t=-1`, err: true},
		{in: `"a";r="1"`, err: true},
	}
	for _, tt := range tests {
		got, err := ParseRateLimit(tt.in)
		if (err != nil) != tt.err || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseRateLimit(%q) = %+v, %v; want %+v (error %v)", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// TestFieldsRoundTrip: what the middleware writes, the client parses back.
func TestFieldsRoundTrip(t *testing.T) {
	r := ratelimit.Rule{Name: `we"ird`, Quota: 10, Period: time.Minute, Burst: 20}
	d := ratelimit.Decision{Rule: r.Name, Remaining: 7, ResetAfter: 1500 * time.Millisecond}
	ps, err := ParseRateLimitPolicy(string(AppendPolicyItem(nil, &r)))
	if err != nil || len(ps) != 1 || ps[0].Name != r.Name || ps[0].Quota != 20 || ps[0].Window != PolicyWindow(&r) {
		t.Errorf("policy round trip: %+v, %v", ps, err)
	}
	ls, err := ParseRateLimit(string(AppendLimitItem(nil, &d)))
	if err != nil || len(ls) != 1 || ls[0].Name != r.Name || ls[0].Remaining != 7 || ls[0].Reset != 2 {
		t.Errorf("limit round trip: %+v, %v", ls, err)
	}
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	tests := []struct {
		name   string
		remote string
		header http.Header
		want   string
	}{
		{"untrusted peer ignores headers", "203.0.113.5:1234", http.Header{"X-Forwarded-For": {"1.2.3.4"}}, "203.0.113.5"},
		{"trusted peer, one hop", "10.0.0.1:1234", http.Header{"X-Forwarded-For": {"198.51.100.7"}}, "198.51.100.7"},
		{"skip trusted hops from the right", "10.0.0.1:1", http.Header{"X-Forwarded-For": {"6.6.6.6, 198.51.100.7, 10.2.2.2"}}, "198.51.100.7"},
		{"several lines", "10.0.0.1:1", http.Header{"X-Forwarded-For": {"6.6.6.6", "198.51.100.7, 10.2.2.2"}}, "198.51.100.7"},
		{"garbage stops at the last trusted hop", "10.0.0.1:1", http.Header{"X-Forwarded-For": {"1.1.1.1, garbage, 10.3.3.3"}}, "10.3.3.3"},
		{"all trusted: leftmost", "10.0.0.1:1", http.Header{"X-Forwarded-For": {"10.9.9.9, 10.3.3.3"}}, "10.9.9.9"},
		{"no header", "10.0.0.1:1", nil, "10.0.0.1"},
		{"forwarded", "10.0.0.1:1", http.Header{"Forwarded": {`for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::17"},
		{"forwarded skips trusted v6", "10.0.0.1:1", http.Header{"Forwarded": {`for=192.0.2.60, for="[2001:db8:ffff::1]"`}}, "192.0.2.60"},
		{"forwarded obfuscated", "10.0.0.1:1", http.Header{"Forwarded": {`for=192.0.2.60, for=_hidden`}}, "10.0.0.1"},
		{"forwarded wins over xff", "10.0.0.1:1", http.Header{"Forwarded": {`for=192.0.2.60`}, "X-Forwarded-For": {"6.6.6.6"}}, "192.0.2.60"},
		{"forwarded without for", "10.0.0.1:1", http.Header{"Forwarded": {`proto=https, for=192.0.2.61;by=x`}}, "192.0.2.61"},
		{"mapped v4", "[::ffff:10.0.0.1]:1", http.Header{"X-Forwarded-For": {"::ffff:198.51.100.9"}}, "198.51.100.9"},
		{"zone dropped", "[fe80::1%eth0]:1", nil, "fe80::1"},
		{"not an address", "pipe", nil, "invalid IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tt.remote, Header: tt.header}
			if got := ClientIP(r, trusted).String(); got != tt.want {
				t.Errorf("ClientIP = %s, want %s", got, tt.want)
			}
		})
	}
}

func FuzzRetryAfter(f *testing.F) {
	f.Add("Retry-After", "120", "")
	f.Add("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:27:00 GMT")
	f.Add("Retry-After", "Sunday, 06-Nov-94 08:49:37 GMT", "")
	f.Add("Retry-After", "Sun Nov  6 08:49:37 1994", "garbage")
	f.Add("Retry-After-Ms", "12.345", "")
	f.Add("X-Ms-Retry-After-Ms", "99999999999999999999", "")
	f.Add("Ratelimit", `"a";r=0;t=5, "b";r=0;t=7`, "")
	f.Add("X-Ratelimit-Reset", "1800000000", "Wed, 21 Oct 2015 07:27:00 GMT")
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, name, value, date string) {
		h := http.Header{}
		h.Set(name, value)
		h.Set("X-Ratelimit-Remaining", "0")
		if date != "" {
			h.Set("Date", date)
		}
		d, ok := RetryDelay(h, now)
		if d < 0 {
			t.Fatalf("RetryDelay(%s: %q) = %v < 0", name, value, d)
		}
		if !ok && d != 0 {
			t.Fatalf("RetryDelay(%s: %q) = %v but not ok", name, value, d)
		}
		// Delay-seconds round-trips exactly.
		if n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64); err == nil && n >= 0 && n < 1<<33 &&
			http.CanonicalHeaderKey(name) == "Retry-After" && isDigits(strings.TrimSpace(value)) {
			if !ok || d != time.Duration(n)*time.Second {
				t.Fatalf("Retry-After %q = %v, %v; want %ds", value, d, ok, n)
			}
		}
	})
}

func FuzzRateLimitFields(f *testing.F) {
	f.Add(`"burst";q=100;w=60, "daily";q=1000;w=86400`)
	f.Add(`"burst";r=50;t=30`)
	f.Add(`"b";q=5;qu="content-bytes";pk=:AQID:;x=?1;y=1.5`)
	f.Add(`tok;r=0;t=1, "x";r=1`)
	f.Fuzz(func(t *testing.T, v string) {
		// Whatever parses re-serialises (for names that the writer can
		// represent) to a value that parses to the same items.
		if ps, err := ParseRateLimitPolicy(v); err == nil {
			var b []byte
			for i, p := range ps {
				if p.Window == 0 || !printable(p.Name) {
					return
				}
				if i > 0 {
					b = append(b, ", "...)
				}
				b = appendSFString(b, p.Name)
				b = append(b, ";q="...)
				b = strconv.AppendInt(b, p.Quota, 10)
				b = append(b, ";w="...)
				b = strconv.AppendInt(b, p.Window, 10)
			}
			again, err := ParseRateLimitPolicy(string(b))
			if err != nil || len(again) != len(ps) {
				t.Fatalf("re-parse of %q: %v, %v", b, again, err)
			}
			for i := range ps {
				if again[i].Name != ps[i].Name || again[i].Quota != ps[i].Quota || again[i].Window != ps[i].Window {
					t.Fatalf("re-parse of %q: %+v, want %+v", b, again[i], ps[i])
				}
			}
		}
		if ls, err := ParseRateLimit(v); err == nil {
			for _, l := range ls {
				if l.Remaining < 0 || l.Reset < -1 {
					t.Fatalf("ParseRateLimit(%q) gave %+v", v, l)
				}
			}
		}
	})
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "1.2.3.4, 10.0.0.2", "")
	f.Add("10.0.0.1:80", "", `for=192.0.2.60;proto=http, for="[2001:db8::1]:80"`)
	f.Add("[::ffff:10.0.0.1]:80", "garbage,,", `for="_x", for=unknown`)
	f.Add("203.0.113.1:1", "1.1.1.1", "")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	f.Fuzz(func(t *testing.T, remote, xff, fwd string) {
		h := http.Header{}
		if xff != "" {
			h.Set("X-Forwarded-For", xff)
		}
		if fwd != "" {
			h.Set("Forwarded", fwd)
		}
		r := &http.Request{RemoteAddr: remote, Header: h}
		got := ClientIP(r, trusted)
		peer := parseHostAddr(remote)
		// An untrusted peer is always the answer, whatever the headers.
		if !isTrusted(peer, trusted) && got != peer {
			t.Fatalf("untrusted peer %v, got %v", peer, got)
		}
		if got.IsValid() {
			if got.Is4In6() || got.Zone() != "" {
				t.Fatalf("address %v not canonical", got)
			}
			// The answer comes from the peer or from the headers.
			if got != peer && !strings.Contains(xff+fwd, got.String()) && !containsAddr(xff+fwd, got) {
				t.Fatalf("ClientIP = %v, found neither in peer %q nor headers %q %q", got, remote, xff, fwd)
			}
		}
		// Without trusted proxies the headers are never read.
		if ClientIP(r, nil) != peer {
			t.Fatal("headers read without trusted proxies")
		}
	})
}

// containsAddr reports whether some token of s parses to a.
func containsAddr(s string, a netip.Addr) bool {
	for _, tok := range strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(",;= \t\"", r) }) {
		if parseHostAddr(tok) == a || parseHostAddr(strings.TrimPrefix(strings.TrimPrefix(tok, "for"), "FOR")) == a {
			return true
		}
	}
	return false
}
