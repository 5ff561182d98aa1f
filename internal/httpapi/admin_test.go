package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/overrides"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
)

const testToken = "s3cret-token"

type adminFixture struct {
	*fixture
	admin   *httptest.Server
	logs    *bytes.Buffer
	reloads int
	failing bool
}

func newAdminFixture(t *testing.T) *adminFixture {
	t.Helper()
	af := &adminFixture{fixture: newFixture(t, Options{}), logs: new(bytes.Buffer)}
	sync := &overrides.Sync{Store: &overrides.MemoryStore{Now: af.clock.Now}, Overrides: af.overrides}
	admin, err := NewAdmin(AdminOptions{
		Token: testToken, Service: af.svc, Store: af.mem, Keys: LocalKeys(af.mem),
		Overrides: af.overrides, OverrideSync: sync,
		Reload: func() error {
			af.reloads++
			if af.failing {
				return errors.New("rules/a.yaml:3: domain: empty domain")
			}
			return nil
		},
		Status:         func() rules.WatchStatus { return rules.WatchStatus{Loads: af.reloads} },
		Logger:         slog.New(slog.NewTextHandler(af.logs, nil)),
		FailureDefault: ratelimit.FailLocal,
	})
	if err != nil {
		t.Fatal(err)
	}
	af.admin = httptest.NewServer(admin)
	t.Cleanup(af.admin.Close)
	return af
}

func (af *adminFixture) call(t *testing.T, method, path, body string) reply {
	t.Helper()
	return do(t, method, af.admin.URL+path, body, "Authorization", "Bearer "+testToken, "X-Sluice-Actor", "alice")
}

func TestAdminNeedsToken(t *testing.T) {
	af := newAdminFixture(t)
	for _, hdr := range [][]string{
		nil,
		{"Authorization", "Bearer wrong"},
		{"Authorization", "Basic " + testToken},
		{"Authorization", "Bearer " + testToken + "x"},
	} {
		r := do(t, "GET", af.admin.URL+"/admin/v1/rules", "", hdr...)
		assertProblem(t, r, http.StatusUnauthorized, "bearer token")
		if r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("401 without WWW-Authenticate")
		}
	}
	if _, err := NewAdmin(AdminOptions{Service: af.svc, Store: af.mem}); err == nil {
		t.Error("NewAdmin without a token succeeded")
	}
}

func TestAdminRulesAndReload(t *testing.T) {
	af := newAdminFixture(t)
	r := af.call(t, "GET", "/admin/v1/rules", "")
	if r.status != 200 {
		t.Fatalf("rules: %d %s", r.status, r.body)
	}
	var out struct {
		Domains []domainView `json:"domains"`
		Reload  *reloadView  `json:"reload"`
	}
	decodeStrict(t, r.body, &out)
	if len(out.Domains) != 1 || out.Domains[0].Name != "t" || len(out.Domains[0].Rules) != 8 {
		t.Fatalf("domains = %+v", out.Domains)
	}
	if last := out.Domains[0].Rules[7]; last.Name != "model_output" || last.CostUnit != "output_tokens" || last.Limit != 50 {
		t.Errorf("last rule = %+v, want model_output counting 50 output_tokens", last)
	}
	first := out.Domains[0].Rules[0]
	if first.Name != "per_user" || first.Source != "rules0.yaml:4" || first.Limit != 3 || first.Unit != "minute" || first.Algorithm != "fixed_window" {
		t.Errorf("first rule = %+v", first)
	}
	// It states no failure_mode: the view shows the one in force.
	if first.FailureMode != "local (default)" {
		t.Errorf("first rule's failure mode %q, want the default in force, local (default)", first.FailureMode)
	}

	r = af.call(t, "POST", "/admin/v1/reload", "")
	if r.status != 200 || af.reloads != 1 {
		t.Errorf("reload: %d %s (reloads %d)", r.status, r.body, af.reloads)
	}
	af.failing = true
	assertProblem(t, af.call(t, "POST", "/admin/v1/reload", ""), http.StatusUnprocessableEntity, "rules/a.yaml:3")
	if !strings.Contains(af.logs.String(), "actor=alice") {
		t.Errorf("reload not logged with its actor:\n%s", af.logs)
	}
}

