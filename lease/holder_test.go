package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

func TestShares(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []Member
		p       int
		want    []int
	}{
		{"alone", []Member{{"a", 1, 30, 30}}, 20, []int{20}},
		{"alone wants less", []Member{{"a", 1, 3, 3}}, 20, []int{3}},
		{"equal", []Member{{"a", 1, 20, 20}, {"b", 1, 20, 20}}, 20, []int{10, 10}},
		{"three round up", []Member{{"a", 1, 20, 20}, {"b", 1, 20, 20}, {"c", 1, 20, 20}}, 20, []int{7, 7, 7}},
		{"weights", []Member{{"a", 1, 20, 20}, {"b", 3, 20, 20}}, 20, []int{5, 15}},
		{"small want leaves the rest", []Member{{"a", 1, 2, 2}, {"b", 1, 20, 20}, {"c", 1, 20, 20}}, 20, []int{2, 9, 9}},
		{"want 0 and weight 0", []Member{{"a", 1, 0, 0}, {"b", 0, 20, 20}, {"c", 1, 20, 20}}, 20, []int{0, 0, 20}},
		{"all small", []Member{{"a", 1, 4, 4}, {"b", 1, 5, 5}}, 20, []int{4, 5}},
		{"none", nil, 20, []int{}},
		// Needs before headroom: b's need is served before a's headroom.
		{"headroom last", []Member{{"a", 1, 4, 5}, {"b", 1, 7, 9}, {"c", 1, 2, 3}, {"d", 1, 6, 7}}, 20, []int{5, 8, 3, 7}},
		{"needs exceed", []Member{{"a", 1, 4, 5}, {"b", 1, 12, 15}, {"c", 1, 8, 10}}, 20, []int{4, 8, 8}},
		{"headroom shared", []Member{{"a", 1, 5, 10}, {"b", 1, 5, 10}}, 20, []int{10, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := shares(tc.members, tc.p)
			if len(got) != len(tc.want) {
				t.Fatalf("shares = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("shares = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestNewHolderRejects(t *testing.T) {
	mem := NewMemoryStore()
	for _, tc := range []struct {
		name string
		c    Store
		cfg  Options
	}{
		{"nil store", nil, Options{Capacity: 10, Partitions: 2}},
		{"no capacity", mem, Options{Partitions: 2}},
		{"infinite capacity", mem, Options{Capacity: math.Inf(1), Partitions: 2}},
		{"no partitions", mem, Options{Capacity: 10}},
		{"negative reserved", mem, Options{Capacity: 10, Partitions: 2, Reserved: -1}},
		{"renewal outlives the lease", mem, Options{Capacity: 10, Partitions: 2, TTL: time.Second, RenewEvery: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewHolder(tc.c, tc.cfg); !errors.Is(err, ErrBadArgument) {
				t.Fatalf("err = %v, want ErrBadArgument", err)
			}
		})
	}
}

// scripted wraps a Store with a latency and a switch that makes its
// calls fail (a store outage, or a killed process), and lets a test hold
// Renew calls until it lets them go.
type scripted struct {
	Store
	latency time.Duration
	down    atomic.Bool
	mute    bool // notifications never arrive
	mu      sync.Mutex
	holdRen chan struct{} // when not nil, Renew waits for it to close
	renews  int
}

var errDown = errors.New("store down")

func (s *scripted) gate(ctx context.Context) error {
	if s.down.Load() {
		return errDown
	}
	if s.latency > 0 {
		select {
		case <-time.After(s.latency):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Watch forwards the store's notifications, or, muted, lets none
// through: the channel stays silent until ctx is done.
func (s *scripted) Watch(ctx context.Context) (<-chan string, error) {
	n, ok := s.Store.(Notifier)
	if !ok || s.mute {
		c := make(chan string)
		context.AfterFunc(ctx, func() { close(c) })
		return c, nil
	}
	return n.Watch(ctx)
}

func (s *scripted) Heartbeat(ctx context.Context, m Member, ttl time.Duration, p int) (View, error) {
	if err := s.gate(ctx); err != nil {
		return View{}, err
	}
	return s.Store.Heartbeat(ctx, m, ttl, p)
}

func (s *scripted) Acquire(ctx context.Context, id string, parts []int, ttl time.Duration) ([]Grant, error) {
	if err := s.gate(ctx); err != nil {
		return nil, err
	}
	return s.Store.Acquire(ctx, id, parts, ttl)
}

func (s *scripted) Renew(ctx context.Context, id string, ls []Grant, ttl time.Duration) ([]bool, error) {
	if err := s.gate(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	hold := s.holdRen
	s.renews++
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.Store.Renew(ctx, id, ls, ttl)
}

func (s *scripted) Release(ctx context.Context, id string, ls []Grant) error {
	if err := s.gate(ctx); err != nil {
		return err
	}
	return s.Store.Release(ctx, id, ls)
}

func (s *scripted) Leave(ctx context.Context, id string) error {
	if err := s.gate(ctx); err != nil {
		return err
	}
	return s.Store.Leave(ctx, id)
}

// runHolder starts h.Run and returns a function that stops it and returns
// Run's error.
func runHolder(t *testing.T, h *Holder) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- h.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestValidityFromSend checks that a lease's deadline counts from the
// instant its request was sent, not from when the answer came.
func TestValidityFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lat = 200 * time.Millisecond
		sc := &scripted{Store: NewMemoryStore(), latency: lat}
		h, err := NewHolder(sc, Options{ID: "a", Capacity: 100, Partitions: 4, TTL: 3 * time.Second, Seed: 1, Window: -1})
		if err != nil {
			t.Fatal(err)
		}
		h.SetBacklog(10000)
		start := time.Now()
		runHolder(t, h)
		// Heartbeat, then Acquire: sent at start+lat, answered at +2 lat.
		time.Sleep(2*lat + time.Millisecond)
		synctest.Wait()
		ls := h.LeasesAt(time.Now())
		if len(ls) != 4 {
			t.Fatalf("leases %+v, want 4", ls)
		}
		validity := 3*time.Second - 30*time.Millisecond - 300*time.Millisecond // TTL − drift − margin
		for _, l := range ls {
			if got := l.Deadline.Sub(start); got != lat+validity {
				t.Errorf("lease %d: deadline start+%v, want start+%v (sent at +%v)", l.Partition, got, lat+validity, lat)
			}
		}
		if got := h.Limiter().Limit(); got != 100 {
			t.Errorf("limit %v, want 100", got)
		}
	})
}

// TestNoUseWhileRenewalInFlight checks that capacity stops at a lease's
// deadline while its renewal hangs, and comes back when it succeeds.
func TestNoUseWhileRenewalInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		sc := &scripted{Store: NewMemoryStore(), holdRen: hold}
		h, err := NewHolder(sc, Options{ID: "a", Capacity: 100, Partitions: 4, TTL: 3 * time.Second,
			CallTimeout: 10 * time.Second, Jitter: -1, Seed: 1, Window: -1})
		if err != nil {
			t.Fatal(err)
		}
		h.SetBacklog(10000)
		start := time.Now()
		runHolder(t, h)
		synctest.Wait()
		lim := h.Limiter()
		if got := lim.Limit(); got != 100 {
			t.Fatalf("limit %v after acquiring, want 100", got)
		}
		deadline := start.Add(3*time.Second - 330*time.Millisecond)
		// The renewal sent at start+1s hangs.
		time.Sleep(time.Until(deadline) - time.Nanosecond)
		synctest.Wait()
		if sc.renews == 0 {
			t.Fatal("no renewal sent")
		}
		if !lim.AllowN(time.Now(), 1) {
			t.Error("AllowN refused just before the deadline")
		}
		time.Sleep(time.Nanosecond)
		if got := lim.Limit(); got != 0 {
			t.Errorf("limit %v at the deadline with the renewal in flight, want 0", got)
		}
		if lim.AllowN(time.Now(), 1) {
			t.Error("AllowN admitted at the deadline with the renewal in flight")
		}
		if s := h.Stats(); s.Leases != 0 || s.Granted != 0 {
			t.Errorf("stats %+v, want no valid lease", s)
		}
		// A stale instant does not bring the leases back.
		before := deadline.Add(-time.Second)
		if s := h.StatsAt(before); s.Leases != 0 || s.Rate != 0 {
			t.Errorf("stats at a stale instant %+v, want no valid lease", s)
		}
		if lim.AllowN(before, 1) || lim.LimitAt(before) != 0 {
			t.Error("a stale instant brought capacity back")
		}
		// A waiter blocks until the renewal comes back.
		waited := make(chan time.Duration, 1)
		go func() {
			t0 := time.Now()
			if err := lim.Wait(context.Background()); err != nil {
				t.Error(err)
			}
			waited <- time.Since(t0)
		}()
		time.Sleep(50 * time.Millisecond)
		close(hold) // the store still has the leases (expiry start+1s+3s)
		synctest.Wait()
		if got := lim.Limit(); got != 100 {
			t.Errorf("limit %v after the renewal came back, want 100", got)
		}
		// Not before the renewal; then as soon as the refilled capacity
		// (which starts empty) allows: within burst/rate.
		if w := <-waited; w < 50*time.Millisecond || w > 150*time.Millisecond {
			t.Errorf("waiter waited %v, want from 50ms (the renewal) to 150ms", w)
		}
	})
}

// TestThrottleController walks the controller of ThrottledAfterAt: a
// hint pauses without cutting, 429s of one episode cut nothing, a repeat
// cuts in proportion to the overshoot (never below Backoff), and the
// ceiling is gone Recovery after a cut.
func TestThrottleController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := NewHolder(NewMemoryStore(), Options{ID: "a", Capacity: 400, Partitions: 16, Jitter: -1, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		h.SetBacklog(1_000_000)
		runHolder(t, h)
		synctest.Wait()
		lim := h.Limiter()
		if got := lim.Limit(); got != 392 { // 400 − 4/s of burst − 1 %
			t.Fatalf("limit %v, want 392", got)
		}
		// A caller that uses it all, so that the window's count is known.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var sent atomic.Int64
		go func() {
			for lim.Wait(ctx) == nil {
				sent.Add(1)
			}
		}()
		time.Sleep(2 * time.Second)

		// A 429 with a hint of 300 ms: a pause, no cut.
		h.ThrottledAfter(300 * time.Millisecond)
		before := sent.Load()
		if s := h.Stats(); s.Paused != 300*time.Millisecond || !math.IsInf(s.Ceiling, 1) || s.Cuts != 0 {
			t.Fatalf("after a hinted 429: paused %v ceiling %v cuts %d, want 300ms, +Inf, 0", s.Paused, s.Ceiling, s.Cuts)
		}
		time.Sleep(299 * time.Millisecond)
		synctest.Wait()
		if n := sent.Load() - before; n > 1 {
			t.Errorf("%d units admitted during the pause, want none (at most one already due)", n)
		}
		// More 429s of the same episode (answers to requests in flight
		// until the pause and a tenth of a period have passed): no cut.
		for range 9 {
			h.Throttled()
		}
		time.Sleep(50 * time.Millisecond)
		h.Throttled()
		if s := h.Stats(); s.Cuts != 0 || s.Throttled != 11 {
			t.Fatalf("within the episode: cuts %d throttled %d, want 0 and 11", s.Cuts, s.Throttled)
		}
		// A repeat after the episode: a cut of 11 (the episode's 429s)
		// over the units sent in the last second.
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		inWindow := float64(h.guardCount(time.Now()))
		h.Throttled()
		s := h.Stats()
		want := 400 * (1 - 11/inWindow)
		if s.Cuts != 1 || math.Abs(s.Ceiling-want) > 0.5 {
			t.Fatalf("repeat: cuts %d ceiling %v, want 1 and %.1f (11 of %v sent)", s.Cuts, s.Ceiling, want, inWindow)
		}
		// Recovery: halfway after one period, gone after two.
		time.Sleep(time.Second)
		if c := h.Stats().Ceiling; math.Abs(c-(want+400)/2) > 1 {
			t.Errorf("ceiling %v a period after the cut, want %.1f", c, (want+400)/2)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if s := h.Stats(); !math.IsInf(s.Ceiling, 1) || lim.Limit() != 392 {
			t.Errorf("two periods after the cut: ceiling %v limit %v, want +Inf and 392", s.Ceiling, lim.Limit())
		}
		// Long after: a new episode; a repeat with an overshoot beyond
		// 1 − Backoff is cut to Backoff.
		time.Sleep(3 * time.Second)
		for range 500 {
			h.Throttled()
		}
		time.Sleep(200 * time.Millisecond)
		h.Throttled()
		if s := h.Stats(); s.Cuts != 2 || s.Ceiling != 300 {
			t.Errorf("a large overshoot: cuts %d ceiling %v, want 2 and 300 (Backoff 0.75)", s.Cuts, s.Ceiling)
		}
	})
}

// TestObserve checks that Observe reads a 429's retry hint, a 503's
// pause (not counted as throttling) and RateLimit-Policy's window.
func TestObserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := NewHolder(NewMemoryStore(), Options{ID: "a", Capacity: 400, Partitions: 16, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		// The policy of the lowest quota per second is "sec" (200/s).
		h.Observe(200, map[string][]string{"Ratelimit-Policy": {`"hour";q=1000000;w=3600, "sec";q=400;w=2`}})
		if w := h.Stats().Window; w != 2*time.Second {
			t.Errorf("window %v, want 2s", w)
		}
		h.Observe(429, map[string][]string{"X-Ms-Retry-After-Ms": {"250"}})
		if s := h.Stats(); s.Throttled != 1 || s.Paused != 250*time.Millisecond {
			t.Errorf("after a 429: throttled %d paused %v, want 1 and 250ms", s.Throttled, s.Paused)
		}
		time.Sleep(time.Second)
		h.Observe(503, map[string][]string{"Retry-After": {"2"}})
		if s := h.Stats(); s.Throttled != 1 || s.Paused != 2*time.Second {
			t.Errorf("after a 503: throttled %d paused %v, want 1 and 2s", s.Throttled, s.Paused)
		}
		h.Observe(429, map[string][]string{"Ratelimit": {`"b";r=0;t=3`}})
		if s := h.Stats(); s.Throttled != 2 || s.Paused != 3*time.Second {
			t.Errorf("after RateLimit t=3: throttled %d paused %v, want 2 and 3s", s.Throttled, s.Paused)
		}
		h.Observe(200, map[string][]string{"Ratelimit-Policy": {`malformed;;`}})
		if w := h.Stats().Window; w != 2*time.Second {
			t.Errorf("a malformed policy changed the window to %v", w)
		}
	})
}

func TestOutagePolicy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy OutagePolicy
		want   ratelimit.Limit
	}{
		{"reserved only", OutageReserved, 10},
		{"even share", OutageEvenShare, 10 + 400/4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemoryStore()
				// Three other members present, so the even share is C/4.
				for _, id := range []string{"x", "y", "z"} {
					if _, err := mem.Heartbeat(context.Background(), Member{ID: id, Weight: 1}, time.Hour, 16); err != nil {
						t.Fatal(err)
					}
				}
				sc := &scripted{Store: mem}
				h, err := NewHolder(sc, Options{ID: "a", Capacity: 400, Partitions: 16, Reserved: 10,
					Outage: tc.policy, Jitter: -1, Seed: 1, Window: -1})
				if err != nil {
					t.Fatal(err)
				}
				if got := h.Limiter().Limit(); got != 10 {
					t.Fatalf("limit before any lease %v, want the reserved 10", got)
				}
				h.SetBacklog(1_000_000)
				runHolder(t, h)
				synctest.Wait()
				if got := h.Limiter().Limit(); got != 410 {
					t.Fatalf("limit %v, want 410 (all free partitions + reserved)", got)
				}
				sc.down.Store(true)
				time.Sleep(3 * time.Second)
				synctest.Wait()
				s := h.Stats()
				if !s.Outage || s.Outages == 0 {
					t.Errorf("stats %+v, want an outage", s)
				}
				if got := h.Limiter().Limit(); got != tc.want {
					t.Errorf("limit in the outage %v, want %v", got, tc.want)
				}
				sc.down.Store(false)
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if s := h.Stats(); s.Outage || s.Rate < 100 {
					t.Errorf("after the outage: %+v, want leases again", s)
				}
			})
		})
	}
}

func TestShutdownReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemoryStore()
		h, err := NewHolder(mem, Options{ID: "a", Capacity: 100, Partitions: 4, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		h.SetBacklog(1000)
		stop := runHolder(t, h)
		synctest.Wait()
		if err := h.Run(context.Background()); !errors.Is(err, ErrRunning) {
			t.Errorf("second Run: %v, want ErrRunning", err)
		}
		if n := len(h.LeasesAt(time.Now())); n != 4 {
			t.Fatalf("%d leases, want 4", n)
		}
		if err := stop(); err != nil {
			t.Fatalf("Run returned %v", err)
		}
		v, err := mem.Heartbeat(context.Background(), Member{ID: "b", Weight: 1}, time.Second, 4)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range v.Partitions {
			if p.Owner != "" {
				t.Errorf("partition %d still owned by %q", i, p.Owner)
			}
		}
		if len(v.Members) != 1 {
			t.Errorf("members %+v, want only b", v.Members)
		}
		if got := h.Limiter().Limit(); got != 0 {
			t.Errorf("limit after shutdown %v, want 0", got)
		}
	})
}

func TestLimiterWaitErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := NewHolder(NewMemoryStore(), Options{ID: "a", Capacity: 100, Partitions: 4, Seed: 1, Window: -1})
		if err != nil {
			t.Fatal(err)
		}
		lim := h.Limiter()
		if err := lim.WaitN(context.Background(), 11); !errors.Is(err, ratelimit.ErrExceedsBurst) {
			t.Errorf("WaitN(11) with largest burst 10: %v, want ErrExceedsBurst", err)
		}
		if err := lim.WaitN(context.Background(), -1); err == nil {
			t.Error("WaitN(-1) succeeded")
		}
		h.SetBacklog(1000)
		runHolder(t, h)
		synctest.Wait()
		// Burst 10 at 100/s: the bucket starts empty, so 10 units need
		// 100ms; a context of 50ms fails at once.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		if err := lim.WaitN(ctx, 10); !errors.Is(err, ratelimit.ErrWouldExceedDeadline) {
			t.Errorf("WaitN(10) with 50ms left: %v, want ErrWouldExceedDeadline", err)
		}
		if time.Since(t0) != 0 {
			t.Error("WaitN waited before failing")
		}
		if err := lim.WaitN(context.Background(), 10); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(t0); got != 100*time.Millisecond {
			t.Errorf("WaitN(10) took %v, want 100ms (new capacity starts empty)", got)
		}
	})
}

