// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService) over gRPC on top of the
// decision service, with the generated types of go-control-plane. It is
// the one translation between Envoy's conventions and the service's; the
// JSON endpoint of internal/httpapi uses it too
// (Server.ShouldRateLimitJSON).
//
// Supported: domain; descriptors with entries, a limit (Envoy's
// RateLimitOverride: requests_per_unit, unit, unit_multiplier, which
// becomes a service.InlineLimit), hits_addend and is_negative_hits; the
// request's hits_addend. A descriptor's cost is its own hits_addend when it
// carries one (0 checks without counting), else the request's (0 counts
// as 1), and is_negative_hits makes it a refund. The response carries
// overall_code and one status per descriptor with code, current_limit
// (name, requests_per_unit, unit), limit_remaining and
// duration_until_reset (for a limit admitted by its fail_open failure
// mode, whose store could not be asked: limit_remaining is the rule's
// limit, since 0 would read as spent, and duration_until_reset is left
// out; envoyproxy/ratelimit answers no such case, failing the call), and,
// when enabled, RateLimit-Policy, RateLimit and
// Retry-After in response_headers_to_add; and dynamic_metadata when a
// quota_mode limit matched (below). Not produced: request_headers_to_add,
// raw_body, quota. Two descriptor entries are Sluice's own: sluice_reserve
// and sluice_settle make a request-time call and its stream-done call a
// reservation and its settlement (settle.go), and are removed before the
// rules see the descriptor.
//
// # quota_mode
//
// A descriptor over a quota_mode limit is OVER_LIMIT while overall_code
// stays OK, unless every quota-mode descriptor of the request is over
// (service's package documentation). Its Envoy filter cannot read a
// descriptor's code, so a response that matched a quota-mode limit carries
// dynamic_metadata naming them, with the key names envoyproxy/ratelimit
// gave them when it introduced quota mode (January 2026):
//
//	domain               the request's domain
//	quotaModeEnabled     true
//	quotaModeViolations  the indexes (numbers, from 0) of the request's
//	                     descriptors over their quota; absent when none
//
// Envoy puts it in the filter's dynamic metadata (envoy.filters.http.
// ratelimit), for routing or access logs. envoyproxy/ratelimit sends
// dynamic metadata only with RESPONSE_DYNAMIC_METADATA and, since April
// 2026, no longer names the violations (a descriptor's OVER_LIMIT code
// says it); Sluice sends it whenever a quota-mode limit matched, and never
// otherwise, so responses without quota mode are unchanged.
//
// Errors: a request that is malformed or beyond a bound is
// INVALID_ARGUMENT, with the message service.Request.Validate gives on
// every transport, and so is one that does not decode as a
// RateLimitRequest (a string that is not valid UTF-8, which proto3
// forbids; Register installs the decoding that says so, where gRPC's own
// would answer INTERNAL); a store that returns an error is UNAVAILABLE, and Envoy
// applies its failure_mode_deny (nothing was decided). With the codec of
// ServerOption on the server, a request is decoded once, straight into its
// RateLimitRequest, and a decoding error is kept for the handler to answer
// (the field is looked for only then); without it, gRPC's default codec
// keeps the request's bytes and the handler decodes them again, with the
// same answers. Either way, a body that is not protobuf at all is gRPC's
// own INTERNAL.
//
// # A store outage under failure_mode: fail_closed
//
// When the store cannot reach its backend and a limit that fails closed
// denies a request, HTTP answers 503, but Envoy's API has no code for it:
// a response is OK or OVER_LIMIT, and any gRPC error hands the decision to
// Envoy's failure_mode_deny, a single switch for the whole filter that
// defaults to letting requests through (docs/service.md's example keeps it so,
// to survive Sluice being unreachable). Answering UNAVAILABLE would thus
// quietly turn every fail_closed rule into fail_open behind such an Envoy,
// which is what fail_closed exists to prevent. So ShouldRateLimit answers
// OVER_LIMIT, with the failed-closed descriptors OVER_LIMIT and, when
// headers are enabled, a Retry-After of when the store retries its
// backend: the rule's failure_mode decides, as on every transport. Envoy
// then answers its client with its rate_limited_status (429 unless
// configured); the outage shows in Sluice's sluice_decisions_total{outcome=
// "fail_closed"} and sluice_store_errors_total. Server.ShouldRateLimitJSON, for HTTP,
// reports it as the *service.UnavailableError it is.
//
// For the same reason, a call sluice serve's overload guard refuses (it
// never reaches this package) is answered OVER_LIMIT by serve, not
// UNAVAILABLE, unless --shed-answer unavailable says otherwise.
package rls

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// Options configure a Server.
type Options struct {
	// Headers adds RateLimit-Policy, RateLimit and (when over the limit)
	// Retry-After to every response's response_headers_to_add.
	Headers bool
}

