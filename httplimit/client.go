package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
)

// A Limiter paces a Client: WaitN blocks until n units of cost may be spent,
// or fails at once (with ratelimit.ErrWouldExceedDeadline, say) when the
// wait would outlast ctx's deadline. *ratelimit.Limiter satisfies it, and so
// does any store-backed or lease-backed limiter with the same method. It is
// retry's Limiter: the Client paces through retry.Caller.
type Limiter = retry.Limiter

// An AdjustableLimiter is a Limiter whose rate the Client may lower and
// raise (see Client, 5). *ratelimit.Limiter satisfies it.
type AdjustableLimiter = retry.AdjustableLimiter

// ErrWouldExceedDeadline is returned by Client.Do, wrapped, when the wait
// needed before the request may be sent — pacing, a shared pause, or the
// delay a throttled response asks for — is longer than the time left before
// the context's deadline. It is ratelimit.ErrWouldExceedDeadline itself, so
// one errors.Is covers the Limiter's refusal too; when the Client decides
// this itself, the error also matches context.DeadlineExceeded.
var ErrWouldExceedDeadline = ratelimit.ErrWouldExceedDeadline

// ErrRejectedLocally is returned by Client.Do, wrapped, when the Client's
// Rejecter rejects a request locally, without sending it, because the
// service has lately been overloaded (see adaptive.Rejecter). It is
// adaptive.ErrRejectedLocally itself, which grpclimit's client returns
// too; it does not match ErrWouldExceedDeadline, so a caller tells a local
// rejection from a wait that would outlast its deadline.
var ErrRejectedLocally = adaptive.ErrRejectedLocally

type costKey struct{}

// WithCost returns a context whose requests cost n units of the Client's
// Limiter (e.g. request units of a database) instead of 1. A negative n
// counts as 0: the request is not paced. Costs are int64 throughout
// Sluice; Limiter.WaitN, in the style of golang.org/x/time/rate, takes an
// int, and a cost above math.MaxInt (on a 32-bit platform) is asked for as
// math.MaxInt, more than any such Limiter grants at once.
func WithCost(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, costKey{}, max(0, n))
}

// costOf returns the cost WithCost put in ctx, or 1.
func costOf(ctx context.Context) int64 {
	if n, ok := ctx.Value(costKey{}).(int64); ok {
		return n
	}
	return 1
}

