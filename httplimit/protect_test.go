package httplimit_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/priority"
)

// recorder is an adaptive.Controller that keeps the limit where it is and
// records every window's Sample: how the tests see which permits ended
// with Done, Dropped or Ignore.
type recorder struct {
	mu      sync.Mutex
	samples []adaptive.Sample
}

func (c *recorder) Update(s adaptive.Sample) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples = append(c.samples, s)
	return s.Limit
}

func (c *recorder) all() []adaptive.Sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]adaptive.Sample(nil), c.samples...)
}

// fixedGuard returns a Guard whose limit stays at n, measured over windows
// of a second, and its recorder.
func fixedGuard(t *testing.T, n int, shed *adaptive.ShedderOptions) (*adaptive.Guard, *recorder) {
	t.Helper()
	rec := &recorder{}
	g, err := adaptive.NewGuard(adaptive.GuardOptions{
		Concurrency: adaptive.ConcurrencyOptions{Max: n, Min: n, Initial: n, Controller: rec, Window: time.Second, MinSamples: 1},
		Shedder:     shed,
	})
	if err != nil {
		t.Fatal(err)
	}
	return g, rec
}

// overloadProblem is the problem+json body of Protect's 503.
type overloadProblem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	RetryAfter int64  `json:"retry-after"`
	Priority   string `json:"priority"`
	Reason     string `json:"reason"`
}

// getPrio sends GET path to srv with the Sluice-Priority header prio (none if
// empty) and returns the status, the Retry-After seconds (0 if absent) and
// the body.
func getPrio(t *testing.T, srv *httptest.Server, path, prio string) (int, int64, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+path, nil)
	if prio != "" {
		req.Header.Set(priority.Header, prio)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var ra int64
	if v := resp.Header.Get("Retry-After"); v != "" {
		if ra, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("Retry-After %q: %v", v, err)
		}
	}
	return resp.StatusCode, ra, body
}

// TestProtectPriorityFromHeader: the header's priority, lowered to
// MaxPriority, or the Priority hook's, is what the handler finds in its
// context and what the Guard counts a refusal under.
func TestProtectPriorityFromHeader(t *testing.T) {
	cases := []struct {
		name   string
		opt    httplimit.ProtectOptions
		header string
		want   priority.Priority
	}{
		{"none", httplimit.ProtectOptions{}, "", priority.Normal},
		{"sheddable", httplimit.ProtectOptions{}, "sheddable", priority.Sheddable},
		{"case ignored", httplimit.ProtectOptions{}, "LOW", priority.Low},
		{"invalid is normal", httplimit.ProtectOptions{}, "urgent!", priority.Normal},
		{"critical untrusted", httplimit.ProtectOptions{}, "critical", priority.Normal},
		{"high untrusted", httplimit.ProtectOptions{}, "high", priority.Normal},
		{"critical trusted", httplimit.ProtectOptions{MaxPriority: priority.Critical}, "critical", priority.Critical},
		{"high up to high", httplimit.ProtectOptions{MaxPriority: priority.High}, "critical", priority.High},
		{"hook wins", httplimit.ProtectOptions{Priority: func(r *http.Request) priority.Priority {
			if r.URL.Path == "/checkout" {
				return priority.Critical
			}
			return priority.Low
		}}, "sheddable", priority.Critical},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, _ := fixedGuard(t, 1, nil)
			seen := make(chan priority.Priority, 1)
			h := httplimit.Protect(g, c.opt)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen <- priority.FromContext(r.Context())
			}))
			srv := httptest.NewServer(h)
			defer srv.Close()
			if code, _, _ := getPrio(t, srv, "/checkout", c.header); code != 200 {
				t.Fatalf("status %d", code)
			}
			if got := <-seen; got != c.want {
				t.Errorf("the handler's priority = %v, want %v", got, c.want)
			}
			// With the limit held, the refusal is counted under the
			// request's priority.
			held, rf := g.TryAcquireAt(time.Now(), priority.Critical)
			if rf.Refused() {
				t.Fatal(rf)
			}
			defer held.Ignore()
			code, _, body := getPrio(t, srv, "/checkout", c.header)
			if code != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", code)
			}
			var pb overloadProblem
			if err := json.Unmarshal(body, &pb); err != nil {
				t.Fatal(err)
			}
			if pb.Priority != c.want.String() {
				t.Errorf("problem priority %q, want %q", pb.Priority, c.want)
			}
			shed := g.Stats().Shed
			for i, n := range shed {
				want := uint64(0)
				if i == int(c.want-priority.Sheddable) {
					want = 1
				}
				if n != want {
					t.Errorf("Stats.Shed = %v: want one refusal, of %v", shed, c.want)
					break
				}
			}
		})
	}
}

