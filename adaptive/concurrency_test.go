package adaptive

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/priority"
)

var t0 = time.Unix(1_000_000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestOptionsRefused(t *testing.T) {
	for _, tt := range []struct {
		opt  ConcurrencyOptions
		want string
	}{
		{ConcurrencyOptions{}, "ConcurrencyOptions.Max 0 must be at least 1"},
		{ConcurrencyOptions{Max: 5, Min: 6}, "ConcurrencyOptions.Min 6"},
		{ConcurrencyOptions{Max: 5, Initial: 9}, "ConcurrencyOptions.Initial 9"},
		{ConcurrencyOptions{Max: 5, Quantile: 1.5}, "ConcurrencyOptions.Quantile"},
		{ConcurrencyOptions{Max: 5, Window: -1}, "ConcurrencyOptions.Window"},
		{ConcurrencyOptions{Max: 5, QueueSize: 3}, "ConcurrencyOptions.MaxWait"},
		{ConcurrencyOptions{Max: 5, Shares: [priority.Levels]float64{1, 0.5, 1, 1, 1}}, "ConcurrencyOptions.Shares"},
		{ConcurrencyOptions{Max: 5, Controller: &Gradient{Smoothing: 2}}, "Gradient.Smoothing"},
		{ConcurrencyOptions{Max: 5, Controller: &AIMD{Backoff: 1}}, "AIMD.Backoff"},
	} {
		if _, err := NewConcurrency(tt.opt); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewConcurrency(%+v) = %v, want an error containing %q", tt.opt, err, tt.want)
		}
	}
	if _, err := NewShedder(ShedderOptions{}); err == nil || !strings.Contains(err.Error(), "Objective.Latency") {
		t.Errorf("NewShedder({}) = %v, want an error naming Objective.Latency", err)
	}
	if _, err := NewGuard(GuardOptions{Concurrency: ConcurrencyOptions{Max: 1}, Features: []Feature{{Name: "x", Off: 0.5, On: 0.6}}}); err == nil {
		t.Error("NewGuard accepted a feature with On above Off")
	}
}

func TestZeroValues(t *testing.T) {
	var l Concurrency
	if _, r := l.TryAcquireAt(at(0), priority.Critical); r.Reason != ReasonLimit {
		t.Errorf("zero Concurrency: refusal %+v, want ReasonLimit", r)
	}
	var s Shedder
	if r := s.AllowAt(at(0), priority.Sheddable); r.Refused() {
		t.Errorf("zero Shedder refused: %+v", r)
	}
	var g Guard
	if _, r := g.TryAcquireAt(at(0), priority.Critical); !r.Refused() {
		t.Error("zero Guard admitted")
	}
	var p Permit
	p.Done() // the zero Permit: nothing happens
}