// TestStaleHolderFenced pauses a holder's renewal past the TTL: another
// holder gets the partitions with new epochs, and the stale renewal is
// refused and counted as losses, never taken as a success.
func TestStaleHolderFenced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemoryStore()
		hold := make(chan struct{})
		sa := &scripted{Store: mem, holdRen: hold}
		a, err := NewHolder(sa, Options{ID: "a", Capacity: 100, Partitions: 4, CallTimeout: time.Minute, Jitter: -1, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		a.SetBacklog(10000)
		runHolder(t, a)
		synctest.Wait()
		old := a.LeasesAt(time.Now())
		if len(old) != 4 {
			t.Fatalf("a holds %d leases, want 4", len(old))
		}
		// a's renewal at 1s hangs; its leases end at 2.67s for a and
		// 2.85s for the store. b arrives at 2.5s.
		time.Sleep(2500 * time.Millisecond)
		b, err := NewHolder(mem, Options{ID: "b", Capacity: 100, Partitions: 4, Jitter: -1, Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		b.SetBacklog(10000)
		runHolder(t, b)
		// a's presence lasts until 3.85s (its heartbeat at 1s went through):
		// until then b aims at half.
		for range 200 { // 2 s in steps of 10 ms, checking exclusivity
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
			now := time.Now()
			if na, nb := len(a.LeasesAt(now)), len(b.LeasesAt(now)); na+nb > 4 {
				t.Fatalf("at %v: a holds %d and b %d valid leases of 4", now, na, nb)
			}
		}
		if n := len(b.LeasesAt(time.Now())); n != 4 {
			t.Fatalf("b holds %d leases after a's expired, want 4", n)
		}
		close(hold) // a's stale renewal reaches the store
		synctest.Wait()
		if s := a.Stats(); s.Losses != 4 {
			t.Errorf("a: losses %d, want 4", s.Losses)
		}
		// a is back (its next heartbeat) and gets its share again, under
		// new epochs: whoever holds a partition now holds a later epoch
		// than the stale one, which the store refuses.
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		now := time.Now()
		current := map[int]Grant{}
		for _, l := range append(a.LeasesAt(now), b.LeasesAt(now)...) {
			current[l.Partition] = l.Grant
		}
		for _, l := range old {
			if ok, err := mem.Valid(context.Background(), l.Grant); err != nil || ok {
				t.Errorf("Valid(stale %+v) = %v, %v; want false", l.Grant, ok, err)
			}
			g, found := current[l.Partition]
			if !found || g.Epoch <= l.Epoch {
				t.Errorf("partition %d: held as %+v (found %v), want an epoch above %d", l.Partition, g, found, l.Epoch)
				continue
			}
			if ok, err := mem.Valid(context.Background(), g); err != nil || !ok {
				t.Errorf("Valid(%+v) = %v, %v; want true", g, ok, err)
			}
		}
	})
}

// rival is a Store on which member "x" takes the first two
// partitions of the holder's first acquire just before it reaches the
// store, and releases them just after: two members that looked at the
// same instant, of which the holder lost.
type rival struct {
	Store
	mu   sync.Mutex
	done bool
}

func (r *rival) Acquire(ctx context.Context, id string, parts []int, ttl time.Duration) ([]Grant, error) {
	r.mu.Lock()
	first := !r.done && len(parts) >= 2
	r.done = true
	r.mu.Unlock()
	if !first {
		return r.Store.Acquire(ctx, id, parts, ttl)
	}
	taken, err := r.Store.Acquire(ctx, "x", parts[:2], ttl)
	if err != nil || len(taken) != 2 {
		return nil, fmt.Errorf("rival acquire: %v %v", taken, err)
	}
	got, err := r.Store.Acquire(ctx, id, parts, ttl)
	if err != nil {
		return nil, err
	}
	return got, r.Store.Release(ctx, "x", taken)
}

// TestLooksAgainAfterContention checks that a holder whose acquire lost
// partitions to another member looks again within a twentieth of a
// period, not a period later.
func TestLooksAgainAfterContention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rc := &rival{Store: NewMemoryStore()}
		h, err := NewHolder(rc, Options{ID: "a", Capacity: 100, Partitions: 4, TTL: 3 * time.Second, Jitter: -1, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		h.SetBacklog(10000)
		start := time.Now()
		runHolder(t, h)
		synctest.Wait()
		if n := len(h.LeasesAt(time.Now())); n != 2 {
			t.Fatalf("a holds %d leases after losing two of four, want 2", n)
		}
		time.Sleep(time.Second/20 + time.Millisecond) // period/20
		synctest.Wait()
		if n := len(h.LeasesAt(time.Now())); n != 4 {
			t.Errorf("a holds %d leases %v after losing two, want 4", n, time.Since(start))
		}
	})
}

