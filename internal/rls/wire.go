package rls

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The protobuf encoding of the hot path's two messages, written by hand:
// the RateLimitRequest as Envoy sends it and the RateLimitResponse as
// Server.response makes it. protobuf-go's generic code, which gRPC's
// default codec runs, walks a table per field and allocates every message
// and string on its own; for these small messages that is most of what a
// codec costs. Each function here takes only the shape it knows and says
// when it does not; everything else goes to protobuf-go. So the messages
// decoded and the bytes written are always those protobuf-go would give
// (FuzzCodec and FuzzWireResponse hold them to it).

// unmarshalRequest decodes b into r.in, which must be zero, as
// proto.Unmarshal would, when b is a RateLimitRequest of the shape Envoy
// sends: a domain, descriptors of entries (key and value) with an
// optional hits_addend and is_negative_hits, and an optional hits_addend;
// each singular field at most once, every string valid UTF-8, no other
// field. For anything else (a descriptor's limit, an unknown field, a
// singular field twice, an encoding error) it reports false, having left
// r.in zero, for proto.Unmarshal to decode.
//
// It reads b twice: the first pass checks the shape and counts the
// descriptors and entries, the second fills them in. Every string is a
// part of one copy of b; a request of one descriptor of up to
// len(r.entries) entries, the usual shape, is held in r itself, and a
// larger one in two more allocations.
func unmarshalRequest(b []byte, r *request) bool {
	var count requestDecoder
	if !count.request(b) {
		return false
	}
	d := requestDecoder{in: &r.in, str: string(b)}
	if count.ndescs == 1 && count.nentries <= len(r.entries) {
		d.descs, d.entries, d.ptrs = r.descs[:], r.entries[:], r.ptrs[:]
		r.in.Descriptors = r.descPtrs[:0]
	} else {
		d.descs = make([]commonv3.RateLimitDescriptor, count.ndescs)
		d.entries = make([]commonv3.RateLimitDescriptor_Entry, count.nentries)
		d.ptrs = make([]*commonv3.RateLimitDescriptor_Entry, count.nentries)
		if count.ndescs > 0 {
			r.in.Descriptors = make([]*commonv3.RateLimitDescriptor, 0, count.ndescs)
		}
	}
	d.request(b)
	return true
}

// requestDecoder is one pass of unmarshalRequest: with in nil it only
// checks and counts; with in set it fills in, into descs, entries and
// ptrs, sized by the count.
type requestDecoder struct {
	ndescs, nentries int // decoded so far
	in               *rlsv3.RateLimitRequest
	str              string // b as a string: every decoded string is a part of it
	descs            []commonv3.RateLimitDescriptor
	entries          []commonv3.RateLimitDescriptor_Entry
	ptrs             []*commonv3.RateLimitDescriptor_Entry
}

// field reads the tag at b[i:] and returns the field's number and type and
// where its value starts; next < 0 when the tag is malformed.
func field(b []byte, i int) (num protowire.Number, typ protowire.Type, next int) {
	num, typ, n := protowire.ConsumeTag(b[i:])
	if n < 0 {
		return 0, 0, -1
	}
	return num, typ, i + n
}

// varint reads a varint at b[i:]; next < 0 when it is malformed.
func varint(b []byte, i int) (v uint64, next int) {
	v, n := protowire.ConsumeVarint(b[i:])
	if n < 0 {
		return 0, -1
	}
	return v, i + n
}

// bytesAt reads a length-delimited value at b[i:] and returns where it
// starts and ends; end < 0 when it is malformed.
func bytesAt(b []byte, i int) (start, end int) {
	l, n := protowire.ConsumeVarint(b[i:])
	if n < 0 || l > uint64(len(b)-i-n) {
		return 0, -1
	}
	return i + n, i + n + int(l)
}

// text reads a string field's value at b[i:]: where it starts and ends,
// end < 0 when it is malformed or, in the counting pass (which has
// checked it for the other), not valid UTF-8.
func (d *requestDecoder) text(b []byte, i int) (start, end int) {
	start, end = bytesAt(b, i)
	if end < 0 || d.in == nil && !utf8.Valid(b[start:end]) {
		return 0, -1
	}
	return start, end
}

