// Package reserve is serve's reservation API over gRPC:
// sluice.v1.RateLimitService (proto/sluice/v1/ratelimit.proto), whose
// Reserve tells a caller in any language how long to wait before it sends,
// and whose Settle tells the actual cost of a reservation kept with
// settle. It only translates: the decisions are internal/service's
// Service.Reserve (and ratelimit.Rule.Reserving for the arithmetic) and
// Service.Settle, which POST /v1/reserve and /v1/settle
// (internal/httpapi) call too, so both transports answer alike.
package reserve

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// ServiceName is the gRPC name of the service; ReserveMethod and
// SettleMethod the full names of its methods.
const (
	ServiceName   = "sluice.v1.RateLimitService"
	ReserveMethod = "/" + ServiceName + "/Reserve"
	SettleMethod  = "/" + ServiceName + "/Settle"
)

// Server answers sluice.v1.RateLimitService from a service.Service.
type Server struct {
	svc *service.Service
}

// New returns a Server deciding with svc.
func New(svc *service.Service) *Server { return &Server{svc: svc} }

// Register registers s as sluice.v1.RateLimitService on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { g.RegisterService(&serviceDesc, s) }

// serviceDesc is sluice.v1.RateLimitService's descriptor, written by hand
// as internal/coord's is (no gRPC plugin to pin): one unary method whose
// messages are sluicev1's. grpc_test.go checks it against the compiled
// .proto; its Metadata, the .proto's path, is what reflection reports.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Reserve", Handler: unary(ReserveMethod, (*Server).Reserve)},
		{MethodName: "Settle", Handler: unary(SettleMethod, (*Server).Settle)},
	},
	Metadata: "sluice/v1/ratelimit.proto",
}

// unary is the handler of a unary method that decodes an In and calls f.
func unary[In any, PIn interface {
	*In
	proto.Message
}, Out any](method string, f func(*Server, context.Context, PIn) (Out, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := PIn(new(In))
		if err := dec(in); err != nil {
			// gRPC calls a request it cannot decode INTERNAL; it is
			// the caller's (a string that is not UTF-8, not protobuf).
			if st := status.Convert(err); st.Code() == codes.Internal {
				return nil, status.Error(codes.InvalidArgument, st.Message())
			}
			return nil, err
		}
		s := srv.(*Server)
		if ic == nil {
			return f(s, ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, func(ctx context.Context, req any) (any, error) {
			return f(s, ctx, req.(PIn))
		})
	}
}

// Reserve answers one reservation.
func (s *Server) Reserve(ctx context.Context, in *sluicev1.ReserveRequest) (*sluicev1.ReserveResponse, error) {
	req, err := convert(in)
	if err != nil {
		return nil, err
	}
	mw := in.GetMaxWait()
	if mw == nil {
		return nil, status.Error(codes.InvalidArgument, "max_wait is required: the longest wait the caller accepts (zero: none)")
	}
	if err := mw.CheckValid(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "max_wait: %v", err)
	}
	if err := settleFields(in, req); err != nil {
		return nil, err
	}
	var resp service.Response
	res, err := s.svc.Reserve(ctx, req, mw.AsDuration(), &resp)
	if err != nil {
		return nil, grpcError(err)
	}
	out := answer(&resp, &res)
	out.Reservation = resp.Reservation
	return out, nil
}

// settleFields reads settle and settle_within into req.
func settleFields(in *sluicev1.ReserveRequest, req *service.Request) error {
	if !in.GetSettle() {
		if in.GetSettleWithin() != nil {
			return status.Error(codes.InvalidArgument, "settle_within without settle")
		}
		return nil
	}
	if sw := in.GetSettleWithin(); sw != nil {
		if err := sw.CheckValid(); err != nil {
			return status.Errorf(codes.InvalidArgument, "settle_within: %v", err)
		}
		if d := sw.AsDuration(); d < time.Millisecond || d > ratelimit.MaxReservationTTL {
			return status.Errorf(codes.InvalidArgument, "settle_within %v out of range [1ms, %v]", d, ratelimit.MaxReservationTTL)
		}
		req.ReservationTTL = sw.AsDuration()
	}
	req.Reservation = ratelimit.NewReservationID()
	return nil
}

// Settle settles one reservation: NOT_FOUND for one never kept or
// expired; already_settled for a repeat.
func (s *Server) Settle(ctx context.Context, in *sluicev1.SettleRequest) (*sluicev1.SettleResponse, error) {
	req := &service.SettleRequest{Reservation: in.GetReservation()}
	ds := in.GetDescriptors()
	top := in.Cost != nil || len(in.GetCosts()) > 0
	switch {
	case top == (len(ds) > 0):
		return nil, status.Error(codes.InvalidArgument, "give either cost or costs (every descriptor's), or descriptors (each descriptor's, in the reserved request's order)")
	case len(ds) > rules.MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors; at most %d", len(ds), rules.MaxDescriptors)
	case top:
		ds = []*sluicev1.SettleDescriptor{{Cost: in.Cost, Costs: in.GetCosts()}}
	}
	units := false
	for i, d := range ds {
		switch {
		case d.Cost == nil && len(d.GetCosts()) == 0:
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: give cost, costs or both", i)
		case (d.Cost != nil) != (ds[0].Cost != nil):
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: give cost for every descriptor or for none", i)
		case d.Cost != nil:
			req.Costs = append(req.Costs, d.GetCost())
		}
		req.Units = append(req.Units, unitCosts(d.GetCosts()))
		units = units || len(d.GetCosts()) > 0
	}
	if !units {
		req.Units = nil
	}
	out, err := s.svc.Settle(ctx, req)
	switch {
	case err == nil:
		return &sluicev1.SettleResponse{Settled: true, Limits: int64(out.Limits), Refunded: out.Refunded, Charged: out.Charged}, nil
	case errors.Is(err, ratelimit.ErrAlreadySettled):
		return &sluicev1.SettleResponse{AlreadySettled: true}, nil
	case errors.Is(err, ratelimit.ErrUnknownReservation):
		return nil, status.Errorf(codes.NotFound, "reservation %s: never kept, or expired (it stays charged at its estimate)", req.Reservation)
	}
	return nil, grpcError(err)
}

