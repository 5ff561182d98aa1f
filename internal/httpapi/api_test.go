package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

const testRules = `domain: t
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: vip
    rate_limit: {unlimited: true, name: vip}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, name: trial}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 2, burst: 4, name: gcra}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0, name: blocked}
  - key: model
    limits:
      - {unit: hour, requests_per_unit: 3, algorithm: fixed_window, name: model_requests}
      - {unit: hour, requests_per_unit: 100, algorithm: fixed_window, cost_unit: input_tokens, name: model_input}
      - {unit: hour, requests_per_unit: 50, algorithm: fixed_window, cost_unit: output_tokens, name: model_output}
`

// fixture is a service on a memory store with the test rules, and its
// HTTP API.
type fixture struct {
	svc       *service.Service
	mem       *memstore.Store
	overrides *service.Overrides
	clock     *storetest.Clock
	reg       *prometheus.Registry
	api       *API
	srv       *httptest.Server
}

func loadSet(t testing.TB, files ...string) *rules.Set {
	t.Helper()
	var ds []*rules.Domain
	for i, f := range files {
		d, err := rules.Parse(fmt.Sprintf("rules%d.yaml", i), []byte(f))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	set, err := rules.NewSet(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func newFixture(t testing.TB, opts Options) *fixture {
	t.Helper()
	f := &fixture{clock: storetest.NewClock(time.Unix(1_800_000_000, 0)), reg: prometheus.NewRegistry()}
	set := loadSet(t, testRules)
	f.mem = memstore.New(memstore.Options{JanitorInterval: -1})
	t.Cleanup(func() { f.mem.Close() })
	f.overrides = service.NewOverrides(set, f.clock.Now)
	var err error
	f.svc, err = service.New(service.Options{Store: f.mem, Ledger: f.mem, Rules: set, Overrides: f.overrides, Metrics: service.NewMetrics(f.reg)})
	if err != nil {
		t.Fatal(err)
	}
	opts.Service = f.svc
	if opts.RLS == nil {
		opts.RLS = rls.New(f.svc, rls.Options{Headers: true})
	}
	opts.Gatherer = f.reg
	f.api, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.api)
	t.Cleanup(f.srv.Close)
	return f
}

type reply struct {
	status int
	header http.Header
	body   string
}

func do(t testing.TB, method, url, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// checkResponse mirrors the JSON answer of /v1/check.
type checkResponse struct {
	Allowed     bool   `json:"allowed"`
	Code        string `json:"code"`
	Descriptors []struct {
		Allowed       bool   `json:"allowed"`
		Code          string `json:"code"`
		Matched       bool   `json:"matched"`
		Rule          string `json:"rule"`
		Limit         int64  `json:"limit"`
		CostUnit      string `json:"cost_unit"`
		Remaining     int64  `json:"remaining"`
		ResetAfterMS  int64  `json:"reset_after_ms"`
		RetryAfterMS  int64  `json:"retry_after_ms"`
		Reason        string `json:"reason"`
		Shadow        bool   `json:"shadow"`
		QuotaMode     bool   `json:"quota_mode"`
		QuotaExceeded bool   `json:"quota_exceeded"`
		Unlimited     bool   `json:"unlimited"`
	} `json:"descriptors"`
}

func decodeStrict(t testing.TB, body string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
}

func checkBody(domain string, cost string, descs ...string) string {
	var ds []string
	for _, d := range descs {
		k, v, _ := strings.Cut(d, "=")
		ds = append(ds, fmt.Sprintf(`{"entries":[{"key":%q,"value":%q}]}`, k, v))
	}
	c := ""
	if cost != "" {
		c = `,"cost":` + cost
	}
	return fmt.Sprintf(`{"domain":%q,"descriptors":[%s]%s}`, domain, strings.Join(ds, ","), c)
}

func TestCheckSequence(t *testing.T) {
	f := newFixture(t, Options{})
	steps := []struct {
		name      string
		body      string
		status    int
		remaining []int64
		rule      string
		reason    string
		retry     bool // Retry-After expected
	}{
		{"first", checkBody("t", "", "user=a"), 200, []int64{2}, "per_user", "ok", false},
		{"check only", checkBody("t", "0", "user=a"), 200, []int64{2}, "per_user", "ok", false},
		{"cost 2", checkBody("t", "2", "user=a"), 200, []int64{0}, "per_user", "ok", false},
		{"over", checkBody("t", "", "user=a"), 429, []int64{0}, "per_user", "limited", true},
		{"other user", checkBody("t", "", "user=b"), 200, []int64{2}, "per_user", "ok", false},
		{"refund", checkBody("t", "-1", "user=a"), 200, []int64{1}, "per_user", "ok", false},
		{"all or nothing", checkBody("t", "2", "user=b", "user=a"), 429, []int64{2, 1}, "per_user", "", true},
		{"b untouched", checkBody("t", "0", "user=b"), 200, []int64{2}, "per_user", "ok", false},
		{"never", checkBody("t", "5", "user=c"), 429, []int64{3}, "per_user", "exceeds_capacity", false},
		{"blocked", checkBody("t", "", "blocked=x"), 429, []int64{0}, "blocked", "exceeds_capacity", false},
	}
	for _, st := range steps {
		r := do(t, "POST", f.srv.URL+"/v1/check", st.body)
		if r.status != st.status {
			t.Fatalf("%s: status %d, want %d: %s", st.name, r.status, st.status, r.body)
		}
		var cr checkResponse
		decodeStrict(t, r.body, &cr)
		if cr.Allowed != (st.status == 200) || (cr.Code == "OK") != (st.status == 200) {
			t.Errorf("%s: allowed %v code %s with status %d", st.name, cr.Allowed, cr.Code, r.status)
		}
		if len(cr.Descriptors) != len(st.remaining) {
			t.Fatalf("%s: %d descriptors, want %d", st.name, len(cr.Descriptors), len(st.remaining))
		}
		for i, want := range st.remaining {
			d := cr.Descriptors[i]
			if d.Remaining != want || d.Rule != st.rule || !d.Matched {
				t.Errorf("%s[%d]: remaining %d rule %q matched %v; want %d %q true", st.name, i, d.Remaining, d.Rule, d.Matched, want, st.rule)
			}
		}
		d := cr.Descriptors[0]
		if st.reason != "" && d.Reason != st.reason {
			t.Errorf("%s: reason %q, want %q", st.name, d.Reason, st.reason)
		}
		if st.reason == "exceeds_capacity" && d.RetryAfterMS != -1 {
			t.Errorf("%s: retry_after_ms %d, want -1 (never)", st.name, d.RetryAfterMS)
		}
		if got := r.header.Get("Retry-After") != ""; got != st.retry {
			t.Errorf("%s: Retry-After %q, want present=%v", st.name, r.header.Get("Retry-After"), st.retry)
		}
		if !strings.Contains(r.header.Get("RateLimit-Policy"), `"`+st.rule+`";q=`) || !strings.Contains(r.header.Get("RateLimit"), `"`+st.rule+`";r=`) {
			t.Errorf("%s: headers %q / %q lack rule %q", st.name, r.header.Get("RateLimit-Policy"), r.header.Get("RateLimit"), st.rule)
		}
		if d.ResetAfterMS <= 0 && st.rule == "per_user" && d.Remaining < 3 {
			t.Errorf("%s: reset_after_ms %d, want > 0", st.name, d.ResetAfterMS)
		}
	}
}

func TestCheckKinds(t *testing.T) {
	f := newFixture(t, Options{})
	tests := []struct {
		name                       string
		body                       string
		matched, unlimited, shadow bool
		rule                       string
		status                     int
	}{
		{"unknown domain", checkBody("nope", "", "user=a"), false, false, false, "", 200},
		{"no matching rule", checkBody("t", "", "other=a"), false, false, false, "", 200},
		{"unlimited", checkBody("t", "1000000", "vip=a"), true, true, false, "vip", 200},
		{"shadow admits", checkBody("t", "", "trial=a"), true, false, true, "trial", 200},
		{"shadow would deny, still OK", checkBody("t", "", "trial=a"), true, false, true, "trial", 200},
		{"gcra burst", checkBody("t", "4", "g=a"), true, false, false, "gcra", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, "POST", f.srv.URL+"/v1/check", tt.body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			var cr checkResponse
			decodeStrict(t, r.body, &cr)
			d := cr.Descriptors[0]
			if d.Matched != tt.matched || d.Unlimited != tt.unlimited || d.Shadow != tt.shadow || d.Rule != tt.rule || !d.Allowed {
				t.Errorf("descriptor = %+v", d)
			}
		})
	}
}

func TestCheckBadInput(t *testing.T) {
	f := newFixture(t, Options{MaxBodyBytes: 4096})
	many := func(n int, one string) string {
		return strings.TrimSuffix(strings.Repeat(one+",", n), ",")
	}
	entry := `{"key":"user","value":"a"}`
	tests := []struct {
		name, body, want string
	}{
		{"empty body", "", "empty body"},
		{"not JSON", "{", "unexpected EOF"},
		{"unknown field", `{"domian":"t"}`, `unknown field "domian"`},
		{"unknown nested field", `{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"b","x":1}]}]}`, `unknown field "x"`},
		{"wrong type", `{"domain":"t","descriptors":[],"cost":"x"}`, `field "cost"`},
		{"trailing data", `{"domain":"t","descriptors":[{"entries":[` + entry + `]}]} {}`, "after the JSON object"},
		{"empty domain", `{"domain":"","descriptors":[{"entries":[` + entry + `]}]}`, "domain is empty"},
		{"no descriptors", `{"domain":"t","descriptors":[]}`, "no descriptors"},
		{"empty entries", `{"domain":"t","descriptors":[{"entries":[]}]}`, "needs at least one entry"},
		{"too many descriptors", `{"domain":"t","descriptors":[` + many(65, `{"entries":[`+entry+`]}`) + `]}`, "MaxDescriptors"},
		{"too many entries", `{"domain":"t","descriptors":[{"entries":[` + many(17, entry) + `]}]}`, "MaxEntries"},
		{"long key", `{"domain":"t","descriptors":[{"entries":[{"key":"` + strings.Repeat("k", 257) + `","value":"v"}]}]}`, "MaxKeyValueBytes"},
		{"long value", `{"domain":"t","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("v", 257) + `"}]}]}`, "MaxKeyValueBytes"},
		{"long domain", `{"domain":"` + strings.Repeat("d", 257) + `","descriptors":[{"entries":[` + entry + `]}]}`, "MaxKeyValueBytes"},
		{"huge cost", `{"domain":"t","descriptors":[{"entries":[` + entry + `],"cost":1099511627777}]}`, "MaxQuota"},
		{"huge negative cost", `{"domain":"t","cost":-1099511627777,"descriptors":[{"entries":[` + entry + `]}]}`, "MaxQuota"},
		{"cost overflow", `{"domain":"t","cost":99999999999999999999,"descriptors":[{"entries":[` + entry + `]}]}`, `field "cost"`},
		// What encoding/json decodes with a loss, so that two requests
		// would share a key: refused, naming the field.
		{"invalid UTF-8 value", `{"domain":"t","descriptors":[{"entries":[` + entry + `,{"key":"k","value":"a` + "\xff" + `"}]}]}`, `field "descriptors[0].entries[1].value": invalid UTF-8 (byte 0xff at offset`},
		{"invalid UTF-8 domain", `{"domain":"` + "\xc3(" + `","descriptors":[{"entries":[` + entry + `]}]}`, `field "domain": invalid UTF-8 (byte 0xc3`},
		{"UTF-16 surrogate as UTF-8", `{"domain":"t","descriptors":[{"entries":[{"key":"` + "\xed\xa0\x80" + `","value":"v"}]}]}`, `field "descriptors[0].entries[0].key": invalid UTF-8`},
		{"lone high surrogate", `{"domain":"t","descriptors":[{"entries":[{"key":"k","value":"\ud800"}]}]}`, `field "descriptors[0].entries[0].value": \ud800 at offset 61 is a lone surrogate`},
		{"lone low surrogate", `{"domain":"t","descriptors":[{"entries":[{"key":"k","value":"x\uDC00"}]}]}`, `field "descriptors[0].entries[0].value": \uDC00 at offset`},
		{"high surrogate then no low one", `{"domain":"\ud83d\u0041","descriptors":[{"entries":[` + entry + `]}]}`, `field "domain": \ud83d at offset 11 is a lone surrogate`},
		{"duplicate top-level member", `{"domain":"t","descriptors":[{"entries":[` + entry + `]}],"domain":"u"}`, `field "domain": given twice (at offsets 1 and 71)`},
		{"duplicate member by case", `{"domain":"t","descriptors":[{"entries":[` + entry + `]}],"DOMAIN":"u"}`, `field "DOMAIN": given twice`},
		{"duplicate escaped member", `{"domain":"t","descriptors":[{"entries":[` + entry + `]}],"\u0064omain":"u"}`, `field "domain": given twice`},
		{"duplicate entry key", `{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"b","key":"c"}]}]}`, `field "descriptors[0].entries[0].key": given twice`},
		{"duplicate descriptor member", `{"domain":"t","descriptors":[{"entries":[` + entry + `]},{"cost":1,"entries":[` + entry + `],"cost":2}]}`, `field "descriptors[1].cost": given twice`},
		{"empty key", `{"domain":"t","descriptors":[{"entries":[{"key":"","value":"b"}]}]}`, "descriptor 0 entry 0: key is empty"},
		{"absent key", `{"domain":"t","descriptors":[{"entries":[` + entry + `]},{"entries":[{"value":"b"}]}]}`, "descriptor 1 entry 0: key is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, "POST", f.srv.URL+"/v1/check", tt.body)
			assertProblem(t, r, http.StatusBadRequest, tt.want)
		})
	}
}

// assertProblem checks an RFC 9457 answer.
func assertProblem(t testing.TB, r reply, status int, detail string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p problem
	decodeStrict(t, r.body, &p)
	if p.Status != status || p.Title != http.StatusText(status) || p.Type == "" {
		t.Errorf("problem = %+v", p)
	}
	if !strings.Contains(p.Detail, detail) {
		t.Errorf("detail %q lacks %q", p.Detail, detail)
	}
}

func TestCheckDescriptorCostOverridesRequestCost(t *testing.T) {
	f := newFixture(t, Options{})
	body := `{"domain":"t","cost":0,"descriptors":[{"entries":[{"key":"user","value":"x"}],"cost":2},{"entries":[{"key":"user","value":"y"}]}]}`
	r := do(t, "POST", f.srv.URL+"/v1/check", body)
	var cr checkResponse
	decodeStrict(t, r.body, &cr)
	if r.status != 200 || cr.Descriptors[0].Remaining != 1 || cr.Descriptors[1].Remaining != 3 {
		t.Errorf("status %d, descriptors %+v; want remaining 1 and 3", r.status, cr.Descriptors)
	}
	// A later body without cost must not inherit the pooled request's.
	r = do(t, "POST", f.srv.URL+"/v1/check", checkBody("t", "", "user=y"))
	decodeStrict(t, r.body, &cr)
	if cr.Descriptors[0].Remaining != 2 {
		t.Errorf("remaining %d after a default-cost request, want 2", cr.Descriptors[0].Remaining)
	}
}

func TestEnvoyJSON(t *testing.T) {
	f := newFixture(t, Options{MaxBodyBytes: 4096})
	req := `{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"e"}]}],"hitsAddend":2}`
	r := do(t, "POST", f.srv.URL+"/json", req)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var out struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			Code         string `json:"code"`
			CurrentLimit struct {
				Name            string `json:"name"`
				RequestsPerUnit int    `json:"requestsPerUnit"`
				Unit            string `json:"unit"`
			} `json:"currentLimit"`
			LimitRemaining     int    `json:"limitRemaining"`
			DurationUntilReset string `json:"durationUntilReset"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal([]byte(r.body), &out); err != nil {
		t.Fatal(err)
	}
	if out.OverallCode != "OK" || len(out.Statuses) != 1 || out.Statuses[0].LimitRemaining != 1 ||
		out.Statuses[0].CurrentLimit.RequestsPerUnit != 3 || out.Statuses[0].CurrentLimit.Unit != "MINUTE" {
		t.Errorf("response = %s", r.body)
	}
	if r.header.Get("RateLimit") == "" {
		t.Errorf("no RateLimit header with headers enabled: %v", r.header)
	}
	// snake_case names are proto3 JSON too.
	r = do(t, "POST", f.srv.URL+"/json", `{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"e"}]}],"hits_addend":2}`)
	if r.status != 429 || !strings.Contains(r.body, "OVER_LIMIT") || r.header.Get("Retry-After") == "" {
		t.Errorf("over the limit: status %d, headers %v, body %s", r.status, r.header, r.body)
	}

	bad := []struct{ name, body, want string }{
		{"unknown field", `{"domain":"t","descriptorz":[]}`, "descriptorz"},
		{"not JSON", `{`, "RateLimitRequest"},
		{"empty domain", `{"descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, "domain is empty"},
		{"no descriptors", `{"domain":"t"}`, "no descriptors"},
		{"too many descriptors", `{"domain":"t","descriptors":[` + strings.TrimSuffix(strings.Repeat(`{"entries":[{"key":"a","value":"b"}]},`, 65), ",") + `]}`, "MaxDescriptors"},
		{"too many entries", `{"domain":"t","descriptors":[{"entries":[` + strings.TrimSuffix(strings.Repeat(`{"key":"a","value":"b"},`, 17), ",") + `]}]}`, "MaxEntries"},
		{"long value", `{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"` + strings.Repeat("v", 300) + `"}]}]}`, "MaxKeyValueBytes"},
		{"bad unit override", `{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"b"}],"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}`, "unit"},
		{"invalid UTF-8", `{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"` + "\xff" + `"}]}]}`, "invalid UTF-8"},
		{"lone surrogate", `{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"\udfff"}]}]}`, `field "descriptors[0].entries[0].value": \udfff at offset 61 is a lone surrogate`},
		{"duplicate member", `{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"b","value":"c"}]}]}`, `duplicate field "value"`},
		{"duplicate member in both spellings", `{"domain":"t","hitsAddend":1,"hits_addend":2,"descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, `duplicate field "hits_addend"`},
		{"empty key", `{"domain":"t","descriptors":[{"entries":[{"key":"","value":"b"}]}]}`, "descriptor 0 entry 0: key is empty"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			assertProblem(t, do(t, "POST", f.srv.URL+"/json", tt.body), http.StatusBadRequest, tt.want)
		})
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	f := newFixture(t, Options{})
	if r := do(t, "GET", f.srv.URL+"/healthz", ""); r.status != 200 {
		t.Errorf("healthz %d", r.status)
	}
	if r := do(t, "GET", f.srv.URL+"/readyz", ""); r.status != 503 {
		t.Errorf("readyz before SetReady: %d, want 503", r.status)
	}
	f.api.SetReady(true)
	if r := do(t, "GET", f.srv.URL+"/readyz", ""); r.status != 200 {
		t.Errorf("readyz when ready: %d, want 200", r.status)
	}
	f.api.SetReady(false)
	if r := do(t, "GET", f.srv.URL+"/readyz", ""); r.status != 503 {
		t.Errorf("readyz when draining: %d, want 503", r.status)
	}
	do(t, "POST", f.srv.URL+"/v1/check", checkBody("t", "", "user=m"))
	r := do(t, "GET", f.srv.URL+"/metrics", "")
	if r.status != 200 || !strings.Contains(r.body, `sluice_decisions_total{domain="t",outcome="ok",rule="per_user"} 1`) {
		t.Errorf("metrics %d lack the decision:\n%s", r.status, r.body)
	}
	if r := do(t, "GET", f.srv.URL+"/v1/check", ""); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/check: %d, want 405", r.status)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without a service succeeded")
	}
	f := newFixture(t, Options{})
	if _, err := New(Options{Service: f.svc, MaxBodyBytes: -1}); err == nil {
		t.Error("New with a negative body bound succeeded")
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"plain", `q"u\o`, "tab\tnl\n", "<&>", "é\u2028x", "bad\xffutf8", "\x00"} {
		got := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Errorf("%q → %s: %v", s, got, err)
			continue
		}
		want, _ := json.Marshal(s)
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Errorf("%q round-trips to %q, want %q", s, back, wantBack)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	f := newFixture(b, Options{})
	body := checkBody("t", "0", "user=bench")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(body))
			w := httptest.NewRecorder()
			f.api.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	})
}