func (d *requestDecoder) request(b []byte) bool {
	var domain, hits bool
	for i := 0; i < len(b); {
		num, typ, j := field(b, i)
		switch {
		case j < 0:
			return false
		case num == 1 && typ == protowire.BytesType && !domain:
			s, e := d.text(b, j)
			if e < 0 {
				return false
			}
			domain, i = true, e
			if d.in != nil {
				d.in.Domain = d.str[s:e]
			}
		case num == 2 && typ == protowire.BytesType:
			s, e := bytesAt(b, j)
			if e < 0 || !d.descriptor(b[:e], s) {
				return false
			}
			i = e
		case num == 3 && typ == protowire.VarintType && !hits:
			v, e := varint(b, j)
			if e < 0 {
				return false
			}
			hits, i = true, e
			if d.in != nil {
				d.in.HitsAddend = uint32(v)
			}
		default:
			return false
		}
	}
	return true
}

// descriptor decodes the descriptor in b[i:].
func (d *requestDecoder) descriptor(b []byte, i int) bool {
	var desc *commonv3.RateLimitDescriptor
	if d.in != nil {
		desc = &d.descs[d.ndescs]
		d.in.Descriptors = append(d.in.Descriptors, desc)
	}
	d.ndescs++
	first := d.nentries
	var hits, negative bool
	for i < len(b) {
		num, typ, j := field(b, i)
		switch {
		case j < 0:
			return false
		case num == 1 && typ == protowire.BytesType:
			s, e := bytesAt(b, j)
			if e < 0 || !d.entry(b[:e], s) {
				return false
			}
			i = e
		case num == 3 && typ == protowire.BytesType && !hits:
			s, e := bytesAt(b, j)
			if e < 0 {
				return false
			}
			v, ok := uint64Value(b[:e], s)
			if !ok {
				return false
			}
			hits, i = true, e
			if desc != nil {
				desc.HitsAddend = &wrapperspb.UInt64Value{Value: v}
			}
		case num == 4 && typ == protowire.VarintType && !negative:
			v, e := varint(b, j)
			if e < 0 {
				return false
			}
			negative, i = true, e
			if desc != nil {
				desc.IsNegativeHits = protowire.DecodeBool(v)
			}
		default:
			return false
		}
	}
	if desc != nil && d.nentries > first {
		desc.Entries = d.ptrs[first:d.nentries:d.nentries]
	}
	return true
}

// entry decodes the entry in b[i:].
func (d *requestDecoder) entry(b []byte, i int) bool {
	var e *commonv3.RateLimitDescriptor_Entry
	if d.in != nil {
		e = &d.entries[d.nentries]
		d.ptrs[d.nentries] = e
	}
	d.nentries++
	var key, value bool
	for i < len(b) {
		num, typ, j := field(b, i)
		if j < 0 || typ != protowire.BytesType || !(num == 1 && !key || num == 2 && !value) {
			return false
		}
		s, end := d.text(b, j)
		if end < 0 {
			return false
		}
		i = end
		if num == 1 {
			key = true
			if e != nil {
				e.Key = d.str[s:end]
			}
		} else {
			value = true
			if e != nil {
				e.Value = d.str[s:end]
			}
		}
	}
	return true
}

// uint64Value decodes the google.protobuf.UInt64Value in b[i:].
func uint64Value(b []byte, i int) (uint64, bool) {
	var v uint64
	var seen bool
	for i < len(b) {
		num, typ, j := field(b, i)
		if j < 0 || num != 1 || typ != protowire.VarintType || seen {
			return 0, false
		}
		if v, i = varint(b, j); i < 0 {
			return 0, false
		}
		seen = true
	}
	return v, true
}

// responseSize returns the size of m's encoding when m has the shape
// Server.response makes: overall_code, statuses (code, current_limit
// without unit_multiplier, limit_remaining, duration_until_reset) and
// response_headers_to_add (key and value), every string valid UTF-8, no
// unknown field, no nil element. For anything else it reports false, for
// protobuf-go to marshal. appendResponse then writes m exactly as
// proto.Marshal does: the same fields in the same order.
func responseSize(m *rlsv3.RateLimitResponse) (int, bool) {
	if len(m.RequestHeadersToAdd) > 0 || len(m.RawBody) > 0 || m.DynamicMetadata != nil || m.Quota != nil || unknown(m) {
		return 0, false
	}
	n := varintSize(uint64(m.OverallCode))
	for _, st := range m.Statuses {
		if !statusTaken(st) {
			return 0, false
		}
		n += nestedSize(statusSize(st))
	}
	for _, h := range m.ResponseHeadersToAdd {
		if h == nil || len(h.RawValue) > 0 || unknown(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
			return 0, false
		}
		n += nestedSize(headerSize(h))
	}
	return n, true
}

