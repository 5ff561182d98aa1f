package coord

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/coord/sluicev1"
)

// TestServiceDesc checks the hand-written service descriptor against the
// service of the compiled .proto: the same name, the same methods, none
// streaming, each decoding its method's input message.
func TestServiceDesc(t *testing.T) {
	fd := sluicev1.File_sluice_v1_semaphore_proto
	if got := fd.Path(); got != serviceDesc.Metadata {
		t.Errorf("Metadata %q, want the .proto's path %q", serviceDesc.Metadata, got)
	}
	sd := fd.Services().ByName("SemaphoreService")
	if sd == nil || string(sd.FullName()) != serviceDesc.ServiceName {
		t.Fatalf("the .proto has no service %s", serviceDesc.ServiceName)
	}
	if len(serviceDesc.Streams) != 0 {
		t.Errorf("%d streams; the .proto has only unary methods", len(serviceDesc.Streams))
	}
	if n := sd.Methods().Len(); n != len(serviceDesc.Methods) {
		t.Errorf("%d methods, the .proto has %d", len(serviceDesc.Methods), n)
	}
	s, _ := newService(t, Limits{})
	for _, m := range serviceDesc.Methods {
		md := sd.Methods().ByName(protoreflect.Name(m.MethodName))
		if md == nil {
			t.Errorf("method %s is not in the .proto", m.MethodName)
			continue
		}
		if md.IsStreamingClient() || md.IsStreamingServer() {
			t.Errorf("method %s streams in the .proto", m.MethodName)
		}
		var decoded protoreflect.FullName
		dec := func(v any) error {
			decoded = v.(proto.Message).ProtoReflect().Descriptor().FullName()
			return status.Error(codes.Canceled, "stop")
		}
		m.Handler(s, context.Background(), dec, nil)
		if decoded != md.Input().FullName() {
			t.Errorf("method %s decodes a %s, want %s", m.MethodName, decoded, md.Input().FullName())
		}
	}
}

// dial serves s's semaphores on an in-memory listener and returns a
// client of it.
func dial(t *testing.T, s *Service, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	return serve(t, s.Register, opts...)
}

// dialWith serves s's semaphores and leases on an in-memory listener and
// returns a client of it.
func dialWith(t *testing.T, s *Service, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	return serve(t, func(g grpc.ServiceRegistrar) { s.Register(g); s.RegisterLeases(g) }, opts...)
}

