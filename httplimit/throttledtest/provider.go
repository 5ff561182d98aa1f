package throttledtest

import (
	"encoding/json"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limitheader"
)

// Limits are the budgets of one model of a Provider: how much of each
// dimension it admits per window (Provider.Window). A limit of 0 is not
// enforced.
type Limits struct {
	// Requests counts calls.
	Requests int64
	// Tokens counts input and output tokens together, as OpenAI's "tokens"
	// does: a call reserves its input tokens plus its max_tokens when it
	// is admitted, and the output it did not use is refunded after the
	// answer.
	Tokens int64
	// InputTokens counts the input tokens of a call, charged when it is
	// admitted.
	InputTokens int64
	// OutputTokens counts the output tokens of a call, charged after the
	// answer: a call is admitted while at least one output token is left,
	// and its output may take the bucket into debt, which later calls wait
	// out.
	OutputTokens int64
}

// A Provider is a throttled LLM-like API to test clients against, an
// http.Handler. Each model (the request's "model"; "" when absent) has its
// own token buckets, one per enforced dimension of its Limits: a bucket
// holds at most its limit and refills continuously at its limit per
// Window, so that any interval of length d admits at most
// limit·(1 + d/Window) of a dimension, plus, for output tokens, the debt
// of the calls answered meanwhile: at most max_tokens − 1 each. (Tokens,
// reserved in full at admission, never go into debt.)
//
// A request's body is JSON:
//
//	{"model": "m", "input_tokens": 120, "max_tokens": 256}
//	{"model": "m", "prompt": "…", "max_tokens": 256}
//
// where the input tokens are input_tokens if given, else PromptTokens of
// the prompt, and max_tokens (1 to 10⁹, as input_tokens is at most 10⁹)
// bounds the output. A call is admitted when every bucket of its model can
// pay (a request, its input tokens, its input plus max_tokens of Tokens,
// one output token): the answer is 200 with a body reporting the usage,
//
//	{"model": "m", "usage": {"input_tokens": 120, "output_tokens": 37}}
//
// the output length drawn uniformly from [1, max_tokens] (unknown to the
// client in advance); the buckets are charged the output afterwards. A
// call that some bucket cannot pay now is answered 429 Too Many Requests
// with Retry-After (whole seconds until it would fit) and costs nothing; a
// call that no bucket could ever pay (more input, or input plus
// max_tokens, than a limit) is answered 400, as is a malformed body.
//
// Every answer carries the budget header fields of Dialect, describing the
// buckets after the call's admission charges (before its output is
// charged), and a Date from Now: OpenAI's
// x-ratelimit-{limit,remaining,reset}-{requests,tokens} (resets as Go
// durations until the bucket is full) or Anthropic's
// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
// (resets as RFC 3339 instants, rounded up to the second), for the enforced
// dimensions that the dialect names (OpenAI's names no input or output
// tokens, which are enforced all the same). A bucket in debt is announced
// with 0 remaining.
//
// Set the fields before the first request. The zero Provider speaks
// OpenAI's dialect, enforces nothing and answers every call. A Provider is
// safe for concurrent use. It logs every charge for MaxUsage, for the
// life of the Provider.
type Provider struct {
	// Dialect is limitheader.DialectOpenAI (or 0) or
	// limitheader.DialectAnthropic.
	Dialect limitheader.Dialect
	// Limits are the budgets of a model that Models does not list.
	Limits Limits
	// Models holds the budgets of the models listed.
	Models map[string]Limits
	// Window is the time in which a bucket refills from empty to full; 0
	// means a minute.
	Window time.Duration
	// Seed seeds the output lengths.
	Seed uint64
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu       sync.Mutex
	rng      *rand.Rand
	accounts map[string]*account
	log      []charge
	stats    ProviderStats
}

// ProviderStats counts a Provider's answers.
type ProviderStats struct {
	// Admitted counts calls answered 200, Throttled those answered 429,
	// Refused those answered 400.
	Admitted, Throttled, Refused int64
}

// Usage is an amount of each dimension.
type Usage struct {
	Requests, InputTokens, OutputTokens int64
}

// BucketState is one bucket of a model, as its header fields announce
// it. Limit is 0 for a dimension not enforced.
type BucketState struct {
	Limit, Remaining int64
	// Reset is the time until the bucket is full.
	Reset time.Duration
}

// State is every bucket of a model.
type State struct {
	Requests, Tokens, InputTokens, OutputTokens BucketState
}

// PromptTokens is the number of input tokens of a prompt: a token per four
// bytes, rounded up.
func PromptTokens(prompt string) int64 { return (int64(len(prompt)) + 3) / 4 }

// maxBody bounds a request's body, maxTokens its input_tokens and
// max_tokens.
const (
	maxBody   = 1 << 20
	maxTokens = 1_000_000_000
)