func TestDoneTwiceDroppedIgnore(t *testing.T) {
	l, err := NewConcurrency(ConcurrencyOptions{Max: 2, Initial: 2, Shares: [priority.Levels]float64{1, 1, 1, 1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := l.TryAcquireAt(at(0), priority.Normal)
	b, _ := l.TryAcquireAt(at(0), priority.Normal)
	if _, r := l.TryAcquireAt(at(0), priority.Normal); r.Reason != ReasonLimit {
		t.Fatalf("third permit: %+v, want ReasonLimit", r)
	}
	a.DoneAt(at(5))
	a.DoneAt(at(6)) // a second end does nothing
	if st := l.Stats(); st.InFlight != 1 {
		t.Fatalf("in flight after Done twice = %d, want 1", st.InFlight)
	}
	b.Ignore()
	c, _ := l.TryAcquireAt(at(7), priority.Normal)
	c.DroppedAt(at(8))
	l.mu.Lock()
	done, drops, n := l.done, l.drops, l.hist.n
	l.mu.Unlock()
	if done != 1 || drops != 1 || n != 1 {
		t.Errorf("done %d, drops %d, latency samples %d; want 1, 1, 1 (Ignore counts nowhere, Dropped gives no latency)", done, drops, n)
	}
}

func TestRefusalError(t *testing.T) {
	l, _ := NewConcurrency(ConcurrencyOptions{Max: 1, Initial: 1})
	ctx := priority.NewContext(context.Background(), priority.Low)
	p, err := l.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Ignore()
	_, err = l.Acquire(ctx)
	var r Refusal
	if !errors.Is(err, ErrOverloaded) || !errors.As(err, &r) || r.Priority != priority.Low || r.RetryAfter < MinRetryAfter || r.RetryAfter > MaxRetryAfter {
		t.Errorf("err = %v (%+v), want a Refusal of a low request with a bounded RetryAfter", err, r)
	}
}

// TestRetryAfterComputed: the hint grows with the refused demand.
func TestRetryAfterComputed(t *testing.T) {
	l, _ := NewConcurrency(ConcurrencyOptions{Max: 10, Initial: 10, MinSamples: 1, Controller: &AIMD{Increase: 1e-9}})
	hint := func(extra int) time.Duration {
		var ps []Permit
		for len(ps) < 10 {
			p, r := l.TryAcquireAt(at(0), priority.Critical)
			if r.Refused() {
				break
			}
			ps = append(ps, p)
		}
		var r Refusal
		for range extra {
			_, r = l.TryAcquireAt(at(0), priority.Critical)
		}
		for i := range ps {
			ps[i].DoneAt(at(100))
		}
		return r.RetryAfter
	}
	_ = hint(0)
	small := hint(5)
	big := hint(500)
	if !(big > small) {
		t.Errorf("RetryAfter with 500 refused %v, with 5 %v: want it to grow with the excess", big, small)
	}
}

// TestAcquireDoneClock: Acquire, Done and Dropped read the time as the
// monotonic time since the Concurrency was built; the latency they measure is
// the time between them, and a Concurrency whose clock was started by an *At
// call measures on the same clock.
func TestAcquireDoneClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		for _, startAt := range []bool{false, true} {
			l, _ := NewConcurrency(ConcurrencyOptions{Max: 10, Initial: 10, MinSamples: 1, Window: 100 * time.Millisecond, Quantile: 1})
			if startAt {
				p, _ := l.TryAcquireAt(time.Now().Add(-time.Hour), priority.Normal)
				p.Ignore()
			}
			p, err := l.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(70 * time.Millisecond) // virtual time in the bubble
			if startAt {
				p.DoneAt(time.Now()) // the *At clock and the monotonic one agree
			} else {
				p.Done()
			}
			time.Sleep(50 * time.Millisecond)
			p, _ = l.Acquire(ctx) // closes the window
			p.Ignore()
			lat := l.Stats().Latency
			if lat < 66*time.Millisecond || lat > 76*time.Millisecond {
				t.Errorf("started by an At call %v: latency %v measured, want 70ms (within its histogram bucket, 67–75.5ms)", startAt, lat)
			}
		}
	})
}

func TestQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := NewConcurrency(ConcurrencyOptions{Max: 1, Initial: 1, QueueSize: 1, MaxWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		held, _ := l.Acquire(context.Background())

		// Queue timeout.
		start := time.Now()
		_, err = l.Acquire(context.Background())
		var r Refusal
		if !errors.As(err, &r) || r.Reason != ReasonQueueTimeout || time.Since(start) != time.Second {
			t.Errorf("queued past MaxWait: %v after %v, want ReasonQueueTimeout after 1s", err, time.Since(start))
		}

		// Cancelled while queued: ctx's error, not a refusal.
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error)
		go func() { _, err := l.Acquire(ctx); errc <- err }()
		synctest.Wait()
		// Queue full meanwhile.
		if _, err := l.Acquire(context.Background()); !errors.As(err, &r) || r.Reason != ReasonQueueFull {
			t.Errorf("with the queue full: %v, want ReasonQueueFull", err)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) || errors.Is(err, ErrOverloaded) {
			t.Errorf("cancelled while queued: %v, want context.Canceled", err)
		}

		// Granted when the holder ends.
		got := make(chan Permit)
		go func() {
			p, err := l.Acquire(priority.NewContext(context.Background(), priority.Critical))
			if err != nil {
				t.Error(err)
			}
			got <- p
		}()
		synctest.Wait()
		held.Done()
		p := <-got
		if st := l.Stats(); st.InFlight != 1 || st.Queued != 0 {
			t.Errorf("after handing over: %+v, want 1 in flight, none queued", st)
		}
		p.Done()
	})
}

