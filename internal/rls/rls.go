// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService) over gRPC on top of the
// decision service, with the generated types of go-control-plane.
//
// Supported: domain; descriptors with entries, a limit override
// (requests_per_unit, unit, unit_multiplier), per-descriptor hits_addend
// (0 checks only) and is_negative_hits (a refund); the request's
// hits_addend (0 counts as 1). The response carries overall_code and one
// status per descriptor with code, current_limit (name, requests_per_unit,
// unit), limit_remaining and duration_until_reset, and, when enabled,
// RateLimit-Policy, RateLimit and Retry-After in response_headers_to_add.
// Not produced: request_headers_to_add, raw_body, dynamic_metadata, quota.
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

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

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
}

// New returns a Server deciding with svc.
func New(svc *service.Service, opts Options) *Server {
	s := &Server{svc: svc, headers: opts.Headers}
	s.pool.New = func() any { return new(call) }
	return s
}

// Register registers the rate limit service on g.
func (s *Server) Register(g *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
}

// call holds the buffers one request reuses.
type call struct {
	req       service.Request
	resp      service.Response
	entries   []rules.Entry
	overrides []service.Override
	policy    []byte
	limit     []byte
}

// ShouldRateLimit implements the RLS v3 API.
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	c := s.pool.Get().(*call)
	defer s.pool.Put(c)
	if err := c.convert(in); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.svc.ShouldRateLimit(ctx, &c.req, &c.resp); err != nil {
		if errors.Is(err, service.ErrInvalidRequest) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return s.response(c), nil
}

// convert fills c.req from in, checking the counts before copying. The
// domain and the entries are validated by Service.ShouldRateLimit, as for
// every API.
func (c *call) convert(in *rlsv3.RateLimitRequest) error {
	descs := in.GetDescriptors()
	if err := rules.CheckDescriptorCount(len(descs)); err != nil {
		return err
	}
	entries, overrides := 0, 0
	for i, d := range descs {
		if err := rules.CheckEntryCount(i, len(d.GetEntries())); err != nil {
			return err
		}
		entries += len(d.GetEntries())
		if d.GetLimit() != nil {
			overrides++
		}
	}
	// Sized up front, so that the descriptors' sub-slices never move.
	c.entries = slices.Grow(c.entries[:0], entries)
	c.overrides = slices.Grow(c.overrides[:0], overrides)
	c.req.Domain = in.GetDomain()
	c.req.Hits = in.GetHitsAddend()
	c.req.Descriptors = c.req.Descriptors[:0]
	for _, d := range descs {
		start := len(c.entries)
		for _, e := range d.GetEntries() {
			c.entries = append(c.entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		sd := service.Descriptor{Entries: c.entries[start:len(c.entries):len(c.entries)], Refund: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			sd.Hits, sd.HasHits = h.GetValue(), true
		}
		if l := d.GetLimit(); l != nil {
			c.overrides = append(c.overrides, service.Override{
				RequestsPerUnit: l.GetRequestsPerUnit(),
				Unit:            rules.Unit(l.GetUnit()),
				Multiplier:      l.GetUnitMultiplier().GetValue(),
			})
			sd.Override = &c.overrides[len(c.overrides)-1]
		}
		c.req.Descriptors = append(c.req.Descriptors, sd)
	}
	return nil
}

func (s *Server) response(c *call) *rlsv3.RateLimitResponse {
	out := &rlsv3.RateLimitResponse{
		OverallCode: code(c.resp.Code),
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(c.resp.Statuses)),
	}
	for i := range c.resp.Statuses {
		st := &c.resp.Statuses[i]
		a := new(statusAlloc)
		ds := &a.status
		ds.Code = code(st.Code)
		switch {
		case st.Rule != nil:
			ds.CurrentLimit = s.currentLimit(st.Rule, st.Unit)
			ds.LimitRemaining = clampU32(st.Decision.Remaining)
			d := st.Decision.ResetAfter
			a.reset.Seconds, a.reset.Nanos = int64(d/time.Second), int32(d%time.Second)
			ds.DurationUntilReset = &a.reset
		case st.Unlimited:
			ds.LimitRemaining = math.MaxUint32
		}
		out.Statuses[i] = ds
	}
	if s.headers {
		out.ResponseHeadersToAdd = c.headers()
	}
	return out
}

// statusAlloc allocates a descriptor's status and its duration together.
type statusAlloc struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	reset  durationpb.Duration
}

// currentLimit returns the current_limit message of a rule, made once per
// rule and shared by every response: a message that is only read may be
// marshalled by many goroutines at once. The cache is emptied when it grows
// past maxLimits (rules replaced by reloads and overrides).
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
	h := []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: string(c.policy)},
		{Key: "RateLimit", Value: string(c.limit)},
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
