package grpclimit_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/priority"
)

// recorder is an adaptive.Controller that keeps the limit and records each
// window's Sample: how the tests see Done, Dropped and Ignore.
type recorder struct {
	mu      sync.Mutex
	samples []adaptive.Sample
}

func (c *recorder) Update(s adaptive.Sample) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples = append(c.samples, s)
	return s.Limit
}

// totals returns the completions and drops of every window closed.
func (c *recorder) totals() (completed, dropped int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.samples {
		completed += s.Completed
		dropped += s.Dropped
	}
	return completed, dropped
}

func fixedGuard(t *testing.T, n int) (*adaptive.Guard, *recorder) {
	t.Helper()
	rec := &recorder{}
	g, err := adaptive.NewGuard(adaptive.GuardOptions{
		Concurrency: adaptive.ConcurrencyOptions{Max: n, Min: n, Initial: n, Controller: rec, Window: time.Second, MinSamples: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g, rec
}

// behaving is a health service whose answer depends on the service name
// asked about, and which records the priority and the sluice-priority
// metadata of each call.
type behaving struct {
	healthpb.UnimplementedHealthServer
	prio     chan priority.Priority
	metadata chan string
	entered  chan struct{}
	returned chan struct{} // the interceptors have returned
	// next, if set, is called with the call's context (a front service).
	next healthpb.HealthClient
}

func newBehaving() *behaving {
	return &behaving{prio: make(chan priority.Priority, 16), metadata: make(chan string, 16), entered: make(chan struct{}, 16), returned: make(chan struct{}, 64)}
}

func (b *behaving) act(ctx context.Context, name string) error {
	b.prio <- priority.FromContext(ctx)
	b.metadata <- strings.Join(metadata.ValueFromIncomingContext(ctx, priority.Metadata), ",")
	if b.next != nil {
		_, err := b.next.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	switch name {
	case "unavailable":
		return status.Error(codes.Unavailable, "below is down")
	case "exhausted":
		return status.Error(codes.ResourceExhausted, "below is over quota")
	case "deadline":
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	case "late":
		<-ctx.Done()
		return nil // answers anyway, after its deadline
	case "wait":
		b.entered <- struct{}{}
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	return nil
}

func (b *behaving) Check(ctx context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := b.act(ctx, r.GetService()); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (b *behaving) Watch(r *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if err := ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	return b.act(ss.Context(), r.GetService())
}

// serveProtected serves svc on a loopback TCP port behind the Protect
// interceptors and returns a client with grpclimit's client interceptors.
func serveProtected(t *testing.T, g *adaptive.Guard, opt grpclimit.ProtectOptions, svc *behaving) healthpb.HealthClient {
	t.Helper()
	return dial(t, listenProtected(t, g, opt, svc), &grpclimit.Client{MaxRetries: -1})
}

// serveProtectedPlain is serveProtected with a client without interceptors,
// which does not pause after a refusal.
func serveProtectedPlain(t *testing.T, g *adaptive.Guard, opt grpclimit.ProtectOptions, svc *behaving) healthpb.HealthClient {
	t.Helper()
	return dial(t, listenProtected(t, g, opt, svc), nil)
}

// listenProtected serves svc behind the Protect interceptors and returns
// its address.
func listenProtected(t *testing.T, g *adaptive.Guard, opt grpclimit.ProtectOptions, svc *behaving) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The outer interceptors give a call the test-deadline metadata asks
	// for, on the server's side (a caller's own deadline reaches the
	// server as a deadline or as a cancellation, whichever comes first),
	// and say when the Protect interceptors have returned.
	deadline := func(ctx context.Context) (context.Context, context.CancelFunc) {
		if vs := metadata.ValueFromIncomingContext(ctx, "test-deadline"); len(vs) > 0 {
			d, _ := time.ParseDuration(vs[0])
			return context.WithTimeout(ctx, d)
		}
		return context.WithCancel(ctx)
	}
	outerUnary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		defer func() { svc.returned <- struct{}{} }()
		ctx, cancel := deadline(ctx)
		defer cancel()
		return handler(ctx, req)
	}
	outerStream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		defer func() { svc.returned <- struct{}{} }()
		ctx, cancel := deadline(ss.Context())
		defer cancel()
		return handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(outerUnary, grpclimit.ProtectUnary(g, opt)), grpc.ChainStreamInterceptor(outerStream, grpclimit.ProtectStream(g, opt)))
	healthpb.RegisterHealthServer(srv, svc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// dial connects to addr through c's client interceptors, or none if c is
// nil.
func dial(t *testing.T, addr string, c *grpclimit.Client) healthpb.HealthClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if c != nil {
		opts = append(opts, grpc.WithUnaryInterceptor(c.UnaryInterceptor()), grpc.WithStreamInterceptor(c.StreamInterceptor()))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// withMetadata returns ctx with the sluice-priority metadata v.
func withMetadata(ctx context.Context, v string) context.Context {
	if v == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, priority.Metadata, v)
}

// TestProtectPriorityFromMetadata: the metadata's priority, lowered to
// MaxPriority, or the hook's, reaches the handler's context and is the one
// the Guard counts a refusal under; Skip leaves a method unguarded.
func TestProtectPriorityFromMetadata(t *testing.T) {
	cases := []struct {
		name string
		opt  grpclimit.ProtectOptions
		md   string
		want priority.Priority
	}{
		{"none", grpclimit.ProtectOptions{}, "", priority.Normal},
		{"sheddable", grpclimit.ProtectOptions{}, "Sheddable", priority.Sheddable},
		{"invalid", grpclimit.ProtectOptions{}, "9", priority.Normal},
		{"critical untrusted", grpclimit.ProtectOptions{}, "critical", priority.Normal},
		{"critical trusted", grpclimit.ProtectOptions{MaxPriority: priority.Critical}, "critical", priority.Critical},
		{"hook", grpclimit.ProtectOptions{Priority: func(context.Context, string) priority.Priority { return priority.High }}, "low", priority.High},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, _ := fixedGuard(t, 1)
			svc := newBehaving()
			client := serveProtectedPlain(t, g, c.opt, svc)
			ctx := withMetadata(t.Context(), c.md)
			if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			if got := <-svc.prio; got != c.want {
				t.Errorf("the handler's priority = %v, want %v", got, c.want)
			}
			held, rf := g.TryAcquireAt(time.Now(), priority.Critical)
			if rf.Refused() {
				t.Fatal(rf)
			}
			defer held.Ignore()
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("with the limit held: %v, want UNAVAILABLE", err)
			}
			shed := g.Stats().Shed
			if shed[c.want-priority.Sheddable] != 1 {
				t.Errorf("Stats.Shed = %v: want the refusal counted under %v", shed, c.want)
			}
		})
	}

	t.Run("skip", func(t *testing.T) {
		g, _ := fixedGuard(t, 1)
		client := serveProtectedPlain(t, g, grpclimit.ProtectOptions{Skip: func(m string) bool { return m == "/grpc.health.v1.Health/Check" }}, newBehaving())
		held, _ := g.TryAcquireAt(time.Now(), priority.Critical)
		defer held.Ignore()
		if _, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("a skipped method, with the limit held: %v", err)
		}
		w, err := client.Watch(t.Context(), &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("a guarded stream, with the limit held: %v, want UNAVAILABLE", err)
		}
	})
}

// TestProtectRefusalRetryInfo: a refused call fails UNAVAILABLE with a
// message saying the server is overloaded and a RetryInfo whose delay is
// computed from the Guard's state: it grows as refusals pile up.
func TestProtectRefusalRetryInfo(t *testing.T) {
	g, _ := fixedGuard(t, 2)
	// The Guard's clock an hour ahead of the wall clock: one completion
	// in the first second (a throughput of 1/s), then both slots held.
	t0 := time.Now().Add(time.Hour)
	pm, _ := g.TryAcquireAt(t0, priority.Normal)
	pm.DoneAt(t0.Add(500 * time.Millisecond))
	a, _ := g.TryAcquireAt(t0.Add(time.Second), priority.Critical)
	b, _ := g.TryAcquireAt(t0.Add(time.Second), priority.Critical)
	defer a.Ignore()
	defer b.Ignore()
	svc := newBehaving()
	client := serveProtectedPlain(t, g, grpclimit.ProtectOptions{}, svc)
	for i := range 3 {
		_, err := client.Check(withMetadata(t.Context(), "low"), &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "overloaded") || !strings.Contains(st.Message(), "low-priority") {
			t.Fatalf("refusal: %v; want UNAVAILABLE saying the server is overloaded", err)
		}
		var delay time.Duration
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay = ri.GetRetryDelay().AsDuration()
			}
		}
		if want := time.Duration(i+2) * time.Second; delay != want {
			t.Errorf("refusal %d: RetryInfo delay %v, want %v", i, delay, want)
		}
		if d, ok := grpclimit.RetryDelay(err); !ok || d != delay {
			t.Errorf("RetryDelay = %v, %v", d, ok)
		}
	}
	select {
	case <-svc.prio:
		t.Error("the handler was called for a refused call")
	default:
	}
}

