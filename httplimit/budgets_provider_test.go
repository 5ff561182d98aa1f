package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/httplimit/throttledtest"
	"github.com/sluicehq/sluice/limitheader"
)

// latencyTransport delays each call by a random latency, half before the
// provider admits it and half after it answers, as a model's generation
// and the network would.
type latencyTransport struct {
	rt       http.RoundTripper
	min, max time.Duration
	mu       sync.Mutex
	rng      *rand.Rand
}

func (t *latencyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	d := t.min + time.Duration(t.rng.Int64N(int64(t.max-t.min)))
	t.mu.Unlock()
	time.Sleep(d / 2)
	resp, err := t.rt.RoundTrip(req)
	time.Sleep(d - d/2)
	return resp, err
}

// llmUsage is the Usage hook of the provider's answers.
func llmUsage(resp *http.Response, body []byte) map[string]int64 {
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var a struct {
		Usage struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &a) != nil {
		return nil
	}
	in, out := a.Usage.InputTokens, a.Usage.OutputTokens
	return map[string]int64{"requests": 1, "tokens": in + out, "input-tokens": in, "output-tokens": out}
}

// providerRun is what one run against a Provider measured.
type providerRun struct {
	calls, throttled429, failed int64
	used                        throttledtest.Usage // of the calls answered 200
	tokens                      int64               // input plus output
	maxUsage                    throttledtest.Usage
}