// TestProtectRefusal: a refused request gets 503, a Retry-After computed
// from the Guard's state (the excess over the throughput measured, so it
// grows as refusals pile up in the window), and a problem+json body saying
// the server is overloaded; the handler is not called and the body is not
// read.
func TestProtectRefusal(t *testing.T) {
	g, _ := fixedGuard(t, 2, nil)
	// On the Guard's clock, started an hour ahead of the wall clock so
	// that the middleware's time.Now() readings all fall at its latest
	// instant: one completion in the first second, so a throughput of one
	// a second, then both slots held.
	t0 := time.Now().Add(time.Hour)
	pm, _ := g.TryAcquireAt(t0, priority.Normal)
	pm.DoneAt(t0.Add(500 * time.Millisecond))
	a, _ := g.TryAcquireAt(t0.Add(time.Second), priority.Critical) // closes the window
	b, _ := g.TryAcquireAt(t0.Add(time.Second), priority.Critical)
	defer a.Ignore()
	defer b.Ignore()
	if st := g.Stats(); st.Throughput != 1 || st.InFlight != 2 {
		t.Fatalf("Stats = %+v; want throughput 1/s, 2 in flight", st)
	}

	protected := httplimit.Protect(g, httplimit.ProtectOptions{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler was called for a refused request")
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := &countingBody{ReadCloser: r.Body}
		r.Body = body
		protected.ServeHTTP(w, r)
		if body.n > 0 {
			t.Error("the middleware read the body of a request it refused")
		}
	}))
	defer srv.Close()
	var prev int64
	for i := range 4 {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/", strings.NewReader("0123456789"))
		req.Header.Set(priority.Header, "low")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503", resp.StatusCode)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("Content-Type %q", ct)
		}
		ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		// The i-th refusal of the window: (i+1 refused + 1) / (1 per s).
		if want := int64(i + 2); ra != want {
			t.Errorf("refusal %d: Retry-After %d, want %d", i, ra, want)
		}
		if ra <= prev {
			t.Errorf("refusal %d: Retry-After %d did not grow from %d", i, ra, prev)
		}
		prev = ra
		var pb overloadProblem
		if err := json.Unmarshal(body, &pb); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		want := overloadProblem{
			Type: "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity", Title: "Temporary reduced capacity",
			Status: 503, RetryAfter: ra, Priority: "low", Reason: "concurrency-limit",
			Detail: "The server is overloaded and refused this low-priority request (concurrency limit reached); retry in " + strconv.FormatInt(ra, 10) + " s.",
		}
		if pb != want {
			t.Errorf("problem\n%+v, want\n%+v", pb, want)
		}
	}
}

// countingBody counts the reads of a request body.
type countingBody struct {
	io.ReadCloser
	n int
}

func (b *countingBody) Read(p []byte) (int, error) {
	b.n++
	return b.ReadCloser.Read(p)
}

