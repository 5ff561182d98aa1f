package throttledtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limitheader"
)

// testClock is a clock the test moves by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newClock() *testClock {
	return &testClock{t: time.Date(2026, 12, 7, 9, 30, 0, 0, time.UTC)}
}

type answer struct {
	status int
	header http.Header
	usage  providerUsage
}

// call sends body to h and decodes the answer.
func call(t *testing.T, h http.Handler, body string) answer {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body)))
	a := answer{status: rec.Code, header: rec.Result().Header}
	if rec.Code == http.StatusOK {
		var ans providerAnswer
		if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil {
			t.Fatalf("answer %q: %v", rec.Body, err)
		}
		a.usage = ans.Usage
	}
	return a
}

// checkAnnounced parses the budget fields of an answer with limitheader
// and compares each named budget with want, the provider's true state (a
// reset rounded up to the second for Anthropic's instants).
func checkAnnounced(t *testing.T, hdr http.Header, now time.Time, want map[string]BucketState) {
	t.Helper()
	a, err := limitheader.ParseAnnouncement(hdr, now)
	if err != nil {
		t.Fatalf("ParseAnnouncement: %v", err)
	}
	if len(a.Budgets) != len(want) {
		t.Errorf("%d budgets announced, want %d: %+v", len(a.Budgets), len(want), a.Budgets)
	}
	for name, w := range want {
		b, ok := a.Budget(name)
		if !ok {
			t.Errorf("no %s budget announced", name)
			continue
		}
		reset := w.Reset
		if b.Dialect == limitheader.DialectAnthropic {
			// An instant rounded up to the second, read relative to
			// Date, which is now truncated to the second.
			full := now.Add(reset)
			if t := full.Truncate(time.Second); t.Before(full) {
				full = t.Add(time.Second)
			}
			reset = full.Sub(now.Truncate(time.Second))
		}
		if b.Limit != w.Limit || b.Remaining != w.Remaining || b.Reset != reset {
			t.Errorf("%s announced limit %d, remaining %d, reset %v; the provider has %d, %d, %v",
				name, b.Limit, b.Remaining, b.Reset, w.Limit, w.Remaining, reset)
		}
	}
}

func retryAfter(t *testing.T, hdr http.Header) time.Duration {
	t.Helper()
	n, err := strconv.Atoi(hdr.Get("Retry-After"))
	if err != nil {
		t.Fatalf("Retry-After %q: %v", hdr.Get("Retry-After"), err)
	}
	return time.Duration(n) * time.Second
}