// Server implements RateLimitServiceServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc     *service.Service
	headers bool
	pool    sync.Pool // of *call
	limits  sync.Map  // limitKey → *rlsv3.RateLimitResponse_RateLimit
	nlimits atomic.Int64
	// What shouldRateLimitHandler hands the server's interceptors, made
	// once rather than on every call.
	info  grpc.UnaryServerInfo
	unary grpc.UnaryHandler
}

// New returns a Server deciding with svc.
func New(svc *service.Service, opts Options) *Server {
	s := &Server{svc: svc, headers: opts.Headers}
	s.pool.New = func() any { return new(call) }
	s.info = grpc.UnaryServerInfo{Server: s, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	s.unary = func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	}
	return s
}

// Register registers the rate limit service on g, with the decoding of
// requests described by the package documentation (Errors).
func (s *Server) Register(g *grpc.Server) {
	g.RegisterService(&serviceDesc, s)
}

// serviceDesc is rlsv3.RateLimitService_ServiceDesc with its own handler:
// the generated one lets gRPC decode the request, and gRPC answers a
// request it cannot decode INTERNAL — a proto3 string that is not valid
// UTF-8 among them, which is the client's error, not the server's.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimitHandler}},
	Metadata:    rlsv3.RateLimitService_ServiceDesc.Metadata,
}

// shouldRateLimitHandler decodes the request itself, so that a request
// that is well-formed protobuf but not a valid RateLimitRequest is
// INVALID_ARGUMENT. It hands gRPC a *request to decode into. The codec of
// ServerOption decodes the RateLimitRequest in that one pass and keeps
// the error, if any; any other codec sees an Empty, which keeps every
// field as unknown bytes and checks nothing but the wire format, and
// those bytes are then decoded as the RateLimitRequest. Either way, what
// is not protobuf at all is gRPC's own error (INTERNAL).
func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	growStack()
	r := new(request)
	if err := dec(r); err != nil {
		return nil, err
	}
	in, err := r.get()
	if err != nil {
		return nil, err
	}
	s := srv.(*Server)
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, in)
	}
	return interceptor(ctx, in, &s.info, s.unary)
}

// growStack grows the calling goroutine's stack, in one step, to have
// stackReserve bytes free below its caller.
//
// gRPC runs each call on a new goroutine, which starts with a small stack
// (the runtime sizes it by the average stack in use at the last GC, and
// the many idle goroutines of a loaded server keep that at its 2 KiB
// minimum). Decoding, deciding and answering need more, so the stack would
// double twice during the call, each time copying every frame on it and
// adjusting their pointers: 10–15 % of serve's CPU under load. Growing it
// here, while the stack is shallow, does it once, and halves that cost;
// the runtime frees the grown stack to its per-P cache when the goroutine
// ends. The frame only has to exist: the runtime checks its size on
// entry; the array is never touched, so nothing is zeroed.
//
//go:noinline
func growStack() {
	if stackNever {
		var b [stackReserve]byte
		keep(b[:])
	}
}

// stackNever is false; the compiler cannot tell, so growStack keeps its
// frame.
var stackNever bool

//go:noinline
func keep([]byte) {}

// stackReserve is the stack growStack makes room for: what a call uses
// below the handler, with margin (under load, a profile with 4 KiB shows
// no growth below growStack). With what is above it, the goroutine's
// stack becomes 8 KiB; one that already has the room (the runtime's
// starting size follows the stacks it finds at GC) does not grow.
const stackReserve = 4 << 10