// Client is a client-level wrapper of an *http.Client for calling a service
// that throttles its callers. It does what a good client of such a service
// does, in this order, on every Do:
//
//  1. Local rejection: if the Client has a Rejecter, it may reject the
//     request locally, before anything else, with a probability that grows
//     as the service refuses more of the requests sent lately (429, 503 or
//     an error of the transport); Do then fails at once with an error
//     matching ErrRejectedLocally, and nothing is sent. See
//     adaptive.Rejecter (the SRE book's adaptive throttling).
//  2. Pacing: it waits for the Limiter (if any) to grant the request's cost
//     (WithCost), so that calls stay under the service's limit instead of
//     discovering it through 429s.
//  3. Announced budgets: with Budgets, it reserves the request's estimate
//     (WithEstimate: for an LLM, the prompt's tokens and max_tokens) in
//     every dimension the service has announced for the request's key
//     (requests, tokens, input and output tokens, an IETF policy), waiting
//     until the announced budgets, refilled as the service refills them,
//     cover it beside the calls in flight; then it learns the response's
//     budgets (limitheader.ParseAnnouncement) and settles the estimate
//     with what the call used (Usage reads it from the body when the
//     caller has read it; a 429 or 503 costs nothing). See Budgets.
//  4. Shared pause: when a response is 429 or 503 and says how long to wait
//     (Retry-After as delay-seconds or HTTP-date, Retry-After-Ms,
//     X-Ms-Retry-After-Ms, or RateLimit's t; see RetryDelay), capped at
//     MaxPause, every request of the same scope (the host, by default) made
//     through this Client waits until then — one pause shared by all
//     goroutines, not one retrying goroutine each. When it ends, the
//     waiting requests are spread over the first backoff step (full
//     jitter) and pass through the Limiter again, so traffic resumes
//     gradually.
//  5. Rate in proportion (retry.Ceiling, as a lease.Holder does): a 429
//     with a retry hint pauses for that long and cuts nothing; the 429s
//     that come back until the pause has ended (and 100 ms more, for the
//     requests in flight) are one episode and cut nothing. Only a 429
//     after an episode, within two seconds of its end — the pause did not
//     suffice — cuts the Limiter's rate, in proportion to the overshoot
//     (the last episode's 429s over the cost sent in the last second),
//     never below Decrease times the rate nor below MinRate; the rate
//     then climbs back to MaxRate linearly in Recovery. A 503 is
//     overload, not quota: it pauses as its hint says and cuts nothing
//     (the Rejecter and Concurrency answer overload).
//  6. Retries: a throttled request is retried only if it may be (an
//     idempotent method without a body, or any request with GetBody), at
//     most MaxRetries times, after the shared pause plus a full-jitter
//     exponential backoff, and only while the retry budget lasts: retries
//     may be at most RetryRatio of the requests of the last RetryWindow
//     (plus MinRetries). Otherwise the throttled response is returned to the
//     caller — backpressure travels upstream instead of piling on.
//  7. Deadlines: if a wait it must make is longer than the time left before
//     the request context's deadline, Do fails at once with an error
//     matching ErrWouldExceedDeadline.
//  8. Concurrency: with a Concurrency limiter, each attempt holds one of
//     its slots while it is in flight; the limit adapts to the service's
//     latency and overload answers (see the field).
//
// Errors of the transport are returned as they are, never retried: that is
// the transport's business.
//
// The order of the waits is: local rejection, shared pause, Limiter,
// announced budgets, concurrency slot, send (a slot is held only while a request is in
// flight). The Rejecter comes first so that a request it rejects fails at once, rather
// than after sitting out a pause or a pacing wait for nothing, and takes
// no capacity from the Limiter, which is the service's to give to
// requests that are sent. Every attempt, retries included, is one request
// of the Rejecter; a retry it rejects is not made, and the service's
// throttled response is returned instead. An attempt counts as accepted
// when the service answers anything but 429 or 503 (a 400 or a 404 too:
// it did its work); a 429, a 503, an error of the transport, a timeout,
// or a wait that would outlast the deadline are not accepts, and a request
// whose context was cancelled counts as one, since it says nothing
// against the service.
//
// The zero value is a Client with defaults for every field: no Limiter
// (pacing and AIMD off), http.DefaultClient, the host as pause scope. A
// Client is safe for concurrent use, and the point is to share one; it must
// not be copied after first use, nor its fields changed.
type Client struct {
	// HTTP sends the requests; nil means http.DefaultClient.
	HTTP *http.Client
	// Limiter paces requests; nil means no pacing. If it is an
	// AdjustableLimiter, the Client lowers its rate when 429s repeat and
	// raises it back (see 5 above).
	Limiter Limiter
	// Rejecter rejects requests locally while the service is overloaded
	// (see the list above); nil means off. Share one
	// Rejecter among every client of the same service. It reads its own
	// clock (adaptive.RejecterOptions.Now), not Now.
	Rejecter *adaptive.Rejecter
	// Concurrency bounds the requests in flight to the service with an
	// adaptive limit (see adaptive.Concurrency) that shrinks when the service
	// slows down or answers 429 or 503 and grows back gradually; nil means
	// no bound. Each attempt holds a slot from just before it is sent until
	// its response's header arrives: its latency then is a sample, an
	// overload answer or an error of the transport a drop, a request the
	// caller cancelled neither. A request that finds no slot (after the
	// Limiter's queue, if it has one) fails at once with the Limiter's
	// adaptive.Refusal, matching adaptive.ErrOverloaded. Share one Limiter
	// among every client of the same service.
	Concurrency *adaptive.Concurrency

	// MaxRate is the rate the Limiter is set to when nothing is cut; 0
	// means the Limiter's rate at first use.
	MaxRate ratelimit.Limit
	// MinRate is the floor of the rate; 0 means MaxRate/100.
	MinRate ratelimit.Limit
	// Decrease is the lowest factor by which one cut (repeated 429s)
	// lowers the rate: a cut is in proportion to the overshoot, never
	// deeper than this; 0 (or a value outside (0, 1)) means 0.5.
	Decrease float64
	// Recovery is the time in which a cut rate climbs back to MaxRate;
	// 0 means 2 s.
	Recovery time.Duration

	// MaxRetries bounds the retries of one request; 0 means 3, negative
	// means none.
	MaxRetries int
	// RetryRatio is the retry budget: retries at most this fraction of the
	// requests over RetryWindow, plus MinRetries; 0 means 0.1.
	RetryRatio float64
	// RetryWindow is the sliding window of the retry budget; 0 means 10 s.
	RetryWindow time.Duration
	// MinRetries are allowed per RetryWindow whatever the ratio, so that a
	// quiet client may retry at all; 0 means 10, negative means none.
	MinRetries int
	// BaseBackoff and MaxBackoff bound the full-jitter backoff: before
	// retry k (from 0) it waits a random time in [0, min(MaxBackoff,
	// BaseBackoff·2^k)), after any shared pause. 0 means 50 ms and 10 s.
	BaseBackoff, MaxBackoff time.Duration
	// MaxPause caps the wait a response may ask for; 0 means 1 minute.
	MaxPause time.Duration
	// PauseScope returns the scope of a request's shared pause; nil means
	// its URL's host. Return the tenant, say, when one tenant's 429 must
	// not pause calls made for others.
	PauseScope func(*http.Request) string

	// Budgets paces every dimension of the budgets the service announces
	// in its responses (see 3 above, and Budgets); nil means off. Share
	// one among every Client calling the same service account.
	Budgets *Budgets
	// Usage reads what a call actually used, by dimension name, from its
	// response and its body, to settle the call's reservation in Budgets
	// (see Budgets and Reservation.Settle); nil, or a nil map, keeps the
	// estimate as the cost. It is called once per answer other than 429
	// and 503 (those cost nothing), when the caller has read the body to
	// its end or closed it, with what the caller read (nil beyond 4 MiB):
	// the body reaches the caller as it came. It sees the status: a 400,
	// say, may cost nothing. A response whose body is never closed keeps
	// its estimate in flight for good.
	Usage func(resp *http.Response, body []byte) map[string]int64

	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Rand returns a random number in [0, 1) for the jitter; nil means
	// math/rand/v2.Float64.
	Rand func() float64

	once   sync.Once
	caller *retry.Caller // the sequence, made from the fields on first use
}

