package httplimit

import (
	"errors"
	"maps"
	"net/http"
	"net/netip"
	"strconv"
)

// A Key names one dimension of a policy: the part of the request that picks
// its bucket (the client's address, an API key, the route...). A Policy with
// several Keys has one bucket per combination, e.g. per route and client.
type Key struct {
	// Scope describes the key in problem details, e.g. "ip" or
	// "header X-Api-Key".
	Scope string
	// Secret keeps the key's value out of responses: the problem details of
	// a denial then name the scope only. Keys taken from credentials (API
	// keys, tokens) must be secret.
	Secret bool
	// Append appends the key's value for r to dst and returns the extended
	// slice; ok false means the policy does not apply to r (e.g. the header
	// is absent). It must not keep dst.
	Append func(dst []byte, r *http.Request) (b []byte, ok bool)

	// err is why the constructor could not make the key; New reports it.
	err error
}

// ByIP keys by the client's address, as ClientIP finds it behind the
// trusted proxies given (none by default: the peer address is used and
// forwarding headers are ignored). It applies to every request; one whose
// peer is not an IP address is keyed "unknown".
func ByIP(trusted ...netip.Prefix) Key {
	trusted = append([]netip.Prefix(nil), trusted...)
	return Key{Scope: "ip", Append: func(dst []byte, r *http.Request) ([]byte, bool) {
		a := ClientIP(r, trusted)
		if !a.IsValid() {
			return append(dst, "unknown"...), true
		}
		return a.AppendTo(dst), true
	}}
}

// ByHeader keys by the value of the request header field name (its first
// line), e.g. an API key or a tenant. It does not apply to requests without
// the field. The key is secret: its value never appears in responses. A
// store key longer than 256 bytes is replaced by its SHA-256 digest.
//
// An empty name makes a Key that New refuses.
func ByHeader(name string) Key {
	if name == "" {
		return Key{Scope: "header", err: errors.New(`ByHeader(""): the header name is empty`)}
	}
	canon := http.CanonicalHeaderKey(name)
	return Key{Scope: "header " + canon, Secret: true, Append: func(dst []byte, r *http.Request) ([]byte, bool) {
		vs := r.Header[canon]
		if len(vs) == 0 || vs[0] == "" {
			return dst, false
		}
		return append(dst, vs[0]...), true
	}}
}

// ByRoute keys by the pattern of net/http.ServeMux that matches the
// request, e.g. "POST /items/{id}", so all requests to one endpoint share a
// bucket whatever their path values. It uses r.Pattern when the middleware
// runs inside the mux, and otherwise asks mux (which may be nil then). It
// does not apply to requests that no pattern matches.
func ByRoute(mux *http.ServeMux) Key {
	return Key{Scope: "route", Append: func(dst []byte, r *http.Request) ([]byte, bool) {
		p := route(mux, r)
		if p == "" {
			return dst, false
		}
		return append(dst, p...), true
	}}
}

// ByMethod keys by the request method.
func ByMethod() Key {
	return Key{Scope: "method", Append: func(dst []byte, r *http.Request) ([]byte, bool) {
		return append(dst, r.Method...), true
	}}
}

// KeyFunc keys by any function of the request; ok false means the policy
// does not apply. The value appears in responses unless secret is true.
func KeyFunc(scope string, secret bool, f func(r *http.Request) (key string, ok bool)) Key {
	return Key{Scope: scope, Secret: secret, Append: func(dst []byte, r *http.Request) ([]byte, bool) {
		k, ok := f(r)
		if !ok {
			return dst, false
		}
		return append(dst, k...), true
	}}
}

// route returns the ServeMux pattern of r: r.Pattern, or mux's match.
func route(mux *http.ServeMux, r *http.Request) string {
	if r.Pattern != "" || mux == nil {
		return r.Pattern
	}
	_, p := mux.Handler(r)
	return p
}

// A CostFunc returns the cost of a request in the limit's units (reads
// cheap, writes dear). A negative cost is counted as 0.
type CostFunc func(r *http.Request) int64

// CostByMethod costs a request by its method, def when the method is not
// in costs.
func CostByMethod(costs map[string]int64, def int64) CostFunc {
	costs = maps.Clone(costs)
	return func(r *http.Request) int64 {
		if c, ok := costs[r.Method]; ok {
			return c
		}
		return def
	}
}

// CostByRoute costs a request by the ServeMux pattern that matches it (see
// ByRoute), def when the pattern is not in costs.
func CostByRoute(mux *http.ServeMux, costs map[string]int64, def int64) CostFunc {
	costs = maps.Clone(costs)
	return func(r *http.Request) int64 {
		if c, ok := costs[route(mux, r)]; ok {
			return c
		}
		return def
	}
}

// appendInt is strconv.AppendInt in base 10.
func appendInt(b []byte, n int64) []byte { return strconv.AppendInt(b, n, 10) }
