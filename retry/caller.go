package retry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// A Limiter paces a Caller: WaitN blocks until n units of cost may be
// spent, or fails at once when the wait would outlast ctx's deadline.
// *ratelimit.Limiter satisfies it, and so do the store- and lease-backed
// limiters.
type Limiter interface {
	WaitN(ctx context.Context, n int) error
}

// An AdjustableLimiter is a Limiter whose rate a Caller lowers when
// refusals over quota repeat and raises back (see Ceiling).
// *ratelimit.Limiter satisfies it.
type AdjustableLimiter interface {
	Limiter
	Limit() ratelimit.Limit
	SetLimit(ratelimit.Limit)
}

// A Rejecter rejects calls locally while the service is overloaded:
// Allow is asked before every attempt, Accept told of every attempt the
// service accepted. *adaptive.Rejecter satisfies it.
type Rejecter interface {
	Allow() bool
	Accept()
}

// An Outcome is what a transport makes of one attempt's answer.
type Outcome int

const (
	// Accepted: the service answered and did its work, whatever the
	// answer (a 400 or a NOT_FOUND too).
	Accepted Outcome = iota
	// Refused: the service refused the attempt for now (HTTP 429 or 503;
	// gRPC RESOURCE_EXHAUSTED or UNAVAILABLE with RetryInfo).
	Refused
	// Failed: no answer that says the service did its work: an error of
	// the transport, a timeout, a local refusal. It is not retried.
	Failed
)

// An Answer is a transport's reading of one attempt's answer.
type Answer struct {
	Outcome Outcome
	// Hint is the wait a refusal asked for, when Hinted.
	Hint   time.Duration
	Hinted bool
	// Quota marks a refusal over quota (429, RESOURCE_EXHAUSTED), which
	// feeds the Ceiling when repeated; any other refusal is overload and
	// only pauses.
	Quota bool
	// Retryable marks a refusal whose attempt may be sent again.
	Retryable bool
}

// A Stage is where a Caller's sequence stopped before an answer.
type Stage int

const (
	// StageReject: the Rejecter rejected the call; Err is ErrRejected.
	StageReject Stage = iota
	// StagePause: waiting for the scope's shared pause.
	StagePause
	// StagePacing: waiting for the Limiter; Err is the Limiter's.
	StagePacing
	// StageRetry: waiting before a retry (the pause and the backoff).
	StageRetry
)

// ErrRejected is the Err of a StageError of StageReject.
var ErrRejected = errors.New("retry: rejected locally")

// A StageError is a Caller's sequence stopped at a wait (or the Rejecter)
// rather than by an answer. Err is Wait's error (a *DeadlineError, or the
// context's), the Limiter's, or ErrRejected.
type StageError struct {
	Stage Stage
	Err   error
}

func (e *StageError) Error() string { return fmt.Sprintf("retry: stage %d: %v", e.Stage, e.Err) }
func (e *StageError) Unwrap() error { return e.Err }

// A Call is one call made through a Caller.
type Call struct {
	// Scope is the scope of the shared pause the call waits for and
	// extends.
	Scope string
	// Cost is what the call takes of the Limiter; 0 or less: not paced.
	Cost int64
	// Send makes attempt a (a.N from 0) and classifies its answer; its
	// error is what Do returns when the sequence ends on this attempt.
	// It calls a.Sending just before the attempt leaves (after any local
	// slot was found), so that only what is sent is counted.
	Send func(ctx context.Context, a Attempt) (Answer, error)
	// Drop, if set, is called when a refused attempt is to be retried,
	// before the wait (HTTP closes the refused response's body there).
	Drop func()
}

// An Attempt is one attempt of a Call.
type Attempt struct {
	N    int // 0 for the first
	c    *Caller
	cost int64
}

// Sending counts the attempt as sent now.
func (a Attempt) Sending() { a.c.sending(a.cost) }

