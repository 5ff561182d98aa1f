package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServeAdminAuthFailures: serve gives the admin API the budget of
// --admin-auth-failures and --admin-auth-failure-period (the right token
// still passes), and /metrics counts the failures and the refusals.
func TestServeAdminAuthFailures(t *testing.T) {
	p := startInProcess(t, func(l *limitsConfig) {
		l.adminAuthFailures, l.adminAuthFailurePeriod = 2, time.Hour
	})
	admin := func(auth string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+p.up["admin"]+"/admin/v1/rules", nil)
		req.Header.Set("Authorization", auth)
		resp, err := p.web.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if r := admin("bearer tok"); r.StatusCode != 200 {
		t.Fatalf("lower-case scheme: %d", r.StatusCode)
	}
	for range 2 {
		if r := admin("Bearer guess"); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a guess: %d, want 401", r.StatusCode)
		}
	}
	r := admin("Bearer guess")
	if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") != "3600" {
		t.Fatalf("after 2 failures: %d, Retry-After %q; want 429 and 3600", r.StatusCode, r.Header.Get("Retry-After"))
	}
	if r := admin("Bearer tok"); r.StatusCode != 200 {
		t.Fatalf("the right token after the budget is spent: %d, want 200", r.StatusCode)
	}

	resp, err := p.web.Get("http://" + p.up["http"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"\nsluice_admin_auth_failures_total 2\n", "\nsluice_admin_auth_refused_total 1\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
}