// runProvider has workers goroutines call p through a Client (with Budgets
// or not) for d of virtual time, each call with random input tokens and
// max_tokens, estimating its output tokens as max_tokens/outDiv; it runs
// inside a synctest bubble.
func runProvider(t *testing.T, p *throttledtest.Provider, budgets bool, outDiv int64, workers int, d time.Duration) providerRun {
	t.Helper()
	c := &httplimit.Client{
		HTTP: &http.Client{Transport: &latencyTransport{rt: throttledtest.HandlerTransport{Handler: p},
			min: 200 * time.Millisecond, max: 3 * time.Second, rng: rand.New(rand.NewPCG(1, 2))}},
		Usage: llmUsage,
	}
	if budgets {
		c.Budgets = &httplimit.Budgets{}
	}
	end := time.Now().Add(d)
	var mu sync.Mutex
	var run providerRun
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			ctx, cancel := context.WithDeadline(context.Background(), end)
			defer cancel()
			for time.Now().Before(end) {
				in, maxTok := 100+rng.Int64N(900), 50+rng.Int64N(450)
				body, _ := json.Marshal(map[string]any{"model": "m", "input_tokens": in, "max_tokens": maxTok})
				cctx := httplimit.WithEstimate(ctx, httplimit.Estimate{Key: "m", Cost: map[string]int64{
					"tokens": in + maxTok, "input-tokens": in, "output-tokens": maxTok / outDiv}})
				req, _ := http.NewRequestWithContext(cctx, http.MethodPost, "http://llm.test/v1/messages", bytes.NewReader(body))
				resp, err := c.Do(req)
				if err != nil {
					// A wait past the end fails at once, a call in flight
					// at the end fails with the deadline: this worker is
					// done.
					if !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						run.failed++
						mu.Unlock()
					}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				u := llmUsage(resp, b)
				mu.Lock()
				if u != nil {
					run.calls++
					run.used.Requests++
					run.used.InputTokens += u["input-tokens"]
					run.used.OutputTokens += u["output-tokens"]
					run.tokens += u["tokens"]
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	run.throttled429 = p.Stats().Throttled
	run.maxUsage = p.MaxUsage("m", time.Minute)
	return run
}

// TestBudgetsAgainstProvider paces 8 goroutines to the budgets a Provider
// announces, in both dialects, for 5 minutes of virtual time: no 429 (an
// estimate of max_tokens never under-estimates the output, and the calls
// sent before the first announcement fit a full budget), and at least
// 85 % of the binding dimension's budget used (what any 5 minutes admit:
// the limit once full plus 5 minutes of refill); the same with the
// provider's budgets refilled over 10 minutes, which the Budgets (assuming
// a minute) learn from the resets. Beside them, for the figures, the same
// Client without Budgets, and with an output estimate of max_tokens/4 (a
// loose bound: the under-estimates of the calls in flight go into debt).
func TestBudgetsAgainstProvider(t *testing.T) {
	const (
		workers = 8
		d       = 5 * time.Minute
	)
	cases := []struct {
		dialect limitheader.Dialect
		limits  throttledtest.Limits
		binding string
		bound   int64 // the binding dimension's limit
		used    func(providerRun) int64
	}{
		// Tokens bind: about 690 a call (825 reserved), 87 calls a
		// minute; requests allow 120.
		{limitheader.DialectOpenAI, throttledtest.Limits{Requests: 120, Tokens: 60000}, "tokens", 60000,
			func(r providerRun) int64 { return r.tokens }},
		// Output tokens bind: about 138 a call (275 reserved), 72 calls
		// a minute; input tokens allow 91, requests 200.
		{limitheader.DialectAnthropic, throttledtest.Limits{Requests: 200, InputTokens: 50000, OutputTokens: 10000}, "output-tokens", 10000,
			func(r providerRun) int64 { return r.used.OutputTokens }},
	}
	type variant struct {
		budgets bool
		outDiv  int64
		window  time.Duration // the provider's; the Budgets assume a minute
	}
	for _, tc := range cases {
		for _, v := range []variant{{true, 1, time.Minute}, {false, 1, time.Minute}, {true, 4, time.Minute}, {true, 1, 10 * time.Minute}} {
			budgets := v.budgets
			if v.outDiv > 1 && tc.dialect != limitheader.DialectAnthropic {
				continue // OpenAI's tokens are reserved at max_tokens by the provider itself
			}
			t.Run(fmt.Sprintf("%v/budgets=%v/output-estimate=max_tokens÷%d/window=%v", tc.dialect, budgets, v.outDiv, v.window), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p := &throttledtest.Provider{Dialect: tc.dialect, Limits: tc.limits, Seed: 3, Window: v.window}
					r := runProvider(t, p, budgets, v.outDiv, workers, d)
					allowed := tc.bound * int64(v.window+d) / int64(v.window)
					share := float64(tc.used(r)) / float64(allowed)
					t.Logf("%v budgets=%v output-estimate=max_tokens/%d window=%v: %d calls answered, %d answered 429 (%.1f%% of %d sent), %d failed; %s used %d of %d allowed in %v: %.1f%%; most in a minute: %+v",
						tc.dialect, budgets, v.outDiv, v.window, r.calls, r.throttled429, 100*float64(r.throttled429)/float64(r.calls+r.throttled429),
						r.calls+r.throttled429, r.failed, tc.binding, tc.used(r), allowed, d, 100*share, r.maxUsage)
					if !budgets {
						return
					}
					if v.outDiv > 1 {
						// An under-estimate lets the output go into debt,
						// which the provider announces as 0 left, not
						// how deep: calls are sent early, and refused.
						// A figure, with a loose bound.
						if frac := float64(r.throttled429) / float64(r.calls+r.throttled429); frac > 0.25 {
							t.Errorf("%.1f%% answered 429", 100*frac)
						}
						return
					}
					if r.throttled429 != 0 {
						t.Errorf("%d answers 429, want 0", r.throttled429)
					}
					if share < 0.85 {
						t.Errorf("used %.1f%% of the binding budget, want at least 85%%", 100*share)
					}
				})
			})
		}
	}
}

