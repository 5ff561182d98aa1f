package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
)

// Options configure a Server. Store and at least one Policy are required.
type Options struct {
	Store    ratelimit.Store
	Policies []Policy
	// Shadow decides and reports (OnDecision) but never refuses.
	Shadow bool
	// OnDecision, if set, is called after each decision with the
	// decisions of the policies that applied (nil on a Store error), the
	// Store's error, and whether the call is (or in shadow mode would be)
	// denied.
	OnDecision func(ctx context.Context, fullMethod string, ds []ratelimit.Decision, err error, denied bool)
	// ErrorRetryAfter is the RetryInfo delay of the UNAVAILABLE answered
	// when the Store returns an error; default one second.
	ErrorRetryAfter time.Duration
}

// Server holds the server interceptors. It is safe for concurrent use.
type Server struct {
	cfg Options // cfg.Policies is the Server's own copy
}

// NewServer returns a Server for cfg, or an error if cfg is incomplete or a
// rule is invalid.
func NewServer(cfg Options) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("grpclimit: Options.Store is nil")
	}
	if len(cfg.Policies) == 0 {
		return nil, errors.New("grpclimit: Options.Policies is empty")
	}
	if cfg.ErrorRetryAfter <= 0 {
		cfg.ErrorRetryAfter = time.Second
	}
	names := make(map[string]bool)
	for i, l := range cfg.Policies {
		// A nameless policy would be reported as "" in QuotaFailure
		// details and metrics: almost surely a forgotten field.
		if l.Rule.Name == "" {
			return nil, fmt.Errorf("grpclimit: policy %d: Policy.Rule.Name is empty; it names the policy in QuotaFailure details", i)
		}
		if err := l.Rule.Validate(); err != nil {
			return nil, fmt.Errorf("grpclimit: policy %d: %w", i, err)
		}
		for j, k := range l.Keys {
			if k.err != nil {
				return nil, fmt.Errorf("grpclimit: policy %q: Policy.Keys[%d]: %w", l.Rule.Name, j, k.err)
			}
		}
		if names[l.Rule.Name] {
			return nil, fmt.Errorf("grpclimit: two policies are named %q", l.Rule.Name)
		}
		names[l.Rule.Name] = true
		for j, k := range l.Keys {
			if k.Append == nil {
				return nil, fmt.Errorf("grpclimit: policy %q: key %d (%q) has no Append function", l.Rule.Name, j, k.Scope)
			}
		}
	}
	cfg.Policies = append([]Policy(nil), cfg.Policies...)
	return &Server{cfg: cfg}, nil
}

// UnaryInterceptor returns the unary server interceptor.
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := s.decide(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor returns the stream server interceptor; it decides once
// when the stream starts.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := s.decide(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// decide returns the status error refusing the call, or nil.
func (s *Server) decide(ctx context.Context, method string) error {
	var (
		itemsBuf [4]ratelimit.Item
		dsBuf    [4]ratelimit.Decision
		idxBuf   [4]int
		buf      [128]byte
	)
	items, idx := itemsBuf[:0], idxBuf[:0]
	for i := range s.cfg.Policies {
		l := &s.cfg.Policies[i]
		b, ok := admit.AppendKey(buf[:0], l.Rule.Name, len(l.Keys), func(dst []byte, j int) ([]byte, bool) {
			return l.Keys[j].Append(dst, ctx, method)
		})
		if !ok {
			continue
		}
		cost := int64(1)
		if l.Cost != nil {
			cost = max(0, l.Cost(ctx, method))
		}
		items = append(items, ratelimit.Item{Key: string(b), Rule: &l.Rule, Cost: cost})
		idx = append(idx, i)
	}
	if len(items) == 0 {
		return nil
	}
	ds, v := admit.Decide(ctx, s.cfg.Store, dsBuf[:0], items)
	if v.Err != nil {
		s.report(ctx, method, nil, v.Err, true)
		if s.cfg.Shadow {
			return nil
		}
		return unavailable(s.cfg.ErrorRetryAfter, "the rate limiter could not decide")
	}
	if v.Outcome == admit.Admitted {
		s.report(ctx, method, ds, nil, false)
		return nil
	}
	s.report(ctx, method, ds, nil, true)
	if s.cfg.Shadow {
		return nil
	}
	if v.Outcome == admit.Unavailable {
		return unavailable(v.RetryAfter, "the rate limiter is unavailable")
	}
	retry := v.RetryAfter
	qf := &errdetails.QuotaFailure{}
	var names []string
	for i := range ds {
		d := &ds[i]
		if d.Allowed {
			continue
		}
		l := &s.cfg.Policies[idx[i]]
		names = append(names, d.Rule)
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     scope(l),
			Description: fmt.Sprintf("quota %q allows %d units per %d s; this call costs %d and %d remain", d.Rule, l.Rule.Capacity(), limitheader.PolicyWindow(l.Rule.QuotaWindow()), items[i].Cost, max(0, d.Remaining)),
		})
	}
	st := status.New(codes.ResourceExhausted, "quota exceeded: "+strings.Join(names, ", "))
	var details []protoadapt.MessageV1
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	details = append(details, qf)
	return withDetails(st, details...)
}

func (s *Server) report(ctx context.Context, method string, ds []ratelimit.Decision, err error, denied bool) {
	if s.cfg.OnDecision != nil {
		s.cfg.OnDecision(ctx, method, ds, err, denied)
	}
}

func unavailable(retry time.Duration, msg string) error {
	return withDetails(status.New(codes.Unavailable, msg), &errdetails.RetryInfo{RetryDelay: durationpb.New(max(retry, time.Millisecond))})
}

func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if s, err := st.WithDetails(details...); err == nil {
		st = s
	}
	return st.Err()
}

func scope(l *Policy) string {
	if len(l.Keys) == 0 {
		return l.Rule.Name + ": global"
	}
	s := make([]string, len(l.Keys))
	for i, k := range l.Keys {
		s[i] = k.Scope
	}
	return l.Rule.Name + ": " + strings.Join(s, "|")
}
