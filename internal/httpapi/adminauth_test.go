package httpapi

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/storetest"
)

// authFixture is an Admin called in process, so that each request can
// come from any address, on a clock the test moves.
type authFixture struct {
	admin *Admin
	clock *storetest.Clock
	reg   *prometheus.Registry
	logs  *bytes.Buffer
}

func newAuthFixture(t *testing.T, failures int, period time.Duration) *authFixture {
	t.Helper()
	f := newFixture(t, Options{})
	af := &authFixture{clock: storetest.NewClock(time.Unix(1_900_000_000, 0)), reg: prometheus.NewRegistry(), logs: new(bytes.Buffer)}
	var err error
	af.admin, err = NewAdmin(AdminOptions{
		Token: testToken, Service: f.svc, Store: f.mem,
		AuthFailures: failures, AuthFailurePeriod: period,
		Registerer: af.reg, Now: af.clock.Now,
		Logger: slog.New(slog.NewTextHandler(af.logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return af
}

// get sends GET /admin/v1/rules from remote with the Authorization header
// auth ("" for none).
func (af *authFixture) get(remote, auth string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "/admin/v1/rules", nil)
	req.RemoteAddr = remote
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	af.admin.ServeHTTP(w, req)
	return w
}

// counts reads the two counters from the registry, as /metrics would.
func (af *authFixture) counts(t *testing.T) (failures, refused float64) {
	t.Helper()
	mfs, err := af.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) != 1 {
			t.Fatalf("%s has %d series", mf.GetName(), len(mf.GetMetric()))
		}
		got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
	}
	if len(got) != 2 {
		t.Fatalf("registered: %v", got)
	}
	return got["sluice_admin_auth_failures_total"], got["sluice_admin_auth_refused_total"]
}

// TestAdminAuthBruteForce: an address that keeps guessing is refused with
// 429 and a Retry-After once its burst of failures is spent; the right
// token is accepted all the while, from that address too, and costs
// nothing; another address is not affected; the budget comes back at the
// configured rate.
func TestAdminAuthBruteForce(t *testing.T) {
	af := newAuthFixture(t, 5, 10*time.Second)
	const attacker, other = "192.0.2.1:4000", "198.51.100.7:5000"

	// Successes do not consume the failure budget.
	for range 20 {
		if w := af.get(attacker, "Bearer "+testToken); w.Code != 200 {
			t.Fatalf("right token: %d %s", w.Code, w.Body)
		}
	}
	for i := range 5 {
		if w := af.get(attacker, "Bearer guess"+strconv.Itoa(i)); w.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, w.Code)
		}
	}
	for _, auth := range []string{"Bearer guess", "", "Bearer " + testToken + "x"} {
		w := af.get("192.0.2.1:4001", auth) // another port of the same address
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("after the burst, %q: %d %s, want 429", auth, w.Code, w.Body)
		}
		if ra := w.Header().Get("Retry-After"); ra != "10" {
			t.Errorf("Retry-After %q, want 10", ra)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" || !strings.Contains(w.Body.String(), "failed authentications") {
			t.Errorf("429: %s %s", ct, w.Body)
		}
	}
	// The right token is never refused because of the address's failures
	// (the issue: a stale dashboard tab locked its operator out).
	for i := range 10 {
		if w := af.get("192.0.2.1:4002", "Bearer "+testToken); w.Code != 200 {
			t.Fatalf("right token %d of 10 from the guessing address: %d %s, want 200", i+1, w.Code, w.Body)
		}
	}
	if f, r := af.counts(t); f != 5 || r != 3 {
		t.Errorf("failures %v refused %v, want 5 and 3", f, r)
	}

	// Another address still has its budget.
	if w := af.get(other, "Bearer wrong"); w.Code != http.StatusUnauthorized {
		t.Errorf("other address, wrong token: %d, want 401", w.Code)
	}
	if w := af.get(other, "Bearer "+testToken); w.Code != 200 {
		t.Errorf("other address, right token: %d, want 200", w.Code)
	}

	// One failure comes back per period: one more guess, then 429 again.
	af.clock.Advance(9 * time.Second)
	if w := af.get(attacker, "Bearer guess"); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Errorf("9 s later: %d Retry-After %q, want 429 and 1", w.Code, w.Header().Get("Retry-After"))
	}
	af.clock.Advance(time.Second)
	if w := af.get(attacker, "Bearer guess"); w.Code != http.StatusUnauthorized {
		t.Errorf("10 s later, a guess: %d, want 401", w.Code)
	}
	if w := af.get(attacker, "Bearer guess"); w.Code != http.StatusTooManyRequests {
		t.Errorf("and the next: %d, want 429", w.Code)
	}
	if w := af.get(attacker, "Bearer "+testToken); w.Code != 200 {
		t.Errorf("and the right token: %d, want 200", w.Code)
	}
	if f, r := af.counts(t); f != 7 || r != 5 {
		t.Errorf("failures %v refused %v, want 7 and 5", f, r)
	}
}