// Caller is the retry-and-pacing sequence of a throttle-aware client,
// whatever its transport; httplimit.Client and grpclimit.Client are
// adapters around one. Its Do runs a call so:
//
//  1. the call counts in the Budget; the Rejecter, if any, may reject it
//     at once (StageReject);
//  2. it waits for its scope's shared pause plus a full-jitter first
//     backoff step, so that waiters do not all return at one instant, and
//     then for the Limiter, again if a pause began meanwhile; a wait that
//     would outlast the deadline fails at once (a *DeadlineError);
//  3. the transport sends the attempt and classifies the answer;
//  4. a refusal with a hint extends the scope's pause (at most MaxPause);
//     one over quota feeds the Ceiling, which cuts an AdjustableLimiter's
//     rate only when refusals repeat;
//  5. a retryable refusal is retried at most MaxRetries times, while the
//     Budget lasts and the Rejecter allows, after the pause and a
//     full-jitter exponential backoff, all of which must fit before the
//     deadline; otherwise the refusal is returned as it came.
//
// An attempt counts as accepted by the Rejecter when Accepted, or when the
// caller cancelled it; a refusal, a failure or a wait that would outlast
// the deadline are not accepts.
//
// Its fields are set before first use and not changed after; the zero
// value has the documented defaults. A Caller is safe for concurrent use
// and must not be copied after first use.
type Caller struct {
	// Limiter paces the calls; nil: no pacing. An AdjustableLimiter's
	// rate is kept at MaxRate under the Ceiling, never below MinRate.
	Limiter Limiter
	// MaxRate: 0 means the Limiter's rate at first use; MinRate: 0 means
	// MaxRate/100. Decrease is the Ceiling's Backoff, 0.5 by default;
	// Recovery its Recovery.
	MaxRate, MinRate ratelimit.Limit
	Decrease         float64
	Recovery         time.Duration
	// Rejecter rejects calls locally; nil: off.
	Rejecter Rejecter
	// MaxRetries bounds the retries of a call: 0 means 3, negative none.
	MaxRetries int
	// RetryRatio, MinRetries and RetryWindow make the Budget (NewBudget's
	// defaults).
	RetryRatio  float64
	MinRetries  int
	RetryWindow time.Duration
	// BaseBackoff and MaxBackoff bound the full-jitter backoff: retry k
	// (from 0) waits a random time in [0, min(MaxBackoff,
	// BaseBackoff·2^k)) after the pause; 0 means 50 ms and 10 s.
	BaseBackoff, MaxBackoff time.Duration
	// MaxPause caps the pause a refusal may ask for; 0 means a minute.
	MaxPause time.Duration
	// Now is the clock, Rand returns a number in [0, 1) for the jitter;
	// nil means time.Now and math/rand/v2.Float64.
	Now  func() time.Time
	Rand func() float64

	pauses Pauses

	once   sync.Once
	budget *Budget

	mu                   sync.Mutex
	adj                  AdjustableLimiter
	rate, maxRate        float64
	minRate              float64
	thr                  Ceiling
	sent                 sentWindow
	requests, refused    int64
	retries, retryDenied int64
}

// CallerStats are a Caller's counters.
type CallerStats struct {
	// Requests counts the attempts sent; Refused the refusals among
	// their answers.
	Requests, Refused int64
	// Retries counts the retries made, RetriesDenied the refusals
	// returned because the Budget was spent.
	Retries, RetriesDenied int64
	// Rate is the AdjustableLimiter's rate now (0 without one).
	Rate ratelimit.Limit
}

// Stats returns the Caller's counters.
func (c *Caller) Stats() CallerStats {
	c.start()
	c.mu.Lock()
	defer c.mu.Unlock()
	return CallerStats{Requests: c.requests, Refused: c.refused, Retries: c.retries, RetriesDenied: c.retryDenied, Rate: ratelimit.Limit(c.rate)}
}

// The episode of a Caller's refusals over quota lasts this long after
// their pause (the attempts in flight at the first one are answered), and
// one within throttleRepeat of an episode's end is a repeat (see Ceiling).
const (
	throttleGrace  = 100 * time.Millisecond
	throttleRepeat = 2 * time.Second
)

func (c *Caller) start() {
	c.once.Do(func() {
		c.budget = NewBudget(c.RetryRatio, c.MinRetries, c.RetryWindow)
		a, ok := c.Limiter.(AdjustableLimiter)
		if !ok {
			return
		}
		c.adj = a
		c.maxRate = float64(c.MaxRate)
		if c.maxRate <= 0 {
			c.maxRate = float64(a.Limit())
		}
		c.minRate = float64(c.MinRate)
		if c.minRate <= 0 {
			c.minRate = c.maxRate / 100
		}
		c.rate = min(float64(a.Limit()), c.maxRate)
		dec := c.Decrease
		if !(dec > 0 && dec < 1) {
			dec = 0.5
		}
		c.thr = Ceiling{Backoff: dec, Recovery: c.Recovery, MaxPause: c.maxPause()}
	})
}

func (c *Caller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Caller) maxPause() time.Duration {
	if c.MaxPause > 0 {
		return c.MaxPause
	}
	return DefaultMaxPause
}

// Do runs call as the Caller's doc says and returns the error of the
// attempt it ended on, or a *StageError when it stopped before an answer.
func (c *Caller) Do(ctx context.Context, call Call) error {
	c.start()
	c.budget.Request(c.now())
	if c.Rejecter != nil && !c.Rejecter.Allow() {
		return &StageError{Stage: StageReject, Err: ErrRejected}
	}
	maxRetries := c.MaxRetries
	if maxRetries == 0 {
		maxRetries = 3
	}
	for n := 0; ; n++ {
		if err := c.Await(ctx, call.Scope, call.Cost); err != nil {
			c.settle(ctx, false)
			return err
		}
		ans, err := call.Send(ctx, Attempt{N: n, c: c, cost: call.Cost})
		if ans.Outcome != Refused {
			c.settle(ctx, ans.Outcome == Accepted)
			return err
		}
		now := c.now()
		c.Observe(call.Scope, now, ans)
		if !ans.Retryable || n >= maxRetries || !c.allowRetry(now) {
			return err
		}
		if call.Drop != nil {
			call.Drop()
		}
		// The retry waits for the shared pause and then its own jitter;
		// all of it must fit before the deadline.
		wait := c.pauses.Left(call.Scope, func() time.Time { return now }) + c.backoff(n)
		if werr := Wait(ctx, now, wait); werr != nil {
			c.settle(ctx, false)
			return &StageError{Stage: StageRetry, Err: werr}
		}
	}
}

