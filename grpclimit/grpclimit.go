// Package grpclimit applies Sluice's limits to gRPC: server interceptors
// that refuse calls over a limit with RESOURCE_EXHAUSTED and a
// google.rpc.RetryInfo detail saying when to come back, and client
// interceptors that honour that detail.
//
// It is the one library package allowed to import gRPC (the module's
// import rules, which internal/deps checks); what it shares with httplimit,
// the HTTP edge, lives in admit (store keys and verdicts), retry (the retry
// budget and the deadline-aware wait) and limitheader (policy windows).
//
// # Server
//
// A Server decides each call (once per stream for streaming calls) against
// a Store, all policies of a call all or nothing, like httplimit's
// middleware:
//
//   - a call a quota refuses fails with codes.ResourceExhausted, a
//     RetryInfo detail (retry_delay: when the same call would be admitted)
//     and a QuotaFailure detail naming each violated policy and its scope;
//     a call whose cost exceeds a limit's capacity can never succeed and
//     gets no RetryInfo;
//   - when the Store fails closed or returns an error, the call fails with
//     codes.Unavailable and a RetryInfo — the server is overloaded, not the
//     caller over its quota.
//
// # Overload protection
//
// ProtectUnary and ProtectStream guard the calls with an adaptive.Guard:
// the priority comes from the sluice-priority metadata (trusted up to
// ProtectOptions.MaxPriority, Normal by default), and a call the Guard
// sheds fails with codes.Unavailable and a RetryInfo whose delay is
// computed from the Guard's state — overload, never RESOURCE_EXHAUSTED.
// Chain them after the rate-limit interceptors, so a call over its quota
// takes no overload capacity.
//
// # Client
//
// A Client's interceptors wait before each call while a pause is on: a
// RESOURCE_EXHAUSTED or UNAVAILABLE carrying RetryInfo starts a pause shared
// by every call through the Client. A unary call so refused is retried
// after the delay, at most MaxRetries times and within a retry budget (at
// most RetryRatio of the calls of the last RetryWindow, plus MinRetries);
// a wait longer than the call's deadline fails at once with an error that
// matches ratelimit.ErrWouldExceedDeadline and carries codes.DeadlineExceeded.
// Streams are not retried (their messages may already have been consumed);
// their refusals still start the pause.
//
// With a Throttle (adaptive.Throttle), the Client also throttles itself
// while the server is overloaded: before anything else, a call (and each
// retry) may be rejected locally, with a probability that grows as the
// server refuses more of the calls sent lately. A call so rejected fails
// at once with codes.Unavailable, a message saying it was "throttled
// locally", and an error matching ErrThrottled; nothing is sent. The
// server's own refusals (RESOURCE_EXHAUSTED, UNAVAILABLE) are returned to
// the caller as they came, after the retries.
//
// Both interceptors send the priority of the call's context (other than
// Normal) as sluice-priority metadata, unless the call sets its own.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
)

// A Key names one dimension of a policy: what picks a call's bucket.
type Key struct {
	// Scope describes the key in QuotaFailure details, e.g. "peer".
	Scope string
	// Append appends the key's value for the call to dst; ok false means
	// the policy does not apply to the call.
	Append func(dst []byte, ctx context.Context, fullMethod string) (b []byte, ok bool)

	// err is why the constructor could not make the key; NewServer
	// reports it.
	err error
}

// ByPeer keys by the IP address of the calling peer ("unknown" when the
// transport has none, as with in-memory connections).
func ByPeer() Key {
	return Key{Scope: "peer", Append: func(dst []byte, ctx context.Context, _ string) ([]byte, bool) {
		if a := peerAddr(ctx); a.IsValid() {
			return a.Unmap().AppendTo(dst), true
		}
		return append(dst, "unknown"...), true
	}}
}

// peerAddr returns the IP address of the calling peer, or the zero Addr.
func peerAddr(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}
	}
	if ta, ok := p.Addr.(*net.TCPAddr); ok {
		// What parsing ta.String() would give, without building the string.
		return ta.AddrPort().Addr()
	}
	ap, _ := netip.ParseAddrPort(p.Addr.String())
	return ap.Addr()
}

// ByMetadata keys by the first value of the incoming metadata key name (an
// API key, a tenant); the policy does not apply to calls without it. A
// store key longer than 256 bytes is replaced by its SHA-256 digest, so a
// caller cannot make the store hold values of any size.
func ByMetadata(name string) Key {
	if name == "" {
		return Key{Scope: "metadata", err: errors.New(`ByMetadata(""): the metadata name is empty`)}
	}
	name = strings.ToLower(name)
	return Key{Scope: "metadata " + name, Append: func(dst []byte, ctx context.Context, _ string) ([]byte, bool) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		if len(vs) == 0 || vs[0] == "" {
			return dst, false
		}
		return append(dst, vs[0]...), true
	}}
}

// ByMethod keys by the full method name, "/package.Service/Method".
func ByMethod() Key {
	return Key{Scope: "method", Append: func(dst []byte, _ context.Context, m string) ([]byte, bool) {
		return append(dst, m...), true
	}}
}

