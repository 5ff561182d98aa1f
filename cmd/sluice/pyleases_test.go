package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/longtest"
)

// TestPythonLeases is lease's published example (lease/published_test.go)
// through sluice serve, with both processors in Python
// (testdata/lease_worker.py, clients/python/sluice.py's LeaseHolder and
// Pacer), scaled to half the records to keep it short: A (5,000 records)
// and B (2,500) share 500 requests a second, leased as 20 × 25, against
// a loopback server that counts in fixed one-second windows and answers
// 429 beyond 500 in a window. The ideal times, as the published example
// computes them: B at half the capacity, 2,500 / 250 = 10 s; A, every
// record at the whole capacity, 7,500 / 500 = 15 s. Each must finish
// within 5 % of its ideal, with no 429 and every record accepted once.
// It holds bounds in real time (about 20 s): a long test (make test-long).
// The pacing itself costs 2 % (245/s of 250: A 15.31 s, B 10.20 s at
// best). The Pacer now catches up after a stall (a token bucket of burst
// 2 lost it: A 15.64 to 15.74 s, B 10.52 to 10.71 s in 3 runs of 3 beside
// four CPU loops and TestSemaphoreScenario), and kept the times in every
// run since, loaded or not (A at most 15.60 s, B 10.41 s). It stays a
// long test for the 429s: in 5 of 20 loaded runs one of the stub's
// windows received 5 to 55 requests too many (where tabulated, right
// after a window short by as many, in A and B alike: the stub counted
// late what was sent in time, its process or the machine stalled at a
// window's edge), which no pacing within the 5 % absorbs.
// bench/RESULTS.md, section 16, has the figures.
func TestPythonLeases(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	python := needPython(t)
	const (
		capacity   = 500
		partitions = 20
		ttl        = 2 * time.Second
		service    = "py-published"
	)
	records := map[byte]int{'A': 5000, 'B': 2500}
	idealA := time.Duration(float64(records['A']+records['B']) / capacity * float64(time.Second))
	idealB := time.Duration(float64(records['B']) / (capacity / 2) * float64(time.Second))
	bin := buildSluice(t)
	tokenFile := filepath.Join(t.TempDir(), "coord-token")
	if err := os.WriteFile(tokenFile, []byte(coordToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, bin, []string{"SLUICE_COORD_TOKEN="}, "serve", "--rules", rulesDir(t, map[string]string{"st.yaml": testRuleFile}),
		"--log-format", "json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--coord-token-file", tokenFile)
	base := "http://" + p.next(t, "sluice serving", 10*time.Second).str("http")

	// The throttled downstream: fixed one-second windows from origin.
	type event struct {
		at     time.Duration // since the start signal
		win    int64         // the stub's window
		client byte
		record int
		ok     bool
	}
	var (
		mu     sync.Mutex
		events []event
		start  time.Time
		window int64 = -1
		count  int
	)
	origin := time.Now()
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rec, err := strconv.Atoi(q.Get("r"))
		c := q.Get("c")
		if err != nil || len(c) != 1 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		now := time.Now()
		el := now.Sub(origin)
		mu.Lock()
		if n := int64(el / time.Second); n != window {
			window, count = n, 0
		}
		ok := count < capacity
		if ok {
			count++
		}
		if !start.IsZero() {
			events = append(events, event{at: now.Sub(start), win: window, client: c[0], record: rec, ok: ok})
		}
		mu.Unlock()
		if !ok {
			left := time.Second - el%time.Second
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(left.Seconds()))))
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer stub.Close()

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // no worker outlives the test
	defer cancel()
	worker, err := filepath.Abs(filepath.Join("testdata", "lease_worker.py"))
	if err != nil {
		t.Fatal(err)
	}
	ttlArg := strconv.FormatFloat(ttl.Seconds(), 'f', -1, 64)
	var ws []*pyProcess
	for _, name := range []string{"A", "B"} {
		w := startPython(t, ctx, python, worker, base, coordToken, service, name, strconv.Itoa(records[name[0]]), stub.URL,
			strconv.Itoa(capacity), strconv.Itoa(partitions), ttlArg)
		w.line(t, "READY", 0, 20*time.Second)
		ws = append(ws, w)
	}
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	for _, w := range ws {
		if _, err := fmt.Fprintln(w.stdin, "GO"); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range ws {
		name := string("AB"[i])
		got := w.line(t, "DONE "+name, 1, 40*time.Second)
		if got[0] != "0" {
			t.Errorf("%s met %s 429s, want none", name, got[0])
		}
		w.wait(t, 10*time.Second)
	}

	mu.Lock()
	defer mu.Unlock()
	var a, b time.Duration
	refused, total := 0, len(events)
	accepted := map[byte]map[int]int{'A': {}, 'B': {}}
	// Per window of the stub's (which decides the 429s), from the first
	// one that received anything.
	perSec := [][3]int{}
	for _, e := range events {
		s := int(e.win - events[0].win)
		for len(perSec) <= s {
			perSec = append(perSec, [3]int{})
		}
		switch {
		case !e.ok:
			refused++
			perSec[s][2]++
		case e.client == 'A':
			a = max(a, e.at)
			accepted['A'][e.record]++
			perSec[s][0]++
		default:
			b = max(b, e.at)
			accepted['B'][e.record]++
			perSec[s][1]++
		}
	}
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "window    A      B   429s\n")
	for s, x := range perSec {
		fmt.Fprintf(&tbl, "%4d %6d %6d %6d\n", s, x[0], x[1], x[2])
	}
	t.Logf("A %.3f s (ideal %v), B %.3f s (ideal %v); throttled %d of %d\n%s", a.Seconds(), idealA, b.Seconds(), idealB, refused, total, tbl.String())
	if a < idealA || a > idealA+idealA/20 {
		t.Errorf("A finished at %v, want within 5%% of %v", a, idealA)
	}
	if b < idealB || b > idealB+idealB/20 {
		t.Errorf("B finished at %v, want within 5%% of %v", b, idealB)
	}
	if refused != 0 {
		t.Errorf("the stub refused %d of %d requests (429), want none", refused, total)
	}
	for c, n := range records {
		lost, dupes := 0, 0
		for i := range n {
			switch k := accepted[c][i]; {
			case k == 0:
				lost++
			case k > 1:
				dupes += k - 1
			}
		}
		if lost != 0 || dupes != 0 {
			t.Errorf("%c: %d records lost, %d accepted twice, want none", c, lost, dupes)
		}
	}
}

