package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServeMemoryFloodAndEmptyRules runs serve on a small memory store
// (--memory-max-keys 64) with --rules-refuse-empty. A flood of fresh keys
// leaves a spent key denied and is counted in the store's metrics, with
// the store within its bound; deleting every rule file is refused, so the
// spent key stays denied.
func TestServeMemoryFloodAndEmptyRules(t *testing.T) {
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	up, h, done := serveInProcess(t, serveConfig{
		rulesDir: dir, store: "memory", memoryMaxKeys: 64, rulesRefuseEmpty: true,
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second,
	})
	// waitLog waits for a log record for which match is true.
	waitLog := func(what string, match func(map[string]string) bool) map[string]string {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case r := <-h.ch:
				if match(r) {
					return r
				}
			case err := <-done:
				t.Fatalf("serve returned: %v", err)
			case <-timeout:
				t.Fatalf("no log of %s", what)
			}
		}
	}
	base := "http://" + up["http"]
	check := func(user string) int {
		t.Helper()
		resp, err := http.Post(base+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"st","descriptors":[{"entries":[{"key":"user","value":"`+user+`"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 3 {
		if code := check("spent"); code != http.StatusOK {
			t.Fatalf("request %d of 3 for a 3/minute key: %d", i+1, code)
		}
	}
	if code := check("spent"); code != http.StatusTooManyRequests {
		t.Fatalf("fourth request for a 3/minute key: %d, want 429", code)
	}
	for i := range 1000 {
		if code := check(fmt.Sprint("flood", i)); code != http.StatusOK {
			t.Fatalf("flood key %d: %d", i, code)
		}
	}
	if code := check("spent"); code != http.StatusTooManyRequests {
		t.Errorf("the spent key after a flood of 1,000 fresh keys: %d, want 429", code)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metric := func(name string) int {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(metrics)
		if m == nil {
			t.Fatalf("no %s in /metrics", name)
		}
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		return int(v)
	}
	if keys := metric("sluice_store_keys"); keys > 64 || keys == 0 {
		t.Errorf("sluice_store_keys = %d, want 1..64", keys)
	}
	if n := metric("sluice_store_evictions_total") + metric("sluice_store_unkept_total"); n < 1000-64 {
		t.Errorf("evicted + unkept keys = %d after 1,001 keys in a store of 64, want at least %d", n, 1000-64)
	}
	if n := metric("sluice_store_evicted_exhausted_total"); n != 0 {
		t.Errorf("sluice_store_evicted_exhausted_total = %d, want 0", n)
	}

	if err := os.Remove(filepath.Join(dir, "st.yaml")); err != nil {
		t.Fatal(err)
	}
	r := waitLog("the refused reload", func(r map[string]string) bool {
		return r["msg"] == "rules reload failed; keeping the last good rules"
	})
	if !strings.Contains(r["err"], "no domain") {
		t.Errorf("reload error: %q, want one saying no domain is left", r["err"])
	}
	if code := check("spent"); code != http.StatusTooManyRequests {
		t.Errorf("the spent key after its rule file was deleted under --rules-refuse-empty: %d, want 429", code)
	}
}

// TestServeRedisFreeze is the measurement through serve: a
// fail_closed 100/hour key, Redis frozen (SIGSTOP) while 20 decisions are
// in flight. Each is answered 503 within --redis-timeout and a margin;
// once Redis resumes (SIGCONT) and reads them, they take nothing, so the
// key admits exactly the 100 it had.
func TestServeRedisFreeze(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := rulesDir(t, map[string]string{"st.yaml": `domain: st
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100, name: hourly, failure_mode: fail_closed}
`})
	const timeout = 100 * time.Millisecond
	up, _, _ := serveInProcess(t, serveConfig{
		rulesDir: dir, store: "redis", redisAddrs: []string{srv.Addr()}, redisPrefix: "fz:", redisTimeout: timeout,
		redisPipelines: 4, grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second,
	})
	// Keep-alive connections, opened before the freeze, as a proxy's are.
	web := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 10 * time.Second}
	check := func(user string) int {
		resp, err := web.Post("http://"+up["http"]+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"st","descriptors":[{"entries":[{"key":"user","value":"`+user+`"}]}]}`))
		if err != nil {
			t.Error(err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	const inFlight = 20
	// The warm-up opens the connections the frozen calls will use, on
	// another key: a call of it that a loaded machine makes outlast the
	// timeout (503, whether Redis then applies it or not) is asked again,
	// and leaves the frozen key's count as it was.
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			for range 10 {
				if check("warm-up") == http.StatusOK {
					return
				}
			}
			t.Error("warm-up: no decision in 10 calls")
		})
	}
	wg.Wait()
	const left = 100

	srv.Freeze()
	codes := make(chan int, inFlight)
	took := make(chan time.Duration, inFlight)
	for range inFlight {
		wg.Go(func() {
			start := time.Now()
			codes <- check("frozen")
			took <- time.Since(start)
		})
	}
	wg.Wait()
	srv.Thaw()
	close(codes)
	close(took)
	for c := range codes {
		if c != http.StatusServiceUnavailable {
			t.Errorf("a decision while Redis was frozen: %d, want 503 (fail_closed)", c)
		}
	}
	worst := time.Duration(0)
	for d := range took {
		worst = max(worst, d)
	}
	// The breaker may answer later calls at once; none waits much past the
	// timeout (the margin is for a loaded machine running -race).
	if worst > timeout+time.Second {
		t.Errorf("slowest decision while Redis was frozen: %v, want within %v and a margin", worst, timeout)
	}
	t.Logf("slowest of %d decisions with Redis frozen: %v", inFlight, worst)

	// Redis is back; once the breaker lets calls through, the key admits
	// exactly what it had left, then 429. A 503 meanwhile is not a
	// decision (the breaker still open, or serve's overload guard shedding
	// after the slow calls): asked again, within a bound.
	deadline := time.Now().Add(10 * time.Second)
	admitted, unavailable := 0, 0
	for {
		c := check("frozen")
		switch c {
		case http.StatusOK:
			admitted++
		case http.StatusServiceUnavailable:
			unavailable++
			if time.Now().After(deadline) {
				t.Fatalf("Redis resumed %v ago, but decisions are still 503 (%d admitted)", 10*time.Second, admitted)
			}
			time.Sleep(20 * time.Millisecond) // polling the breaker's probe, bounded by the deadline
			continue
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("after the freeze: %d", c)
		}
		if c == http.StatusTooManyRequests || admitted > 100 {
			break
		}
	}
	t.Logf("after the thaw: %d admitted, then 429; %d answers 503 meanwhile", admitted, unavailable)
	if admitted != left {
		t.Errorf("after the freeze the key admitted %d, want the %d it had left: %d denied calls consumed capacity", admitted, left, left-admitted)
	}
}

// serveInProcess runs serve with cfg until the test ends, and returns
// where it listens, its log records from then on, and its result (read
// only by the cleanup, which checks it).
func serveInProcess(t *testing.T, cfg serveConfig) (map[string]string, recordHandler, <-chan error) {
	t.Helper()
	h := recordHandler{ch: make(chan map[string]string, 1024)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(h)) }()
	up := waitServing(t, h, done)
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second): // or a test read its result
			t.Error("serve did not stop")
		}
	})
	return up, h, done
}
