package lease

import (
	"math"
	"testing"
	"time"
)

// TestEstimator steps the demand estimate through fixed instants. With
// C = 1000 in 10 partitions and a window of one second, k partitions pace
// at 98·k a second (pacing: a burst of k, 1 % less), so the need is
// ⌈demand / 98⌉ and the want ⌈1.25 · demand / 98⌉.
func TestEstimator(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cfg := Options{Capacity: 1000, Partitions: 10, RenewEvery: time.Second,
		RateWindow: 2 * time.Second, DrainTime: 10 * time.Second, Headroom: 0.25}
	full := bucket{limit: 980, burst: 10, window: time.Second, ceiling: math.Inf(1)}
	// A holder on a fresh estimator: the first refresh starts the offer.
	fresh := func() *estimator {
		e := newEstimator(cfg)
		e.offer(t0, -1)
		return &e
	}
	type step struct {
		at         time.Duration
		do         func(e *estimator)
		b          bucket
		demand     float64
		need, want int
	}
	up, down := 1-math.Exp(-2), math.Exp(-0.5) // a second at τ/4 = 0.5 s; at τ = 2 s
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"arrivals: the rate rises fast and decays over RateWindow", []step{
			{0, nil, full, 0, 0, 0},
			{time.Second, func(e *estimator) { e.ask(100) }, full, 100 * up, 1, 2},
			{2 * time.Second, nil, full, 100 * up * down, 1, 1},
			// A refusal is asked for too; nothing is counted twice.
			{3 * time.Second, func(e *estimator) { e.ask(300); e.ask(-5) }, full,
				100*up*down + (300-100*up*down)*up, 3, 4},
		}},
		{"the backlog drains over DrainTime; its growth arrives", []step{
			{0, func(e *estimator) { e.setBacklog(980) }, full, 98, 1, 2},
			{time.Second, nil, full, 98, 1, 2},
			{2 * time.Second, func(e *estimator) { e.setBacklog(1960) }, full, 980*up + 196, 10, 10},
			{3 * time.Second, func(e *estimator) { e.setBacklog(-1) }, full, 980 * up * down, 6, 7},
		}},
		{"the ceiling caps need and want", []step{
			{0, func(e *estimator) { e.setBacklog(9800) }, bucket{limit: 980, burst: 10, window: time.Second, ceiling: 300}, 980, 4, 4},
		}},
		{"without a window a partition's rate is its capacity", []step{
			{0, func(e *estimator) { e.setBacklog(1000) }, bucket{ceiling: math.Inf(1)}, 100, 1, 2},
		}},
		{"waiters on an empty bucket: at least the even share", []step{
			{0, func(e *estimator) { e.enter(5) }, bucket{empty: true, window: time.Second, ceiling: math.Inf(1), even: 250}, 0.5, 3, 3},
			// No rate at all, a waiter: it used all it was offered.
			{time.Second, nil, bucket{empty: true, window: time.Second, ceiling: math.Inf(1), even: 250}, 5*up + 0.5, 10, 10},
			// Nobody waits: the estimate alone.
			{2 * time.Second, func(e *estimator) { e.leave(5) }, full, 5 * up * down, 1, 1},
		}},
		{"waiters on an empty bucket, no view yet: everything", []step{
			{0, func(e *estimator) { e.enter(1) }, bucket{empty: true, window: time.Second, ceiling: math.Inf(1)}, 0.1, 10, 10},
		}},
		{"waiters on a bucket used to the full: everything", []step{
			{0, nil, full, 0, 0, 0},
			// Offered 980 at 980/s over the second; 971 admitted and
			// the burst's 10 left is all of it.
			{time.Second, func(e *estimator) { e.block(); e.admit(971) }, full, 0, 10, 10},
			// Judged half a period apart: still saturated 0.4 s later,
			// whatever was admitted.
			{1400 * time.Millisecond, nil, full, 0, 10, 10},
			// At 1.5 s: 0.5 s offered at 980/s, a waiter that blocked
			// but half used: not saturated.
			{1500 * time.Millisecond, func(e *estimator) { e.block(); e.admit(200) }, full, 0, 0, 0},
		}},
		{"waiters that did not use it all: the estimate alone", []step{
			{0, nil, full, 0, 0, 0},
			{time.Second, func(e *estimator) { e.block(); e.admit(900) }, full, 0, 0, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := fresh()
			for _, s := range tc.steps {
				if s.do != nil {
					s.do(e)
				}
				need, want := e.estimate(at(s.at), s.b)
				if math.Abs(e.demand-s.demand) > 1e-9 || need != s.need || want != s.want {
					t.Fatalf("at %v: demand %.4f need %d want %d; want %.4f, %d, %d", s.at, e.demand, need, want, s.demand, s.need, s.want)
				}
			}
		})
	}
}