// TestProtectOutcomes: a permit ends Done when the handler answers, Dropped
// when it answers 503 or 429 or its request's deadline passed, Ignore when
// the client went away or the handler panicked — as the Guard's window
// shows — and in every case the slot is given back.
func TestProtectOutcomes(t *testing.T) {
	cases := []struct {
		name               string
		path               string
		cancel             bool
		completed, dropped int
	}{
		{"ok", "/ok", false, 1, 0},
		{"handler 503", "/busy", false, 0, 1},
		{"handler 429", "/quota", false, 0, 1},
		{"deadline passed", "/late", false, 0, 1},
		{"client went away", "/wait", true, 0, 0},
		{"panic", "/panic", false, 0, 0},
		{"429 as an answer", "/quota", false, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, rec := fixedGuard(t, 4, nil)
			var opt httplimit.ProtectOptions
			if c.name == "429 as an answer" {
				opt.Overloaded = func(status int) bool { return status == http.StatusServiceUnavailable }
			}
			entered := make(chan struct{})
			returned := make(chan struct{})
			inner := httplimit.Protect(g, opt)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/busy":
					w.WriteHeader(http.StatusServiceUnavailable)
				case "/quota":
					w.WriteHeader(http.StatusTooManyRequests)
				case "/late":
					<-r.Context().Done()
					io.WriteString(w, "late")
				case "/wait":
					close(entered)
					<-r.Context().Done()
				case "/panic":
					panic(http.ErrAbortHandler)
				default:
					io.WriteString(w, "ok")
				}
			}))
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(returned)
				if r.URL.Path == "/late" {
					ctx, cancel := context.WithTimeout(r.Context(), time.Millisecond)
					defer cancel()
					r = r.WithContext(ctx)
				}
				inner.ServeHTTP(w, r)
			})
			srv := httptest.NewServer(h)
			defer srv.Close()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if c.cancel {
				go func() { <-entered; cancel() }()
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+c.path, nil)
			resp, err := srv.Client().Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			} else if !c.cancel && c.path != "/panic" {
				t.Fatal(err)
			}
			<-returned
			if n := g.Stats().InFlight; n != 0 {
				t.Errorf("%d permits still held", n)
			}
			// Close the window well after, on the Guard's clock.
			pm, _ := g.TryAcquireAt(time.Now().Add(time.Minute), priority.Normal)
			pm.Ignore()
			var completed, dropped int
			for _, s := range rec.all() {
				completed += s.Completed
				dropped += s.Dropped
			}
			if completed != c.completed || dropped != c.dropped {
				t.Errorf("windows: %d completed, %d dropped; want %d, %d", completed, dropped, c.completed, c.dropped)
			}
		})
	}
}