// TestProtectOutcomes: a call's permit ends Done when it succeeds, Dropped
// when it fails UNAVAILABLE, RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED or its
// deadline passed, Ignore when its caller cancelled; streams end Ignore
// unless they failed as overloaded calls do.
func TestProtectOutcomes(t *testing.T) {
	cases := []struct {
		name               string
		service            string
		timeout            bool
		clientDeadline     bool
		cancel             bool
		completed, dropped int
		streamDropped      int
	}{
		{"ok", "ok", false, false, false, 1, 0, 0},
		{"unavailable", "unavailable", false, false, false, 0, 1, 1},
		{"exhausted", "exhausted", false, false, false, 0, 1, 1},
		{"deadline", "deadline", true, false, false, 0, 1, 1},
		{"answered after the deadline", "late", true, false, false, 0, 1, 1},
		// The caller's own deadline: the server may see it as a
		// cancellation (RST_STREAM) before its own deadline timer fires;
		// it is a drop all the same.
		{"the caller's deadline", "wait", false, true, false, 0, 1, 1},
		{"cancelled", "wait", false, false, true, 0, 0, 0},
	}
	for _, c := range cases {
		for _, stream := range []bool{false, true} {
			name := c.name + "/unary"
			if stream {
				name = c.name + "/stream"
			}
			t.Run(name, func(t *testing.T) {
				g, rec := fixedGuard(t, 4)
				svc := newBehaving()
				client := serveProtected(t, g, grpclimit.ProtectOptions{}, svc)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if c.timeout {
					ctx = metadata.AppendToOutgoingContext(ctx, "test-deadline", "20ms")
				}
				if c.clientDeadline {
					// Long enough for the call to reach the handler on a
					// fresh connection on a loaded machine (at 20 ms it
					// once did not, and the test waited for a handler
					// that never ran); the handler waits it out.
					var cancelDeadline context.CancelFunc
					ctx, cancelDeadline = context.WithTimeout(ctx, 500*time.Millisecond)
					defer cancelDeadline()
				}
				if c.cancel {
					go func() { <-svc.entered; cancel() }()
				}
				req := &healthpb.HealthCheckRequest{Service: c.service}
				if stream {
					if w, err := client.Watch(ctx, req); err == nil {
						for err == nil {
							_, err = w.Recv()
						}
					}
				} else {
					_, _ = client.Check(ctx, req)
				}
				select {
				case <-svc.returned:
				case <-time.After(30 * time.Second): // a bound, not a synchronisation: fail rather than hang
					t.Fatal("the handler never returned: the call did not reach it")
				}
				if n := g.Stats().InFlight; n != 0 {
					t.Fatalf("%d permits held after the call", n)
				}
				pm, _ := g.TryAcquireAt(time.Now().Add(time.Minute), priority.Normal)
				pm.Ignore()
				completed, dropped := rec.totals()
				wantC, wantD := c.completed, c.dropped
				if stream {
					wantC, wantD = 0, c.streamDropped
				}
				if completed != wantC || dropped != wantD {
					t.Errorf("windows: %d completed, %d dropped; want %d, %d", completed, dropped, wantC, wantD)
				}
			})
		}
	}
}