// TestProviderOpenAI: OpenAI's fields announce the true state of the
// requests and tokens buckets (tokens reserving input plus max_tokens, the
// unused output refunded after the answer); a call over a budget is
// answered 429 with the wait until it fits, and fits after that wait.
func TestProviderOpenAI(t *testing.T) {
	clk := newClock()
	p := &Provider{Limits: Limits{Requests: 3, Tokens: 1000}, Now: clk.Now, Seed: 1}
	const body = `{"model":"gpt-test","input_tokens":100,"max_tokens":200}`

	a := call(t, p, body)
	if a.status != http.StatusOK {
		t.Fatalf("first call: %d", a.status)
	}
	// A request refills in 60s/3 = 20s; a token in 60 ms.
	checkAnnounced(t, a.header, clk.Now(), map[string]BucketState{
		"requests": {Limit: 3, Remaining: 2, Reset: 20 * time.Second},
		"tokens":   {Limit: 1000, Remaining: 700, Reset: 300 * 60 * time.Millisecond},
	})
	out := a.usage.OutputTokens
	if a.usage.InputTokens != 100 || out < 1 || out > 200 {
		t.Fatalf("usage %+v", a.usage)
	}
	if got := p.State("gpt-test").Tokens; got.Remaining != 900-out || got.Reset != time.Duration(100+out)*60*time.Millisecond {
		t.Errorf("after the answer, tokens %+v; want %d remaining (the unused output refunded)", got, 900-out)
	}

	for i := 0; i < 2; i++ {
		if a = call(t, p, body); a.status != http.StatusOK {
			t.Fatalf("call %d: %d", i+2, a.status)
		}
	}
	st := p.State("gpt-test")
	if st.Requests.Remaining != 0 {
		t.Fatalf("requests %+v after three calls", st.Requests)
	}
	a = call(t, p, body)
	if a.status != http.StatusTooManyRequests {
		t.Fatalf("fourth call: %d, want 429", a.status)
	}
	checkAnnounced(t, a.header, clk.Now(), map[string]BucketState{"requests": st.Requests, "tokens": st.Tokens})
	if got := retryAfter(t, a.header); got != 20*time.Second {
		t.Errorf("Retry-After %v, want 20s (one request's refill)", got)
	}
	if p.State("gpt-test") != st {
		t.Error("a call answered 429 changed the buckets")
	}
	clk.Advance(19 * time.Second)
	if a = call(t, p, body); a.status != http.StatusTooManyRequests || retryAfter(t, a.header) != time.Second {
		t.Fatalf("a second early: %d, Retry-After %q; want 429, 1", a.status, a.header.Get("Retry-After"))
	}
	clk.Advance(time.Second)
	if a = call(t, p, body); a.status != http.StatusOK {
		t.Fatalf("after Retry-After: %d, want 200", a.status)
	}
	if got, want := p.Stats(), (ProviderStats{Admitted: 4, Throttled: 2}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	clk.Advance(time.Minute)
	if got, want := p.State("gpt-test"), (State{Requests: BucketState{3, 3, 0}, Tokens: BucketState{1000, 1000, 0}}); got != want {
		t.Errorf("a window later: %+v, want full buckets %+v", got, want)
	}
}

// TestProviderAnthropic: Anthropic's fields announce requests, input and
// output tokens; output is charged after the answer and can take its
// bucket into debt, which the next call waits out.
func TestProviderAnthropic(t *testing.T) {
	clk := newClock()
	p := &Provider{Dialect: limitheader.DialectAnthropic, Now: clk.Now, Seed: 7,
		Limits: Limits{Requests: 60, InputTokens: 600, OutputTokens: 30}}
	const body = `{"model":"claude-test","prompt":"` + "0123456789abcdefghijklmnopqrstuv" + `","max_tokens":1000}`

	before := p.State("claude-test")
	a := call(t, p, body)
	if a.status != http.StatusOK {
		t.Fatalf("first call: %d", a.status)
	}
	after := p.State("claude-test")
	if a.usage.InputTokens != 8 {
		t.Errorf("a prompt of 32 bytes counted %d input tokens, want 8", a.usage.InputTokens)
	}
	// The header describes the call's admission charges, not its output.
	checkAnnounced(t, a.header, clk.Now(), map[string]BucketState{
		"requests":      after.Requests,
		"input-tokens":  after.InputTokens,
		"output-tokens": before.OutputTokens,
	})
	if after.Requests != (BucketState{60, 59, time.Second}) || after.InputTokens != (BucketState{600, 592, 800 * time.Millisecond}) {
		t.Errorf("after one call: %+v", after)
	}
	out := a.usage.OutputTokens
	if out <= 31 {
		t.Fatalf("seed 7 drew %d output tokens; the test needs more than the bucket holds", out)
	}
	// 2 s per output token.
	if want := (BucketState{30, 0, time.Duration(out) * 2 * time.Second}); after.OutputTokens != want {
		t.Errorf("output tokens %+v, want %+v (in debt)", after.OutputTokens, want)
	}

	a = call(t, p, body)
	if a.status != http.StatusTooManyRequests {
		t.Fatalf("a call while output tokens are in debt: %d, want 429", a.status)
	}
	// One output token is back when the debt is 58 s.
	wait := time.Duration(out)*2*time.Second - 58*time.Second
	if got := retryAfter(t, a.header); got != wait {
		t.Errorf("Retry-After %v, want %v", got, wait)
	}
	checkAnnounced(t, a.header, clk.Now(), map[string]BucketState{
		"requests": after.Requests, "input-tokens": after.InputTokens, "output-tokens": after.OutputTokens,
	})
	clk.Advance(wait)
	if a = call(t, p, body); a.status != http.StatusOK {
		t.Fatalf("after Retry-After: %d, want 200", a.status)
	}
	ann, _ := limitheader.ParseAnnouncement(a.header, clk.Now())
	if b, ok := ann.Budget("output-tokens"); !ok || b.Remaining != 1 {
		t.Errorf("output tokens announced %+v, want 1 remaining", b)
	}
}

// TestProviderModels: each model has its own buckets, with the limits
// Models gives it or the default.
func TestProviderModels(t *testing.T) {
	clk := newClock()
	p := &Provider{Now: clk.Now, Limits: Limits{Requests: 1}, Models: map[string]Limits{"big": {Requests: 2}}}
	for _, c := range []struct {
		model string
		want  int
	}{
		{"small", http.StatusOK}, {"small", http.StatusTooManyRequests},
		{"other", http.StatusOK},
		{"big", http.StatusOK}, {"big", http.StatusOK}, {"big", http.StatusTooManyRequests},
	} {
		if a := call(t, p, `{"model":"`+c.model+`","max_tokens":1}`); a.status != c.want {
			t.Errorf("%s: %d, want %d", c.model, a.status, c.want)
		}
	}
	if got := p.State("big").Requests.Limit; got != 2 {
		t.Errorf("big's limit %d, want 2", got)
	}
}

// TestProviderRefuses: malformed calls and calls larger than a limit are
// answered 400 and cost nothing.
func TestProviderRefuses(t *testing.T) {
	clk := newClock()
	p := &Provider{Now: clk.Now, Limits: Limits{Requests: 10, InputTokens: 100, Tokens: 150}}
	for _, body := range []string{
		`{"model":"m","input_tokens":10}`,                  // no max_tokens
		`{"model":"m","input_tokens":-1,"max_tokens":1}`,   // negative input
		`{"model":"m","max_tokens":1000000001}`,            // absurd max_tokens
		`{"model":"m","input_tokens":101,"max_tokens":1}`,  // more input than the limit
		`{"model":"m","input_tokens":100,"max_tokens":51}`, // more than Tokens
		`{"model":`,
	} {
		if a := call(t, p, body); a.status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", body, a.status)
		}
	}
	if st := p.State("m"); st.Requests.Remaining != 10 || st.InputTokens.Remaining != 100 {
		t.Errorf("refused calls were charged: %+v", st)
	}
	if got := p.Stats(); got != (ProviderStats{Refused: 6}) {
		t.Errorf("stats %+v", got)
	}
}

