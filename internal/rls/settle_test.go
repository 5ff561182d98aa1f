package rls

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// settleClient serves a domain of 100 tokens a minute per user (gcra)
// over a real gRPC connection on loopback, on a memory store that keeps
// reservations, and returns a client.
func settleClient(t *testing.T) rlsv3.RateLimitServiceClient {
	t.Helper()
	dom, err := rules.Parse("s.yaml", []byte("domain: ai\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: gcra, name: tokens}\n"))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New(memstore.Options{JanitorInterval: -1})
	t.Cleanup(func() { mem.Close() })
	svc, err := service.New(service.Options{Store: mem, Ledger: mem, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOption(nil))
	New(svc, Options{}).Register(g)
	conn := serveLoopback(t, g)
	return rlsv3.NewRateLimitServiceClient(conn)
}

// envoyCall is a call of Envoy's filter: one descriptor of entries kv
// with hits_addend n.
func envoyCall(n uint64, kv ...string) *rlsv3.RateLimitRequest {
	d := &ratelimitv3.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(n)}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
}

// TestEnvoyStreamDone: Envoy's request-time call with sluice_reserve
// reserves an estimate of 60; its stream-done call with sluice_settle and
// hits_addend 20 settles it (40 back); the settlement is OK even when it
// finds nothing to settle; the reserved entries never reach the rules (a
// plain call on the same user shares the key).
func TestEnvoyStreamDone(t *testing.T) {
	c := settleClient(t)
	ctx := t.Context()
	remaining := func() uint32 {
		t.Helper()
		out, err := c.ShouldRateLimit(ctx, envoyCall(0, "user", "alice"))
		if err != nil {
			t.Fatal(err)
		}
		return out.Statuses[0].LimitRemaining
	}
	out, err := c.ShouldRateLimit(ctx, envoyCall(60, "sluice_reserve", "req-1", "user", "alice"))
	if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request-time call: %v, %v", out, err)
	}
	if r := remaining(); r != 40 {
		t.Fatalf("remaining %d after an estimate of 60, want 40", r)
	}
	// The reserved entry may sit anywhere: the descriptor is its other
	// entries.
	done := envoyCall(20, "user", "alice", "sluice_settle", "req-1")
	out, err = c.ShouldRateLimit(ctx, done)
	if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK || len(out.Statuses) != 1 || out.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("stream-done call: %v, %v", out, err)
	}
	if r := remaining(); r != 80 {
		t.Fatalf("remaining %d after settling 60 at 20, want 80", r)
	}
	// A repeat, an unknown request and an actual above the estimate.
	if out, err = c.ShouldRateLimit(ctx, done); err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("repeat: %v, %v", out, err)
	}
	if out, err = c.ShouldRateLimit(ctx, envoyCall(5, "sluice_settle", "nobody", "user", "alice")); err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("unknown: %v, %v", out, err)
	}
	if r := remaining(); r != 80 {
		t.Fatalf("remaining %d after a repeat and an unknown settlement, want 80", r)
	}
	if _, err = c.ShouldRateLimit(ctx, envoyCall(10, "sluice_reserve", "req-2", "user", "alice")); err != nil {
		t.Fatal(err)
	}
	if _, err = c.ShouldRateLimit(ctx, envoyCall(150, "sluice_settle", "req-2", "user", "alice")); err != nil {
		t.Fatal(err)
	}
	// 70 left, 140 more charged: a debt of 70; the next check is denied.
	out, err = c.ShouldRateLimit(ctx, envoyCall(1, "user", "alice"))
	if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after a charge past the limit: %v, %v", out, err)
	}
	// A request id used twice is a plain check, never an error that
	// Envoy's failure_mode_deny would decide.
	if out, err = c.ShouldRateLimit(ctx, envoyCall(0, "sluice_reserve", "req-2", "user", "bob")); err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request id used twice: %v, %v", out, err)
	}
	for _, bad := range []*rlsv3.RateLimitRequest{
		envoyCall(1, "sluice_reserve", "r"),
		envoyCall(1, "sluice_settle", "", "user", "a"),
		envoyCall(1, "sluice_settle", "r", "user", "a", "sluice_reserve", "r"),
		{Domain: "ai", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			envoyCall(1, "sluice_reserve", "a", "user", "x").Descriptors[0],
			envoyCall(1, "sluice_reserve", "b", "user", "y").Descriptors[0]}},
	} {
		if _, err := c.ShouldRateLimit(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v; want INVALID_ARGUMENT", bad, err)
		}
	}
}