// TestStatedDemand runs two holders on one MemoryStore, in a bubble,
// whose callers pace themselves and state their demand (SetDemand): with
// backlogs they share the partitions evenly; when one states none, the
// other takes them all. AllowanceAt reports the rate, the bucket that
// paces it, a deadline a validity ahead, and a Changed that closes.
func TestStatedDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemoryStore()
		opts := Options{Capacity: 1000, Partitions: 10, TTL: 3 * time.Second}
		a, err := NewHolder(mem, Options{ID: "a", Capacity: opts.Capacity, Partitions: opts.Partitions, TTL: opts.TTL, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewHolder(mem, Options{ID: "b", Capacity: opts.Capacity, Partitions: opts.Partitions, TTL: opts.TTL, Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		first := a.AllowanceAt(time.Now())
		if first.Rate != 0 || !first.Deadline.IsZero() {
			t.Fatalf("before Run: %+v, want no rate and no deadline", first)
		}
		a.SetDemand(0, 10000)
		b.SetDemand(0, 10000)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for _, h := range []*Holder{a, b} {
			wg.Go(func() { _ = h.Run(ctx) })
		}
		time.Sleep(5 * time.Second) // virtual: a few periods
		synctest.Wait()
		now := time.Now()
		for _, h := range []*Holder{a, b} {
			al := h.AllowanceAt(now)
			limit, burst := pacing(500, time.Second)
			if al.Rate != 500 || al.Limit != limit || al.Burst != burst || al.Window != time.Second {
				t.Errorf("%s: %+v, want 500/s paced at %v with burst %d in 1s windows", h.ID(), al, limit, burst)
			}
			if left := al.Deadline.Sub(now); left <= 0 || left > h.Options().validity() {
				t.Errorf("%s: deadline %v ahead, want within the validity %v", h.ID(), left, h.Options().validity())
			}
		}
		select {
		case <-first.Changed:
		default:
			t.Error("the first allowance's Changed is still open after the rate changed")
		}
		b.SetDemand(0, 0)
		b.Wake()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		now = time.Now()
		if ra, rb := a.AllowanceAt(now).Rate, b.AllowanceAt(now).Rate; ra != 1000 || rb != 0 {
			t.Errorf("after b stated no demand: a %v/s, b %v/s; want 1000 and 0", ra, rb)
		}
		if st := b.StatsAt(now); st.Demand != 0 || st.Need != 0 {
			t.Errorf("b's stats: demand %v need %d, want 0 and 0", st.Demand, st.Need)
		}
		cancel()
		wg.Wait()
	})
}