// A Policy is one limit a Server applies.
type Policy struct {
	// Rule is the limit; its Name must be unique within a Config.
	Rule ratelimit.Rule
	// Keys pick the bucket; none means one bucket for every call.
	Keys []Key
	// Cost is the cost of a call; nil means 1.
	Cost func(ctx context.Context, fullMethod string) int64
}

// Config configures a Server. Store and at least one Policy are required.
type Config struct {
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
	cfg Config // cfg.Policies is the Server's own copy
}

// NewServer returns a Server for cfg, or an error if cfg is incomplete or a
// rule is invalid.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("grpclimit: Config.Store is nil")
	}
	if len(cfg.Policies) == 0 {
		return nil, errors.New("grpclimit: Config.Policies is empty")
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

// RetryDelay returns the delay of the RetryInfo detail of err, if it has
// one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(0, ri.GetRetryDelay().AsDuration()), true
		}
	}
	return 0, false
}

// Client holds the client interceptors. The zero value is ready to use with
// the defaults of each field; it is safe for concurrent use and must not be
// copied after first use.
type Client struct {
	// MaxRetries bounds the retries of one unary call; 0 means 3, negative
	// means none.
	MaxRetries int
	// RetryRatio, RetryWindow and MinRetries make the retry budget:
	// retries at most RetryRatio (default 0.1) of the calls of the last
	// RetryWindow (default 10 s), plus MinRetries (default 10; negative
	// means none).
	RetryRatio  float64
	RetryWindow time.Duration
	MinRetries  int
	// MaxPause caps the pause (and the wait before a retry) that a
	// RetryInfo may ask for; 0 means 1 minute. httplimit.Client's MaxPause
	// does the same for HTTP.
	MaxPause time.Duration
	// Throttle rejects calls locally while the server is overloaded
	// (adaptive throttling); nil means off. The order is: throttle, pause,
	// call — a call the Throttle rejects fails at once instead of sitting
	// out a pause first. Every attempt, retries included, is one request
	// of the Throttle; a retry it rejects is not made and the server's
	// refusal is returned. An attempt counts as accepted when the server
	// answers with any code but RESOURCE_EXHAUSTED, UNAVAILABLE or
	// DEADLINE_EXCEEDED (INVALID_ARGUMENT or NOT_FOUND too: it did its
	// work), or the caller cancels it; a stream, when its first message
	// or its end arrives. Share one Throttle among every client of the
	// same server.
	Throttle *adaptive.Throttle
	// Concurrency bounds the unary calls in flight to the server with an
	// adaptive limit (see adaptive.Limiter) that shrinks when the server
	// slows down or answers RESOURCE_EXHAUSTED, UNAVAILABLE or
	// DEADLINE_EXCEEDED and grows back gradually; nil means no bound. Each
	// attempt holds a slot while it is in flight: its latency is then a
	// sample, an overload answer a drop, a call its caller cancelled
	// neither. A call that finds no slot (after the Limiter's queue, if it
	// has one) fails at once with codes.Unavailable and an error matching
	// adaptive.ErrOverloaded. Streams take no slot: a stream's life is not
	// a service time. Share one Limiter among every client of the same
	// server.
	Concurrency *adaptive.Limiter

	budgetOnce sync.Once
	budget     *retry.Budget

	pause retry.Pauses // one scope, "": the whole Client

	mu      sync.Mutex
	retries int64
	denied  int64
}

// ErrWouldExceedDeadline is ratelimit.ErrWouldExceedDeadline: a Client
// returns it, wrapped in a DEADLINE_EXCEEDED status, when the wait a pause
// asks for outlasts the call's deadline.
var ErrWouldExceedDeadline = ratelimit.ErrWouldExceedDeadline

// ErrThrottled is adaptive.ErrThrottled: the error of a call the Client's
// Throttle rejected locally, carried by a codes.Unavailable status whose
// message says "throttled locally". errors.Is tells it from an
// UNAVAILABLE the server sent.
var ErrThrottled = adaptive.ErrThrottled

// throttledError is a call the Throttle rejected.
type throttledError struct{ method string }

