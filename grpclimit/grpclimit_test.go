package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

type fakeStore struct{ err error }

func (f fakeStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	return dst, f.err
}

// countingHealth counts the calls that reach the service.
type countingHealth struct {
	*health.Server
	calls atomic.Int64
}

func (h *countingHealth) Check(ctx context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	return h.Server.Check(ctx, r)
}

// start serves the health service behind the server interceptors on an
// in-memory listener and returns a client connection with the client
// interceptors of c.
func start(t *testing.T, cfg grpclimit.Options, c *grpclimit.Client) (healthpb.HealthClient, *countingHealth) {
	t.Helper()
	if cfg.Store == nil {
		st := memstore.New(memstore.Options{JanitorInterval: -1})
		t.Cleanup(func() { st.Close() })
		cfg.Store = st
	}
	s, err := grpclimit.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(s.UnaryInterceptor()), grpc.StreamInterceptor(s.StreamInterceptor()))
	h := &countingHealth{Server: health.NewServer()}
	healthpb.RegisterHealthServer(srv, h)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	opts := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
	if c != nil {
		opts = append(opts, grpc.WithUnaryInterceptor(c.UnaryInterceptor()), grpc.WithStreamInterceptor(c.StreamInterceptor()))
	}
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn), h
}

func TestServerRefusesWithRetryInfo(t *testing.T) {
	cl, _ := start(t, grpclimit.Options{Policies: []grpclimit.Policy{{
		Rule: ratelimit.Rule{Name: "per_tenant", Quota: 1, Period: time.Hour},
		Keys: []grpclimit.Key{grpclimit.ByMetadata("x-tenant"), grpclimit.ByMethod()},
	}}}, nil)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "acme")
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("second call: %v, want RESOURCE_EXHAUSTED", err)
	}
	d, ok := grpclimit.RetryDelay(err)
	if !ok || d < 59*time.Minute || d > time.Hour {
		t.Errorf("RetryInfo delay %v, %v; want about 1h", d, ok)
	}
	var qf *errdetails.QuotaFailure
	for _, det := range st.Details() {
		if q, ok := det.(*errdetails.QuotaFailure); ok {
			qf = q
		}
	}
	if qf == nil || len(qf.Violations) != 1 || qf.Violations[0].Subject != "per_tenant: metadata x-tenant|method" {
		t.Errorf("QuotaFailure = %v", qf)
	}
	// Another tenant, and a call without the key, are not limited.
	other := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "other")
	if _, err := cl.Check(other, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("other tenant: %v", err)
	}
	if _, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("no tenant: %v", err)
	}
}

// TestStream: streams are decided when they start, and the client's stream
// interceptor turns their refusal into a shared pause.
func TestStream(t *testing.T) {
	c := &grpclimit.Client{}
	cl, _ := start(t, grpclimit.Options{Policies: []grpclimit.Policy{{
		Rule: ratelimit.Rule{Name: "all", Quota: 1, Period: time.Hour},
	}}}, c)
	if _, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	ws, err := cl.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = ws.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{}); !errors.Is(err, ratelimit.ErrWouldExceedDeadline) {
		t.Errorf("stream during the pause: %v, want ErrWouldExceedDeadline", err)
	}
}

func TestServerUnavailable(t *testing.T) {
	cl, _ := start(t, grpclimit.Options{
		Store:    fakeStore{err: errors.New("down")},
		Policies: []grpclimit.Policy{{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}, Keys: []grpclimit.Key{grpclimit.ByPeer()}}},
	}, nil)
	_, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want UNAVAILABLE", err)
	}
	if d, ok := grpclimit.RetryDelay(err); !ok || d != time.Second {
		t.Errorf("RetryInfo %v, %v; want 1s", d, ok)
	}
}

func TestServerShadow(t *testing.T) {
	var refused atomic.Int64
	cl, _ := start(t, grpclimit.Options{
		Shadow:   true,
		Policies: []grpclimit.Policy{{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Hour}}},
		OnDecision: func(_ context.Context, _ string, _ []ratelimit.Decision, _ error, r bool) {
			if r {
				refused.Add(1)
			}
		},
	}, nil)
	for range 3 {
		if _, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("shadow mode refused: %v", err)
		}
	}
	if refused.Load() != 2 {
		t.Errorf("%d refusals reported, want 2", refused.Load())
	}
}

// refuseOnce refuses its n-th decision (from 1) with a fixed delay and
// admits every other.
type refuseOnce struct {
	n     int64
	delay time.Duration
	calls atomic.Int64
}

func (r *refuseOnce) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	refuse := r.calls.Add(1) == r.n
	for _, it := range items {
		d := ratelimit.Decision{Allowed: true, Capacity: it.Rule.Capacity(), Rule: it.Rule.Name}
		if refuse {
			d.Allowed, d.Reason, d.RetryAfter = false, ratelimit.ReasonLimited, r.delay
		}
		dst = append(dst, d)
	}
	return dst, nil
}

