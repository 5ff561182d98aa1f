package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
)

// announcingHealth answers Check with md in its response header.
type announcingHealth struct {
	*health.Server
	md metadata.MD
}

func (h *announcingHealth) Check(ctx context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := grpc.SetHeader(ctx, h.md); err != nil {
		return nil, err
	}
	return h.Server.Check(ctx, r)
}

// startAnnouncing serves announcingHealth on a loopback TCP port and
// returns a client whose calls go through c.
func startAnnouncing(t *testing.T, md metadata.MD, c *grpclimit.Client) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, &announcingHealth{Server: health.NewServer(), md: md})
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(c.UnaryInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// TestClientBudgets: the unary interceptor learns the budgets a server
// announces in its response metadata (OpenAI's fields, lower-case) and
// paces to them: a requests budget announced spent holds the next call
// for its refill, which outlasts the deadline, so the call fails at once
// with DEADLINE_EXCEEDED and is not sent.
func TestClientBudgets(t *testing.T) {
	b := &httplimit.Budgets{}
	cl := startAnnouncing(t, metadata.Pairs("x-ratelimit-limit-requests", "2", "x-ratelimit-remaining-requests", "0",
		"x-ratelimit-reset-requests", "30s"), &grpclimit.Client{Budgets: b})
	ctx := httplimit.WithEstimate(t.Context(), httplimit.Estimate{Key: "health"})
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err) // nothing known yet: sent at once
	}
	if _, wait, _ := b.TryReserve("health", nil, time.Now()); wait < 20*time.Second {
		t.Fatalf("after the announcement, the next call waits %v, want about 30 s", wait)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_, err := cl.Check(dctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, ratelimit.ErrWouldExceedDeadline) {
		t.Fatalf("a call past its deadline: %v, want DEADLINE_EXCEEDED matching ErrWouldExceedDeadline", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("it failed after %v, want at once", d)
	}
}

// TestClientBudgetsCharge: a call is settled with the charge its response
// metadata announce (x-ms-request-charge) as httplimit.RequestUnits, or
// with what the Usage hook reads; the pace it was reserved in is charged
// accordingly.
func TestClientBudgetsCharge(t *testing.T) {
	for _, tc := range []struct {
		name  string
		usage func(any, metadata.MD) map[string]int64
		debt  bool // the pace is in debt after the call
	}{
		{"charge", nil, true},
		{"usage hook", func(_ any, md metadata.MD) map[string]int64 {
			if len(md.Get("x-ms-request-charge")) == 0 {
				t.Error("the hook saw no metadata")
			}
			return map[string]int64{httplimit.RequestUnits: 1}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &httplimit.Budgets{}
			b.SetPace("db", httplimit.RequestUnits, 10, 10, time.Now()) // 10 RU/s, burst 10
			cl := startAnnouncing(t, metadata.Pairs("x-ms-request-charge", "25.5"), &grpclimit.Client{Budgets: b, Usage: tc.usage})
			ctx := httplimit.WithEstimate(t.Context(), httplimit.Estimate{Key: "db", Cost: map[string]int64{httplimit.RequestUnits: 1}})
			if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			// Charged 26: 16 RU short of 1, 1.7 s at 10 RU/s; charged 1:
			// 9 left.
			_, wait, _ := b.TryReserve("db", map[string]int64{httplimit.RequestUnits: 1}, time.Now())
			if got := wait > time.Second; got != tc.debt {
				t.Errorf("the next call waits %v; want a debt: %v", wait, tc.debt)
			}
		})
	}
}