// TestProtectShedsLowestFirst: under overload, on the Guard's clock, the
// lowest priorities are refused first — by the Concurrency's shares at the
// limit, and by the Shedder when the latency objective is missed — while
// the higher ones still reach the handler.
func TestProtectShedsLowestFirst(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	trustAll := httplimit.ProtectOptions{MaxPriority: priority.Critical}

	t.Run("limiter shares", func(t *testing.T) {
		g, _ := fixedGuard(t, 10, nil)
		srv := httptest.NewServer(httplimit.Protect(g, trustAll)(handler))
		defer srv.Close()
		// 8 of 10 held: Sheddable and Low may fill 80% and 85%, so they
		// are refused; Normal (90%) and above still pass.
		now := time.Now()
		for range 8 {
			pm, rf := g.TryAcquireAt(now, priority.Critical)
			if rf.Refused() {
				t.Fatal(rf)
			}
			defer pm.Ignore()
		}
		for _, p := range []priority.Priority{priority.Sheddable, priority.Low, priority.Normal, priority.High, priority.Critical} {
			want := 200
			if p < priority.Normal {
				want = 503
			}
			if code, _, _ := getPrio(t, srv, "/", p.String()); code != want {
				t.Errorf("%v: status %d, want %d", p, code, want)
			}
		}
	})

	t.Run("shedder", func(t *testing.T) {
		g, _ := fixedGuard(t, 100, &adaptive.ShedderOptions{
			Objective:  adaptive.Objective{Latency: 100 * time.Millisecond},
			Interval:   time.Second,
			MinSamples: 5,
			Ki:         0.1,                         // a first step (0.22) below the sheddable share (0.4)
			Float64:    func() float64 { return 0 }, // any chance above 0 sheds
		})
		// One interval of 400 ms completions, four in five of them
		// sheddable: the objective is missed, so the Shedder sheds a
		// fraction smaller than the sheddable share.
		t0 := time.Now().Add(time.Hour)
		pms := make([]adaptive.Permit, 10)
		for i := range pms {
			p := priority.Sheddable
			if i%5 == 4 {
				p = priority.Normal
			}
			var rf adaptive.Refusal
			if pms[i], rf = g.TryAcquireAt(t0.Add(time.Duration(i)*10*time.Millisecond), p); rf.Refused() {
				t.Fatal(rf)
			}
		}
		for i := range pms {
			pms[i].DoneAt(t0.Add(time.Duration(400+i*10) * time.Millisecond))
		}
		pm, _ := g.TryAcquireAt(t0.Add(1200*time.Millisecond), priority.Normal) // closes the interval
		pm.Ignore()
		prob := g.Stats().Shedder.Probability
		if !(prob[0] > 0) || prob[2] != 0 {
			t.Fatalf("shed probabilities %v: want Sheddable > 0, Normal 0", prob)
		}

		srv := httptest.NewServer(httplimit.Protect(g, trustAll)(handler))
		defer srv.Close()
		for range 5 {
			code, ra, body := getPrio(t, srv, "/", "sheddable")
			if code != 503 || ra < 1 || !strings.Contains(string(body), `"reason":"shed"`) {
				t.Errorf("sheddable: %d, Retry-After %d, %s; want 503 shed", code, ra, body)
			}
			if code, _, _ := getPrio(t, srv, "/", "normal"); code != 200 {
				t.Errorf("normal: %d, want 200", code)
			}
			if code, _, _ := getPrio(t, srv, "/", "critical"); code != 200 {
				t.Errorf("critical: %d, want 200", code)
			}
		}
	})
}

// TestClientPropagatesPriority: the Client sends the priority of the
// request's context as Sluice-Priority unless the request sets its own, and
// nothing for Normal; through Protect on the way in, a priority set on one
// service reaches the next.
func TestClientPropagatesPriority(t *testing.T) {
	got := make(chan string, 1)
	next := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- strings.Join(r.Header.Values(priority.Header), ",")
	}))
	defer next.Close()
	client := &httplimit.Client{HTTP: next.Client()}
	call := func(ctx context.Context, url, header string) string {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if header != "" {
			req.Header.Set(priority.Header, header)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if req.Header.Get(priority.Header) != header {
			t.Error("Do changed the caller's request")
		}
		return <-got
	}
	ctx := t.Context()
	if h := call(priority.NewContext(ctx, priority.High), next.URL, ""); h != "high" {
		t.Errorf("context High: header %q, want high", h)
	}
	if h := call(priority.NewContext(ctx, priority.Sheddable), next.URL, "low"); h != "low" {
		t.Errorf("request's own header: %q, want low", h)
	}
	if h := call(ctx, next.URL, ""); h != "" {
		t.Errorf("no priority: header %q, want none", h)
	}
	if h := call(priority.NewContext(ctx, priority.Normal), next.URL, ""); h != "" {
		t.Errorf("Normal: header %q, want none", h)
	}

	// front reads the priority and calls next with its request's context.
	g, _ := fixedGuard(t, 4, nil)
	front := httptest.NewServer(httplimit.Protect(g, httplimit.ProtectOptions{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", next.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return
		}
		resp.Body.Close()
	})))
	defer front.Close()
	for _, p := range []string{"sheddable", "low"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", front.URL, nil)
		req.Header.Set(priority.Header, p)
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if h := <-got; h != p {
			t.Errorf("through front: next saw %q, want %q", h, p)
		}
	}
}