// TestProviderRule: a client that resends every refused call after its
// Retry-After (and sometimes sooner) never gets more than the provider's
// rule admits in any window — limit·(1 + d/Window), plus max_tokens − 1
// for output tokens charged after their answer — and gets at least the
// limit, so the bound binds.
func TestProviderRule(t *testing.T) {
	clk := newClock()
	const window, maxTokens = 10 * time.Second, 50
	lim := Limits{Requests: 20, InputTokens: 400, OutputTokens: 300}
	p := &Provider{Dialect: limitheader.DialectAnthropic, Now: clk.Now, Window: window, Seed: 3, Limits: lim}
	ok := 0
	for i := 0; i < 600; i++ {
		before := p.State("m")
		a := call(t, p, fmt.Sprintf(`{"model":"m","input_tokens":%d,"max_tokens":%d}`, 5+i%30, maxTokens))
		after := p.State("m")
		// The fields describe the admission's charges, not the output
		// charged after the answer.
		checkAnnounced(t, a.header, clk.Now(), map[string]BucketState{
			"requests": after.Requests, "input-tokens": after.InputTokens, "output-tokens": before.OutputTokens,
		})
		if t.Failed() {
			t.Fatalf("call %d", i)
		}
		switch a.status {
		case http.StatusOK:
			ok++
			clk.Advance(time.Duration(i%7) * 10 * time.Millisecond)
		case http.StatusTooManyRequests:
			if i%3 == 0 {
				clk.Advance(100 * time.Millisecond) // impatient
			} else {
				clk.Advance(retryAfter(t, a.header))
			}
		default:
			t.Fatalf("call %d: %d", i, a.status)
		}
	}
	for _, d := range []time.Duration{window / 2, window, 3 * window} {
		got := p.MaxUsage("m", d)
		t.Logf("most charged in %v: %+v", d, got)
		scale := func(l int64) int64 { return l + l*int64(d)/int64(window) }
		if got.Requests > scale(lim.Requests) || got.InputTokens > scale(lim.InputTokens) ||
			got.OutputTokens > scale(lim.OutputTokens)+maxTokens-1 {
			t.Errorf("in %v: %+v admitted, over the rule's %d requests, %d input, %d output tokens",
				d, got, scale(lim.Requests), scale(lim.InputTokens), scale(lim.OutputTokens)+maxTokens-1)
		}
		if d == window && got.Requests < lim.Requests && got.InputTokens < lim.InputTokens && got.OutputTokens < lim.OutputTokens {
			t.Errorf("in %v: %+v admitted: no budget was used up, the test proves nothing", d, got)
		}
	}
	if st := p.Stats(); st.Throttled == 0 || int(st.Admitted) != ok {
		t.Errorf("stats %+v, %d admitted", st, ok)
	}
}

