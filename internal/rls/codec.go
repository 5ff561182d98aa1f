package rls

import (
	"fmt"

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
// The codec marshals a message that has go-control-plane's vtprotobuf
// methods (SizeVT, MarshalToSizedBufferVTStrict: the rate limit
// responses) with them, into a buffer from gRPC's pool when the message is
// above gRPC's pooling threshold, as the default codec does; it decodes a
// ShouldRateLimit request straight into its RateLimitRequest and keeps a
// decoding error for the handler to answer INVALID_ARGUMENT (see the
// package documentation, Errors). Every other message (health,
// reflection) goes through gRPC's default protobuf codec, whose name it
// also bears, so the content-type is unchanged.
//
// Register works on a server without the option too, at the cost of one
// more pass over each request.
func ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{})
}

// protoCodec is gRPC's default codec, which codec defers to.
var protoCodec = encoding.GetCodecV2(protocodec.Name)

// vtMessage is what codec needs of a message to marshal it itself.
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict([]byte) (int, error)
}

// codec is the encoding.CodecV2 of ServerOption. The zero value is ready;
// it is stateless and safe for concurrent use.
type codec struct{}

func (codec) Name() string { return protocodec.Name }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMessage)
	if !ok {
		return protoCodec.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		// gRPC would not return a buffer this small to its pool
		// (mem.NewBuffer), so it is a plain slice, as in the default
		// codec.
		buf := make([]byte, size)
		if err := marshalVT(m, buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if err := marshalVT(m, (*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = (*buf)[:size]
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// marshalVT writes m into buf, which is exactly SizeVT bytes long
// (MarshalToSizedBufferVTStrict writes from the end backwards).
func marshalVT(m vtMessage, buf []byte) error {
	n, err := m.MarshalToSizedBufferVTStrict(buf)
	if err != nil {
		return err
	}
	if n != len(buf) {
		return fmt.Errorf("rls: %T marshalled to %d bytes, its size is %d", m, n, len(buf))
	}
	return nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*request)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	r.decoded = true
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