// ClientStats are a Client's counters.
type ClientStats struct {
	// Requests counts the HTTP requests sent, retries included.
	Requests int64
	// Throttled counts the 429 and 503 responses.
	Throttled int64
	// Retries counts the retries made; RetriesDenied the throttled
	// responses returned because the retry budget was spent.
	Retries, RetriesDenied int64
	// Rate is the Limiter's rate now (0 without an adjustable Limiter).
	Rate ratelimit.Limit
}

// Stats returns the Client's counters.
func (c *Client) Stats() ClientStats {
	st := c.seq().Stats()
	return ClientStats{Requests: st.Requests, Throttled: st.Refused, Retries: st.Retries, RetriesDenied: st.RetriesDenied, Rate: st.Rate}
}

// seq returns the Client's retry.Caller, made from its fields on first
// use.
func (c *Client) seq() *retry.Caller {
	c.once.Do(func() {
		c.caller = &retry.Caller{
			Limiter: c.Limiter, MaxRate: c.MaxRate, MinRate: c.MinRate, Decrease: c.Decrease, Recovery: c.Recovery,
			MaxRetries: c.MaxRetries, RetryRatio: c.RetryRatio, MinRetries: c.MinRetries, RetryWindow: c.RetryWindow,
			BaseBackoff: c.BaseBackoff, MaxBackoff: c.MaxBackoff, MaxPause: c.MaxPause, Now: c.Now, Rand: c.Rand,
		}
		if c.Rejecter != nil {
			c.caller.Rejecter = c.Rejecter
		}
	})
	return c.caller
}

func (c *Client) clock() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Client) scope(req *http.Request) string {
	if c.PauseScope != nil {
		return c.PauseScope(req)
	}
	return req.URL.Host
}

