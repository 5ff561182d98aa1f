package coord

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/concurrency"
)

func newService(t *testing.T, l Limits) (*Service, *concurrency.MemoryStore) {
	t.Helper()
	m := concurrency.NewMemoryStore()
	s, err := New(Options{Store: m, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	return s, m
}

// code returns err's Code, failing the test if err is no *Error.
func code(t *testing.T, err error) Code {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is no *coord.Error", err)
	}
	return e.Code
}

func TestAcquireRenewRelease(t *testing.T) {
	s, m := newService(t, Limits{})
	ctx := context.Background()
	g, err := s.Acquire(ctx, AcquireRequest{Name: "db", Limit: 2, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Valid from the request's receipt: TTL less the margin, and the
	// moment the Service took before its store call.
	if g.Fence != 1 || checkID("permit_id", g.PermitID) != nil || g.ValidFor <= 0 || g.ValidFor > time.Second-time.Second/50+100*time.Millisecond {
		t.Errorf("grant = %+v; want fence 1, a well-formed id, valid for (0, 980ms + 100ms]", g)
	}
	if n := m.HoldersAt(time.Now(), "db"); n != 1 {
		t.Errorf("store holders = %d, want 1", n)
	}
	if v, err := s.Renew(ctx, "db", g.PermitID, 2*time.Second); err != nil || v <= time.Second || v > 2*time.Second {
		t.Errorf("Renew = %v, %v; want (1s, 2s]", v, err)
	}
	if _, err := s.Renew(ctx, "other", g.PermitID, 0); code(t, err) != NotFound {
		t.Errorf("Renew under another name: %v, want NotFound", err)
	}
	if err := s.Release(ctx, "db", g.PermitID); err != nil {
		t.Fatal(err)
	}
	if n := m.HoldersAt(time.Now(), "db"); n != 0 {
		t.Errorf("store holders after Release = %d, want 0", n)
	}
	if err := s.Release(ctx, "db", g.PermitID); code(t, err) != NotFound {
		t.Errorf("second Release: %v, want NotFound", err)
	}
	if _, err := s.Renew(ctx, "db", g.PermitID, 0); code(t, err) != NotFound {
		t.Errorf("Renew after Release: %v, want NotFound", err)
	}
	g2, err := s.Acquire(ctx, AcquireRequest{Name: "db", Limit: 2})
	if err != nil || g2.Fence != 2 || g2.PermitID == g.PermitID {
		t.Errorf("second grant = %+v, %v; want fence 2 and a new id", g2, err)
	}
}

func TestBounds(t *testing.T) {
	s, _ := newService(t, Limits{MaxNameBytes: 8, MinTTL: time.Second, MaxTTL: time.Minute, MaxWait: 5 * time.Second})
	ctx := context.Background()
	for _, tc := range []struct {
		req  AcquireRequest
		want string
	}{
		{AcquireRequest{Limit: 1}, "name is empty"},
		{AcquireRequest{Name: "123456789", Limit: 1}, "name is 9 bytes: at most 8"},
		{AcquireRequest{Name: "a\xff", Limit: 1}, "not valid UTF-8"},
		{AcquireRequest{Name: "a", Limit: 0}, "limit 0"},
		{AcquireRequest{Name: "a", Limit: MaxLimit + 1}, "limit 1099511627777"},
		{AcquireRequest{Name: "a", Limit: 2, Weight: 3}, "weight 3: want 1 to the limit, 2"},
		{AcquireRequest{Name: "a", Limit: 2, Weight: -1}, "weight -1"},
		{AcquireRequest{Name: "a", Limit: 1, TTL: time.Millisecond}, "ttl 1ms: want 1s to 1m0s"},
		{AcquireRequest{Name: "a", Limit: 1, TTL: time.Hour}, "ttl 1h0m0s"},
		{AcquireRequest{Name: "a", Limit: 1, Wait: 6 * time.Second}, "wait 6s: want 0 to 5s"},
		{AcquireRequest{Name: "a", Limit: 1, Wait: -1}, "wait -1ns"},
	} {
		_, err := s.Acquire(ctx, tc.req)
		if err == nil || code(t, err) != Invalid || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Acquire(%+v) = %v; want Invalid saying %q", tc.req, err, tc.want)
		}
	}
	for _, id := range []string{"", "short", strings.Repeat("A", 25) + "1", strings.Repeat("a", 26)} {
		if err := s.Release(ctx, "a", id); code(t, err) != Invalid {
			t.Errorf("Release(%q) = %v; want Invalid", id, err)
		}
	}
	if _, err := s.Renew(ctx, "a", strings.Repeat("A", 26), time.Hour); code(t, err) != Invalid {
		t.Errorf("Renew with ttl 1h: %v; want Invalid", err)
	}
	// A well-formed id that was never granted holds nothing.
	if err := s.Release(ctx, "a", strings.Repeat("A", 26)); code(t, err) != NotFound {
		t.Errorf("Release of an id never granted: %v; want NotFound", err)
	}
	for _, l := range []Limits{{MinTTL: time.Microsecond}, {MinTTL: time.Second, MaxTTL: time.Millisecond * 500}, {DefaultTTL: time.Hour}, {MaxWaiters: -1}} {
		if _, err := New(Options{Store: concurrency.NewMemoryStore(), Limits: l}); err == nil {
			t.Errorf("New with %+v: no error", l)
		}
	}
}

// TestLimitNeverExceeded runs many acquirers of a weighted semaphore at
// once and checks the weight held.
func TestLimitNeverExceeded(t *testing.T) {
	s, _ := newService(t, Limits{})
	const limit, workers, rounds = 4, 12, 5
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			weight := int64(1 + w%2)
			for range rounds {
				g, err := s.Acquire(context.Background(), AcquireRequest{Name: "x", Limit: limit, Weight: weight, Wait: 10 * time.Second, Fair: w%3 == 0})
				if err != nil {
					errs <- err
					return
				}
				n := held.Add(weight)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				held.Add(-weight)
				if err := s.Release(context.Background(), "x", g.PermitID); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if p := peak.Load(); p > limit || p == 0 {
		t.Errorf("peak weight held = %d; want 1 to %d", p, limit)
	}
}

// TestWaiterGranted checks that a waiting acquire is granted once the
// permit is released, and that one more waiter than MaxWaiters is
// refused.
func TestWaiterGranted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newService(t, Limits{MaxWaiters: 1})
		ctx := context.Background()
		first, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1}); code(t, err) != NoPermit {
			t.Errorf("acquire without wait while held: %v; want NoPermit", err)
		}
		got := make(chan Grant, 1)
		go func() {
			g, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: 10 * time.Second})
			if err != nil {
				t.Error(err)
			}
			got <- g
		}()
		synctest.Wait()
		if n := s.Waiting("x"); n != 1 {
			t.Fatalf("waiting = %d, want 1", n)
		}
		if _, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: time.Second}); code(t, err) != TooManyWaiters {
			t.Errorf("a second waiter with MaxWaiters 1: %v; want TooManyWaiters", err)
		}
		start := time.Now()
		if err := s.Release(ctx, "x", first.PermitID); err != nil {
			t.Fatal(err)
		}
		g := <-got
		if g.Fence != 2 {
			t.Errorf("waiter's fence = %d, want 2", g.Fence)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("waiter granted %v after the release; want at once", d)
		}
		if n := s.Waiting("x"); n != 0 {
			t.Errorf("waiting after the grant = %d, want 0", n)
		}
	})
}