type keysOut struct {
	Domain  string    `json:"domain"`
	Entries []entry   `json:"entries"`
	Limits  []keyView `json:"limits"`
}

func TestAdminInspectAndReset(t *testing.T) {
	af := newAdminFixture(t)
	for range 2 {
		do(t, "POST", af.srv.URL+"/v1/check", checkBody("t", "", "user=login:bob"))
	}
	inspect := func() keyView {
		t.Helper()
		r := af.call(t, "GET", "/admin/v1/keys?domain=t&entry="+url.QueryEscape("user=login:bob"), "")
		if r.status != 200 {
			t.Fatalf("inspect: %d %s", r.status, r.body)
		}
		var out keysOut
		decodeStrict(t, r.body, &out)
		if len(out.Limits) != 1 {
			t.Fatalf("limits = %+v", out.Limits)
		}
		return out.Limits[0]
	}
	k := inspect()
	if k.Rule != "per_user" || k.Remaining != 1 || k.Limit != 3 || k.Stored == nil || !*k.Stored || k.State == nil || k.State.N != 2 {
		t.Errorf("before reset: %+v (state %+v)", k, k.State)
	}
	if !strings.HasPrefix(k.Key, "t|user:login%3Abob#") {
		t.Errorf("key %q", k.Key)
	}

	r := af.call(t, "POST", "/admin/v1/keys/reset", `{"domain":"t","entries":[{"key":"user","value":"login:bob"}]}`)
	if r.status != 200 || !strings.Contains(r.body, k.Key) {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	k = inspect()
	if k.Remaining != 3 || *k.Stored {
		t.Errorf("after reset: %+v", k)
	}
	if !strings.Contains(af.logs.String(), "admin: keys reset") {
		t.Errorf("reset not logged:\n%s", af.logs)
	}

	bad := []struct {
		method, path, body string
		status             int
		detail             string
	}{
		{"GET", "/admin/v1/keys?domain=nope&entry=a=b", "", 404, "not loaded"},
		{"GET", "/admin/v1/keys?domain=t&entry=novalue", "", 400, "KEY=VALUE"},
		{"GET", "/admin/v1/keys?domain=t", "", 400, "at least one entry"},
		{"GET", "/admin/v1/keys?entry=a=b", "", 400, "domain is empty"},
		{"POST", "/admin/v1/keys/reset", `{"domain":"t","entries":[{"key":"user","value":"x"}],"extra":1}`, 400, `unknown field "extra"`},
		{"POST", "/admin/v1/keys/reset", `{"domain":"t","entries":[{"key":"user","value":"` + strings.Repeat("v", 300) + `"}]}`, 400, "MaxKeyValueBytes"},
		{"POST", "/admin/v1/keys/reset", `{"domain":"` + strings.Repeat("d", 70_000) + `"}`, 413, "exceeds 65536 bytes (MaxBodyBytes)"},
	}
	for _, b := range bad {
		assertProblem(t, af.call(t, b.method, b.path, b.body), b.status, b.detail)
	}
}

func TestAdminOverrides(t *testing.T) {
	af := newAdminFixture(t)
	check := func(want int, wantLimit int64) {
		t.Helper()
		r := do(t, "POST", af.srv.URL+"/v1/check", checkBody("t", "0", "user=o"))
		var cr checkResponse
		decodeStrict(t, r.body, &cr)
		if d := cr.Descriptors[0]; d.Remaining != int64(want) || d.Limit != wantLimit {
			t.Errorf("remaining %d limit %d, want %d %d", d.Remaining, d.Limit, want, wantLimit)
		}
		if p := r.header.Get("RateLimit-Policy"); !strings.Contains(p, ";q="+jsonInt(wantLimit)+";") {
			t.Errorf("RateLimit-Policy %q does not announce %d", p, wantLimit)
		}
	}
	do(t, "POST", af.srv.URL+"/v1/check", checkBody("t", "", "user=o"))
	check(2, 3)

	r := af.call(t, "PUT", "/admin/v1/overrides/t/per_user", `{"limit":10,"ttl":"1h","reason":"incident 42"}`)
	if r.status != 200 {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	check(9, 10) // at once, against what was consumed

	r = af.call(t, "GET", "/admin/v1/overrides", "")
	var list struct {
		Overrides []overrideView `json:"overrides"`
	}
	decodeStrict(t, r.body, &list)
	if len(list.Overrides) != 1 || list.Overrides[0].Limit != 10 || list.Overrides[0].Reason != "incident 42" || !strings.HasPrefix(list.Overrides[0].By, "alice") {
		t.Errorf("overrides = %+v", list.Overrides)
	}
	if r := af.call(t, "GET", "/admin/v1/rules", ""); !strings.Contains(r.body, `"override"`) {
		t.Errorf("rules do not show the override: %s", r.body)
	}
	if !strings.Contains(af.logs.String(), "admin: override set") || !strings.Contains(af.logs.String(), "incident 42") {
		t.Errorf("override not logged:\n%s", af.logs)
	}

	af.clock.Advance(time.Hour) // expired
	check(2, 3)

	af.call(t, "PUT", "/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"1h"}`)
	check(0, 1)
	if r := af.call(t, "DELETE", "/admin/v1/overrides/t/per_user", ""); r.status != http.StatusNoContent {
		t.Errorf("delete: %d %s", r.status, r.body)
	}
	check(2, 3)
	assertProblem(t, af.call(t, "DELETE", "/admin/v1/overrides/t/per_user", ""), 404, "no override")

	bad := []struct {
		path, body string
		status     int
		detail     string
	}{
		{"/admin/v1/overrides/t/nope", `{"limit":1,"ttl":"1h"}`, 404, "no rule named"},
		{"/admin/v1/overrides/x/per_user", `{"limit":1,"ttl":"1h"}`, 404, "not loaded"},
		{"/admin/v1/overrides/t/vip", `{"limit":1,"ttl":"1h"}`, 400, "unlimited"},
		{"/admin/v1/overrides/t/per_user", `{"limit":-1,"ttl":"1h"}`, 400, "out of range"},
		{"/admin/v1/overrides/t/per_user", `{"limit":1099511627777,"ttl":"1h"}`, 400, "out of range"},
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"9999h"}`, 400, "expiry"},
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"-1s"}`, 400, "expiry"},
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"soon"}`, 400, `"ttl"`},
		{"/admin/v1/overrides/t/per_user", `{"limit":1}`, 400, `"ttl"`},
		{"/admin/v1/overrides/t/per_user", `{"ttl":"1h"}`, 400, `"limit"`},
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"1h","burst":5}`, 400, "no burst"},
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"1h","lmit":2}`, 400, `unknown field "lmit"`},
		// Decoded strictly, as /v1/check: nothing JSON would decode with a loss.
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"1h","limit":1000}`, 400, `given twice`},
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"1h","LIMIT":1000}`, 400, `given twice`},
		{"/admin/v1/overrides/t/per_user", "{\"limit\":1,\"ttl\":\"1h\",\"reason\":\"\xff\"}", 400, `invalid UTF-8`},
		{"/admin/v1/overrides/t/per_user", `{"limit":1,"ttl":"1h","reason":"\ud800"}`, 400, `surrogate`},
	}
	for _, b := range bad {
		assertProblem(t, af.call(t, "PUT", b.path, b.body), b.status, b.detail)
	}
	// A burst is fine on GCRA.
	if r := af.call(t, "PUT", "/admin/v1/overrides/t/gcra", `{"limit":5,"burst":50,"ttl":"10m"}`); r.status != 200 {
		t.Errorf("gcra override: %d %s", r.status, r.body)
	}
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
