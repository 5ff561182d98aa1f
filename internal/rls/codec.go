package rls

import (
	"runtime/debug"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"
)

// ServerOption returns the option that gives a gRPC server the codec of
// this package, for the server Register is called on. It is a server
// option, not a registration, so that it changes no other gRPC server or
// client in the process.
//
// The codec marshals a RateLimitResponse and decodes a ShouldRateLimit
// request with the hand-written encoding of wire.go, which takes the
// shapes rls itself makes and Envoy sends, in half the time of
// protobuf-go's generic code and a fraction of its allocations
// (bench/RESULTS.md §12); a message of any other shape goes to
// protobuf-go, so the bytes and messages are the same either way. A
// response above gRPC's pooling threshold is written into a buffer from
// gRPC's pool, as the default codec does. A decoding error is kept for
// the handler to answer INVALID_ARGUMENT (see the package documentation,
// Errors). Every other message (health, reflection) goes through gRPC's
// default protobuf codec, whose name it also bears, so the content-type
// is unchanged.
//
// The hand-written encoding is an optimisation and protobuf-go the
// reference: when it panics, onPanic is told (the panic's value and
// stack, for the caller to log and count as a bug) and the message goes
// through protobuf-go instead, so the call is answered as it would have
// been. With onPanic nil, the panic goes on and stops the process.
//
// Register works on a server without the option too, at the cost of one
// more pass over each request.
func ServerOption(onPanic func(v any, stack []byte)) grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{onPanic: onPanic})
}

// protoCodec is gRPC's default codec, which codec defers to.
var protoCodec = encoding.GetCodecV2(protocodec.Name)

// codec is the encoding.CodecV2 of ServerOption. The zero value is ready;
// it is stateless and safe for concurrent use.
type codec struct {
	onPanic func(v any, stack []byte) // nil: panics go on
}

// contain reports a panic of the hand-written encoding to onPanic, which
// the caller then does again with protobuf-go; it reports whether there
// was one. Without onPanic, the panic goes on.
func (c codec) contain(v any) bool {
	if v == nil {
		return false
	}
	if c.onPanic == nil {
		panic(v)
	}
	c.onPanic(v, debug.Stack())
	return true
}

func (codec) Name() string { return protocodec.Name }

func (c codec) Marshal(v any) (out mem.BufferSlice, err error) {
	m, ok := v.(*rlsv3.RateLimitResponse)
	if !ok {
		return protoCodec.Marshal(v)
	}
	defer func() {
		if c.contain(recover()) {
			out, err = protoCodec.Marshal(v)
		}
	}()
	size, ok := responseSize(m)
	if !ok {
		return protoCodec.Marshal(v)
	}
	if size <= len(smallBuffer{}.data) {
		b := new(smallBuffer)
		b.buf = appendResponse(b.data[:0], m)
		b.slice[0] = &b.buf
		return b.slice[:], nil
	}
	if mem.IsBelowBufferPoolingThreshold(size) {
		// gRPC would not return a buffer this small to its pool
		// (mem.NewBuffer), so it is a plain slice, as in the default
		// codec.
		return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, size), m))}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = appendResponse((*buf)[:0], m)
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// smallBuffer is a small response's encoding with what gRPC takes it in,
// in one allocation (three when made apart: the bytes, the slice header
// boxed in a Buffer, the BufferSlice).
type smallBuffer struct {
	slice [1]mem.Buffer
	buf   mem.SliceBuffer // data[:size]
	data  [128]byte
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*request)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	r.decoded = true
	if c.unmarshalRequest(b, r) {
		return nil
	}
	if err := proto.Unmarshal(b, &r.in); err != nil {
		if proto.Unmarshal(b, new(emptypb.Empty)) != nil {
			// Not protobuf at all: gRPC's own error, as without the
			// codec.
			return err
		}
		r.err = decodeError(b, err)
	}
	return nil
}

// unmarshalRequest is the package's unmarshalRequest, its panic
// contained: then r is reset, for protobuf-go to decode b.
func (c codec) unmarshalRequest(b []byte, r *request) (ok bool) {
	defer func() {
		if c.contain(recover()) {
			*r = request{decoded: true}
			ok = false
		}
	}()
	return unmarshalRequest(b, r)
}

// request is what ShouldRateLimit's handler decodes a request into. With
// the codec of ServerOption, in is the request and err the error that
// decoding it gave, nil or an INVALID_ARGUMENT status. With any other
// codec, which sees it as the proto.Message it delegates to (an Empty),
// raw holds the request's encoding as unknown fields, decoded by
// request.get. A request is used by one call, not shared.
type request struct {
	in      rlsv3.RateLimitRequest
	raw     emptypb.Empty
	decoded bool // by codec
	err     error
	// The messages of a request of one descriptor of up to four entries,
	// which unmarshalRequest decodes into here.
	descs    [1]commonv3.RateLimitDescriptor
	descPtrs [1]*commonv3.RateLimitDescriptor
	entries  [4]commonv3.RateLimitDescriptor_Entry
	ptrs     [4]*commonv3.RateLimitDescriptor_Entry
}

// ProtoReflect makes a request a proto.Message for codecs other than
// ServerOption's: it is the Empty that keeps the bytes.
func (r *request) ProtoReflect() protoreflect.Message { return r.raw.ProtoReflect() }

// get returns the decoded request or the status error to answer.
func (r *request) get() (*rlsv3.RateLimitRequest, error) {
	if !r.decoded {
		b := r.raw.ProtoReflect().GetUnknown()
		if err := proto.Unmarshal(b, &r.in); err != nil {
			return nil, decodeError(b, err)
		}
		return &r.in, nil
	}
	if r.err != nil {
		return nil, r.err
	}
	return &r.in, nil
}
