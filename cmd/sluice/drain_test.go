package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestEnqueueDrain: sluice enqueue puts a file's lines into the embedded
// server's stream; sluice drain then POSTs each once, paced, and stops
// when the stream is empty.
func TestEnqueueDrain(t *testing.T) {
	enqueueDrain(t, 600, "-rate", "300/s")
}

// TestDrainLeased: the same on capacity leased on a real Redis.
func TestDrainLeased(t *testing.T) {
	srv := redistest.Standalone(t)
	enqueueDrain(t, 600, "-lease-redis", srv.Addr(), "-capacity", "300/s", "-partitions", "10")
}

// enqueueDrain enqueues n records and drains them with the pacing flags,
// which must allow 300/s.
func enqueueDrain(t *testing.T, n int, pacing ...string) {
	dir := t.TempDir()
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, "{\"record\":%d}\n", i)
	}
	file := filepath.Join(dir, "records.jsonl")
	if err := os.WriteFile(file, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	for range 2 { // the second time adds nothing: same keys
		out.Reset()
		if err := run(ctx, []string{"enqueue", "-data", data, "-file", file}, &out, &errb); err != nil {
			t.Fatalf("enqueue: %v\n%s", err, errb.String())
		}
	}
	if want := fmt.Sprintf("enqueued %d records on records.records\n", n); out.String() != want {
		t.Errorf("enqueue said %q, want %q", out.String(), want)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	requests := 0
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		requests++
		seen[r.Header.Get(drain.IdempotencyKeyHeader)]++
	}))
	defer hs.Close()
	errb.Reset()
	begin := time.Now()
	if err := run(ctx, append([]string{"drain", "-data", data, "-url", hs.URL}, pacing...), &out, &errb); err != nil {
		t.Fatalf("drain: %v\n%s", err, errb.String())
	}
	took := time.Since(begin)
	t.Logf("drained in %v:\n%s", took, errb.String())
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n || requests != n {
		t.Errorf("%d keys in %d requests, want %d once each", len(seen), requests, n)
	}
	for i := 1; i <= n; i++ {
		if seen[fmt.Sprint("rec-", i)] != 1 {
			t.Fatalf("record rec-%d sent %d times", i, seen[fmt.Sprint("rec-", i)])
		}
	}
	if took < 1900*time.Millisecond {
		t.Errorf("drained %d at 300/s in %v: faster than the rate", n, took)
	}
	if !strings.Contains(errb.String(), "drain: progress") || !strings.Contains(errb.String(), fmt.Sprint("done=", n)) {
		t.Errorf("no progress logged:\n%s", errb.String())
	}
}

func TestProgressLine(t *testing.T) {
	got := progressLine(drain.Stats{Done: 250, Backlog: 750, Rate: 100, ETA: 7500 * time.Millisecond, BacklogAt: time.Now()}, 20)
	if want := "[#####...............]  25% 250/1000 100/s ETA 8s  429s 0  failed 0  dead 0 "; got != want {
		t.Errorf("progressLine = %q, want %q", got, want)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]float64{"2000/s": 2000, "500": 500, "60/m": 1, "7200/h": 2, "0.5/s": 0.5} {
		if got, err := parseRate(in); err != nil || got != want {
			t.Errorf("parseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0/s", "-1/s", "x/s", "1/d", "NaN", "Inf/s", "1e300/s", strings.Repeat("1", 40)} {
		if _, err := parseRate(in); err == nil {
			t.Errorf("parseRate(%q) succeeded", in)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"2000/s", "1/m", "5/h", "3", "", "1e9/s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseRate(s)
		if err != nil {
			return
		}
		if len(s) > 32 || !(r > 0 && r <= maxRate) {
			t.Fatalf("parseRate(%q) = %v accepted", s, r)
		}
	})
}
