package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/priority"
)

func newLimiter(t *testing.T, o adaptive.ConcurrencyOptions) *adaptive.Concurrency {
	t.Helper()
	l, err := adaptive.NewConcurrency(o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestClientConcurrencyBound: with a Concurrency limiter of 4, no more than
// 4 requests are in flight to the service; the others fail at once with
// the limiter's refusal, and the slots come back when the answers do.
func TestClientConcurrencyBound(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	defer srv.Close()
	l := newLimiter(t, adaptive.ConcurrencyOptions{Max: 4, Initial: 4, Controller: &adaptive.AIMD{}})
	c := &httplimit.Client{Concurrency: l}
	// Critical: a priority's share of the limit is the whole of it.
	ctx := priority.NewContext(t.Context(), priority.Critical)

	const n = 6
	results := make(chan error, n)
	for range n {
		go func() {
			_, err := get(t, ctx, c, srv.URL)
			results <- err
		}()
	}
	in, refused, done := 0, 0, 0
	for in+refused < n {
		select {
		case <-arrived:
			in++
		case err := <-results:
			done++
			if !errors.Is(err, adaptive.ErrOverloaded) {
				t.Fatalf("a request that returned before any was answered: %v, want the limiter's refusal", err)
			}
			refused++
		}
	}
	if in != 4 || refused != n-4 {
		t.Errorf("%d requests reached the service and %d were refused; want 4 and %d", in, refused, n-4)
	}
	if st := l.Stats(); st.InFlight != 4 {
		t.Errorf("%d slots held with 4 requests in flight", st.InFlight)
	}
	close(release)
	for ; done < n; done++ {
		if err := <-results; err != nil {
			t.Errorf("a request in flight: %v", err)
		}
	}
	if st := l.Stats(); st.InFlight != 0 {
		t.Errorf("%d slots still held after every answer", st.InFlight)
	}
}

// TestClientConcurrencyShrinks: a service that answers 503 makes the
// Concurrency limit shrink (each answer is a drop), and one that answers
// 200 again lets it grow back.
func TestClientConcurrencyShrinks(t *testing.T) {
	f := &flaky{}
	f.status.Store(http.StatusServiceUnavailable)
	srv := httptest.NewServer(f)
	defer srv.Close()
	l := newLimiter(t, adaptive.ConcurrencyOptions{Max: 20, Min: 1, Initial: 20, Window: time.Millisecond, MinSamples: 1, Controller: &adaptive.AIMD{}})
	c := &httplimit.Client{Concurrency: l, MaxRetries: -1}
	// Until the limit has fallen (a window closes every millisecond of
	// answers; bounded by a count of requests, not by time).
	for i := 0; l.Stats().Limit > 4; i++ {
		if i == 5000 {
			t.Fatalf("the limit is still %v after 5,000 answers 503", l.Stats().Limit)
		}
		if resp, err := get(t, t.Context(), c, srv.URL); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%v, %v; want the service's 503 passed on", resp, err)
		}
	}
	low := l.Stats().Limit
	// The service recovers. Growth needs the limiter to be the bottleneck
	// (at least half the limit in flight), so four callers keep it busy
	// until the limit has grown (bounded by a count of requests).
	f.status.Store(0)
	var wg sync.WaitGroup
	var calls atomic.Int64
	for range 4 {
		wg.Go(func() {
			for l.Stats().Limit <= low && calls.Add(1) <= 20000 {
				if _, err := get(t, t.Context(), c, srv.URL); err != nil && !errors.Is(err, adaptive.ErrOverloaded) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if l.Stats().Limit <= low {
		t.Fatalf("the limit is still %v after 20,000 requests answered 200", l.Stats().Limit)
	}
	t.Logf("the limit fell from 20 to %v on 503s and grew back to %v on 200s", low, l.Stats().Limit)
}