// statusTaken reports whether appendStatus writes st as proto.Marshal does.
func statusTaken(st *rlsv3.RateLimitResponse_DescriptorStatus) bool {
	if st == nil || st.Quota != nil || unknown(st) {
		return false
	}
	if l := st.CurrentLimit; l != nil && (l.UnitMultiplier != nil || unknown(l) || !utf8.ValidString(l.Name)) {
		return false
	}
	return st.DurationUntilReset == nil || !unknown(st.DurationUntilReset)
}

// unknown reports whether m holds fields its type does not declare.
func unknown(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) > 0 }

// Field tags, as written (number << 3 | type), all below 128: one byte.
const (
	tagVarint1 = 1<<3 | byte(protowire.VarintType)
	tagVarint2 = 2<<3 | byte(protowire.VarintType)
	tagVarint3 = 3<<3 | byte(protowire.VarintType)
	tagBytes1  = 1<<3 | byte(protowire.BytesType)
	tagBytes2  = 2<<3 | byte(protowire.BytesType)
	tagBytes3  = 3<<3 | byte(protowire.BytesType)
	tagBytes4  = 4<<3 | byte(protowire.BytesType)
)

// varintSize is the size of a proto3 scalar field of value v with its
// one-byte tag: nothing for 0, which proto3 does not write.
func varintSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// textSize is the size of a proto3 string field with its one-byte tag.
func textSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

// nestedSize is the size of a message field of n bytes with its tag.
func nestedSize(n int) int { return 1 + protowire.SizeBytes(n) }

func appendVarintField(b []byte, tag byte, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, tag), v)
}

func appendTextField(b []byte, tag byte, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(append(b, tag), s)
}

func appendNested(b []byte, tag byte, n int) []byte {
	return protowire.AppendVarint(append(b, tag), uint64(n))
}

func appendResponse(b []byte, m *rlsv3.RateLimitResponse) []byte {
	b = appendVarintField(b, tagVarint1, uint64(m.OverallCode))
	for _, st := range m.Statuses {
		b = appendStatus(appendNested(b, tagBytes2, statusSize(st)), st)
	}
	for _, h := range m.ResponseHeadersToAdd {
		b = appendNested(b, tagBytes3, headerSize(h))
		b = appendTextField(appendTextField(b, tagBytes1, h.Key), tagBytes2, h.Value)
	}
	return b
}

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := varintSize(uint64(st.Code)) + varintSize(uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		n += nestedSize(limitSize(l))
	}
	if d := st.DurationUntilReset; d != nil {
		n += nestedSize(durationSize(d))
	}
	return n
}

func appendStatus(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) []byte {
	b = appendVarintField(b, tagVarint1, uint64(st.Code))
	if l := st.CurrentLimit; l != nil {
		b = appendNested(b, tagBytes2, limitSize(l))
		b = appendVarintField(b, tagVarint1, uint64(l.RequestsPerUnit))
		b = appendVarintField(b, tagVarint2, uint64(l.Unit))
		b = appendTextField(b, tagBytes3, l.Name)
	}
	b = appendVarintField(b, tagVarint3, uint64(st.LimitRemaining))
	if d := st.DurationUntilReset; d != nil {
		b = appendNested(b, tagBytes4, durationSize(d))
		b = appendVarintField(b, tagVarint1, uint64(d.Seconds))
		b = appendVarintField(b, tagVarint2, uint64(d.Nanos)) // sign-extended, as protobuf writes an int32
	}
	return b
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	return varintSize(uint64(l.RequestsPerUnit)) + varintSize(uint64(l.Unit)) + textSize(l.Name)
}

func durationSize(d *durationpb.Duration) int {
	return varintSize(uint64(d.Seconds)) + varintSize(uint64(d.Nanos))
}

func headerSize(h *corev3.HeaderValue) int { return textSize(h.Key) + textSize(h.Value) }