// Do sends req as the Client's doc describes and returns its response: a
// success, the last throttled response when retrying is not allowed or the
// budget is spent, or an error. As with http.Client.Do, a response's body
// must be closed by the caller.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	req = withPriority(req) // the caller's priority goes on to the service
	ctx := req.Context()
	scope := c.scope(req)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	retryable := rewindable && (idempotent(req.Method) || req.GetBody != nil)
	var resp *http.Response
	err := c.seq().Do(ctx, retry.Call{
		Scope: scope,
		Cost:  costOf(ctx),
		Send: func(ctx context.Context, a retry.Attempt) (retry.Answer, error) {
			resp = nil
			if a.N > 0 && req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return retry.Answer{Outcome: retry.Failed}, fmt.Errorf("httplimit: rewinding the body for a retry: %w", err)
				}
				req = req.Clone(ctx)
				req.Body = body
			}
			var res *Reservation
			if c.Budgets != nil {
				e := estimateOf(ctx, scope)
				var err error
				if res, err = c.Budgets.reserve(ctx, e.Key, e.Cost, c.clock); err != nil {
					return retry.Answer{Outcome: retry.Failed}, fmt.Errorf("httplimit: %s %s: budgets of %q: %w", req.Method, req.URL.Redacted(), e.Key, err)
				}
			}
			var permit adaptive.Permit
			if c.Concurrency != nil {
				var err error
				if permit, err = c.Concurrency.Acquire(ctx); err != nil {
					res.Release(c.clock())
					return retry.Answer{Outcome: retry.Failed}, fmt.Errorf("httplimit: %s %s: concurrency: %w", req.Method, req.URL.Redacted(), err)
				}
			}
			a.Sending()
			r, err := hc.Do(req)
			refused := err == nil && (r.StatusCode == http.StatusTooManyRequests || r.StatusCode == http.StatusServiceUnavailable)
			endPermit(&permit, ctx, err != nil || refused)
			if err != nil {
				res.Settle(nil, c.clock()) // the service may have done the work
				return retry.Answer{Outcome: retry.Failed}, err
			}
			if res != nil {
				c.settleFrom(res, r, refused)
			}
			resp = r
			return classify(r, c.Now, retryable), nil
		},
		Drop: func() { discard(resp); resp = nil },
	})
	if err != nil {
		if resp != nil {
			discard(resp)
		}
		return nil, explain(err, req, scope)
	}
	return resp, nil
}

// classify reads a response as retry.Caller sees it: 429 (over quota) and
// 503 (overload) are refusals, with the hint limitheader.RetryDelay finds;
// anything else is an answer.
func classify(resp *http.Response, now func() time.Time, retryable bool) retry.Answer {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return retry.Answer{Outcome: retry.Accepted}
	}
	t := time.Now
	if now != nil {
		t = now
	}
	hint, hinted := limitheader.RetryDelay(resp.Header, t())
	return retry.Answer{Outcome: retry.Refused, Hint: hint, Hinted: hinted, Quota: resp.StatusCode == http.StatusTooManyRequests, Retryable: retryable}
}

// explain returns the error of Do for err from retry.Caller.Do: a wait or
// the Rejecter that stopped the sequence, said as where; any other error
// as it is.
func explain(err error, req *http.Request, scope string) error {
	se, ok := errors.AsType[*retry.StageError](err)
	if !ok {
		return err
	}
	switch se.Stage {
	case retry.StageReject:
		return fmt.Errorf("httplimit: %s %s: %w", req.Method, req.URL.Redacted(), ErrRejectedLocally)
	case retry.StagePacing:
		return fmt.Errorf("httplimit: pacing: %w", se.Err)
	case retry.StagePause:
		return explainWait(se.Err, "httplimit: calls to %q are paused", scope)
	default:
		return explainWait(se.Err, "httplimit: %s %s: retrying", req.Method, req.URL.Redacted())
	}
}

// explainWait returns the error of retry.Wait: a refusal to outlast the
// deadline prefixed with what was waited for (format and args), which it
// wraps; a done context's error as it is.
func explainWait(err error, format string, args ...any) error {
	if _, ok := errors.AsType[*retry.DeadlineError](err); !ok {
		return err
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// discard reads a little of a body that is not returned, so that the
// connection may be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	_ = resp.Body.Close()
}

// idempotent reports whether RFC 9110 §9.2.2 calls method idempotent.
func idempotent(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}