// TestClientPropagatesPriority: the client interceptors send the
// context's priority as sluice-priority metadata, unless the call sets its
// own, and nothing for Normal; through ProtectUnary, a front service's
// priority reaches the service it calls.
func TestClientPropagatesPriority(t *testing.T) {
	bigGuard := func() *adaptive.Guard { g, _ := fixedGuard(t, 8); return g }
	next := newBehaving()
	nextClient := serveProtected(t, bigGuard(), grpclimit.ProtectOptions{}, next)
	call := func(ctx context.Context) string {
		t.Helper()
		if _, err := nextClient.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		<-next.prio
		return <-next.metadata
	}
	ctx := t.Context()
	if md := call(priority.NewContext(ctx, priority.Low)); md != "low" {
		t.Errorf("context Low: metadata %q, want low", md)
	}
	if md := call(withMetadata(priority.NewContext(ctx, priority.Low), "sheddable")); md != "sheddable" {
		t.Errorf("the call's own metadata: %q, want sheddable", md)
	}
	if md := call(ctx); md != "" {
		t.Errorf("no priority: %q, want none", md)
	}
	if md := call(priority.NewContext(ctx, priority.Normal)); md != "" {
		t.Errorf("Normal: %q, want none", md)
	}

	front := newBehaving()
	front.next = nextClient
	frontClient := serveProtected(t, bigGuard(), grpclimit.ProtectOptions{}, front)
	for _, p := range []string{"sheddable", "low"} {
		if _, err := frontClient.Check(withMetadata(ctx, p), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		<-front.prio
		<-front.metadata
		<-next.prio
		if md := <-next.metadata; md != p {
			t.Errorf("through front: next saw %q, want %q", md, p)
		}
	}

	// Streams too.
	w, err := nextClient.Watch(priority.NewContext(ctx, priority.Sheddable), &healthpb.HealthCheckRequest{})
	if err == nil {
		for err == nil {
			_, err = w.Recv()
		}
	}
	<-next.prio
	if md := <-next.metadata; md != "sheddable" {
		t.Errorf("stream: metadata %q, want sheddable", md)
	}
}

// TestProtectShedsLowestFirst: with 8 of 10 slots held, Sheddable and Low
// calls are refused (their shares of the limit are full), Normal and above
// pass.
func TestProtectShedsLowestFirst(t *testing.T) {
	g, _ := fixedGuard(t, 10)
	client := serveProtectedPlain(t, g, grpclimit.ProtectOptions{MaxPriority: priority.Critical}, newBehaving())
	now := time.Now()
	for range 8 {
		pm, rf := g.TryAcquireAt(now, priority.Critical)
		if rf.Refused() {
			t.Fatal(rf)
		}
		defer pm.Ignore()
	}
	for _, p := range []priority.Priority{priority.Sheddable, priority.Low, priority.Normal, priority.High, priority.Critical} {
		want := codes.OK
		if p < priority.Normal {
			want = codes.Unavailable
		}
		_, err := client.Check(withMetadata(t.Context(), p.String()), &healthpb.HealthCheckRequest{})
		if status.Code(err) != want {
			t.Errorf("%v: %v, want %v", p, err, want)
		}
	}
}