// TestEstimatorUsed checks the rate of admitted units, which Stats
// reports, and the offer integrated at the bucket's successive limits.
func TestEstimatorUsed(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	e := newEstimator(Options{Capacity: 100, Partitions: 4, RenewEvery: time.Second,
		RateWindow: 2 * time.Second, DrainTime: time.Second})
	e.offer(t0, -1) // the bucket is unsized: the offer starts here
	e.estimate(t0, bucket{ceiling: math.Inf(1)})
	e.offer(t0.Add(200*time.Millisecond), 50) // 10 units
	e.admit(40)
	e.estimate(t0.Add(time.Second), bucket{limit: 100, ceiling: math.Inf(1)}) // 80 more
	if want := 40 * (1 - math.Exp(-2)); math.Abs(e.used-want) > 1e-9 {
		t.Errorf("used %.4f/s, want %.4f", e.used, want)
	}
	// Judged at 1 s: the offer is spent, and nobody waited.
	if e.offered != 0 || e.saturated {
		t.Errorf("offered %v saturated %v after the judgement, want 0 and false", e.offered, e.saturated)
	}
	e.offer(t0.Add(1250*time.Millisecond), 100)
	e.offer(t0.Add(1250*time.Millisecond), 100) // no time passed
	if e.offered != 25 {
		t.Errorf("offered %v, want 25", e.offered)
	}
}

// TestEstimatorStated steps a stated demand (Holder.SetDemand) through
// fixed instants, with the C = 1000 in 10 partitions of TestEstimator: the
// stated rate is the arrival rate at once (no average), the Limiter's
// counts no longer count, and a backlog wants every partition under the
// ceiling.
func TestEstimatorStated(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	cfg := Options{Capacity: 1000, Partitions: 10, RenewEvery: time.Second,
		RateWindow: 2 * time.Second, DrainTime: 10 * time.Second, Headroom: 0.25}
	full := bucket{limit: 980, burst: 10, window: time.Second, ceiling: math.Inf(1)}
	e := newEstimator(cfg)
	e.offer(t0, -1)
	for i, s := range []struct {
		do         func(e *estimator)
		b          bucket
		demand     float64
		need, want int
	}{
		// 300/s stated: ⌈300/98⌉ = 4, ⌈375/98⌉ = 4.
		{func(e *estimator) { e.setStated(300, 0) }, full, 300, 4, 4},
		// What the Limiter counts is ignored, waiters and saturation too.
		{func(e *estimator) { e.ask(5000); e.admit(5000); e.enter(3); e.block() }, full, 300, 4, 4},
		// A backlog: demand adds backlog ÷ DrainTime, and need and want
		// are every partition.
		{func(e *estimator) { e.leave(3); e.setStated(0, 50) }, full, 5, 10, 10},
		// ... those under the ceiling only.
		{nil, bucket{limit: 980, burst: 10, window: time.Second, ceiling: 200}, 5, 3, 3},
		// Nothing stated: nothing needed, at once.
		{func(e *estimator) { e.setStated(0, 0) }, full, 0, 0, 0},
		// A rate that means nothing counts as 0; a negative backlog too.
		{func(e *estimator) { e.setStated(math.NaN(), -7) }, full, 0, 0, 0},
		{func(e *estimator) { e.setStated(math.Inf(1), 0) }, full, 0, 0, 0},
		{func(e *estimator) { e.setStated(-1, 0) }, full, 0, 0, 0},
	} {
		if s.do != nil {
			s.do(&e)
		}
		need, want := e.estimate(t0.Add(time.Duration(i+1)*time.Second), s.b)
		if math.Abs(e.demand-s.demand) > 1e-9 || need != s.need || want != s.want {
			t.Fatalf("step %d: demand %.4f need %d want %d; want %.4f, %d, %d", i, e.demand, need, want, s.demand, s.need, s.want)
		}
	}
}