// decodeRequest decodes a RateLimitRequest from its protobuf encoding as
// the gRPC service does; a request that does not decode (invalid UTF-8 in
// a string, a malformed field) is a gRPC INVALID_ARGUMENT status, naming
// the string that is not UTF-8.
func decodeRequest(b []byte) (*rlsv3.RateLimitRequest, error) {
	in := new(rlsv3.RateLimitRequest)
	if err := proto.Unmarshal(b, in); err != nil {
		return nil, decodeError(b, err)
	}
	return in, nil
}

// decodeError is the INVALID_ARGUMENT status for err, the error of
// decoding b as a RateLimitRequest, naming the string that is not UTF-8
// if that is why.
func decodeError(b []byte, err error) error {
	msg := err.Error()
	if f := invalidUTF8(b, (*rlsv3.RateLimitRequest)(nil).ProtoReflect().Descriptor(), ""); f != "" {
		msg = "field " + f + " is not valid UTF-8"
	}
	return status.Error(codes.InvalidArgument, "decoding the RateLimitRequest: "+msg)
}

// invalidUTF8 returns the path (descriptors[0].entries[1].value) of the
// first string field of message md encoded in b that is not valid UTF-8,
// or "". It explains an error of proto.Unmarshal, which does not name the
// field; it stops at anything malformed.
func invalidUTF8(b []byte, md protoreflect.MessageDescriptor, path string) string {
	var seen map[protowire.Number]int // occurrences of repeated fields
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		name := string(fd.Name())
		if path != "" {
			name = path + "." + name
		}
		if fd.IsList() {
			if seen == nil {
				seen = make(map[protowire.Number]int)
			}
			name += "[" + strconv.Itoa(seen[num]) + "]"
			seen[num]++
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name
			}
		case protoreflect.MessageKind:
			if f := invalidUTF8(v, fd.Message(), name); f != "" {
				return f
			}
		}
	}
	return ""
}

// call holds the buffers one request reuses.
type call struct {
	req     service.Request
	resp    service.Response
	entries []rules.Entry
	inline  []service.InlineLimit
	policy  []byte
	limit   []byte
	settling
}

// ShouldRateLimit implements the RLS v3 API. A request denied because the
// store is unavailable and its limits fail closed is answered OVER_LIMIT
// (see the package documentation).
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	c := s.pool.Get().(*call)
	defer s.pool.Put(c)
	if err := s.decide(ctx, c, in); err != nil && !failedClosed(err) {
		return nil, grpcError(ctx, err)
	}
	return s.response(c), nil
}

// ShouldRateLimitJSON decides in as ShouldRateLimit does, for the JSON
// endpoint (POST /json), but returns the service's errors as they are: an invalid request wraps
// service.ErrInvalidRequest, and a request the store could not decide,
// failed-closed limits included, is a *service.UnavailableError.
func (s *Server) ShouldRateLimitJSON(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	c := s.pool.Get().(*call)
	defer s.pool.Put(c)
	if err := s.decide(ctx, c, in); err != nil {
		return nil, err
	}
	return s.response(c), nil
}

func (s *Server) decide(ctx context.Context, c *call, in *rlsv3.RateLimitRequest) error {
	c.keeps = s.svc.KeepsReservations()
	if err := c.convert(in); err != nil {
		return err
	}
	s.settle(ctx, c)
	var err error
	if len(c.req.Descriptors) > 0 {
		err = s.svc.Decide(ctx, &c.req, &c.resp)
		if notKept(err) {
			err = nil
		}
	} else {
		c.resp.Code, c.resp.Statuses = service.OK, c.resp.Statuses[:0]
	}
	for _, i := range c.settledAt { // a settled descriptor is answered OK
		c.resp.Statuses = slices.Insert(c.resp.Statuses, i, service.Status{})
	}
	return err
}

// failedClosed reports whether err is a request denied by limits that
// failed closed.
func failedClosed(err error) bool {
	var ue *service.UnavailableError
	return errors.As(err, &ue) && ue.FailedClosed()
}

