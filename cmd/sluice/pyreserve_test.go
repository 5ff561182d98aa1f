package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// pyPaceRules: the downstream's limit, 50/s with a burst of 10, less 2
// units of burst as headroom for the lateness of a send made when told (a
// round trip, a sleep's jitter): a send made later than its instant moves
// the downstream's bucket as if it were on time and the next early, so a
// pacing rule equal to the downstream's, burst included, leaves no room
// for it (its first burst is sent at the very edge); a window limit,
// which cannot be reserved; and an hourly window of tokens, which the
// workers check with settle and settle.
const pyPaceRules = `domain: py
descriptors:
  - key: job
    rate_limit: {period: 1s, requests_per_unit: 50, burst: 8, name: job}
  - key: win
    rate_limit: {unit: second, requests_per_unit: 5, name: win}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 100, cost_unit: tokens, name: tokens}
`

// TestPythonPacing runs the built binary's serve and two Python
// processes that pace themselves into one rule of 50/s through
// clients/python/sluice.py (RateLimits.pace, POST /v1/reserve), each
// then sending to a stub that enforces the downstream's limit (the rate
// of the rule, its burst 2 more): the stub refuses nothing, and the two
// together send at the rule's rate, within 5 %.
func TestPythonPacing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	python := needPython(t)
	bin := buildSluice(t)
	p := startSluice(t, bin, nil, "serve", "--rules", rulesDir(t, map[string]string{"py.yaml": pyPaceRules}), "--log-format", "json",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	up := p.next(t, "sluice serving", 10*time.Second)

	rule := &ratelimit.Rule{Name: "job", Quota: 50, Period: time.Second, Burst: 10} // the downstream's
	const pacedBurst = 8                                                            // the rule's in pyPaceRules
	var (
		mu      sync.Mutex
		state   ratelimit.State
		arrived []time.Time
		refused int
	)
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		now := time.Now()
		d := rule.Decide(&state, now, 1)
		arrived = append(arrived, now)
		if !d.Allowed {
			refused++
		}
		mu.Unlock()
		if !d.Allowed {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer stub.Close()

	const each = 80
	worker := filepath.Join("testdata", "reserve_worker.py")
	var procs []*pyProcess
	for range 2 {
		procs = append(procs, startPython(t, t.Context(), python, worker, "http://"+up.str("http"), stub.URL, "80"))
	}
	for _, w := range procs {
		if f := w.line(t, "done", 1, 30*time.Second); f[0] != "0" {
			t.Errorf("a worker saw %s refusals from the stub", f[0])
		}
		w.wait(t, 10*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	if refused != 0 || len(arrived) != 2*each {
		t.Fatalf("the stub refused %d of %d sends (want 0 of %d)", refused, len(arrived), 2*each)
	}
	// The burst goes at once; the rest at the rule's rate.
	span := arrived[len(arrived)-1].Sub(arrived[0])
	rate := float64(len(arrived)-pacedBurst) / span.Seconds()
	if rate < 50*0.95 || rate > 50*1.05 {
		t.Errorf("%d sends over %v: %.2f/s beyond the burst; want 50/s within 5%%", len(arrived), span, rate)
	}
	t.Logf("%d sends over %v: %.2f/s beyond the burst of %d, none refused", len(arrived), span.Round(time.Millisecond), rate, pacedBurst)
}