// serve serves what register registers on an in-memory listener and
// returns a client of it.
func serve(t *testing.T, register func(grpc.ServiceRegistrar), opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	g := grpc.NewServer(opts...)
	register(g)
	go g.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// invoke calls method of the semaphore service.
func invoke(ctx context.Context, cc *grpc.ClientConn, method string, in, out proto.Message) error {
	return cc.Invoke(ctx, "/"+ServiceName+"/"+method, in, out)
}

func TestGRPC(t *testing.T) {
	s, err := New(Options{Store: concurrency.NewMemoryStore(), Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, s)
	bg := context.Background()
	ctx := metadata.AppendToOutgoingContext(bg, "authorization", "Bearer tok")
	acq := &sluicev1.AcquireRequest{Name: "db", Limit: 1, Ttl: durationpb.New(time.Second)}
	var g sluicev1.AcquireResponse
	if err := invoke(bg, cc, "Acquire", acq, &g); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Acquire without the token: %v; want UNAUTHENTICATED", err)
	}
	wrong := metadata.AppendToOutgoingContext(bg, "authorization", "Bearer nope")
	if err := invoke(wrong, cc, "Acquire", acq, &g); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Acquire with a wrong token: %v; want UNAUTHENTICATED", err)
	}
	if err := invoke(ctx, cc, "Acquire", acq, &g); err != nil {
		t.Fatal(err)
	}
	if g.GetFence() != 1 || checkID("permit_id", g.GetPermitId()) != nil || g.GetValidFor().AsDuration() <= 0 {
		t.Errorf("grant %v; want fence 1, an id and a validity", &g)
	}
	if err := invoke(ctx, cc, "Acquire", acq, &g); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second Acquire of limit 1: %v; want RESOURCE_EXHAUSTED", err)
	}
	var rn sluicev1.RenewResponse
	if err := invoke(ctx, cc, "Renew", &sluicev1.RenewRequest{Name: "db", PermitId: g.GetPermitId()}, &rn); err != nil || rn.GetValidFor().AsDuration() <= time.Second {
		t.Errorf("Renew = %v, %v; want the default TTL's validity", &rn, err)
	}
	for _, tc := range []struct {
		method string
		in     proto.Message
		want   codes.Code
	}{
		{"Acquire", &sluicev1.AcquireRequest{Name: "db", Limit: 0}, codes.InvalidArgument},
		{"Acquire", &sluicev1.AcquireRequest{Name: "db", Limit: 1, Ttl: &durationpb.Duration{Seconds: 1, Nanos: -1}}, codes.InvalidArgument},
		{"Renew", &sluicev1.RenewRequest{Name: "db", PermitId: "AAAAAAAAAAAAAAAAAAAAAAAAAA"}, codes.NotFound},
		{"Release", &sluicev1.ReleaseRequest{Name: "db", PermitId: "x"}, codes.InvalidArgument},
		{"Holders", &sluicev1.HoldersRequest{}, codes.InvalidArgument},
	} {
		if err := invoke(ctx, cc, tc.method, tc.in, new(sluicev1.ReleaseResponse)); status.Code(err) != tc.want {
			t.Errorf("%s(%v): %v; want %v", tc.method, tc.in, err, tc.want)
		}
	}
	var hs sluicev1.HoldersResponse
	if err := invoke(bg, cc, "Holders", &sluicev1.HoldersRequest{Name: "db"}, &hs); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Holders without the token: %v; want UNAUTHENTICATED", err)
	}
	if err := invoke(ctx, cc, "Holders", &sluicev1.HoldersRequest{Name: "db"}, &hs); err != nil {
		t.Fatal(err)
	}
	if hs.GetName() != "db" || len(hs.GetHolders()) != 1 || hs.GetWaiting() != 0 {
		t.Fatalf("Holders = %v; want db's one holder, nobody waiting", &hs)
	}
	if h := hs.GetHolders()[0]; h.GetFence() != g.GetFence() || h.GetWeight() != 1 || h.GetHeldFor() == nil || h.GetHeldFor().AsDuration() < 0 ||
		h.GetExpiresIn().AsDuration() <= 0 || h.GetExpiresIn().AsDuration() > DefaultTTL {
		t.Errorf("holder = %v; want fence %d, weight 1, held for >= 0, expiring within the default TTL (renewed)", h, g.GetFence())
	}
	if err := invoke(ctx, cc, "Release", &sluicev1.ReleaseRequest{Name: "db", PermitId: g.GetPermitId()}, new(sluicev1.ReleaseResponse)); err != nil {
		t.Fatal(err)
	}
	if err := invoke(ctx, cc, "Release", &sluicev1.ReleaseRequest{Name: "db", PermitId: g.GetPermitId()}, new(sluicev1.ReleaseResponse)); status.Code(err) != codes.NotFound {
		t.Errorf("second Release: %v; want NOT_FOUND", err)
	}
	if err := invoke(ctx, cc, "Holders", &sluicev1.HoldersRequest{Name: "db"}, &hs); err != nil || len(hs.GetHolders()) != 0 {
		t.Errorf("Holders after the release = %v, %v; want none", &hs, err)
	}
}

// TestGRPCDeadline checks that a waiting acquire whose call's deadline
// passes is answered DEADLINE_EXCEEDED and leaves nothing held.
func TestGRPCDeadline(t *testing.T) {
	s, m := newService(t, Limits{})
	returned := make(chan error, 2) // the server's answers, once its handler returns
	cc := dial(t, s, grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if _, ok := req.(*sluicev1.AcquireRequest); ok {
			returned <- err
		}
		return resp, err
	}))
	bg := context.Background()
	var first sluicev1.AcquireResponse
	if err := invoke(bg, cc, "Acquire", &sluicev1.AcquireRequest{Name: "db", Limit: 1}, &first); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	err := invoke(ctx, cc, "Acquire", &sluicev1.AcquireRequest{Name: "db", Limit: 1, Wait: durationpb.New(5 * time.Second)}, new(sluicev1.AcquireResponse))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("acquire past its deadline: %v; want DEADLINE_EXCEEDED", err)
	}
	<-returned // the first acquire's
	// The client's deadline cancels the call, or the server's own passes.
	if err := <-returned; status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Canceled {
		t.Errorf("the server answered the acquire past its deadline %v; want DEADLINE_EXCEEDED or CANCELLED", err)
	}
	if err := invoke(bg, cc, "Release", &sluicev1.ReleaseRequest{Name: "db", PermitId: first.GetPermitId()}, new(sluicev1.ReleaseResponse)); err != nil {
		t.Fatal(err)
	}
	if n := m.HoldersAt(time.Now(), "db"); n != 0 {
		t.Errorf("holders after the release = %d, want 0: the caller that gave up holds one", n)
	}
}