// grpcError returns the gRPC status of a failed decision.
func grpcError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, service.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

// convert fills c.req from in in the service's terms (see the package
// documentation). It checks the counts before it copies anything, with the
// service's own checks; Service.Decide validates the rest.
func (c *call) convert(in *rlsv3.RateLimitRequest) error {
	descs := in.GetDescriptors()
	if err := service.CheckDescriptorCount(len(descs)); err != nil {
		return err
	}
	entries, inline := 0, 0
	for i, d := range descs {
		if err := service.CheckEntryCount(i, len(d.GetEntries())); err != nil {
			return err
		}
		entries += len(d.GetEntries())
		if d.GetLimit() != nil {
			inline++
		}
	}
	// Sized up front, so that the descriptors' sub-slices never move.
	c.entries = slices.Grow(c.entries[:0], entries)
	c.inline = slices.Grow(c.inline[:0], inline)
	c.req.Domain = in.GetDomain()
	c.req.Descriptors = c.req.Descriptors[:0]
	c.req.Reservation = ""
	c.settling.reset()
	cost := int64(max(in.GetHitsAddend(), 1))
	for i, d := range descs {
		start := len(c.entries)
		marked := ""
		for _, e := range d.GetEntries() {
			re := rules.Entry{Key: e.GetKey(), Value: e.GetValue()}
			if ok, err := c.settling.mark(i, re); err != nil {
				return err
			} else if ok {
				if marked != "" && marked != re.Key {
					return invalid(i, "has both %s and %s", ReserveKey, SettleKey)
				}
				marked = re.Key
				continue
			}
			c.entries = append(c.entries, re)
		}
		if marked != "" && len(c.entries) == start {
			return invalid(i, "has no entries besides %s", marked)
		}
		sd := service.Descriptor{Entries: c.entries[start:len(c.entries):len(c.entries)], Cost: cost}
		if h := d.GetHitsAddend(); h != nil {
			// Saturated: anything past MaxInt64 is refused by Validate
			// as beyond MaxQuota all the same.
			sd.Cost = int64(min(h.GetValue(), math.MaxInt64))
		}
		if d.GetIsNegativeHits() {
			sd.Cost = -sd.Cost
		}
		if l := d.GetLimit(); l != nil {
			c.inline = append(c.inline, service.InlineLimit{
				RequestsPerUnit: l.GetRequestsPerUnit(),
				Unit:            rules.Unit(l.GetUnit()),
				Multiplier:      l.GetUnitMultiplier().GetValue(),
			})
			sd.InlineLimit = &c.inline[len(c.inline)-1]
		}
		switch marked {
		case SettleKey:
			if err := c.settling.settled(i, &sd); err != nil {
				return err
			}
			continue
		case ReserveKey:
			sd.Tag = descriptorTag(sd.Entries)
			c.reserveTags = append(c.reserveTags, sd.Tag)
		}
		c.req.Descriptors = append(c.req.Descriptors, sd)
	}
	if c.reserveID != "" && c.keeps {
		c.req.Reservation = reservationID(c.req.Domain, c.reserveID, c.reserveTags)
	}
	return nil
}

func (s *Server) response(c *call) *rlsv3.RateLimitResponse {
	out, ptrs, sts := newResponse(len(c.resp.Statuses))
	out.OverallCode = code(c.resp.Code)
	for i := range c.resp.Statuses {
		st := &c.resp.Statuses[i]
		a := &sts[i]
		ds := &a.status
		ds.Code = code(st.Code)
		switch {
		case st.Rule != nil:
			ds.CurrentLimit = s.currentLimit(st.Rule, st.Unit)
			if !st.RemainingKnown() {
				// fail_open: the store was not asked, so nothing is known
				// of the key. limit_remaining cannot say so (0 would read
				// as spent): it states the rule's limit, and
				// duration_until_reset is left out.
				ds.LimitRemaining = clampU32(st.Decision.Capacity)
				break
			}
			ds.LimitRemaining = clampU32(st.Decision.Remaining)
			d := st.Decision.ResetAfter
			a.reset.Seconds, a.reset.Nanos = int64(d/time.Second), int32(d%time.Second)
			ds.DurationUntilReset = &a.reset
		case st.Unlimited:
			ds.LimitRemaining = math.MaxUint32
		}
		ptrs[i] = ds
	}
	out.Statuses = ptrs
	out.DynamicMetadata = quotaMetadata(c.req.Domain, c.resp.Statuses)
	if s.headers {
		out.ResponseHeadersToAdd = c.headers()
	}
	return out
}

