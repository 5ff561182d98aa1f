package coord

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/lease"
)

// TestLeaseServiceDesc checks the hand-written descriptor of
// sluice.v1.LeaseService against the compiled .proto: the same name and
// methods, Watch alone streaming (from the server), each decoding its
// method's input message.
func TestLeaseServiceDesc(t *testing.T) {
	fd := sluicev1.File_sluice_v1_lease_proto
	if got := fd.Path(); got != leaseServiceDesc.Metadata {
		t.Errorf("Metadata %q, want the .proto's path %q", leaseServiceDesc.Metadata, got)
	}
	sd := fd.Services().ByName("LeaseService")
	if sd == nil || string(sd.FullName()) != leaseServiceDesc.ServiceName {
		t.Fatalf("the .proto has no service %s", leaseServiceDesc.ServiceName)
	}
	if n := sd.Methods().Len(); n != len(leaseServiceDesc.Methods)+len(leaseServiceDesc.Streams) {
		t.Errorf("%d methods and %d streams, the .proto has %d", len(leaseServiceDesc.Methods), len(leaseServiceDesc.Streams), n)
	}
	s, _ := newService(t, Limits{})
	for _, m := range leaseServiceDesc.Methods {
		md := sd.Methods().ByName(protoreflect.Name(m.MethodName))
		if md == nil || md.IsStreamingClient() || md.IsStreamingServer() {
			t.Errorf("method %s is not a unary method of the .proto", m.MethodName)
			continue
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
	for _, st := range leaseServiceDesc.Streams {
		md := sd.Methods().ByName(protoreflect.Name(st.StreamName))
		if md == nil || md.IsStreamingClient() || !md.IsStreamingServer() || st.ClientStreams || !st.ServerStreams {
			t.Errorf("stream %s is not a server stream of the .proto", st.StreamName)
		}
	}
}

// TestGRPCLeases: Join, Watch's stream (the grant at once, then the
// capacity once leased), Demand, Leave (the stream then ends NOT_FOUND),
// behind the bearer token; a made-up holder id is NOT_FOUND and a bound
// INVALID_ARGUMENT.
func TestGRPCLeases(t *testing.T) {
	s, err := New(Options{Store: concurrency.NewMemoryStore(), Token: "tok",
		Leases: func(string) (lease.Store, error) { return lease.NewMemoryStore(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	ln := dialWith(t, s)
	bg := context.Background()
	ctx := metadata.AppendToOutgoingContext(bg, "authorization", "Bearer tok")
	call := func(ctx context.Context, method string, in, out proto.Message) error {
		return ln.Invoke(ctx, "/"+LeaseServiceName+"/"+method, in, out)
	}
	join := &sluicev1.JoinRequest{Service: "db", Capacity: 100, Partitions: 4, Ttl: durationpb.New(time.Second), Backlog: 50}
	var j sluicev1.JoinResponse
	if err := call(bg, "Join", join, &j); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Join without the token: %v, want UNAUTHENTICATED", err)
	}
	if err := call(ctx, "Join", join, &j); err != nil {
		t.Fatal(err)
	}
	id := j.GetGrant().GetHolderId()
	if checkID("holder_id", id) != nil || j.GetGrant().GetVersion() != 1 {
		t.Fatalf("join answered %v: want a holder id and version 1", &j)
	}
	desc := &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}
	open := func(ctx context.Context, id string) grpc.ClientStream {
		st, err := ln.NewStream(ctx, desc, "/"+LeaseServiceName+"/Watch")
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendMsg(&sluicev1.WatchRequest{Service: "db", HolderId: id}); err != nil {
			t.Fatal(err)
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if err := open(bg, id).RecvMsg(new(sluicev1.WatchResponse)); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Watch without the token: %v, want UNAUTHENTICATED", err)
	}
	if err := open(ctx, "AAAAAAAAAAAAAAAAAAAAAAAAAA").RecvMsg(new(sluicev1.WatchResponse)); status.Code(err) != codes.NotFound {
		t.Errorf("Watch of a made-up holder: %v, want NOT_FOUND", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st := open(wctx, id)
	var w sluicev1.WatchResponse
	if err := st.RecvMsg(&w); err != nil {
		t.Fatal(err)
	}
	if w.GetGrant().GetVersion() < 1 {
		t.Errorf("the stream's first grant %v: want one at once", &w)
	}
	for w.GetGrant().GetRate() != 100 {
		prev := w.GetGrant().GetVersion()
		if err := st.RecvMsg(&w); err != nil {
			t.Fatalf("before the full rate: %v", err)
		}
		if w.GetGrant().GetVersion() <= prev {
			t.Fatalf("version %d after %d: want it to grow", w.GetGrant().GetVersion(), prev)
		}
	}
	g := GrantFromMsg(w.GetGrant())
	if len(g.Leases) != 4 || g.PaceRate <= 0 || g.Burst < 1 || g.Window != time.Second || g.ValidFor <= 0 || g.ValidFor > time.Second {
		t.Errorf("grant at the full rate %+v: want 4 leases, a bucket, a 1s window, valid within (0, 1s]", g)
	}
	var d sluicev1.DemandResponse
	if err := call(ctx, "Demand", &sluicev1.DemandRequest{Service: "db", HolderId: id, Backlog: 50, Version: g.Version}, &d); err != nil || d.GetGrant().GetRate() != 100 {
		t.Errorf("Demand: %v, %v; want the full rate", &d, err)
	}
	for _, tc := range []struct {
		method string
		in     proto.Message
		want   codes.Code
	}{
		{"Join", &sluicev1.JoinRequest{Service: "db", Capacity: 100, Partitions: 0}, codes.InvalidArgument},
		{"Join", &sluicev1.JoinRequest{Service: "db", Capacity: 100, Partitions: 4, Ttl: &durationpb.Duration{Seconds: 1, Nanos: -1}}, codes.InvalidArgument},
		{"Demand", &sluicev1.DemandRequest{Service: "db", HolderId: "AAAAAAAAAAAAAAAAAAAAAAAAAA"}, codes.NotFound},
		{"Demand", &sluicev1.DemandRequest{Service: "other", HolderId: id}, codes.NotFound},
		{"Leave", &sluicev1.LeaveRequest{Service: "db", HolderId: "x"}, codes.InvalidArgument},
	} {
		if err := call(ctx, tc.method, tc.in, new(sluicev1.LeaveResponse)); status.Code(err) != tc.want {
			t.Errorf("%s(%v): %v; want %v", tc.method, tc.in, err, tc.want)
		}
	}
	if err := call(ctx, "Leave", &sluicev1.LeaveRequest{Service: "db", HolderId: id}, new(sluicev1.LeaveResponse)); err != nil {
		t.Fatal(err)
	}
	for {
		err := st.RecvMsg(&w)
		if err == nil {
			continue
		}
		if err == io.EOF || status.Code(err) != codes.NotFound {
			t.Errorf("the stream after Leave: %v, want NOT_FOUND", err)
		}
		break
	}
}
