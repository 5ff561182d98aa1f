package httpapi

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/overrides"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// fuzzOverrideRules define targets whose names a naive key would confuse:
// a/b + c and a + b/c, names with spaces, escapes and non-ASCII letters,
// and a domain "." that no path can address.
var fuzzOverrideRules = []string{testRules, `domain: a/b
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5, name: c}
`, `domain: a
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5, name: b/c}
  - key: k2
    rate_limit: {unit: minute, requests_per_unit: 5, name: b}
  - key: k3
    rate_limit: {unit: minute, requests_per_unit: 5, name: "ü %2F+"}
`, `domain: .
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5, name: a/b}
`}

// FuzzAdminOverrides puts two overrides, lists them and deletes the
// first. Every answer is either a 4xx problem with a detail or a success;
// what succeeded is listed as it was set, one entry per distinct target,
// and deleting one target removes that one only.
func FuzzAdminOverrides(f *testing.F) {
	const ok = `{"limit": 7, "burst": 0, "ttl": "1h", "reason": "incident 42"}`
	for _, s := range [][6]string{
		{"a/b", "c", ok, "a", "b/c", ok},
		{"a", "b/c", ok, "a/b", "c", `{"limit": 9, "ttl": "2h"}`},
		{"t", "gcra", `{"limit": 3, "burst": 6, "ttl": "30m"}`, "t", "gcra", `{"limit": 4, "ttl": "30m", "reason": "again"}`},
		{".", "a/b", ok, "a", "b", ok},
		{"a", "ü %2F+", ok, "a", "ü %2F+", `{"limit": 1, "ttl": "1m", "reason": "\u00fc\ud800"}`},
		{"t", "per_user", `{"limit": 1, "ttl": "1h", "burst": 2}`, "t", "vip", ok},
		{"t", "per_user", `{"limit": -1, "ttl": "1h"}`, "t", "per_user", `{"ttl": "1h"}`},
		{"t", "gcra", `{"limit": 1, "ttl": "1ns"}`, "t", "per_user", `{"limit": 2, "ttl": "1ms"}`},
		{"t", "per_user", `{"limit": 1, "ttl": "9999h"}`, "t", "per_user", `{"limit": 1, "ttl": "1h"} {}`},
		{"t\xff", "per_user", ok, "", "per_user", ok},
		{"..", "x", ok, "t", "..", ok},
		{"t", "per_user", `{"limit": 1, "ttl": "1h", "extra": 1}`, "t", "nope", ok},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	set := loadSet(f, fuzzOverrideRules...)
	mem := memstore.New(memstore.Options{JanitorInterval: -1})
	f.Cleanup(func() { mem.Close() })
	svc, err := service.New(service.Options{Store: mem, Rules: set})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, d1, r1, b1, d2, r2, b2 string) {
		table := service.NewOverrides(set, nil)
		admin, err := NewAdmin(AdminOptions{
			Token: testToken, Service: svc, Store: mem,
			Overrides: table, OverrideSync: &overrides.Sync{Store: &overrides.MemoryStore{}, Overrides: table},
		})
		if err != nil {
			t.Fatal(err)
		}
		call := func(method, target, body string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(method, target, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+testToken)
			req.Header.Set("X-Sluice-Actor", "fuzz\xff")
			w := httptest.NewRecorder()
			admin.ServeHTTP(w, req)
			return w
		}
		path := func(d, r string) string {
			return "/admin/v1/overrides/" + url.PathEscape(d) + "/" + url.PathEscape(r)
		}
		model := map[[2]string]overrideView{}
		for _, p := range [][3]string{{d1, r1, b1}, {d2, r2, b2}} {
			w := call("PUT", path(p[0], p[1]), p[2])
			if w.Code != http.StatusOK {
				refused(t, w, "PUT "+path(p[0], p[1]))
				continue
			}
			var v overrideView
			if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
				t.Fatalf("PUT %s: 200 with %q: %v", path(p[0], p[1]), w.Body, err)
			}
			var req overrideRequest
			if err := json.Unmarshal([]byte(p[2]), &req); err != nil || req.Limit == nil {
				t.Fatalf("PUT %s: 200 for body %q (%v)", path(p[0], p[1]), p[2], err)
			}
			if v.Domain != p[0] || v.Rule != p[1] || v.Limit != *req.Limit || v.Burst != req.Burst || v.Reason != req.Reason || !utf8.ValidString(v.By) {
				t.Fatalf("PUT %s %q: answered %+v", path(p[0], p[1]), p[2], v)
			}
			model[[2]string{p[0], p[1]}] = v
		}
		list := func() []overrideView {
			w := call("GET", "/admin/v1/overrides", "")
			var out struct {
				Overrides []overrideView `json:"overrides"`
			}
			if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &out) != nil {
				t.Fatalf("GET /admin/v1/overrides: %d %s", w.Code, w.Body)
			}
			return out.Overrides
		}
		// An override set for less than a minute may have expired by the
		// time it is listed: it need not be listed.
		const brief = int64(time.Minute / time.Millisecond)
		same := func(got []overrideView) {
			t.Helper()
			listed := map[[2]string]bool{}
			for _, g := range got {
				listed[[2]string{g.Domain, g.Rule}] = true
			}
			if len(listed) != len(got) {
				t.Fatalf("listed one target twice: %+v", got)
			}
			for k, want := range model {
				if !listed[k] && want.ExpiresInMS >= brief {
					t.Fatalf("set %+v, not listed in %+v", want, got)
				}
			}
			for _, g := range got {
				want, ok := model[[2]string{g.Domain, g.Rule}]
				if !ok {
					t.Fatalf("listed %+v, never set", g)
				}
				if d := want.ExpiresInMS - g.ExpiresInMS; d < 0 || d > brief {
					t.Fatalf("listed %+v, set %+v", g, want)
				}
				g.ExpiresInMS = want.ExpiresInMS
				if g != want {
					t.Fatalf("listed %+v, set %+v", g, want)
				}
			}
		}
		same(list())

		w := call("DELETE", path(d1, r1), "")
		if v, set := model[[2]string{d1, r1}]; set {
			if w.Code == http.StatusNotFound && v.ExpiresInMS < brief {
				refused(t, w, "DELETE "+path(d1, r1)) // it expired
			} else if w.Code != http.StatusNoContent {
				t.Fatalf("DELETE %s: %d %s, want 204", path(d1, r1), w.Code, w.Body)
			}
			delete(model, [2]string{d1, r1})
		} else {
			refused(t, w, "DELETE "+path(d1, r1))
		}
		same(list())
	})
}

