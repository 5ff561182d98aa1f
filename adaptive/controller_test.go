package adaptive

import (
	"math"
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
	// quarter of the way to a lower window; a higher one at the same
	// throughput (a queue) leaves it; a higher one with the throughput
	// fallen by a quarter or more, twice running (a slower server),
	// scales it by the fall in throughput; one a quarter or more below
	// it (a faster server) replaces it.
	b := &Gradient{}
	_ = b.validate()
	for i, s := range []struct {
		lat  time.Duration
		x    float64
		base time.Duration
	}{
		{30 * ms, 1000, 30 * ms}, {50 * ms, 1000, 40 * ms}, {40 * ms, 1000, 40 * ms}, {40 * ms, 1000, 40 * ms}, {40 * ms, 1000, 40 * ms},
		{36 * ms, 1000, 39 * ms},  // lower: a quarter of the way
		{135 * ms, 1000, 39 * ms}, // queueing: held
		{100 * ms, 500, 39 * ms},  // slower, once: held
		{100 * ms, 500, 78 * ms},  // slower, twice: ×2 (the fall in throughput)
		{30 * ms, 1000, 30 * ms},  // far below (a faster server): taken
	} {
		b.Update(Sample{Limit: 10, Latency: s.lat, Completed: 10, Throughput: s.x})
		if b.Baseline() != s.base {
			t.Errorf("baseline step %d: %v, want %v", i, b.Baseline(), s.base)
		}
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
