package httplimit_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/httplimit/throttledtest"
	"github.com/sluicehq/sluice/ratelimit"
)

// *ratelimit.Limiter is what the Client is built for.
var _ httplimit.AdjustableLimiter = (*ratelimit.Limiter)(nil)

// script is a test server answering from a list of responses in turn (the
// last one repeats) and recording when each request arrived, with its body.
type script struct {
	mu       sync.Mutex
	replies  []func(w http.ResponseWriter)
	arrivals []time.Time
	bodies   []string
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	i := min(len(s.arrivals), len(s.replies)-1)
	s.arrivals = append(s.arrivals, time.Now())
	s.bodies = append(s.bodies, string(body))
	reply := s.replies[i]
	s.mu.Unlock()
	reply(w)
}

func (s *script) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrivals)
}

func throttle(h http.Header) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for k, v := range h {
			w.Header()[k] = v
		}
		w.WriteHeader(http.StatusTooManyRequests)
	}
}

func ok(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }

func get(t *testing.T, ctx context.Context, c *httplimit.Client, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// TestClientHeaderForms: whatever form the delay takes, the retry goes
// out no earlier than asked.
func TestClientHeaderForms(t *testing.T) {
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
	}{
		{"retry-after seconds", http.Header{"Retry-After": {"3"}}, 3 * time.Second},
		{"retry-after date", http.Header{"Retry-After": {"Sat, 01 Jan 2000 00:00:02 GMT"}, "Date": {"Sat, 01 Jan 2000 00:00:00 GMT"}}, 2 * time.Second},
		{"retry-after-ms", http.Header{"Retry-After-Ms": {"750"}}, 750 * time.Millisecond},
		{"x-ms-retry-after-ms", http.Header{"X-Ms-Retry-After-Ms": {"1200"}}, 1200 * time.Millisecond},
		{"ratelimit t", http.Header{"Ratelimit": {`"q";r=0;t=4`}}, 4 * time.Second},
		{"x-ratelimit-reset", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"2"}}, 2 * time.Second},
		{"capped", http.Header{"Retry-After": {"86400"}}, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{replies: []func(http.ResponseWriter){throttle(tt.header), ok}}
				c := &httplimit.Client{
					HTTP:     &http.Client{Transport: throttledtest.HandlerTransport{Handler: s}},
					MaxPause: 5 * time.Second,
					Rand:     func() float64 { return 0 }, // no jitter: exact instants
				}
				resp, err := get(t, t.Context(), c, "http://svc.test/x")
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("Do: %v, %v", resp, err)
				}
				if n := s.count(); n != 2 {
					t.Fatalf("%d requests, want 2", n)
				}
				if got := s.arrivals[1].Sub(s.arrivals[0]); got != tt.want {
					t.Errorf("retried after %v, want %v", got, tt.want)
				}
			})
		})
	}
}

// TestClientHTTPTestServer checks the millisecond form end to end over a
// real loopback server.
func TestClientHTTPTestServer(t *testing.T) {
	s := &script{replies: []func(http.ResponseWriter){throttle(http.Header{"X-Ms-Retry-After-Ms": {"40"}}), ok}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c := &httplimit.Client{HTTP: srv.Client(), Rand: func() float64 { return 0 }}
	resp, err := get(t, t.Context(), c, srv.URL)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("Do: %v, %v", resp, err)
	}
	if got := s.arrivals[1].Sub(s.arrivals[0]); got < 40*time.Millisecond {
		t.Errorf("retried after %v, want at least 40ms", got)
	}
	if st := c.Stats(); st.Requests != 2 || st.Throttled != 1 || st.Retries != 1 {
		t.Errorf("stats = %+v", st)
	}
}

// TestClientSharedPause: one 429 pauses every goroutine sharing the Client
// for that host, and only for that host.
func TestClientSharedPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &script{replies: []func(http.ResponseWriter){throttle(http.Header{"Retry-After": {"10"}}), ok}}
		b := &script{replies: []func(http.ResponseWriter){ok}}
		mux := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Host == "a.test" {
				a.ServeHTTP(w, r)
			} else {
				b.ServeHTTP(w, r)
			}
		})
		c := &httplimit.Client{HTTP: &http.Client{Transport: throttledtest.HandlerTransport{Handler: mux}}, Rand: func() float64 { return 0.5 }}
		// One goroutine gets a 429 asking for 10 s; five more, and one for
		// another host, start while the pause is on.
		t2 := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { get(t, t.Context(), c, "http://a.test/one") })
		synctest.Wait() // the first request has its 429; the pause is on
		for range 5 {
			wg.Go(func() { get(t, t.Context(), c, "http://a.test/more") })
		}
		wg.Go(func() { get(t, t.Context(), c, "http://b.test/other") })
		synctest.Wait()
		if n := b.count(); n != 1 || !b.arrivals[0].Equal(t2) {
			t.Errorf("host b: %d requests at %v, want 1 at once: a pause of host a held it", n, b.arrivals)
		}
		if n := a.count(); n != 1 {
			t.Errorf("host a: %d requests during the pause, want 1 (the throttled one)", n)
		}
		wg.Wait()
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.arrivals) != 7 {
			t.Fatalf("host a: %d requests, want 7 (1 throttled, its retry, 5 others)", len(a.arrivals))
		}
		for _, at := range a.arrivals[1:] {
			if at.Sub(t2) < 10*time.Second {
				t.Errorf("a request went out %v into a 10s pause", at.Sub(t2))
			}
		}
	})
}

