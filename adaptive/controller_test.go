package adaptive

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// TestControllerSteps feeds each controller fixed samples, one window at a
// time, and checks the limit it returns.
func TestControllerSteps(t *testing.T) {
	ms := time.Millisecond
	// Each row starts from a new controller: a Gradient's step size also
	// depends on the directions of its earlier steps (TestGradientAgree).
	g := func() Controller {
		c := &Gradient{Target: 100 * ms}
		if err := c.validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := func() Controller {
		c := &AIMD{Target: 100 * ms}
		if err := c.validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	steps := []struct {
		name string
		c    func() Controller
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
		if got := s.c().Update(s.s); math.Abs(got-s.want) > 1e-9 {
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

	// Gradient with a baseline: the mean of the first ten windows, then
	// a quarter of the way to the mean of the latest five when that is 5%
	// or more lower; a higher window at the same throughput (a queue)
	// leaves it; a change of speed — the throughput a quarter or more
	// lower with the latency above the aim, or a quarter or more higher
	// with the latency below the aim and the time in the system
	// (InFlight / Throughput) a quarter or more lower — holds the limit
	// for one window and from the second scales the baseline by the
	// reference throughput over the mean throughput measured since.
	b := &Gradient{}
	_ = b.validate()
	type step struct {
		lat      time.Duration
		x        float64
		inflight float64
		refused  int
		base     time.Duration
		held     bool // the limit is left as it was
	}
	fast := func(lat, base time.Duration) step { return step{lat, 1000, 10, 1, base, false} }
	rep := func(n int, s step) []step { return slices.Repeat([]step{s}, n) }
	bsteps := slices.Concat(
		[]step{fast(30*ms, 30*ms), fast(50*ms, 40*ms)},
		rep(8, fast(40*ms, 40*ms)),
		// More throughput with as much more in flight, refusing nothing:
		// the same time in the system, a ramp and not a faster server.
		[]step{{39 * ms, 1300, 13, 0, 40 * ms, false}},
		rep(4, fast(39*ms, 40*ms)),                                           // five lower, by less than 5%: left
		[]step{fast(20*ms, 38800*time.Microsecond)},                          // five 35.2 on average: a quarter of the way
		[]step{fast(135*ms, 38800*time.Microsecond)},                         // queueing: held
		[]step{{100 * ms, 500, 10, 1, 38800 * time.Microsecond, true}},       // slower, once: the limit held
		rep(23, step{100 * ms, 500, 10, 1, 77600 * time.Microsecond, false}), // slower, twice: ×2 (the fall in throughput), measured for 23 windows
		[]step{{30 * ms, 1000, 10, 1, 77600 * time.Microsecond, true}},       // faster, once: held
		[]step{fast(30*ms, 38800*time.Microsecond)},                          // faster, twice: ÷2
	)
	for i, s := range bsteps {
		got := b.Update(Sample{Limit: 10, Latency: s.lat, Completed: 10, Throughput: s.x, InFlight: s.inflight, Refused: s.refused})
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
	if r.refX != 995 {
		t.Errorf("a window with refusals: reference throughput %v, want 995", r.refX)
	}
}

// TestGradientAgree: a Gradient takes full steps (Smoothing) while its
// windows agree on the direction, and a fifth of them while they
// alternate, as noise around the limit that holds the aim does.
func TestGradientAgree(t *testing.T) {
	ms := time.Millisecond
	g := &Gradient{Target: 100 * ms}
	_ = g.validate()
	// The fraction of the way to limit·gradient + Queue the step took.
	frac := func(lat time.Duration, gradient float64) float64 {
		got := g.Update(Sample{Limit: 50, Latency: lat, Completed: 100})
		return (got - 50) / (50*gradient + 1 - 50)
	}
	if f := frac(200*ms, 0.5); math.Abs(f-0.2) > 1e-9 {
		t.Errorf("first step: %v of the way, want Smoothing 0.2", f)
	}
	var f float64
	for i := range 60 {
		if i%2 == 0 {
			f = frac(50*ms, 1.1) // up, bounded at MaxGrowth
		} else {
			f = frac(200*ms, 0.5) // down
		}
	}
	if math.Abs(f-0.2*minAgree) > 1e-9 {
		t.Errorf("after 60 alternating steps: %v of the way, want %v (a fifth of Smoothing)", f, 0.2*minAgree)
	}
	for range 40 {
		f = frac(200*ms, 0.5)
	}
	if f < 0.9*0.2 {
		t.Errorf("after 40 steps down: %v of the way, want at least 0.18 (near Smoothing again)", f)
	}
}

// TestLimitHeldWhenNotBottleneck: flat latency with little in flight
// does not grow the limit (the runaway pitfall), and the limit never
// exceeds Max.
func TestLimitHeldWhenNotBottleneck(t *testing.T) {
	l, _ := NewConcurrency(ConcurrencyOptions{Max: 12, Initial: 10, MinSamples: 1, Controller: &AIMD{}})
	for w := range 20 {
		p, _ := l.TryAcquireAt(at(w*100), priority.Normal) // 1 in flight of 10
		p.DoneAt(at(w*100 + 50))
	}
	if got := l.Limit(); got != 10 {
		t.Errorf("limit after 20 windows with 1 in flight = %v, want 10 (held)", got)
	}
	for w := range 20 {
		var ps []Permit
		for range 12 {
			p, r := l.TryAcquireAt(at(2000+w*100), priority.Critical)
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
