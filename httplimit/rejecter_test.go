package httplimit_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/storetest"
)

// flaky answers status to every request while it is non-zero, else 200,
// and counts the requests.
type flaky struct {
	status atomic.Int64
	n      atomic.Int64
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	f.n.Add(1)
	if s := f.status.Load(); s != 0 {
		w.WriteHeader(int(s))
		return
	}
	w.WriteHeader(http.StatusOK)
}

func newRejecter(t *testing.T, o adaptive.RejecterOptions) *adaptive.Rejecter {
	t.Helper()
	th, err := adaptive.NewRejecter(o)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// TestClientRejecter: against a real server that answers 503 for a while,
// the Client rejects most requests locally, at once, with ErrRejectedLocally
// (not ErrWouldExceedDeadline), and returns the 503s of those it sends;
// after the server recovers, rejecting stops and every request is sent
// and answered 200.
func TestClientRejecter(t *testing.T) {
	f := &flaky{}
	f.status.Store(http.StatusServiceUnavailable)
	srv := httptest.NewServer(f)
	defer srv.Close()
	clock := storetest.NewClock(time.Unix(1_200_000, 0))
	window := 20 * time.Second
	th := newRejecter(t, adaptive.RejecterOptions{Window: window, Now: clock.Now, Rand: rand.New(rand.NewPCG(1, 2)).Float64})
	c := &httplimit.Client{HTTP: srv.Client(), Rejecter: th, MaxRetries: -1}
	const step = 100 * time.Millisecond

	// 30 s of failure: a request every 100 ms.
	var rejected, unavailable int
	for range 300 {
		resp, err := get(t, t.Context(), c, srv.URL)
		switch {
		case err == nil && resp.StatusCode == http.StatusServiceUnavailable:
			unavailable++
		case errors.Is(err, httplimit.ErrRejectedLocally) && !errors.Is(err, httplimit.ErrWouldExceedDeadline):
			rejected++
		default:
			t.Fatalf("while failing: %v, %v; want a 503 or ErrRejectedLocally", resp, err)
		}
		clock.Advance(step)
	}
	if sent := f.n.Load(); sent != int64(unavailable) || sent > 45 {
		t.Errorf("the server saw %d requests of 300 while failing (%d 503s returned), want at most 45 (the probability is capped at 0.9)", sent, unavailable)
	}
	st := th.Stats()
	if st.TotalRequests != 300 || st.TotalAccepts != 0 || st.TotalRejected != int64(rejected) {
		t.Errorf("rejecter stats %+v, want 300 requests, no accepts, %d rejected", st, rejected)
	}
	t.Logf("failing: %d rejected locally, %d sent and answered 503; probability at the end %.3f", rejected, unavailable, st.Probability)

	// The server recovers. The rejecter still rejects at first, then
	// stops; within two windows (the cap on the probability kept one request
	// in ten probing it) every request goes out again.
	f.status.Store(0)
	sentBefore := f.n.Load()
	var recovered time.Duration = -1
	rejected = 0
	requests := 0
	for at := time.Duration(0); at < 2*window; at += step {
		requests++
		resp, err := get(t, t.Context(), c, srv.URL)
		switch {
		case err == nil && resp.StatusCode == http.StatusOK:
		case errors.Is(err, httplimit.ErrRejectedLocally):
			rejected++
			if recovered >= 0 {
				t.Fatalf("rejected %v after the recovery, after the probability fell to zero at %v", at, recovered)
			}
		default:
			t.Fatalf("after the recovery: %v, %v; want a 200 or ErrRejectedLocally", resp, err)
		}
		clock.Advance(step)
		if recovered < 0 && th.Stats().Probability == 0 {
			recovered = at
		}
	}
	if rejected == 0 {
		t.Error("nothing was rejected after the recovery: the failure was forgotten at once")
	}
	if recovered < 0 {
		t.Fatalf("still rejecting %v after the recovery (stats %+v)", 2*window, th.Stats())
	}
	if sent := f.n.Load() - sentBefore; sent != int64(requests-rejected) {
		t.Errorf("the server saw %d requests after the recovery, want the %d not rejected", sent, requests-rejected)
	}
	t.Logf("recovery: %d rejected locally, rejecting stopped %v after the recovery", rejected, recovered)
}

// TestClientRejecterPassesOverloadOn: 429s and 503s are returned to the
// caller after the Client's retries, not absorbed, and none of them counts
// as an accept; a 400 or 404 does.
func TestClientRejecterPassesOverloadOn(t *testing.T) {
	for _, c := range []struct {
		status   int
		accepted bool
	}{{http.StatusTooManyRequests, false}, {http.StatusServiceUnavailable, false}, {http.StatusBadRequest, true}, {http.StatusNotFound, true}, {http.StatusInternalServerError, true}} {
		f := &flaky{}
		f.status.Store(int64(c.status))
		srv := httptest.NewServer(f)
		th := newRejecter(t, adaptive.RejecterOptions{Rand: func() float64 { return 0.999999 }})
		cl := &httplimit.Client{HTTP: srv.Client(), Rejecter: th, MaxRetries: 2, Rand: func() float64 { return 0 }}
		resp, err := get(t, t.Context(), cl, srv.URL)
		srv.Close()
		if err != nil || resp.StatusCode != c.status {
			t.Errorf("status %d: got %v, %v; want the response returned", c.status, resp, err)
			continue
		}
		wantSent, wantAccepts := int64(3), int64(0) // the request and its two retries
		if c.accepted {
			wantSent, wantAccepts = 1, 1
		}
		if n := f.n.Load(); n != wantSent {
			t.Errorf("status %d: the server saw %d requests, want %d", c.status, n, wantSent)
		}
		if st := th.Stats(); st.TotalRequests != wantSent || st.TotalAccepts != wantAccepts {
			t.Errorf("status %d: rejecter counted %d requests and %d accepts, want %d and %d", c.status, st.TotalRequests, st.TotalAccepts, wantSent, wantAccepts)
		}
	}
}

// TestClientRejecterRejectsRetry: a retry the Rejecter rejects is not
// sent, and the service's 503 is returned instead of ErrRejectedLocally.
func TestClientRejecterRejectsRetry(t *testing.T) {
	f := &flaky{}
	f.status.Store(http.StatusServiceUnavailable)
	srv := httptest.NewServer(f)
	defer srv.Close()
	at := time.Unix(1_200_000, 0)
	draws := []float64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // whatever the filling below draws
	th := newRejecter(t, adaptive.RejecterOptions{Now: func() time.Time { return at }, Rand: func() float64 {
		r := draws[0]
		draws = draws[1:]
		return r
	}})
	for range 10 { // 10 requests, 4 accepts: p = 2/11 for the request
		th.AllowAt(at)
	}
	for range 4 {
		th.AcceptAt(at)
	}
	draws = []float64{0.99, 0} // the request passes, its retry does not
	before := th.Stats().TotalRejected
	c := &httplimit.Client{HTTP: srv.Client(), Rejecter: th, MaxRetries: 3, Rand: func() float64 { return 0 }}
	resp, err := get(t, t.Context(), c, srv.URL)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("got %v, %v; want the 503", resp, err)
	}
	if n := f.n.Load(); n != 1 {
		t.Errorf("the server saw %d requests, want 1: the retry was rejected", n)
	}
	if st := c.Stats(); st.Retries != 0 {
		t.Errorf("%d retries counted, want 0", st.Retries)
	}
	if st := th.Stats(); st.TotalRejected != before+1 || st.TotalRequests != 12 {
		t.Errorf("rejecter stats %+v, want 12 requests, 1 rejected more than %d", st, before)
	}
}

// TestClientRejecterOutcomes: an error of the transport is not an accept;
// a request its caller cancelled is.
func TestClientRejecterOutcomes(t *testing.T) {
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // answers nothing until the client gives up
	}))
	defer srv.Close()
	th := newRejecter(t, adaptive.RejecterOptions{Rand: func() float64 { return 0.999999 }})
	c := &httplimit.Client{HTTP: srv.Client(), Rejecter: th}

	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(req)
		done <- err
	}()
	// The request reaches the server (whose handler waits), then is
	// cancelled by its caller.
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}
	if st := th.Stats(); st.TotalAccepts != 1 {
		t.Errorf("a cancelled request counted %d accepts, want 1", st.TotalAccepts)
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close() // nothing listens there any more
	if _, err := get(t, t.Context(), c, url); err == nil {
		t.Fatal("a request to a closed server succeeded")
	}
	if st := th.Stats(); st.TotalRequests != 2 || st.TotalAccepts != 1 {
		t.Errorf("after an error of the transport: %d requests, %d accepts, want 2 and 1", st.TotalRequests, st.TotalAccepts)
	}
}