// TestClientBudgetsSteps follows one Client through a Provider's
// announcements: the body reaches the caller whole, the usage is settled
// when it is read, a wait past the deadline fails at once without a call
// sent, and the wait that fits is made.
func TestClientBudgetsSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 60 output tokens a minute: one a second.
		p := &throttledtest.Provider{Dialect: limitheader.DialectAnthropic, Limits: throttledtest.Limits{OutputTokens: 60}, Seed: 1,
			Models: map[string]throttledtest.Limits{"n": {Requests: 1}}}
		var settled []map[string]int64
		c := &httplimit.Client{
			HTTP:    &http.Client{Transport: throttledtest.HandlerTransport{Handler: p}},
			Budgets: &httplimit.Budgets{},
			Usage: func(resp *http.Response, body []byte) map[string]int64 {
				u := llmUsage(resp, body)
				settled = append(settled, u)
				return u
			},
		}
		call := func(ctx context.Context, model string, maxTok int64) (string, error) {
			body := fmt.Sprintf(`{"model":%q,"input_tokens":10,"max_tokens":%d}`, model, maxTok)
			ctx = httplimit.WithEstimate(ctx, httplimit.Estimate{Key: model, Cost: map[string]int64{"output-tokens": maxTok}})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://llm.test/", bytes.NewReader([]byte(body)))
			resp, err := c.Do(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return string(b), err
		}
		// The first call is sent at once and its whole output charged.
		body, err := call(t.Context(), "m", 60)
		if err != nil || len(settled) != 1 || !bytes.Contains([]byte(body), []byte(`"output_tokens"`)) {
			t.Fatalf("first call: %q, %v; settled %v", body, err, settled)
		}
		out := settled[0]["output-tokens"]
		st := p.State("m").OutputTokens
		// The Client knows what the provider knows: a wait of (60 - what
		// is left) seconds, the output's, before the next 60.
		want := time.Duration(60-st.Remaining) * time.Second
		if want != time.Duration(out)*time.Second {
			t.Fatalf("output %d, %d left", out, st.Remaining)
		}
		ctx, cancel := context.WithTimeout(t.Context(), want/2)
		_, err = call(ctx, "m", 60)
		cancel()
		if !errors.Is(err, httplimit.ErrWouldExceedDeadline) {
			t.Fatalf("second call (output %d, %d left): %v, want ErrWouldExceedDeadline", out, st.Remaining, err)
		}
		if got := p.Stats().Admitted + p.Stats().Throttled; got != 1 {
			t.Fatalf("%d calls reached the provider, want 1", got)
		}
		start := time.Now()
		if _, err := call(t.Context(), "m", 60); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != want {
			t.Errorf("waited %v, want about %v", waited, want)
		}
		if p.Stats().Throttled != 0 {
			t.Errorf("%d answers 429", p.Stats().Throttled)
		}

		// Another Client, with Budgets of its own, knows nothing of model
		// n, which this one has just used up: its first call there is
		// answered 429 (released: nothing charged, nothing in flight),
		// from which it learns to wait.
		if _, err := call(t.Context(), "n", 1); err != nil {
			t.Fatal(err)
		}
		// (MaxPause is short so that the 429's shared pause, a minute,
		// does not answer for the Budgets.)
		c = &httplimit.Client{HTTP: c.HTTP, Budgets: &httplimit.Budgets{}, Usage: c.Usage, MaxRetries: -1, MaxPause: time.Millisecond}
		if body, err := call(t.Context(), "n", 1); err != nil || p.Stats().Throttled != 1 {
			t.Fatalf("other client: %q, %v; %d answers 429, want 1", body, err, p.Stats().Throttled)
		}
		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		_, err = call(ctx, "n", 1)
		cancel()
		if !errors.Is(err, httplimit.ErrWouldExceedDeadline) || !strings.Contains(err.Error(), "budgets") {
			t.Fatalf("other client, after the 429: %v, want ErrWouldExceedDeadline from its budgets", err)
		}
		if st := p.Stats(); st.Throttled != 1 || st.Admitted != 3 {
			t.Errorf("provider: %+v, want 3 admitted and 1 throttled", st)
		}
	})
}

// TestClientBudgetsBody checks when the Usage hook runs: once, at the end
// of the body or at its Close, with what the caller read, the body
// reaching the caller whole.
func TestClientBudgetsBody(t *testing.T) {
	const answer = `{"usage":{"input_tokens":3,"output_tokens":5}}`
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Limit-Tokens", "1000")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "990")
		w.Header().Set("X-Ratelimit-Reset-Tokens", "1s")
		io.WriteString(w, answer)
	})
	var calls []string
	c := &httplimit.Client{
		HTTP:    &http.Client{Transport: throttledtest.HandlerTransport{Handler: h}},
		Budgets: &httplimit.Budgets{},
		Usage: func(resp *http.Response, body []byte) map[string]int64 {
			calls = append(calls, string(body))
			return llmUsage(resp, body)
		},
	}
	get := func() *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://llm.test/", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// Read to the end: settled at EOF, once, whatever Close does after.
	resp := get()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != answer || len(calls) != 1 || calls[0] != answer {
		t.Fatalf("read %q; hook calls %q", b, calls)
	}
	resp.Body.Close()
	if len(calls) != 1 {
		t.Fatalf("hook called %d times", len(calls))
	}
	// Closed after a part: settled at Close with that part.
	resp = get()
	part := make([]byte, 10)
	n, _ := io.ReadFull(resp.Body, part)
	resp.Body.Close()
	if len(calls) != 2 || calls[1] != answer[:n] {
		t.Fatalf("hook calls %q, want the 10 bytes read", calls)
	}
}