// refused fails t unless w is a 4xx problem with a detail.
func refused(t *testing.T, w *httptest.ResponseRecorder, what string) {
	t.Helper()
	var p problem
	if w.Code < 400 || w.Code > 499 || w.Header().Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Status != w.Code || p.Detail == "" {
		t.Fatalf("%s: %d %q %s; want a 4xx problem with a detail", what, w.Code, w.Header().Get("Content-Type"), w.Body)
	}
}

// FuzzAdminAuth: a request authenticates exactly when its Authorization
// header is the scheme Bearer, in any case, one or more spaces and the
// token; and the ports of one remote address share one client key.
func FuzzAdminAuth(f *testing.F) {
	for _, s := range [][2]string{
		{"Bearer " + testToken, "192.0.2.1:1"},
		{"bEARER   " + testToken, "[2001:db8::1]:80"},
		{"Bearer\t" + testToken, "[::ffff:10.0.0.1]:2"},
		{"Basic " + testToken, "pipe"},
		{"Bearer  " + testToken + " ", "[fe80::1%eth0]:9"},
		{"bearer", ""},
	} {
		f.Add(s[0], s[1])
	}
	fx := newFixture(f, Options{})
	f.Fuzz(func(t *testing.T, auth, remote string) {
		admin, err := NewAdmin(AdminOptions{Token: testToken, Service: fx.svc, Store: fx.mem})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("GET", "/admin/v1/rules", nil)
		req.RemoteAddr = remote
		req.Header["Authorization"] = []string{auth}
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, req)
		scheme, rest, _ := strings.Cut(auth, " ")
		want := len(auth) > len("Bearer ") && strings.EqualFold(scheme, "bearer") && strings.TrimLeft(rest, " ") == testToken
		if (w.Code == http.StatusOK) != want {
			t.Fatalf("Authorization %q: %d, want authenticated %v", auth, w.Code, want)
		}
		if !want && w.Code != http.StatusUnauthorized {
			t.Fatalf("Authorization %q: %d, want 401", auth, w.Code)
		}
		if host, _, err := net.SplitHostPort(remote); err == nil {
			if k1, k2 := clientKey(net.JoinHostPort(host, "1")), clientKey(net.JoinHostPort(host, "65535")); k1 != k2 {
				t.Fatalf("%q: ports 1 and 65535 have keys %q and %q", remote, k1, k2)
			}
		}
	})
}