// TestPythonLeaseClient runs clients/python/sluice.py's lease client
// against the built binary's serve (--coord-max-holders 1): each error
// answer raises its exception (BadRequest, Unauthorized, TooManyHolders,
// HolderLost for a made-up id and after leave), a holder is granted the
// whole capacity, and its Pacer starts empty, lets nothing through past
// the grant's validity, gives no tokens when the burst grows, and lets
// nobody through once closed (testdata/lease_worker.py's check).
func TestPythonLeaseClient(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	python := needPython(t)
	bin := buildSluice(t)
	tokenFile := filepath.Join(t.TempDir(), "coord-token")
	if err := os.WriteFile(tokenFile, []byte(coordToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, bin, []string{"SLUICE_COORD_TOKEN="}, "serve", "--rules", rulesDir(t, map[string]string{"st.yaml": testRuleFile}),
		"--log-format", "json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--coord-token-file", tokenFile,
		"--coord-max-holders", "1")
	base := "http://" + p.next(t, "sluice serving", 10*time.Second).str("http")
	worker, err := filepath.Abs(filepath.Join("testdata", "lease_worker.py"))
	if err != nil {
		t.Fatal(err)
	}
	w := startPython(t, t.Context(), python, worker, "check", base, coordToken)
	w.line(t, "check ok", 0, 30*time.Second)
	w.wait(t, 10*time.Second)
}
