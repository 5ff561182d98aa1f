package grpclimit

import (
	"context"
	"errors"
	"io"
	"net/textproto"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/limitheader"
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
	// Rejecter rejects calls locally while the server is overloaded
	// (see adaptive.Rejecter); nil means off. The order is: local
	// rejection, pause, call — a call the Rejecter rejects fails at once instead of sitting
	// out a pause first. Every attempt, retries included, is one request
	// of the Rejecter; a retry it rejects is not made and the server's
	// refusal is returned. An attempt counts as accepted when the server
	// answers with any code but RESOURCE_EXHAUSTED, UNAVAILABLE or
	// DEADLINE_EXCEEDED (INVALID_ARGUMENT or NOT_FOUND too: it did its
	// work), or the caller cancels it; a stream, when its first message
	// or its end arrives. Share one Rejecter among every client of the
	// same server.
	Rejecter *adaptive.Rejecter
	// Concurrency bounds the unary calls in flight to the server with an
	// adaptive limit (see adaptive.Concurrency) that shrinks when the server
	// slows down or answers RESOURCE_EXHAUSTED, UNAVAILABLE or
	// DEADLINE_EXCEEDED and grows back gradually; nil means no bound. Each
	// attempt holds a slot while it is in flight: its latency is then a
	// sample, an overload answer a drop, a call its caller cancelled
	// neither. A call that finds no slot (after the Limiter's queue, if it
	// has one) fails at once with codes.Unavailable and an error matching
	// adaptive.ErrOverloaded; with a Rejecter it is no accept (as for
	// httplimit.Client). Streams take no slot: a stream's life is not
	// a service time. Share one Limiter among every client of the same
	// server.
	Concurrency *adaptive.Concurrency
	// Budgets paces unary calls to the budgets the server announces in
	// its response metadata: the header fields that
	// limitheader.ParseAnnouncement reads (OpenAI's, Anthropic's, the
	// IETF RateLimit fields, x-ms-request-charge), as lower-case metadata
	// keys, in the header or the trailer. As with httplimit.Client's
	// Budgets (one type, one model: see httplimit.Budgets), each call
	// reserves the estimate of its context (httplimit.WithEstimate; an
	// estimate's Key "" means the connection's target) before it is sent,
	// after any pause, and is settled when it returns: RESOURCE_EXHAUSTED
	// or UNAVAILABLE cost nothing, another error its estimate, an answer
	// what Usage reads (or the announced charge as
	// httplimit.RequestUnits, or the estimate). A wait that would outlast
	// the deadline fails at once with DEADLINE_EXCEEDED. nil means off;
	// streams are not paced by it.
	Budgets *httplimit.Budgets
	// Usage reads what a unary call used, by dimension name, from its
	// reply and its response's metadata (header and trailer joined), to
	// settle its reservation in Budgets; nil, or a nil map, keeps the
	// estimate.
	Usage func(reply any, md metadata.MD) map[string]int64

	// BaseBackoff and MaxBackoff bound the full-jitter backoff, as
	// httplimit.Client's: a call waiting out a pause waits a random time in
	// [0, BaseBackoff) more, and retry k (from 0) a random time in [0,
	// min(MaxBackoff, BaseBackoff·2^k)) after the pause, so that the calls
	// a pause held do not all return at one instant. 0 means 50 ms and
	// 10 s.
	BaseBackoff, MaxBackoff time.Duration

	once   sync.Once
	caller *retry.Caller // the sequence, made from the fields on first use
}

// seq returns the Client's retry.Caller, made from its fields on first
// use. Its one scope, "", is the whole Client.
func (c *Client) seq() *retry.Caller {
	c.once.Do(func() {
		c.caller = &retry.Caller{
			MaxRetries: c.MaxRetries, RetryRatio: c.RetryRatio, MinRetries: c.MinRetries, RetryWindow: c.RetryWindow,
			BaseBackoff: c.BaseBackoff, MaxBackoff: c.MaxBackoff, MaxPause: c.MaxPause,
		}
		if c.Rejecter != nil {
			c.caller.Rejecter = c.Rejecter
		}
	})
	return c.caller
}

// ErrWouldExceedDeadline is ratelimit.ErrWouldExceedDeadline: a Client
// returns it, wrapped in a DEADLINE_EXCEEDED status, when the wait a pause
// asks for outlasts the call's deadline.
var ErrWouldExceedDeadline = ratelimit.ErrWouldExceedDeadline

// ErrRejectedLocally is adaptive.ErrRejectedLocally: the error of a call
// the Client's Rejecter rejected locally, carried by a codes.Unavailable status whose
// message says "rejected locally". errors.Is tells it from an
// UNAVAILABLE the server sent.
var ErrRejectedLocally = adaptive.ErrRejectedLocally

// rejectedError is a call the Rejecter rejected.
type rejectedError struct{ method string }

