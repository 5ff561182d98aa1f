package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

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