// TestClientHonoursRetryInfo: the client waits the delay and retries.
func TestClientHonoursRetryInfo(t *testing.T) {
	c := &grpclimit.Client{}
	cl, h := start(t, grpclimit.Options{
		Store:    &refuseOnce{n: 2, delay: 50 * time.Millisecond},
		Policies: []grpclimit.Policy{{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}}},
	}, c)
	if _, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("second call, with a retry: %v", err)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Errorf("retried after %v, want the 50ms RetryInfo asked for", el)
	}
	if made, _ := c.Retries(); made != 1 {
		t.Errorf("%d retries, want 1", made)
	}
	if n := h.calls.Load(); n != 2 {
		t.Errorf("service saw %d calls, want 2", n)
	}
}

// TestClientDeadline: a delay past the deadline fails at once.
func TestClientDeadline(t *testing.T) {
	c := &grpclimit.Client{}
	cl, _ := start(t, grpclimit.Options{Policies: []grpclimit.Policy{{
		Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Hour},
	}}}, c)
	cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
	if !errors.Is(err, ratelimit.ErrWouldExceedDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrWouldExceedDeadline and DeadlineExceeded", err)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("code %v, want DeadlineExceeded", status.Code(err))
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("failed after %v, want at once", el)
	}
	// The pause holds for later calls too, which also fail at once.
	ctx2, cancel2 := context.WithTimeout(t.Context(), time.Second)
	defer cancel2()
	if _, err := cl.Check(ctx2, &healthpb.HealthCheckRequest{}); !errors.Is(err, ratelimit.ErrWouldExceedDeadline) {
		t.Errorf("call during the pause: %v", err)
	}
}

// TestClientBudget: every call is refused; retries stay within the ratio.
func TestClientBudget(t *testing.T) {
	c := &grpclimit.Client{MinRetries: -1, RetryRatio: 0.2, MaxRetries: 3, MaxPause: time.Millisecond}
	cl, h := start(t, grpclimit.Options{Policies: []grpclimit.Policy{{
		Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Hour},
	}}}, c)
	const calls = 20
	for range calls {
		cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
	}
	made, refused := c.Retries()
	if made > calls/5 || made < calls/5-1 {
		t.Errorf("%d retries for %d calls at ratio 0.2, want about %d", made, calls, calls/5)
	}
	if refused == 0 {
		t.Error("the budget refused nothing")
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("the service saw %d calls, want 1", n)
	}
}

func TestNewServerRejects(t *testing.T) {
	st := memstore.New(memstore.Options{JanitorInterval: -1})
	t.Cleanup(func() { st.Close() })
	good := grpclimit.Policy{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}}
	for _, cfg := range []grpclimit.Options{
		{Policies: []grpclimit.Policy{good}},
		{Store: st},
		{Store: st, Policies: []grpclimit.Policy{good, good}},
		{Store: st, Policies: []grpclimit.Policy{{Rule: ratelimit.Rule{Name: "b"}}}},
		{Store: st, Policies: []grpclimit.Policy{{Rule: good.Rule, Keys: []grpclimit.Key{{Scope: "x"}}}}},
	} {
		if _, err := grpclimit.NewServer(cfg); err == nil {
			t.Errorf("NewServer(%+v) accepted", cfg)
		}
	}
}

// TestByPeer: the peer's IP address, unmapped and without its port, or
// "unknown" when the peer has none.
func TestByPeer(t *testing.T) {
	k := grpclimit.ByPeer()
	for _, tt := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 5}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 5}, "2001:db8::1"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 5, Zone: "eth0"}, "fe80::1%eth0"},
		{&net.TCPAddr{Port: 5}, "unknown"},
		{&net.UDPAddr{IP: net.ParseIP("192.0.2.7"), Port: 9}, "192.0.2.7"},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "unknown"},
		{nil, "unknown"},
	} {
		ctx := t.Context()
		if tt.addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: tt.addr})
		}
		if b, ok := k.Append(nil, ctx, "/m"); !ok || string(b) != tt.want {
			t.Errorf("ByPeer(%v) = %q, %v; want %q", tt.addr, b, ok, tt.want)
		}
	}
}

// TestLongKeysAreHashed: a key longer than the bound, as a huge metadata
// value makes, is stored as its rule name and a SHA-256, whatever its
// length, and distinct values stay distinct.
func TestLongKeysAreHashed(t *testing.T) {
	rec := new(storetest.Recorder)
	cl, _ := start(t, grpclimit.Options{
		Store: rec,
		Policies: []grpclimit.Policy{{
			Rule: ratelimit.Rule{Name: "k", Quota: 100, Period: time.Second},
			Keys: []grpclimit.Key{grpclimit.ByMetadata("x-api-key")},
		}},
	}, nil)
	for _, v := range []string{"short", strings.Repeat("a", 5000), strings.Repeat("a", 4999) + "b"} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", v)
		if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call with a key of %d bytes: %v", len(v), err)
		}
	}
	keys := rec.Take() // sorted: "k|#…" before "k|short"
	if len(keys) != 3 || keys[2] != "k|short" {
		t.Fatalf("keys = %q", keys)
	}
	for _, k := range keys[:2] {
		if len(k) != len("k|#")+64 || !strings.HasPrefix(k, "k|#") {
			t.Errorf("long key stored as %q… (%d bytes), want k|# and a hex SHA-256", k[:min(len(k), 80)], len(k))
		}
	}
	if keys[0] == keys[1] {
		t.Error("two long keys collided")
	}
}