func (e rejectedError) Error() string {
	return "grpclimit: " + e.method + ": " + adaptive.ErrRejectedLocally.Error()
}
func (e rejectedError) Unwrap() error { return adaptive.ErrRejectedLocally }
func (e rejectedError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// allow reports whether the Rejecter, if any, lets a stream through.
func (c *Client) allow() bool { return c.Rejecter == nil || c.Rejecter.Allow() }

// settle records the outcome err of a stream the Rejecter let through
// (see Client.Rejecter): accepted unless classify says otherwise.
func (c *Client) settle(err error) {
	if c.Rejecter != nil && classify(err, false).Outcome == retry.Accepted {
		c.Rejecter.Accept()
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
		err := c.seq().Do(ctx, retry.Call{Send: func(ctx context.Context, a retry.Attempt) (retry.Answer, error) {
			var res *httplimit.Reservation
			var header, trailer metadata.MD
			callOpts := opts
			if c.Budgets != nil {
				e, _ := httplimit.EstimateFrom(ctx)
				if e.Key == "" {
					e.Key = cc.Target()
				}
				var err error
				if res, err = c.Budgets.Reserve(ctx, e.Key, e.Cost); err != nil {
					return retry.Answer{Outcome: retry.Failed}, waitError(err)
				}
				callOpts = append(opts[:len(opts):len(opts)], grpc.Header(&header), grpc.Trailer(&trailer))
			}
			var permit adaptive.Permit
			if c.Concurrency != nil {
				var err error
				if permit, err = c.Concurrency.Acquire(ctx); err != nil {
					res.Release(time.Now())
					return retry.Answer{Outcome: retry.Failed}, concurrencyError{method, err}
				}
			}
			a.Sending()
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			endPermit(ctx, &permit, err)
			if res != nil {
				c.settleBudget(res, reply, metadata.Join(header, trailer), err)
			}
			return classify(err, true), err
		}})
		return stageError(err, method)
	}
}

// settleBudget learns what a unary call's response metadata md announce
// for res, and settles res by the call's outcome err (see Client.Budgets).
func (c *Client) settleBudget(res *httplimit.Reservation, reply any, md metadata.MD, err error) {
	h := make(map[string][]string, len(md))
	for k, v := range md {
		h[textproto.CanonicalMIMEHeaderKey(k)] = v
	}
	now := time.Now()
	a, _ := limitheader.ParseAnnouncement(h, now) // what is well formed is usable
	res.Learn(a, now)
	switch code := status.Code(err); {
	case code == codes.ResourceExhausted || code == codes.Unavailable:
		res.Release(now)
	case err != nil:
		res.Settle(nil, now) // the server may have done the work
	default:
		var used map[string]int64
		if c.Usage != nil {
			used = c.Usage(reply, md)
		}
		res.SettleCharge(used, a.Charge, now)
	}
}

// classify reads a call's outcome as retry.Caller sees it: RESOURCE_EXHAUSTED
// (over quota) or UNAVAILABLE (overload) with RetryInfo is a refusal with
// its delay; either without RetryInfo, or DEADLINE_EXCEEDED, a failure
// (not accepted, not retried); anything else an answer the server
// accepted (see Client.Rejecter).
func classify(err error, retryable bool) retry.Answer {
	if err == nil || err == io.EOF {
		return retry.Answer{Outcome: retry.Accepted}
	}
	switch code := status.Code(err); code {
	case codes.ResourceExhausted, codes.Unavailable:
		if d, ok := RetryDelay(err); ok {
			return retry.Answer{Outcome: retry.Refused, Hint: d, Hinted: true, Quota: code == codes.ResourceExhausted, Retryable: retryable}
		}
		return retry.Answer{Outcome: retry.Failed}
	case codes.DeadlineExceeded:
		return retry.Answer{Outcome: retry.Failed}
	}
	return retry.Answer{Outcome: retry.Accepted}
}

// stageError returns the error of a call for err from retry.Caller: a
// rejectedError for the Rejecter's rejection, a deadlineError or the
// context's status for a wait that stopped it, any other error as it is.
func stageError(err error, method string) error {
	se, ok := errors.AsType[*retry.StageError](err)
	if !ok {
		return err
	}
	if se.Stage == retry.StageReject {
		return rejectedError{method}
	}
	return waitError(se.Err)
}

// StreamInterceptor returns the stream client interceptor: it waits for a
// pause before opening a stream and starts one when the stream ends with a
// refusal carrying RetryInfo. It does not retry. With a Rejecter, a
// stream is one request, accepted (or not) by its first message or its
// end.
func (c *Client) StreamInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx = withOutgoingPriority(ctx)
		if !c.allow() {
			return nil, rejectedError{method}
		}
		if err := c.seq().Await(ctx, "", 0); err != nil {
			err = stageError(err, method)
			c.settle(err)
			return nil, err
		}
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			c.observe(err)
			c.settle(err)
			return nil, err
		}
		return &observedStream{ClientStream: cs, c: c, unsettled: c.Rejecter != nil}, nil
	}
}

type observedStream struct {
	grpc.ClientStream
	c *Client
	// unsettled is true until the stream's outcome is given to the
	// Rejecter. RecvMsg is not called concurrently (gRPC's rule), so it
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
// RetryInfo (a stream's; Caller.Do observes the unary calls').
func (c *Client) observe(err error) {
	if ans := classify(err, false); ans.Outcome == retry.Refused {
		c.seq().Observe("", time.Now(), ans)
	}
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

// Retries returns the retries made and those the retry budget denied (as
// httplimit.ClientStats' Retries and RetriesDenied).
func (c *Client) Retries() (made, denied int64) {
	st := c.seq().Stats()
	return st.Retries, st.RetriesDenied
}