type providerRequest struct {
	Model       string `json:"model"`
	InputTokens int64  `json:"input_tokens"`
	Prompt      string `json:"prompt"`
	MaxTokens   int64  `json:"max_tokens"`
}

type providerUsage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

type providerAnswer struct {
	Model string        `json:"model"`
	Usage providerUsage `json:"usage"`
}

type providerError struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req providerRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(&req); err != nil {
		p.refuse(w, "invalid_request_error", "malformed body: "+err.Error())
		return
	}
	if req.MaxTokens < 1 || req.MaxTokens > maxTokens || req.InputTokens < 0 || req.InputTokens > maxTokens {
		p.refuse(w, "invalid_request_error", "max_tokens must be in [1, 10^9] and input_tokens in [0, 10^9]")
		return
	}
	in := req.InputTokens
	if in == 0 {
		in = PromptTokens(req.Prompt)
	}

	p.mu.Lock()
	now := p.now()
	a := p.account(req.Model)
	if a.input.tooLarge(in) || a.tokens.tooLarge(in+req.MaxTokens) {
		p.mu.Unlock()
		p.refuse(w, "request_too_large", "the call needs more tokens than the limit allows")
		return
	}
	window := p.window()
	wait := max(a.requests.wait(1, now, window), a.input.wait(in, now, window),
		a.tokens.wait(in+req.MaxTokens, now, window), a.output.wait(1, now, window))
	if wait > 0 {
		p.stats.Throttled++
		p.writeHeader(w.Header(), a, now)
		p.mu.Unlock()
		w.Header().Set("Retry-After", strconv.FormatInt(limitheader.RetryAfterSeconds(wait), 10))
		writeJSON(w, http.StatusTooManyRequests, errorBody("rate_limit_error", "rate limit exceeded"))
		return
	}
	a.requests.take(1, now, window)
	a.input.take(in, now, window)
	a.tokens.take(in+req.MaxTokens, now, window)
	out := 1 + p.random().Int64N(req.MaxTokens)
	p.stats.Admitted++
	p.log = append(p.log, charge{at: now, model: req.Model, use: Usage{Requests: 1, InputTokens: in}})
	p.writeHeader(w.Header(), a, now)
	p.mu.Unlock()

	writeJSON(w, http.StatusOK, providerAnswer{Model: req.Model, Usage: providerUsage{InputTokens: in, OutputTokens: out}})

	// The output is charged after the answer, as providers that stream
	// it do: calls admitted meanwhile did not see it.
	p.mu.Lock()
	now = p.now()
	a.output.take(out, now, window)
	a.tokens.give(req.MaxTokens-out, now, window)
	p.log = append(p.log, charge{at: now, model: req.Model, use: Usage{OutputTokens: out}})
	p.mu.Unlock()
}

// State returns the buckets of model now (by Now).
func (p *Provider) State(model string) State {
	p.mu.Lock()
	defer p.mu.Unlock()
	now, a, w := p.now(), p.account(model), p.window()
	return State{
		Requests:     a.requests.state(now, w),
		Tokens:       a.tokens.state(now, w),
		InputTokens:  a.input.state(now, w),
		OutputTokens: a.output.state(now, w),
	}
}

// Stats returns the counts of the answers so far.
func (p *Provider) Stats() ProviderStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// MaxUsage returns, for each dimension, the most that model was charged in
// any interval of length d: requests and input tokens when calls were
// admitted, output tokens when they were charged. A test compares it with
// the bound of the provider's rule (see Provider). It assumes that Now
// never goes back.
func (p *Provider) MaxUsage(model string, d time.Duration) Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best, sum Usage
	start := 0
	for _, c := range p.log {
		if c.model != model {
			continue
		}
		sum = sum.add(c.use, 1)
		for ; c.at.Sub(p.log[start].at) >= d; start++ {
			if p.log[start].model == model {
				sum = sum.add(p.log[start].use, -1)
			}
		}
		best = Usage{max(best.Requests, sum.Requests), max(best.InputTokens, sum.InputTokens), max(best.OutputTokens, sum.OutputTokens)}
	}
	return best
}

func (u Usage) add(v Usage, sign int64) Usage {
	return Usage{u.Requests + sign*v.Requests, u.InputTokens + sign*v.InputTokens, u.OutputTokens + sign*v.OutputTokens}
}

// A charge is an entry of the log: what a model was charged, when.
type charge struct {
	at    time.Time
	model string
	use   Usage
}

func (p *Provider) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *Provider) window() time.Duration {
	if p.Window > 0 {
		return p.Window
	}
	return time.Minute
}

func (p *Provider) random() *rand.Rand {
	if p.rng == nil {
		p.rng = rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15))
	}
	return p.rng
}