// convert checks the counts before it copies anything, with the
// service's own checks (the rest is Service.Reserve's Validate).
func convert(in *sluicev1.ReserveRequest) (*service.Request, error) {
	ds := in.GetDescriptors()
	if err := service.CheckDescriptorCount(len(ds)); err != nil {
		return nil, grpcError(err)
	}
	n := 0
	for i, d := range ds {
		if err := service.CheckEntryCount(i, len(d.GetEntries())); err != nil {
			return nil, grpcError(err)
		}
		n += len(d.GetEntries())
		nc := len(d.GetCosts())
		if nc == 0 {
			nc = len(in.GetCosts())
		}
		if err := service.CheckCostCount(i, nc); err != nil {
			return nil, grpcError(err)
		}
	}
	cost := int64(1)
	if in.Cost != nil {
		cost = in.GetCost()
	}
	costs := unitCosts(in.GetCosts())
	entries := make([]rules.Entry, 0, n)
	req := &service.Request{Domain: in.GetDomain(), Descriptors: make([]service.Descriptor, len(ds))}
	for i, d := range ds {
		start := len(entries)
		for _, e := range d.GetEntries() {
			entries = append(entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		req.Descriptors[i] = service.Descriptor{Entries: entries[start:len(entries):len(entries)], Cost: cost, Costs: costs}
		if d.Cost != nil {
			req.Descriptors[i].Cost = d.GetCost()
		}
		if len(d.GetCosts()) > 0 {
			req.Descriptors[i].Costs = unitCosts(d.GetCosts())
		}
	}
	return req, nil
}

// unitCosts returns the costs of a map in the order of their units, so
// that the first of several invalid units named in an error is always
// the same.
func unitCosts(m map[string]int64) []service.UnitCost {
	if len(m) == 0 {
		return nil
	}
	cs := make([]service.UnitCost, 0, len(m))
	for u, c := range m {
		cs = append(cs, service.UnitCost{Unit: u, Cost: c})
	}
	slices.SortFunc(cs, func(a, b service.UnitCost) int { return strings.Compare(a.Unit, b.Unit) })
	return cs
}

// answer is the response of a decided reservation.
func answer(resp *service.Response, res *service.Reservation) *sluicev1.ReserveResponse {
	out := &sluicev1.ReserveResponse{Allowed: resp.Code == service.OK, Descriptors: make([]*sluicev1.ReserveStatus, len(resp.Statuses))}
	if out.Allowed {
		out.Wait = durationpb.New(res.Wait)
	}
	var retry time.Duration
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		ps := &sluicev1.ReserveStatus{Allowed: st.Code == service.OK, Reason: ratelimit.ReasonOK.String()}
		if i < len(res.Waits) {
			ps.Wait = durationpb.New(res.Waits[i])
		}
		switch {
		case st.Rule != nil:
			d := &st.Decision
			ps.Matched, ps.Rule, ps.Limit, ps.Reason = true, d.Rule, d.Capacity, d.Reason.String()
			ps.Shadow, ps.QuotaMode, ps.QuotaExceeded = st.Shadow, st.Quota, st.QuotaExceeded
			ps.CostUnit = st.CostUnit()
			if st.RemainingKnown() {
				ps.Remaining = new(max(d.Remaining, 0))
				ps.ResetAfter = durationpb.New(d.ResetAfter)
			}
			if !d.Allowed && d.RetryAfter != ratelimit.Never {
				ps.RetryAfter = durationpb.New(d.RetryAfter)
			}
			if st.Code == service.OverLimit && retry >= 0 {
				if d.RetryAfter == ratelimit.Never {
					retry = -1 // never: no retry_after
				} else {
					retry = max(retry, d.RetryAfter)
				}
			}
		case st.Unlimited:
			ps.Matched, ps.Unlimited = true, true
			if st.Spec != nil {
				ps.Rule = st.Spec.Name
			}
		}
		out.Descriptors[i] = ps
	}
	if !out.Allowed && retry > 0 {
		out.RetryAfter = durationpb.New(retry)
	}
	return out
}

// grpcError is the status of an error of Service.Reserve or Settle: the request's
// fault, the store's (never a denial), or the call's deadline.
func grpcError(err error) error {
	var ue *service.UnavailableError
	switch {
	case errors.Is(err, service.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.As(err, &ue):
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