// TestClientRetryBudget: with every response a 429, retries stay within
// 10% of the requests and the 429s are returned.
func TestClientRetryBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{replies: []func(http.ResponseWriter){throttle(http.Header{"Retry-After-Ms": {"1"}})}}
		c := &httplimit.Client{
			HTTP:       &http.Client{Transport: throttledtest.HandlerTransport{Handler: s}},
			MinRetries: -1,
			MaxRetries: 5,
			Rand:       func() float64 { return 0 },
		}
		const calls = 200
		for range calls {
			resp, err := get(t, t.Context(), c, "http://svc.test/")
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("status %d, want the 429 returned", resp.StatusCode)
			}
		}
		st := c.Stats()
		if st.Retries > calls/10 || st.Retries < calls/10-1 {
			t.Errorf("%d retries for %d calls, want about 10%%", st.Retries, calls)
		}
		if st.Requests != calls+st.Retries {
			t.Errorf("requests %d, want calls + retries = %d", st.Requests, calls+st.Retries)
		}
		if st.RetriesDenied == 0 {
			t.Error("the budget never refused a retry")
		}
	})
}

// TestClientRetryable: POST without GetBody is not retried; POST with
// GetBody is, with its body intact; MaxRetries < 0 retries nothing.
func TestClientRetryable(t *testing.T) {
	tests := []struct {
		name     string
		body     func() io.Reader
		noGetter bool
		max      int
		want     int // requests the server sees
	}{
		{name: "with GetBody", body: func() io.Reader { return strings.NewReader("payload") }, want: 2},
		{name: "without GetBody", body: func() io.Reader { return io.MultiReader(strings.NewReader("payload")) }, noGetter: true, want: 1},
		{name: "no retries", body: func() io.Reader { return bytes.NewReader([]byte("payload")) }, max: -1, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{replies: []func(http.ResponseWriter){throttle(http.Header{"Retry-After": {"1"}}), ok}}
				c := &httplimit.Client{HTTP: &http.Client{Transport: throttledtest.HandlerTransport{Handler: s}}, MaxRetries: tt.max}
				req, _ := http.NewRequest("POST", "http://svc.test/", tt.body())
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if n := s.count(); n != tt.want {
					t.Fatalf("server saw %d requests, want %d", n, tt.want)
				}
				for i, b := range s.bodies {
					if b != "payload" {
						t.Errorf("body %d = %q", i, b)
					}
				}
			})
		})
	}
}

// TestClientREADMEPacing: a first user's scenario. 20 requests paced at 8/s
// (burst 1) against a server that answers the third with 429 and
// Retry-After-Ms: 100. The hint pauses, cuts nothing, and the 20 complete
// in about 2.4 s of virtual time (19 gaps of 125 ms plus the pause and the
// retry's jitter), not the 4.8 s of halving the rate and climbing back 1%
// of it per success.
func TestClientREADMEPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{}
		s.replies = []func(http.ResponseWriter){ok, ok, throttle(http.Header{"Retry-After-Ms": {"100"}}), ok}
		lim := ratelimit.NewLimiter(8, 1)
		c := &httplimit.Client{
			HTTP:    &http.Client{Transport: throttledtest.HandlerTransport{Handler: s}},
			Limiter: lim,
			Rand:    func() float64 { return 0.5 },
		}
		start := time.Now()
		for i := range 20 {
			resp, err := get(t, t.Context(), c, "http://svc.test/")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: %v %v", i, resp, err)
			}
		}
		took := time.Since(start)
		st := c.Stats()
		t.Logf("20 requests at 8/s with one 429 (Retry-After-Ms: 100): %v; rate %v, throttled %d, retries %d", took, st.Rate, st.Throttled, st.Retries)
		if took > 2600*time.Millisecond || took < 2375*time.Millisecond {
			t.Errorf("took %v, want about 2.4 s (2.375 s of pacing, the 100 ms pause, a retry)", took)
		}
		if st.Rate != 8 || lim.Limit() != 8 {
			t.Errorf("rate %v (limiter %v) after one hinted 429, want 8: a hint pauses and cuts nothing", st.Rate, lim.Limit())
		}
		if st.Throttled != 1 || st.Retries != 1 {
			t.Errorf("throttled %d retries %d, want 1 and 1", st.Throttled, st.Retries)
		}
	})
}