// TestFeaturesHysteresis steps the load level through a table: a feature
// goes off at Off, stays off until the level falls to On, and back on.
func TestFeaturesHysteresis(t *testing.T) {
	st := &featureState{f: Feature{Name: "recommendations", Off: 0.8, On: 0.3}}
	st.on.Store(true)
	for i, s := range []struct {
		level float64
		want  bool
	}{{0.5, true}, {0.79, true}, {0.8, false}, {0.5, false}, {0.31, false}, {0.3, true}, {0.7, true}, {1.5, false}} {
		if got := st.update(s.level); got != s.want {
			t.Errorf("step %d, level %v: enabled %v, want %v", i, s.level, got, s.want)
		}
	}
}

// TestGuardFeatureUnderLoad: in the simulator at 3×, the feature is off
// while overloaded and on again once the load has fallen to 0.2×.
func TestGuardFeatureUnderLoad(t *testing.T) {
	g := simGuard(t, 5, nil)
	cfg := baseSim(func(t time.Duration) float64 {
		if t < 3*time.Second {
			return 3
		}
		return 0.2
	}, g)
	cfg.duration = 6 * time.Second
	var during, after bool = true, false
	cfg.probe = func(at time.Duration) {
		switch {
		case at > 2*time.Second && at < 3*time.Second:
			during = during && g.Enabled("recommendations")
		case at > 5*time.Second:
			after = g.Enabled("recommendations")
		}
	}
	runSim(cfg)
	if during || !after {
		t.Errorf("recommendations enabled during overload %v, after %v; want false, true", during, after)
	}
	if !g.Enabled("unknown") {
		t.Error("an unknown feature is disabled")
	}
}

// TestQueueEvictsLowerPriority: a full queue lets a newcomer of higher
// priority in by refusing the lowest-priority waiter (the one that came
// last among them), which gets a Refusal with ReasonQueueFull at once; a
// newcomer of the same or lower priority is refused itself.
func TestQueueEvictsLowerPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := NewConcurrency(ConcurrencyOptions{Max: 1, Initial: 1, QueueSize: 2, MaxWait: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		held, _ := l.Acquire(priority.NewContext(context.Background(), priority.Critical))
		type result struct {
			name string
			p    Permit
			err  error
		}
		res := make(chan result, 4)
		wait := func(name string, p priority.Priority) {
			go func() {
				pm, err := l.Acquire(priority.NewContext(context.Background(), p))
				res <- result{name, pm, err}
			}()
			synctest.Wait()
		}
		wait("sheddable-1", priority.Sheddable)
		wait("sheddable-2", priority.Sheddable)
		// Full of sheddable work: another sheddable request is refused.
		if _, err := l.Acquire(priority.NewContext(context.Background(), priority.Sheddable)); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("sheddable newcomer with the queue full: %v, want a refusal", err)
		}
		// A critical one takes the place of the last sheddable waiter.
		wait("critical", priority.Critical)
		var r Refusal
		select {
		case got := <-res:
			if got.name != "sheddable-2" || !errors.As(got.err, &r) || r.Reason != ReasonQueueFull || r.Priority != priority.Sheddable || r.RetryAfter <= 0 {
				t.Errorf("evicted %s with %v, want sheddable-2 refused with ReasonQueueFull and a retry hint", got.name, got.err)
			}
		default:
			t.Fatal("nobody was evicted for the critical request")
		}
		if st := l.Stats(); st.Queued != 2 || st.Refused[priority.Sheddable.Index()] != 2 {
			t.Errorf("after the eviction: %d queued, %d sheddable refused; want 2 and 2", st.Queued, st.Refused[priority.Sheddable.Index()])
		}
		// The critical request is served first, then the sheddable one.
		held.Done()
		got := <-res
		if got.name != "critical" || got.err != nil {
			t.Fatalf("first served: %s (%v), want critical", got.name, got.err)
		}
		got.p.Done()
		got = <-res
		if got.name != "sheddable-1" || got.err != nil {
			t.Fatalf("then served: %s (%v), want sheddable-1", got.name, got.err)
		}
		got.p.Done()
	})
}