// TestGoneWaiterHoldsNothing checks that a waiter whose caller goes away
// is answered Gone, leaves the count and the fair queue, and holds no
// permit afterwards.
func TestGoneWaiterHoldsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, m := newService(t, Limits{})
		bg := context.Background()
		first, err := s.Acquire(bg, AcquireRequest{Name: "x", Limit: 1, Fair: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		done := make(chan error, 1)
		go func() {
			_, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: 10 * time.Second, Fair: true})
			done <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-done; code(t, err) != Gone {
			t.Errorf("cancelled waiter: %v; want Gone", err)
		}
		if err := s.Release(bg, "x", first.PermitID); err != nil {
			t.Fatal(err)
		}
		if n := m.HoldersAt(time.Now(), "x"); n != 0 {
			t.Errorf("holders after the waiter left and the holder released = %d, want 0", n)
		}
		// The queue is empty: a fair acquire with no wait is granted.
		if _, err := s.Acquire(bg, AcquireRequest{Name: "x", Limit: 1, Fair: true}); err != nil {
			t.Errorf("fair acquire after the waiter left: %v", err)
		}
		if n := s.Waiting("x"); n != 0 {
			t.Errorf("waiting = %d, want 0", n)
		}
	})
}

// TestLapsedPermit checks that a permit not renewed lapses within its
// TTL, that a waiter then gets it with a larger fence, and that the old
// id renews nothing.
func TestLapsedPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newService(t, Limits{})
		ctx := context.Background()
		const ttl = time.Second
		start := time.Now()
		old, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		g, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < ttl || d > ttl+concurrency.DefaultMaxBackoff {
			t.Errorf("granted %v after the first grant; want within [TTL, TTL + poll interval]", d)
		}
		if g.Fence <= old.Fence {
			t.Errorf("fence after the lapse = %d, not above %d", g.Fence, old.Fence)
		}
		if _, err := s.Renew(ctx, "x", old.PermitID, ttl); code(t, err) != NotFound {
			t.Errorf("renewal of the lapsed permit: %v; want NotFound", err)
		}
	})
}