// Await waits for scope's shared pause (and a first backoff step of
// jitter) and then for cost of the Limiter, again if a pause began
// meanwhile; it returns a *StageError when a wait fails.
func (c *Caller) Await(ctx context.Context, scope string, cost int64) error {
	c.start()
	for {
		var now time.Time
		if d := c.pauses.Left(scope, func() time.Time { now = c.now(); return now }); d > 0 {
			d += c.backoff(0)
			if err := Wait(ctx, now, d); err != nil {
				return &StageError{Stage: StagePause, Err: err}
			}
		}
		if c.Limiter != nil && cost > 0 {
			if c.adj != nil { // set once by start; a plain Limiter is never cut
				c.mu.Lock()
				if c.thr.Lowered() {
					c.setRateLocked(c.now()) // climbing back after a cut
				}
				c.mu.Unlock()
			}
			if err := c.Limiter.WaitN(ctx, waitCost(cost)); err != nil {
				return &StageError{Stage: StagePacing, Err: err}
			}
		}
		if c.pauses.Left(scope, c.now) <= 0 {
			return nil
		}
	}
}

// Observe records a refusal (ans.Outcome Refused) received at now: a hint
// extends scope's pause, at most MaxPause; one over quota feeds the
// Ceiling. Do calls it; a transport calls it itself for what Do does not
// run (a stream's refusal).
func (c *Caller) Observe(scope string, now time.Time, ans Answer) {
	c.start()
	hint := time.Duration(0)
	if ans.Hinted {
		hint = min(max(0, ans.Hint), c.maxPause())
	}
	if hint > 0 {
		c.pauses.Extend(scope, now, now.Add(hint))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refused++
	if c.adj != nil && ans.Quota {
		c.thr.Throttled(now, hint, throttleGrace, throttleRepeat, c.rate, func() float64 { return float64(c.sent.add(now, 0)) })
		c.setRateLocked(now)
	}
}

// allowRetry reports whether the Budget and the Rejecter allow a retry at
// now. The Budget's share is spent even if the Rejecter rejects it: the
// budget only errs on the side of fewer retries.
func (c *Caller) allowRetry(now time.Time) bool {
	if !c.budget.Retry(now) {
		c.mu.Lock()
		c.retryDenied++
		c.mu.Unlock()
		return false
	}
	if c.Rejecter != nil && !c.Rejecter.Allow() {
		return false
	}
	c.mu.Lock()
	c.retries++
	c.mu.Unlock()
	return true
}

func (c *Caller) sending(cost int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	if c.adj != nil {
		c.sent.add(c.now(), max(0, cost))
	}
}

// settle tells the Rejecter of an attempt it let through: accepted, or
// cancelled by its caller (which says nothing against the service).
func (c *Caller) settle(ctx context.Context, accepted bool) {
	if c.Rejecter != nil && (accepted || errors.Is(ctx.Err(), context.Canceled)) {
		c.Rejecter.Accept()
	}
}

// setRateLocked sets the Limiter's rate at now: MaxRate under the
// ceiling, never below the floor. c.mu is held.
func (c *Caller) setRateLocked(now time.Time) {
	if c.adj == nil {
		return
	}
	r := max(c.minRate, min(c.maxRate, c.thr.At(now)))
	if r != c.rate {
		c.rate = r
		c.adj.SetLimit(ratelimit.Limit(r))
	}
}

// backoff returns the full-jitter delay before retry n (from 0).
func (c *Caller) backoff(n int) time.Duration {
	base, ceil := c.BaseBackoff, c.MaxBackoff
	if base <= 0 {
		base = 50 * time.Millisecond
	}
	if ceil <= 0 {
		ceil = 10 * time.Second
	}
	d := ceil
	if n < 30 && base<<n < ceil {
		d = base << n
	}
	r := rand.Float64
	if c.Rand != nil {
		r = c.Rand
	}
	return time.Duration(r() * float64(d))
}

// waitCost converts a cost (never negative) to the int that Limiter.WaitN
// takes, saturating where int is narrower than int64.
func waitCost(n int64) int {
	return int(min(n, math.MaxInt))
}

// sentWindow counts the cost sent over the last second, in ten buckets of
// a tenth of a second.
type sentWindow struct {
	at   int64 // the index of the latest bucket: Unix time in tenths of a second
	cost [10]int64
}

// add counts n sent at now, and returns what was sent over the last
// second.
func (w *sentWindow) add(now time.Time, n int64) int64 {
	const k = int64(len(w.cost))
	i := now.UnixNano() / int64(100*time.Millisecond)
	if d := i - w.at; d > 0 {
		for j := int64(1); j <= min(d, k); j++ {
			w.cost[(w.at+j)%k] = 0
		}
		w.at = i
	}
	if i > w.at-k {
		w.cost[i%k] += n
	}
	var sum int64
	for _, c := range w.cost {
		sum += c
	}
	return sum
}