// account returns the buckets of model, made on first use.
func (p *Provider) account(model string) *account {
	if a, ok := p.accounts[model]; ok {
		return a
	}
	l, ok := p.Models[model]
	if !ok {
		l = p.Limits
	}
	a := &account{requests: bucket{limit: l.Requests}, tokens: bucket{limit: l.Tokens},
		input: bucket{limit: l.InputTokens}, output: bucket{limit: l.OutputTokens}}
	if p.accounts == nil {
		p.accounts = make(map[string]*account)
	}
	p.accounts[model] = a
	return a
}

// writeHeader sets the budget fields of the provider's dialect and Date.
func (p *Provider) writeHeader(h http.Header, a *account, now time.Time) {
	h.Set("Date", now.UTC().Format(http.TimeFormat))
	w := p.window()
	type dim struct {
		name string
		b    *bucket
	}
	if p.Dialect == limitheader.DialectAnthropic {
		for _, d := range [...]dim{{"requests", &a.requests}, {"tokens", &a.tokens}, {"input-tokens", &a.input}, {"output-tokens", &a.output}} {
			if d.b.limit == 0 {
				continue
			}
			s := d.b.state(now, w)
			full := now.Add(s.Reset)
			if t := full.Truncate(time.Second); t.Before(full) {
				full = t.Add(time.Second)
			}
			h.Set("Anthropic-Ratelimit-"+d.name+"-Limit", strconv.FormatInt(s.Limit, 10))
			h.Set("Anthropic-Ratelimit-"+d.name+"-Remaining", strconv.FormatInt(s.Remaining, 10))
			h.Set("Anthropic-Ratelimit-"+d.name+"-Reset", full.UTC().Format(time.RFC3339))
		}
		return
	}
	for _, d := range [...]dim{{"requests", &a.requests}, {"tokens", &a.tokens}} {
		if d.b.limit == 0 {
			continue
		}
		s := d.b.state(now, w)
		h.Set("X-Ratelimit-Limit-"+d.name, strconv.FormatInt(s.Limit, 10))
		h.Set("X-Ratelimit-Remaining-"+d.name, strconv.FormatInt(s.Remaining, 10))
		h.Set("X-Ratelimit-Reset-"+d.name, s.Reset.String())
	}
}

func (p *Provider) refuse(w http.ResponseWriter, typ, msg string) {
	p.mu.Lock()
	p.stats.Refused++
	p.mu.Unlock()
	writeJSON(w, http.StatusBadRequest, errorBody(typ, msg))
}

func errorBody(typ, msg string) providerError {
	var e providerError
	e.Error.Type, e.Error.Message = typ, msg
	return e
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// An account is the buckets of one model.
type account struct {
	requests, tokens, input, output bucket
}

// A bucket is a token bucket of limit tokens refilled at limit per window,
// kept as the instant at which it is full (a full bucket's is in the
// past): the time it lacks from full, its debt, measures what it lacks in
// tokens at window/limit per token, and may exceed window (the bucket is
// then below empty). A limit of 0 is not enforced: such a bucket pays
// everything.
type bucket struct {
	limit int64
	full  time.Time
}

// debt is the time until b is full.
func (b *bucket) debt(now time.Time) time.Duration { return max(0, b.full.Sub(now)) }

// span is the refill time of n tokens, rounded up.
func (b *bucket) span(n int64, window time.Duration) time.Duration {
	hi, lo := bits.Mul64(uint64(n), uint64(window))
	if hi >= uint64(b.limit) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(b.limit))
	if r > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(q)
}

// tooLarge reports whether b could never pay n.
func (b *bucket) tooLarge(n int64) bool { return b.limit > 0 && n > b.limit }

// wait is the time until b can pay n (0 when it can now).
func (b *bucket) wait(n int64, now time.Time, window time.Duration) time.Duration {
	if b.limit == 0 || n <= 0 {
		return 0
	}
	return max(0, addSat(b.debt(now), b.span(n, window))-window)
}

// take charges n, into debt if need be.
func (b *bucket) take(n int64, now time.Time, window time.Duration) {
	if b.limit == 0 || n <= 0 {
		return
	}
	b.full = now.Add(addSat(b.debt(now), b.span(n, window)))
}

// give refunds n, up to full.
func (b *bucket) give(n int64, now time.Time, window time.Duration) {
	if b.limit == 0 || n <= 0 {
		return
	}
	b.full = now.Add(max(0, b.debt(now)-b.span(n, window)))
}

// addSat is a+b for non-negative a and b, saturated.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// state is what b's header fields announce: the whole tokens left (0 in
// debt) and the time until full.
func (b *bucket) state(now time.Time, window time.Duration) BucketState {
	if b.limit == 0 {
		return BucketState{}
	}
	debt := b.debt(now)
	s := BucketState{Limit: b.limit, Reset: debt}
	if debt < window {
		hi, lo := bits.Mul64(uint64(window-debt), uint64(b.limit))
		q, _ := bits.Div64(hi, lo, uint64(window))
		s.Remaining = int64(q)
	}
	return s
}