func TestAuthorized(t *testing.T) {
	open, _ := newService(t, Limits{})
	if !open.Authorized("") || !open.Authorized("x") {
		t.Error("a Service without a token refused a call")
	}
	s, err := New(Options{Store: concurrency.NewMemoryStore(), Token: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Authorized("secret") || s.Authorized("") || s.Authorized("secreT") {
		t.Error("Authorized with token \"secret\" answers wrongly")
	}
}

// TestShutdown checks that Shutdown ends a waiting acquire at once, as
// Unavailable, holding nothing, and that renewals and releases go on.
func TestShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, m := newService(t, Limits{})
		ctx := context.Background()
		held, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: 10 * time.Second})
			done <- err
		}()
		synctest.Wait()
		start := time.Now()
		s.Shutdown()
		if err := <-done; code(t, err) != Unavailable || !strings.Contains(err.Error(), "shutting down") {
			t.Errorf("waiter at shutdown: %v; want Unavailable, shutting down", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("the waiter ended %v after Shutdown; want at once", d)
		}
		if _, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: time.Second}); code(t, err) != Unavailable {
			t.Errorf("a wait after Shutdown: %v; want Unavailable", err)
		}
		if _, err := s.Renew(ctx, "x", held.PermitID, 0); err != nil {
			t.Errorf("renewal after Shutdown: %v", err)
		}
		if err := s.Release(ctx, "x", held.PermitID); err != nil {
			t.Errorf("release after Shutdown: %v", err)
		}
		if n := m.HoldersAt(time.Now(), "x"); n != 0 {
			t.Errorf("holders = %d, want 0", n)
		}
	})
}

// TestMetrics checks the calls counted by outcome and the waiting gauge.
func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		s, err := New(Options{Store: concurrency.NewMemoryStore(), Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		g, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1})
		s.Acquire(ctx, AcquireRequest{Name: "", Limit: 1})
		s.Renew(ctx, "x", g.PermitID, 0)
		done := make(chan struct{})
		go func() {
			s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, Wait: time.Second})
			close(done)
		}()
		synctest.Wait()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_semaphore_waiting Acquires of the coordination API waiting for a permit in this process, over every semaphore.
# TYPE sluice_semaphore_waiting gauge
sluice_semaphore_waiting 1
`), "sluice_semaphore_waiting"); err != nil {
			t.Error(err)
		}
		<-done
		s.Release(ctx, "x", g.PermitID)
		s.Release(ctx, "x", g.PermitID)
		for _, tc := range []struct {
			method, outcome string
			want            float64
		}{
			{"acquire", "ok", 1}, {"acquire", "no_permit", 2}, {"acquire", "invalid", 1},
			{"renew", "ok", 1}, {"release", "ok", 1}, {"release", "not_found", 1},
		} {
			if n := testutil.ToFloat64(s.metrics.calls.WithLabelValues(tc.method, tc.outcome)); n != tc.want {
				t.Errorf("calls{%s,%s} = %v, want %v", tc.method, tc.outcome, n, tc.want)
			}
		}
	})
}

// TestValidForAfterAWait: a permit granted after a wait of 5 s is valid
// for the wait and the TTL (less its margin) from the request, since the
// caller counts ValidFor from when it sent the request; counted from the
// answer, it would look valid for 980 ms from 5 s before: already lapsed.
func TestValidForAfterAWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newService(t, Limits{})
		ctx := context.Background()
		first, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan Grant, 1)
		go func() {
			g, err := s.Acquire(ctx, AcquireRequest{Name: "x", Limit: 1, TTL: time.Second, Wait: 10 * time.Second})
			if err != nil {
				t.Error(err)
			}
			got <- g
		}()
		synctest.Wait()
		time.Sleep(5 * time.Second) // the bubble's clock: the wait
		if err := s.Release(ctx, "x", first.PermitID); err != nil {
			t.Fatal(err)
		}
		g := <-got
		if want := 5*time.Second + time.Second - time.Second/50; g.ValidFor != want {
			t.Errorf("valid for %v after a wait of 5 s, want %v (the wait, and TTL less TTL/50)", g.ValidFor, want)
		}
	})
}
