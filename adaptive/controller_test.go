package adaptive

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestControllerSteps feeds each controller fixed samples, one window at a
// time, and checks the limit it returns.
func TestControllerSteps(t *testing.T) {
	ms := time.Millisecond
	g := &Gradient{Target: 100 * ms}
	a := &AIMD{Target: 100 * ms}
	if err := g.validate(); err != nil {
		t.Fatal(err)
	}
	if err := a.validate(); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		c    Controller
		s    Sample
		want float64
	}{
		// limit + 0.2·(limit·gradient + 1 − limit)
		{"gradient at target", g, Sample{Limit: 50, Latency: 100 * ms, Completed: 100}, 50 + 0.2*1},
		{"gradient 2× slow", g, Sample{Limit: 50, Latency: 200 * ms, Completed: 100}, 50 + 0.2*(25+1-50)},
		{"gradient 4× slow, bounded at 0.5", g, Sample{Limit: 50, Latency: 400 * ms, Completed: 100}, 50 + 0.2*(25+1-50)},
		{"gradient fast, bounded at MaxGrowth", g, Sample{Limit: 50, Latency: 10 * ms, Completed: 100}, 50 + 0.2*(55+1-50)},
		{"gradient drops", g, Sample{Limit: 50, Latency: 10 * ms, Completed: 80, Dropped: 20}, 50 + 0.2*(25+1-50)},
		{"gradient no completions", g, Sample{Limit: 50}, 50},
		{"aimd good", a, Sample{Limit: 50, Latency: 90 * ms, Completed: 100}, 51},
		{"aimd slow", a, Sample{Limit: 50, Latency: 110 * ms, Completed: 100}, 45},
		{"aimd drop", a, Sample{Limit: 50, Latency: 10 * ms, Completed: 100, Dropped: 1}, 45},
	}
	for _, s := range steps {
		if got := s.c.Update(s.s); math.Abs(got-s.want) > 1e-9 {
			t.Errorf("%s: limit %v, want %v", s.name, got, s.want)
		}
	}

	// AIMD without a target: queueing is in-flight rising while
	// throughput stays flat.
	q := &AIMD{}
	_ = q.validate()
	for i, s := range []struct {
		inflight, throughput, want float64
	}{{20, 1000, 51}, {25, 1250, 51}, {30, 1260, 45}, {30, 1260, 51}} {
		if got := q.Update(Sample{Limit: 50, Completed: 100, InFlight: s.inflight, Throughput: s.throughput}); got != s.want {
			t.Errorf("aimd queueing step %d: limit %v, want %v", i, got, s.want)
		}
	}

	// Gradient with a baseline: the mean of the first windows, then a
	// quarter of the way to the mean of the latest five when that is
	// lower; a higher window at the same throughput (a queue) leaves it;
	// a change of speed — the throughput a quarter or more lower with the
	// latency above the aim, or a quarter or more higher with the latency
	// below the baseline — holds the limit for one window and from the
	// second scales the baseline by the reference throughput over the
	// mean throughput measured since.
	b := &Gradient{}
	_ = b.validate()
	type step struct {
		lat  time.Duration
		x    float64
		base time.Duration
		held bool // the limit is left as it was
	}
	rep := func(n int, s step) []step { return slices.Repeat([]step{s}, n) }
	bsteps := slices.Concat(
		[]step{{30 * ms, 1000, 30 * ms, false}, {50 * ms, 1000, 40 * ms, false}},
		rep(3, step{40 * ms, 1000, 40 * ms, false}),
		rep(4, step{36 * ms, 1000, 40 * ms, false}),  // lower, but fewer than five yet
		[]step{{36 * ms, 1000, 39 * ms, false}},      // five lower: a quarter of the way
		[]step{{135 * ms, 1000, 39 * ms, false}},     // queueing: held
		[]step{{100 * ms, 500, 39 * ms, true}},       // slower, once: the limit held
		rep(13, step{100 * ms, 500, 78 * ms, false}), // slower, twice: ×2 (the fall in throughput), measured for 13 windows
		[]step{{30 * ms, 1000, 78 * ms, true}},       // faster, once: held
		[]step{{30 * ms, 1000, 39 * ms, false}},      // faster, twice: ÷2
	)
	for i, s := range bsteps {
		got := b.Update(Sample{Limit: 10, Latency: s.lat, Completed: 10, Throughput: s.x, Refused: 1})
		if b.Baseline() != s.base || (got == 10) != s.held {
			t.Errorf("baseline step %d: baseline %v, limit %v; want %v, held %v", i, b.Baseline(), got, s.base, s.held)
		}
	}
	// A window in which the limiter refused nothing shows the demand, not
	// what the server can do: it leaves the reference throughput as it is.
	r := &Gradient{}
	_ = r.validate()
	for range warmWindows {
		r.Update(Sample{Limit: 10, Latency: 30 * ms, Completed: 10, Throughput: 1000})
	}
	r.Update(Sample{Limit: 10, Latency: 30 * ms, Completed: 10, Throughput: 900})
	if r.refX != 1000 {
		t.Errorf("a window without refusals moved the reference throughput from 1000 to %v", r.refX)
	}
	r.Update(Sample{Limit: 10, Latency: 30 * ms, Completed: 10, Throughput: 900, Refused: 1})
	if r.refX != 990 {
		t.Errorf("a window with refusals: reference throughput %v, want 990", r.refX)
	}
}

// TestLimitHeldWhenNotBottleneck: flat latency with little in flight
// does not grow the limit (the runaway pitfall), and the limit never
// exceeds Max.
func TestLimitHeldWhenNotBottleneck(t *testing.T) {
	l, _ := NewLimiter(Options{Max: 12, Initial: 10, MinSamples: 1, Controller: &AIMD{}})
	for w := range 20 {
		p, _ := l.TryAcquireAt(at(w*100), Normal) // 1 in flight of 10
		p.DoneAt(at(w*100 + 50))
	}
	if got := l.Limit(); got != 10 {
		t.Errorf("limit after 20 windows with 1 in flight = %v, want 10 (held)", got)
	}
	for w := range 20 {
		var ps []Permit
		for range 12 {
			p, r := l.TryAcquireAt(at(2000+w*100), Critical)
			if !r.Refused() {
				ps = append(ps, p)
			}
		}
		for i := range ps {
			ps[i].DoneAt(at(2000 + w*100 + 50))
		}
	}
	if got := l.Limit(); got != 12 {
		t.Errorf("limit after busy windows = %v, want the maximum 12", got)
	}
}
