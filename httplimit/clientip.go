package httplimit

import (
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns the address of the client that sent r, as far as it can
// be trusted.
//
// The peer address (r.RemoteAddr) is the client unless it lies in one of
// the trusted prefixes: only a trusted proxy's word about whom it forwarded
// for is believed. Then the forwarding headers are read from the right — the
// hop the trusted proxy itself appended — skipping every address that is
// also a trusted proxy; the first address that is not is the client. The
// Forwarded field (RFC 7239, its "for" parameters) is used when present,
// X-Forwarded-For otherwise. An entry that is not an IP address (an
// obfuscated identifier, "unknown", garbage) ends the walk: the last trusted
// hop is then returned, since nothing to its left can be checked. With no
// trusted prefixes (the default) the headers are never read, so a client
// cannot choose its own key by forging them.
//
// IPv4-mapped IPv6 addresses are unmapped and zones dropped, so one client
// has one address. The zero Addr is returned when r.RemoteAddr is not an
// address (as with some test transports).
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseHostAddr(r.RemoteAddr)
	if !peer.IsValid() || !isTrusted(peer, trusted) {
		return peer
	}
	client := peer
	if vs := r.Header["Forwarded"]; len(vs) > 0 {
		walkRight(vs, func(elem string) bool {
			a, ok := forwardedFor(elem)
			if !ok {
				return true // an element without for= says nothing of the client
			}
			if !a.IsValid() {
				return false
			}
			client = a
			return isTrusted(a, trusted)
		})
		return client
	}
	walkRight(r.Header["X-Forwarded-For"], func(elem string) bool {
		a := parseHostAddr(strings.TrimSpace(elem))
		if !a.IsValid() {
			return false
		}
		client = a
		return isTrusted(a, trusted)
	})
	return client
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// walkRight calls f on the comma-separated elements of the field lines vs
// from the last to the first, while f returns true.
func walkRight(vs []string, f func(elem string) bool) {
	for i := len(vs) - 1; i >= 0; i-- {
		v := vs[i]
		for {
			j := lastUnquotedComma(v)
			if !f(v[j+1:]) {
				return
			}
			if j < 0 {
				break
			}
			v = v[:j]
		}
	}
}

// lastUnquotedComma returns the index of the last ',' of v outside a
// quoted string, or -1.
func lastUnquotedComma(v string) int {
	last, quoted := -1, false
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				last = i
			}
		}
	}
	return last
}

// forwardedFor returns the address of the for parameter of one Forwarded
// element; ok is false when the element has no for parameter, and the
// address is invalid when its node is not an IP address.
func forwardedFor(elem string) (a netip.Addr, ok bool) {
	for elem != "" {
		var pair string
		pair, elem, _ = strings.Cut(elem, ";")
		k, v, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if !strings.EqualFold(k, "for") {
			continue
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return parseHostAddr(v), true
	}
	return netip.Addr{}, false
}

// parseHostAddr parses "ip", "ip:port", "[ipv6]" or "[ipv6]:port" into a
// canonical address: unmapped, without zone. It allocates nothing.
func parseHostAddr(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return canonical(ap.Addr())
	}
	if len(s) >= 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 && strings.IndexByte(s, ':') == i {
		s = s[:i] // IPv4 with a port that is not a number, e.g. RFC 7239's "1.2.3.4:_x"
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return canonical(a)
	}
	return netip.Addr{}
}

func canonical(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }
