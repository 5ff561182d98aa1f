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
	"testing"
	"time"
)

// TestServeMemoryFloodAndEmptyRules runs serve on a small memory store
// (--memory-max-keys 64) with --rules-refuse-empty. A flood of fresh keys
// leaves a spent key denied and is counted in the store's metrics, with
// the store within its bound; deleting every rule file is refused, so the
// spent key stays denied.
func TestServeMemoryFloodAndEmptyRules(t *testing.T) {
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	h := recordHandler{ch: make(chan map[string]string, 1024)}
	cfg := serveConfig{
		rulesDir: dir, store: "memory", memoryMaxKeys: 64, rulesRefuseEmpty: true,
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second,
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(h)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
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
	up := waitLog("serving", func(r map[string]string) bool { return r["msg"] == "sluice serving" })
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