// TestClientRepeated429sCutInProportion: 429s without a hint. The first
// episode cuts nothing; a repeat after it, within two seconds, cuts in
// proportion to the overshoot (the episode's 429s over what was sent in
// the last second), never below Decrease of the rate; the rate then climbs
// back to the maximum within Recovery (2 s by default).
func TestClientRepeated429sCutInProportion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		tooMany := false
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if tooMany {
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			w.WriteHeader(http.StatusOK)
		})
		set := func(v bool) { mu.Lock(); tooMany = v; mu.Unlock() }
		lim := ratelimit.NewLimiter(100, 1)
		c := &httplimit.Client{HTTP: &http.Client{Transport: throttledtest.HandlerTransport{Handler: h}}, Limiter: lim, MaxRetries: -1}
		send := func(n int) {
			for range n {
				resp, err := get(t, t.Context(), c, "http://svc.test/")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
		}
		send(100) // a second at 100/s
		set(true)
		send(1) // the first 429: an episode, no cut
		if got := lim.Limit(); got != 100 {
			t.Errorf("after one 429: rate %v, want 100 (the first episode cuts nothing)", got)
		}
		time.Sleep(200 * time.Millisecond) // virtual: past the episode, within the repeat window
		send(1)                            // a repeat: cut by 1 (the episode's 429s) over ~100 sent
		r1 := float64(lim.Limit())
		if r1 >= 100 || r1 < 98 {
			t.Errorf("after a repeat, one 429 over about 100 sent: rate %v, want a cut of about 1%%", r1)
		}
		// A burst of 429s in one episode, then a repeat: the cut is in
		// proportion, here deeper, but never below Decrease (0.5) of the rate.
		time.Sleep(150 * time.Millisecond)
		send(1) // a repeat again: starts an episode
		send(30)
		time.Sleep(200 * time.Millisecond)
		send(1) // repeat: 31 429s of the episode over ~60 sent in the last second
		r2 := float64(lim.Limit())
		if r2 >= r1*0.75 || r2 < r1*0.5-1 {
			t.Errorf("after a repeat of an episode of 31 429s: rate %v (from %v), want a cut in proportion, deeper than a quarter and never below half", r2, r1)
		}
		set(false)
		time.Sleep(2 * time.Second)
		send(1)
		if got := lim.Limit(); got != 100 {
			t.Errorf("2 s (Recovery) after the last cut: rate %v, want back at 100", got)
		}
	})
}

// TestClientDeadline: a wait longer than the deadline fails at once.
func TestClientDeadline(t *testing.T) {
	tests := []struct {
		name    string
		limiter httplimit.Limiter
		pause   string // Retry-After of the first response
	}{
		{name: "retry after exceeds deadline", pause: "30"},
		{name: "pacing exceeds deadline", limiter: ratelimit.NewLimiter(0.01, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{replies: []func(http.ResponseWriter){ok}}
				if tt.pause != "" {
					s.replies = []func(http.ResponseWriter){throttle(http.Header{"Retry-After": {tt.pause}}), ok}
				}
				c := &httplimit.Client{HTTP: &http.Client{Transport: throttledtest.HandlerTransport{Handler: s}}, Limiter: tt.limiter}
				if tt.limiter != nil {
					get(t, t.Context(), c, "http://svc.test/") // spends the one token
				}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				start := time.Now()
				_, err := get(t, ctx, c, "http://svc.test/")
				if !errors.Is(err, httplimit.ErrWouldExceedDeadline) {
					t.Fatalf("err = %v, want ErrWouldExceedDeadline", err)
				}
				if tt.pause != "" && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("err = %v, want it to match context.DeadlineExceeded too", err)
				}
				if el := time.Since(start); el != 0 {
					t.Errorf("failed after %v, want at once", el)
				}
				// A later call within the pause fails at once too.
				if tt.pause != "" {
					ctx2, cancel2 := context.WithTimeout(t.Context(), time.Second)
					defer cancel2()
					if _, err := get(t, ctx2, c, "http://svc.test/"); !errors.Is(err, httplimit.ErrWouldExceedDeadline) {
						t.Errorf("call during the pause: err = %v", err)
					}
				}
			})
		})
	}
}

func TestWithCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{replies: []func(http.ResponseWriter){ok}}
		lim := ratelimit.NewLimiter(10, 10)
		c := &httplimit.Client{HTTP: &http.Client{Transport: throttledtest.HandlerTransport{Handler: s}}, Limiter: lim}
		req, _ := http.NewRequestWithContext(httplimit.WithCost(t.Context(), 4), "GET", "http://svc.test/", nil)
		if _, err := c.Do(req); err != nil {
			t.Fatal(err)
		}
		if got := lim.Tokens(); got != 6 {
			t.Errorf("tokens after a cost-4 request: %v, want 6", got)
		}
	})
}
