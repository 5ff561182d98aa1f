package rls

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// typicalResponse is a response as Server.response makes it, with
// headers; its current_limit is shared, as the server's are.
func typicalResponse(limit *rlsv3.RateLimitResponse_RateLimit, headers int) *rlsv3.RateLimitResponse {
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
	for i := range 2 {
		out.Statuses = append(out.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: rlsv3.RateLimitResponse_Code(1 + i), CurrentLimit: limit, LimitRemaining: uint32(7 * i),
			DurationUntilReset: &durationpb.Duration{Seconds: 59, Nanos: 250_000_000},
		})
	}
	for i := range headers {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "RateLimit", Value: strings.Repeat("x", i%40)})
	}
	return out
}

var sharedLimit = &rlsv3.RateLimitResponse_RateLimit{Name: "login", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}

// TestCodecMarshal: the codec writes the bytes the default codec writes,
// for a response below gRPC's pooling threshold and one above it (in a
// buffer of gRPC's pool), concurrently on responses that share a
// current_limit; a message without the vtprotobuf methods (health) goes
// through the default codec.
func TestCodecMarshal(t *testing.T) {
	def := encoding.GetCodecV2("proto")
	var wg sync.WaitGroup
	for _, headers := range []int{3, 200} {
		for range 4 {
			wg.Go(func() {
				m := typicalResponse(sharedLimit, headers)
				want, err := proto.Marshal(m)
				if err != nil {
					t.Error(err)
					return
				}
				if mem.IsBelowBufferPoolingThreshold(len(want)) != (headers < 100) {
					t.Errorf("%d bytes: not on the side of the pooling threshold meant", len(want))
				}
				got, err := codec{}.Marshal(m)
				if err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(got.Materialize(), want) {
					t.Errorf("%d headers: the codec's bytes differ from proto.Marshal's", headers)
				}
				got.Free()
			})
		}
	}
	wg.Wait()
	h := &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}
	got, err := codec{}.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := def.Marshal(h)
	if !bytes.Equal(got.Materialize(), want.Materialize()) {
		t.Error("a health response marshals differently")
	}
	var back grpc_health_v1.HealthCheckResponse
	if err := (codec{}).Unmarshal(got, &back); err != nil || back.Status != h.Status {
		t.Errorf("a health response does not round-trip: %v, %v", &back, err)
	}
}

// TestCodecUnmarshal: into a *request, the codec decodes the
// RateLimitRequest in one pass; a string that is not UTF-8 is kept as the
// INVALID_ARGUMENT naming it and is no error of the codec's; what is not
// protobuf is the codec's error, as it is the default codec's.
func TestCodecUnmarshal(t *testing.T) {
	var r request
	if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wireRequest("o", "user", "u1"))}, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.raw.ProtoReflect().GetUnknown()) != 0 {
		t.Error("the codec went through the Empty")
	}
	in, err := r.get()
	if err != nil || in.GetDomain() != "o" || in.GetDescriptors()[0].GetEntries()[0].GetValue() != "u1" {
		t.Fatalf("decoded %v, %v", in, err)
	}

	r = request{}
	if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wireRequest("o", "user", "u\xff"))}, &r); err != nil {
		t.Fatalf("invalid UTF-8 is the codec's error: %v", err)
	}
	_, err = r.get()
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() != "decoding the RateLimitRequest: field descriptors[0].entries[0].value is not valid UTF-8" {
		t.Errorf("invalid UTF-8: %v", err)
	}

	r = request{}
	if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer{0xff}}, &r); err == nil {
		t.Error("not protobuf: no error")
	}
}

// FuzzCodec: for any bytes, the codec's decoding into a request and the
// default codec's (into its Empty, then decoded) agree: both fail, or
// give the same error, or the same request; and what the codec decodes it
// marshals back to an equal request.
func FuzzCodec(f *testing.F) {
	f.Add(wireRequest("edge_proxy", "tenant", "acme", "user", "u-1"))
	f.Add(wireRequest("o\xff", "login", "a"))
	f.Add(wireRequest("o", "log\xc0in", "a"))
	f.Add([]byte{0xff})
	f.Add([]byte{0x08, 0x01}) // field 1 as a varint: protobuf, not a RateLimitRequest
	f.Add([]byte{})
	envoy, _ := proto.Marshal(envoyRequest())
	f.Add(envoy)
	f.Add(append(envoy, 0x12, 0x02, 0x1a, 0x00)) // a descriptor of an empty hits_addend
	f.Add(append(envoy, 0x0a, 0x01, 'x'))        // the domain twice
	def := encoding.GetCodecV2("proto")
	f.Fuzz(func(t *testing.T, b []byte) {
		var viaCodec, viaDefault request
		errCodec := codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &viaCodec)
		errDefault := def.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &viaDefault)
		if (errCodec == nil) != (errDefault == nil) {
			t.Fatalf("codec %v, default codec %v", errCodec, errDefault)
		}
		if errCodec != nil {
			return
		}
		a, errA := viaCodec.get()
		d, errD := viaDefault.get()
		if (errA == nil) != (errD == nil) || (errA != nil && errA.Error() != errD.Error()) {
			t.Fatalf("codec %v, default codec %v", errA, errD)
		}
		if errA != nil {
			if status.Code(errA) != codes.InvalidArgument {
				t.Fatalf("%v, want INVALID_ARGUMENT", errA)
			}
			return
		}
		if !proto.Equal(a, d) {
			t.Fatalf("codec %v, default codec %v", a, d)
		}
		out, err := codec{}.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		back := new(rlsv3.RateLimitRequest)
		if err := proto.Unmarshal(out.Materialize(), back); err != nil || !proto.Equal(back, a) {
			t.Fatalf("marshalled back to %v, %v; want %v", back, err, a)
		}
	})
}

// TestCodecContain: a panic of the hand-written encoding is reported with
// its stack, for the caller to redo with protobuf-go; without onPanic it
// goes on.
func TestCodecContain(t *testing.T) {
	var got any
	var stack []byte
	c := codec{onPanic: func(v any, s []byte) { got, stack = v, s }}
	if c.contain(nil) || got != nil {
		t.Fatal("no panic was reported as one")
	}
	if !c.contain("boom") || got != "boom" || !strings.Contains(string(stack), "TestCodecContain") {
		t.Fatalf("reported %v with stack\n%s", got, stack)
	}
	defer func() {
		if v := recover(); v != "boom" {
			t.Errorf("without onPanic: recovered %v, want the panic to go on", v)
		}
	}()
	codec{}.contain("boom")
}