// TestAdminAuthClientKey: the ports of an address share its budget, IPv6
// addresses share that of their /64, and other /64s have their own.
func TestAdminAuthClientKey(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.1:80":                       "192.0.2.1",
		"[::ffff:192.0.2.1]:80":              "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:443":         "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:1":           "2001:db8:1:2::/64",
		"[fe80::1%eth0]:80":                  "fe80::/64",
		"2001:db8::1":                        "2001:db8::/64",
		"pipe":                               "non-ip",
		"":                                   "non-ip",
		"[2001:db8:1:3:3:4:5:6]:443":         "2001:db8:1:3::/64",
		"[2001:db8:1:2:3:4:5:6%x]:443<junk>": "non-ip",
	} {
		if got := clientKey(remote); got != want {
			t.Errorf("clientKey(%q) = %q, want %q", remote, got, want)
		}
	}

	af := newAuthFixture(t, 2, time.Minute)
	for _, remote := range []string{"[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff::9]:2"} {
		af.get(remote, "Bearer wrong")
	}
	if w := af.get("[2001:db8:1:2:abcd::1]:3", "Bearer wrong"); w.Code != http.StatusTooManyRequests {
		t.Errorf("a third address of the same /64: %d, want 429", w.Code)
	}
	if w := af.get("[2001:db8:1:3::1]:3", "Bearer wrong"); w.Code != http.StatusUnauthorized {
		t.Errorf("the next /64: %d, want 401", w.Code)
	}
}

// TestAdminAuthBearerScheme: the scheme name is case-insensitive and may
// be followed by several spaces (RFC 9110); anything else is refused.
func TestAdminAuthBearerScheme(t *testing.T) {
	af := newAuthFixture(t, 100, time.Second)
	for _, auth := range []string{"Bearer " + testToken, "bearer " + testToken, "BEARER " + testToken, "bEaReR  " + testToken} {
		if w := af.get("192.0.2.1:1", auth); w.Code != 200 {
			t.Errorf("%q: %d, want 200", auth, w.Code)
		}
	}
	for _, auth := range []string{"Bearer", "Bearer" + testToken, "Basic " + testToken, "Bearers " + testToken, "Bearer\t" + testToken, "Bearer " + strings.ToUpper(testToken), testToken} {
		if w := af.get("192.0.2.1:1", auth); w.Code != http.StatusUnauthorized {
			t.Errorf("%q: %d, want 401", auth, w.Code)
		}
	}
}

// TestAdminAuthLogsBounded: a flood of failures from many addresses logs
// at most authLogBurst lines at once, then one per period counting what it
// held back; no line carries the token presented.
func TestAdminAuthLogsBounded(t *testing.T) {
	af := newAuthFixture(t, 3, 10*time.Second)
	const secret = "Bearer guess-do-not-log-me"
	for i := range 1000 {
		af.get("10.0."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250)+":1", secret)
	}
	lines := strings.Split(strings.TrimSpace(af.logs.String()), "\n")
	if len(lines) != authLogBurst {
		t.Fatalf("1000 failures logged %d lines, want %d:\n%s", len(lines), authLogBurst, af.logs)
	}
	if !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "outcome=wrong_token") || !strings.Contains(lines[0], "remote=10.0.0.0:1") {
		t.Errorf("first line: %s", lines[0])
	}
	af.clock.Advance(10 * time.Second)
	af.get("10.9.9.9:1", "")
	lines = strings.Split(strings.TrimSpace(af.logs.String()), "\n")
	if len(lines) != authLogBurst+1 || !strings.Contains(lines[authLogBurst], "suppressed=990") || !strings.Contains(lines[authLogBurst], "outcome=no_bearer_token") {
		t.Errorf("the line a period later: %q", lines[len(lines)-1])
	}
	if strings.Contains(af.logs.String(), "do-not-log-me") {
		t.Errorf("the token was logged:\n%s", af.logs)
	}
	if f, _ := af.counts(t); f != 1001 {
		t.Errorf("failures %v, want 1001", f)
	}
}

// TestAdminAuthOptions: a budget that does not make a valid rule is
// refused, and two Admins cannot register their metrics on one registry.
func TestAdminAuthOptions(t *testing.T) {
	f := newFixture(t, Options{})
	if _, err := NewAdmin(AdminOptions{Token: testToken, Service: f.svc, Store: f.mem, AuthFailurePeriod: 200 * 365 * 24 * time.Hour}); err == nil {
		t.Error("a failure period of 200 years was accepted")
	}
	reg := prometheus.NewRegistry()
	if _, err := NewAdmin(AdminOptions{Token: testToken, Service: f.svc, Store: f.mem, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewAdmin(AdminOptions{Token: testToken, Service: f.svc, Store: f.mem, Registerer: reg}); err == nil {
		t.Error("a second Admin registered its metrics on the same registry")
	}
}
