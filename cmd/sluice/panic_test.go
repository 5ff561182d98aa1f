package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/recovery"
)

// injectedPanics counts the panics tests of this package inject on
// purpose; TestMain checks that serve recovered no other.
var injectedPanics atomic.Int64

func TestMain(m *testing.M) {
	code := m.Run()
	if got, want := recovery.Total(), injectedPanics.Load(); code == 0 && got != want {
		// Containment must not hide bugs: a panic recovered in a test
		// that did not inject it is one.
		fmt.Fprintf(os.Stderr, "FAIL: serve recovered %d panics during the tests, %d of them injected; the others are bugs (their records are in the failing tests' logs)\n", got, want)
		code = 1
	}
	os.Exit(code)
}

// panicHooks panic in a call that asks for it: an HTTP request with the
// header Sluice-Test-Panic, a gRPC call with the metadata of that name.
func panicHooks() *serveHooks {
	const name = "sluice-test-panic"
	asked := func(ctx context.Context) bool {
		md, _ := metadata.FromIncomingContext(ctx)
		return len(md.Get(name)) > 0
	}
	return &serveHooks{
		http: func(listener string, next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(name) != "" {
					injectedPanics.Add(1)
					panic("injected on " + listener)
				}
				next.ServeHTTP(w, r)
			})
		},
		unary: func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if asked(ctx) {
				injectedPanics.Add(1)
				panic("injected in " + info.FullMethod)
			}
			return handler(ctx, req)
		},
		stream: func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if asked(ss.Context()) {
				injectedPanics.Add(1)
				panic("injected in " + info.FullMethod)
			}
			return handler(srv, ss)
		},
	}
}

// TestPanicsContained injects a panic on every listener of a running
// serve: each caller gets INTERNAL or 500 problem+json, the log one record
// with the stack, sluice_panics_total{listener} counts it, and serve goes
// on answering.
func TestPanicsContained(t *testing.T) {
	cfg := serveConfig{
		rulesDir: rulesDir(t, map[string]string{"st.yaml": testRuleFile}), store: "memory",
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", adminAddr: "127.0.0.1:0", adminToken: "tok",
		maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second, limits: defaultLimits(), hooks: panicHooks(),
	}
	up, h, _ := serveInProcess(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(up["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "st", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "ann"}}}}}
	panicking := metadata.AppendToOutgoingContext(ctx, "sluice-test-panic", "1")

	do := func(addr, method, path string, panic bool) (int, http.Header, string) {
		t.Helper()
		r, _ := http.NewRequestWithContext(ctx, method, "http://"+addr+path, strings.NewReader(`{"domain":"st","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`))
		r.Header.Set("Authorization", "Bearer tok")
		if panic {
			r.Header.Set("Sluice-Test-Panic", "1")
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}

	type call struct {
		listener string
		run      func() error // the injected panic
	}
	calls := []call{
		{"grpc", func() error { _, err := rls.ShouldRateLimit(panicking, req); return err }},
		{"grpc", func() error {
			w, err := healthpb.NewHealthClient(conn).Watch(panicking, &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = w.Recv()
			}
			return err
		}},
		{"http", func() error { return problem500(do(up["http"], "POST", "/v1/check", true)) }},
		{"admin", func() error { return problem500(do(up["admin"], "GET", "/admin/v1/status", true)) }},
		{"admin", func() error { return problem500(do(up["admin"], "GET", "/admin/v1/dashboard/", true)) }},
	}
	want := map[string]int{}
	for _, c := range calls {
		err := c.run()
		if c.listener == "grpc" && status.Code(err) != codes.Internal {
			t.Errorf("gRPC call: %v, want INTERNAL", err)
		} else if c.listener != "grpc" && err != nil {
			t.Error(err)
		}
		want[c.listener]++
		rec := nextRecord(t, h, "panic recovered")
		if rec["listener"] != c.listener || rec["level"] != "ERROR" || !strings.Contains(rec["panic"], "injected") || !strings.Contains(rec["stack"], "panicHooks") {
			t.Errorf("record %v", rec)
		}
	}

	// serve goes on, on every listener, and the counts are exported.
	if resp, err := rls.ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("after the panics, ShouldRateLimit: %v, %v", resp, err)
	}
	if code, _, body := do(up["http"], "POST", "/v1/check", false); code != 200 {
		t.Errorf("after the panics, /v1/check: %d %s", code, body)
	}
	code, _, metrics := do(up["http"], "GET", "/metrics", false)
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for l, n := range want {
		if line := fmt.Sprintf("sluice_panics_total{listener=%q} %d\n", l, n); !strings.Contains(metrics, line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}

// problem500 checks an answer to a call that panicked.
func problem500(code int, h http.Header, body string) error {
	if code != 500 || h.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, `"status":500`) {
		return fmt.Errorf("answer %d %q %s, want 500 problem+json", code, h.Get("Content-Type"), body)
	}
	return nil
}

// nextRecord waits for the next log record with message msg.
func nextRecord(t *testing.T, h recordHandler, msg string) map[string]string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-h.ch:
			if r["msg"] == msg {
				return r
			}
		case <-deadline:
			t.Fatalf("no %q record", msg)
			return nil
		}
	}
}