// BenchmarkDecodeCheck measures the strict decoding of a /v1/check body
// alone, the part a JSON check adds to every call.
func BenchmarkDecodeCheck(b *testing.B) {
	body := []byte(`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"acme"},{"key":"user","value":"alice"}],"cost":3},{"entries":[{"key":"path","value":"/v1/orders"}]}],"cost":1}`)
	var in checkRequest
	var scan strictScan
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeCheck(body, &in, &scan); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReadyzNoDomain: /readyz stays 200 with no domain loaded, and says so.
func TestReadyzNoDomain(t *testing.T) {
	f := newFixture(t, Options{})
	f.api.SetReady(true)
	if r := do(t, "GET", f.srv.URL+"/readyz", ""); r.status != 200 || r.body != "ready\n" {
		t.Fatalf("with rules: %d %q", r.status, r.body)
	}
	if err := f.svc.SetRules(nil); err != nil {
		t.Fatal(err)
	}
	if r := do(t, "GET", f.srv.URL+"/readyz", ""); r.status != 200 || r.body != NoDomainReady {
		t.Errorf("no domain: %d %q; want 200 %q", r.status, r.body, NoDomainReady)
	}
}

// TestCheckQuotaMode: /v1/check answers a descriptor over its quota as
// OVER_LIMIT with quota_exceeded in an allowed request.
func TestCheckQuotaMode(t *testing.T) {
	f := newFixture(t, Options{})
	if err := f.svc.SetRules(loadSet(t, `domain: q
descriptors:
  - key: backend
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1, name: quota}
`)); err != nil {
		t.Fatal(err)
	}
	do(t, "POST", f.srv.URL+"/v1/check", checkBody("q", "", "backend=a"))
	r := do(t, "POST", f.srv.URL+"/v1/check", checkBody("q", "", "backend=a", "backend=b"))
	var got checkResponse
	decodeStrict(t, r.body, &got)
	if r.status != 200 || !got.Allowed || len(got.Descriptors) != 2 {
		t.Fatalf("%d %s; want 200, allowed", r.status, r.body)
	}
	a, b := got.Descriptors[0], got.Descriptors[1]
	if a.Allowed || a.Code != "OVER_LIMIT" || !a.QuotaExceeded || !a.QuotaMode || b.QuotaExceeded || !b.Allowed || !b.QuotaMode {
		t.Errorf("descriptors %+v; want a over its quota, b within", got.Descriptors)
	}
}
