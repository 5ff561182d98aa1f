package grpclimit

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
)

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
