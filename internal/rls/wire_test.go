package rls

import (
	"bytes"
	"math"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// envoyRequest is a request as Envoy sends it: two descriptors, one with
// its own hits_addend and is_negative_hits, and the request's hits_addend.
func envoyRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: "edge_proxy",
		Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: entries("tenant", "acme", "user", "u-1234567", "path", "/api/v1/orders")},
			{Entries: entries("remote_address", "10.0.0.1"), HitsAddend: wrapperspb.UInt64(3), IsNegativeHits: true},
			{}, // no entries: refused by the service, decoded all the same
		},
		HitsAddend: 2,
	}
}

// TestWireRequest: requests of the shape Envoy sends are decoded by the
// hand-written decoder, into what proto.Unmarshal gives; every other shape
// is left to proto.Unmarshal, with the request untouched.
func TestWireRequest(t *testing.T) {
	mustMarshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	withLimit := envoyRequest()
	withLimit.Descriptors[0].Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
	domain := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "again")
	for _, tt := range []struct {
		name  string
		b     []byte
		taken bool
	}{
		{"envoy", mustMarshal(envoyRequest()), true},
		{"one entry", wireRequest("o", "user", "u1"), true},
		{"empty", nil, true},
		{"empty descriptor hits_addend", append(mustMarshal(envoyRequest()), 0x12, 0x02, 0x1a, 0x00), true},
		{"a limit", mustMarshal(withLimit), false},
		{"domain twice", append(mustMarshal(envoyRequest()), domain...), false},
		{"unknown field", append(mustMarshal(envoyRequest()), 0x28, 0x01), false},
		{"domain as a varint", []byte{0x08, 0x01}, false},
		{"not UTF-8", wireRequest("o", "user", "u\xff"), false},
		{"truncated", mustMarshal(envoyRequest())[:20], false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var r request
			got := &r.in
			if taken := unmarshalRequest(tt.b, &r); taken != tt.taken {
				t.Fatalf("taken %v, want %v", taken, tt.taken)
			}
			if !tt.taken {
				if !proto.Equal(got, new(rlsv3.RateLimitRequest)) {
					t.Fatalf("left %v, want it untouched", got)
				}
				return
			}
			want := new(rlsv3.RateLimitRequest)
			if err := proto.Unmarshal(tt.b, want); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("decoded %v, proto.Unmarshal %v", got, want)
			}
		})
	}
	// Allocations: the request and one copy of the bytes; for more than
	// one descriptor or four entries, four slices (descriptors, entries and
	// their pointers); one per hits_addend.
	for _, tt := range []struct {
		b    []byte
		want float64
	}{{wireRequest("o", "tenant", "acme", "user", "u1"), 2}, {mustMarshal(envoyRequest()), 7}} {
		if n := testing.AllocsPerRun(100, func() { unmarshalRequest(tt.b, new(request)) }); n != tt.want {
			t.Errorf("%v allocations to decode %x, want %v", n, tt.b, tt.want)
		}
	}
}

// FuzzWireResponse: a response built from the fuzzer's numbers and
// strings, of the shape Server.response makes or not, marshals through the
// codec to exactly proto.Marshal's bytes (or fails as it does).
func FuzzWireResponse(f *testing.F) {
	f.Add(uint8(2), int32(1), uint32(10), int32(2), "login", uint32(0), int64(59), int32(250_000_000), "RateLimit", "10;w=60", uint8(0))
	f.Add(uint8(1), int32(-1), uint32(math.MaxUint32), int32(-7), "", uint32(math.MaxUint32), int64(-1), int32(-1), "", "", uint8(7))
	f.Add(uint8(0), int32(0), uint32(0), int32(0), "bad\xff", uint32(0), int64(0), int32(0), "k", "v\xc0", uint8(3))
	f.Fuzz(func(t *testing.T, statuses uint8, code int32, rpu uint32, unit int32, name string, remaining uint32, secs int64, nanos int32, key, value string, extra uint8) {
		limit := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit)}
		m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(code)}
		for i := range int(statuses % 4) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(code + int32(i)), LimitRemaining: remaining}
			if i%2 == 0 {
				st.CurrentLimit = limit
				st.DurationUntilReset = &durationpb.Duration{Seconds: secs, Nanos: nanos}
			}
			m.Statuses = append(m.Statuses, st)
		}
		for range int(statuses / 4 % 8) {
			m.ResponseHeadersToAdd = append(m.ResponseHeadersToAdd, &corev3.HeaderValue{Key: key, Value: value})
		}
		// Shapes the hand-written encoder leaves to protobuf-go.
		switch extra % 8 {
		case 1:
			m.RawBody = []byte(value + "x")
		case 2:
			m.DynamicMetadata = &structpb.Struct{}
		case 3:
			limit.UnitMultiplier = wrapperspb.UInt32(rpu)
		case 4:
			m.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), uint64(rpu)))
		case 5:
			m.Statuses = append(m.Statuses, nil)
		case 6:
			m.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: key}}
		}
		want, wantErr := proto.Marshal(m)
		got, err := codec{}.Marshal(m)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("codec error %v, proto.Marshal's %v", err, wantErr)
		}
		if err != nil {
			return
		}
		if g := got.Materialize(); !bytes.Equal(g, want) {
			t.Fatalf("codec wrote %x, proto.Marshal %x", g, want)
		}
		got.Free()
	})
}
