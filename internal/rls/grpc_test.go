package rls

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// wireRequest encodes a RateLimitRequest of one descriptor by hand, so
// that its strings can hold any bytes (proto.Marshal refuses invalid
// UTF-8).
func wireRequest(domain string, kv ...string) []byte {
	var d []byte
	for i := 0; i+1 < len(kv); i += 2 {
		var e []byte
		e = protowire.AppendString(protowire.AppendTag(e, 1, protowire.BytesType), kv[i])
		e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), kv[i+1])
		d = protowire.AppendBytes(protowire.AppendTag(d, 1, protowire.BytesType), e)
	}
	var b []byte
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), domain)
	return protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), d)
}

// rawMessage returns a message whose encoding is b: an Empty whose
// unknown fields are b, which proto.Marshal writes as they are.
func rawMessage(b []byte) *emptypb.Empty {
	m := new(emptypb.Empty)
	m.ProtoReflect().SetUnknown(b)
	return m
}

// TestGRPCInvalidUTF8: over a real gRPC connection on loopback, a request
// whose domain, key or value is not valid UTF-8 is INVALID_ARGUMENT naming
// the field (gRPC's own decoding answers INTERNAL), and a valid request
// sent the same way is decided, through the server's interceptors: with
// gRPC's default codec (grpc.NewServer as it is) and with ServerOption's.
func TestGRPCInvalidUTF8(t *testing.T) {
	t.Run("default codec", func(t *testing.T) { testGRPCInvalidUTF8(t) })
	t.Run("codec", func(t *testing.T) { testGRPCInvalidUTF8(t, ServerOption(nil)) })
}

func testGRPCInvalidUTF8(t *testing.T, opts ...grpc.ServerOption) {
	var intercepted atomic.Int32
	g := grpc.NewServer(append(opts, grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if _, ok := req.(*rlsv3.RateLimitRequest); ok && info.FullMethod == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			intercepted.Add(1)
		}
		return h(ctx, req)
	}))...)
	outageServer(t, outageStore{}).Register(g)
	conn := serveLoopback(t, g)
	call := func(b []byte) (*rlsv3.RateLimitResponse, error) {
		out := new(rlsv3.RateLimitResponse)
		err := conn.Invoke(t.Context(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rawMessage(b), out)
		return out, err
	}

	for _, tt := range []struct {
		name, field string
		req         []byte
	}{
		{"domain", "domain", wireRequest("o\xff", "login", "a")},
		{"key", "descriptors[0].entries[0].key", wireRequest("o", "log\xc0in", "a")},
		{"value", "descriptors[0].entries[1].value", wireRequest("o", "login", "a", "user", "\xed\xa0\x80")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := call(tt.req)
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || st.Message() != "decoding the RateLimitRequest: field "+tt.field+" is not valid UTF-8" {
				t.Errorf("%v; want INVALID_ARGUMENT: field %s is not valid UTF-8", err, tt.field)
			}
		})
	}
	if n := intercepted.Load(); n != 0 {
		t.Errorf("the interceptor saw %d requests that did not decode", n)
	}

	// U+FFFD itself is valid UTF-8: decided (the outage store fails it
	// closed, so OVER_LIMIT), through the interceptor.
	out, err := call(wireRequest("o", "login", "\ufffd"))
	if err != nil || out.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a valid request: %v, %v", out, err)
	}
	if n := intercepted.Load(); n != 1 {
		t.Errorf("the interceptor saw %d requests, want 1", n)
	}
	// An empty key is valid protobuf but refused by the service.
	_, err = call(wireRequest("o", "", "a"))
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() != "invalid request: descriptor 0 entry 0: key is empty" {
		t.Errorf("an empty key: %v; want INVALID_ARGUMENT, key is empty", err)
	}
	// What is not protobuf at all is gRPC's own error.
	if _, err := call([]byte{0xff}); status.Code(err) != codes.Internal {
		t.Errorf("not protobuf: %v; want INTERNAL (gRPC's decoding)", err)
	}
	if b, _ := proto.Marshal(rawMessage(wireRequest("o", "k", "\xff"))); len(b) == 0 {
		t.Error("the raw message does not marshal")
	}
}

// BenchmarkDecode: what decoding a typical request costs through the
// generated handler (gRPC's codec straight into a RateLimitRequest),
// through Register's with gRPC's default codec (into the request's Empty,
// then decoded again) and with ServerOption's (one pass).
func BenchmarkDecode(b *testing.B) {
	req := wireRequest("edge_proxy", "tenant", "acme", "user", "u-1234567", "path", "/api/v1/orders")
	b.Run("generated", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := proto.Unmarshal(req, new(rlsv3.RateLimitRequest)); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"register", encoding.GetCodecV2("proto")}, {"codec", codec{}}} {
		data := mem.BufferSlice{mem.SliceBuffer(req)} // as gRPC hands it over
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r := new(request)
					if err := c.codec.Unmarshal(data, r); err != nil {
						b.Fatal(err)
					}
					if _, err := r.get(); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkMarshal: what marshalling a typical response (two statuses,
// three headers) costs with gRPC's default codec and with ServerOption's.
func BenchmarkMarshal(b *testing.B) {
	m := typicalResponse(sharedLimit, 3)
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"default", encoding.GetCodecV2("proto")}, {"codec", codec{}}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					out, err := c.codec.Marshal(m)
					if err != nil {
						b.Fatal(err)
					}
					out.Free()
				}
			})
		})
	}
}

// serveLoopback serves g on a loopback port until the test ends and
// returns a client connection to it.
func serveLoopback(t *testing.T, g *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	t.Cleanup(func() {
		g.Stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