func (e throttledError) Error() string {
	return "grpclimit: " + e.method + ": " + adaptive.ErrThrottled.Error()
}
func (e throttledError) Unwrap() error { return adaptive.ErrThrottled }
func (e throttledError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// allow reports whether the Throttle, if any, lets a call through.
func (c *Client) allow() bool { return c.Throttle == nil || c.Throttle.Allow() }

// settle records the outcome err of a call the Throttle let through (see
// Client.Throttle).
func (c *Client) settle(err error) {
	if c.Throttle == nil {
		return
	}
	if err == nil || err == io.EOF {
		c.Throttle.Accept()
		return
	}
	switch status.Code(err) {
	case codes.ResourceExhausted, codes.Unavailable, codes.DeadlineExceeded:
	default:
		c.Throttle.Accept()
	}
}

// concurrencyError is a call that found no slot of the Client's
// Concurrency limiter: UNAVAILABLE, matching adaptive.ErrOverloaded.
type concurrencyError struct {
	method string
	err    error
}

func (e concurrencyError) Error() string {
	return "grpclimit: " + e.method + ": too many calls in flight to the server: " + e.err.Error()
}
func (e concurrencyError) Unwrap() error { return e.err }
func (e concurrencyError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// deadlineError is a pause that outlasts the deadline: it wraps
// retry.Wait's refusal, so it matches ErrWouldExceedDeadline and
// context.DeadlineExceeded, and gRPC sees it as codes.DeadlineExceeded.
type deadlineError struct{ err *retry.DeadlineError }

func (e deadlineError) Error() string {
	return "grpclimit: the server asks for " + e.err.Error()
}
func (e deadlineError) Unwrap() error { return e.err }
func (e deadlineError) GRPCStatus() *status.Status {
	return status.New(codes.DeadlineExceeded, e.Error())
}

// UnaryInterceptor returns the unary client interceptor.
func (c *Client) UnaryInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx = withOutgoingPriority(ctx)
		maxRetries := c.MaxRetries
		if maxRetries == 0 {
			maxRetries = 3
		}
		c.countCall()
		if !c.allow() {
			return throttledError{method}
		}
		for attempt := 0; ; attempt++ {
			if err := c.waitPause(ctx); err != nil {
				c.settle(err)
				return err
			}
			var permit adaptive.Permit
			if c.Concurrency != nil {
				var err error
				if permit, err = c.Concurrency.Acquire(ctx); err != nil {
					c.settle(err)
					return concurrencyError{method, err}
				}
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			endPermit(ctx, &permit, err)
			c.settle(err)
			// The retry waits in waitPause for the pause observe has just
			// extended, failing at once if it outlasts the deadline.
			if !c.observe(err) || attempt >= maxRetries || !c.allowRetry() {
				return err
			}
		}
	}
}

// StreamInterceptor returns the stream client interceptor: it waits for a
// pause before opening a stream and starts one when the stream ends with a
// refusal carrying RetryInfo. It does not retry. With a Throttle, a
// stream is one request, accepted (or not) by its first message or its
// end.
func (c *Client) StreamInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx = withOutgoingPriority(ctx)
		if !c.allow() {
			return nil, throttledError{method}
		}
		if err := c.waitPause(ctx); err != nil {
			c.settle(err)
			return nil, err
		}
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			c.observe(err)
			c.settle(err)
			return nil, err
		}
		return &observedStream{ClientStream: cs, c: c, unsettled: c.Throttle != nil}, nil
	}
}

type observedStream struct {
	grpc.ClientStream
	c *Client
	// unsettled is true until the stream's outcome is given to the
	// Throttle. RecvMsg is not called concurrently (gRPC's rule), so it
	// needs no lock.
	unsettled bool
}

func (s *observedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.c.observe(err)
	}
	if s.unsettled {
		s.unsettled = false
		s.c.settle(err)
	}
	return err
}

// observe starts or extends the pause when err is a refusal with
// RetryInfo, and reports whether it was one.
func (c *Client) observe(err error) bool {
	if err == nil {
		return false
	}
	code := status.Code(err)
	if code != codes.ResourceExhausted && code != codes.Unavailable {
		return false
	}
	d, ok := RetryDelay(err)
	if !ok {
		return false
	}
	maxPause := c.MaxPause
	if maxPause <= 0 {
		maxPause = time.Minute
	}
	d = min(d, maxPause)
	now := time.Now()
	c.pause.Extend("", now, now.Add(d))
	return true
}

// waitPause waits while a pause is on, failing at once if it outlasts the
// deadline.
func (c *Client) waitPause(ctx context.Context) error {
	var now time.Time
	d := c.pause.Left("", func() time.Time { now = time.Now(); return now })
	if d <= 0 {
		return nil
	}
	if err := retry.Wait(ctx, now, d); err != nil {
		return waitError(err)
	}
	return nil
}

// waitError returns the error of a call whose wait failed with err (from
// retry.Wait): a DEADLINE_EXCEEDED deadlineError when the wait would have
// outlasted the deadline, the status of the context's error otherwise.
func waitError(err error) error {
	if de, ok := errors.AsType[*retry.DeadlineError](err); ok {
		return deadlineError{de}
	}
	return status.FromContextError(err).Err()
}

// retryBudget returns the Client's retry budget, made on first use.
func (c *Client) retryBudget() *retry.Budget {
	c.budgetOnce.Do(func() { c.budget = retry.NewBudget(c.RetryRatio, c.MinRetries, c.RetryWindow) })
	return c.budget
}

func (c *Client) countCall() { c.retryBudget().Request(time.Now()) }

// allowRetry reports whether the retry budget and the Throttle allow a
// retry. The budget's share is spent even if the Throttle rejects it: the
// budget only errs on the side of fewer retries.
func (c *Client) allowRetry() bool {
	ok := c.retryBudget().Retry(time.Now())
	if ok && !c.allow() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		c.denied++
		return false
	}
	c.retries++
	return true
}

// Retries returns the retries made and those the retry budget denied (as
// httplimit.ClientStats' Retries and RetriesDenied).
func (c *Client) Retries() (made, denied int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retries, c.denied
}