// quotaMetadata returns the dynamic_metadata of a response whose statuses
// are sts (see quota_mode in the package documentation), or nil when no
// quota-mode limit decided.
func quotaMetadata(domain string, sts []service.Status) *structpb.Struct {
	quota := false
	var over []*structpb.Value
	for i := range sts {
		quota = quota || sts[i].Quota
		if sts[i].QuotaExceeded {
			over = append(over, structpb.NewNumberValue(float64(i)))
		}
	}
	if !quota {
		return nil
	}
	f := map[string]*structpb.Value{
		"domain":           structpb.NewStringValue(domain),
		"quotaModeEnabled": structpb.NewBoolValue(true),
	}
	if len(over) > 0 {
		f["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: over})
	}
	return &structpb.Struct{Fields: f}
}

// statusAlloc allocates a descriptor's status and its duration together.
type statusAlloc struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	reset  durationpb.Duration
}

// oneStatus is a response of one descriptor, the common case, in one
// allocation.
type oneStatus struct {
	resp rlsv3.RateLimitResponse
	ptrs [1]*rlsv3.RateLimitResponse_DescriptorStatus
	sts  [1]statusAlloc
}

// newResponse returns a response and the slices for its n statuses: one
// allocation for one descriptor, three for more (not one per status). The
// response is the caller's; gRPC marshals it after the handler returns.
func newResponse(n int) (*rlsv3.RateLimitResponse, []*rlsv3.RateLimitResponse_DescriptorStatus, []statusAlloc) {
	if n == 1 {
		a := new(oneStatus)
		return &a.resp, a.ptrs[:], a.sts[:]
	}
	return new(rlsv3.RateLimitResponse), make([]*rlsv3.RateLimitResponse_DescriptorStatus, n), make([]statusAlloc, n)
}

// currentLimit returns the current_limit message of a rule, made once per
// rule and shared by every response: a message that is only read may be
// marshalled by many goroutines at once. The cache is emptied when it grows
// past maxLimits (rules replaced by reloads, overrides and inline limits).
func (s *Server) currentLimit(r *ratelimit.Rule, u rules.Unit) *rlsv3.RateLimitResponse_RateLimit {
	k := limitKey{r, u}
	if m, ok := s.limits.Load(k); ok {
		return m.(*rlsv3.RateLimitResponse_RateLimit)
	}
	m := &rlsv3.RateLimitResponse_RateLimit{
		Name:            r.Name,
		RequestsPerUnit: clampU32(r.Quota),
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(u),
	}
	if s.nlimits.Add(1) > maxLimits {
		s.limits.Clear()
		s.nlimits.Store(0)
	}
	s.limits.Store(k, m)
	return m
}

type limitKey struct {
	rule *ratelimit.Rule
	unit rules.Unit
}

const maxLimits = 1 << 14

// headers returns RateLimit-Policy and RateLimit for every decided limit,
// and Retry-After when the request is over the limit.
func (c *call) headers() []*corev3.HeaderValue {
	var retry int64
	c.policy, c.limit, retry = c.resp.AppendFields(c.policy[:0], c.limit[:0])
	if len(c.policy) == 0 {
		return nil
	}
	h := []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: string(c.policy)}}
	if len(c.limit) > 0 { // none when every limit failed open
		h = append(h, &corev3.HeaderValue{Key: "RateLimit", Value: string(c.limit)})
	}
	if retry > 0 {
		h = append(h, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(retry, 10)})
	}
	return h
}

func code(c service.Code) rlsv3.RateLimitResponse_Code {
	if c == service.OverLimit {
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return rlsv3.RateLimitResponse_OK
}

func clampU32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}