// TestProviderMaxUsage: the sliding maximum over a known log.
func TestProviderMaxUsage(t *testing.T) {
	clk := newClock()
	p := &Provider{Now: clk.Now}
	for _, step := range []time.Duration{0, time.Second, time.Second, 5 * time.Second, 0} {
		clk.Advance(step)
		if a := call(t, p, `{"model":"m","input_tokens":10,"max_tokens":1}`); a.status != http.StatusOK {
			t.Fatal(a.status)
		}
	}
	call(t, p, `{"model":"other","input_tokens":10,"max_tokens":1}`)
	// Calls at 0, 1, 2, 7, 7 s: three in any 3 s, two in [7 s, 8 s).
	if got := p.MaxUsage("m", 3*time.Second); got != (Usage{3, 30, 3}) {
		t.Errorf("MaxUsage(3s) = %+v, want {3 30 3}", got)
	}
	if got := p.MaxUsage("m", time.Second); got != (Usage{2, 20, 2}) {
		t.Errorf("MaxUsage(1s) = %+v, want {2 20 2}", got)
	}
	if got := p.MaxUsage("m", 10*time.Second); got != (Usage{5, 50, 5}) {
		t.Errorf("MaxUsage(10s) = %+v, want {5 50 5}", got)
	}
}

// TestProviderHTTP: over a real connection (httptest.NewServer, real
// clock), concurrent calls are each admitted or refused, never both, and
// the headers parse.
func TestProviderHTTP(t *testing.T) {
	p := &Provider{Dialect: limitheader.DialectOpenAI, Limits: Limits{Requests: 10, Tokens: 100_000}}
	srv := httptest.NewServer(p)
	defer srv.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := 0; i < 20; i++ {
		wg.Go(func() {
			resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader(`{"input_tokens":10,"max_tokens":10}`))
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if a, err := limitheader.ParseAnnouncement(resp.Header, time.Now()); err != nil || len(a.Budgets) != 2 {
				t.Errorf("announcement %+v, %v", a, err)
			}
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	// Ten fit at once; the refill of 20 s of a minute-long bucket is not
	// quick enough for another while the test runs, unless it runs for
	// seconds.
	if codes[http.StatusOK] < 10 || codes[http.StatusOK]+codes[http.StatusTooManyRequests] != 20 {
		t.Errorf("answers %v, want at least ten 200s and the rest 429", codes)
	}
	if st := p.Stats(); st.Admitted != int64(codes[http.StatusOK]) {
		t.Errorf("stats %+v, answers %v", st, codes)
	}
}
