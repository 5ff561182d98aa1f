package storetest

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// testConcurrent decides from 16 goroutines on one key at a fixed instant:
// exactly the capacity is admitted.
func testConcurrent(t *testing.T, newStore NewStore) {
	const (
		capacity   = 500
		goroutines = 16
		requests   = 64 // per goroutine: 1024 in all
	)
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := ruleOf(alg, capacity, time.Hour)
		var admitted, denied atomic.Int64
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				items := []ratelimit.Item{{Key: k, Rule: r, Cost: 1}}
				var ds []ratelimit.Decision
				for range requests {
					var err error
					ds, err = e.store.Decide(t.Context(), ds[:0], items)
					if err != nil || len(ds) != 1 {
						t.Errorf("Decide: %v, %d decisions", err, len(ds))
						return
					}
					if ds[0].Allowed {
						admitted.Add(1)
					} else {
						denied.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		if got := admitted.Load(); got != capacity {
			t.Errorf("%d of %d concurrent requests admitted, want exactly %d", got, goroutines*requests, capacity)
		}
		if got := denied.Load(); got != goroutines*requests-capacity {
			t.Errorf("%d denied, want %d", got, goroutines*requests-capacity)
		}
		if got := e.remaining(k, r); got != 0 {
			t.Errorf("%d remaining afterwards, want 0", got)
		}
	})
}

// testConcurrentAllOrNothing decides requests of one and two keys from many
// goroutines: what each key consumed is exactly what its admitted requests
// asked for.
func testConcurrentAllOrNothing(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	ka, kb := e.key("a"), e.key("b")
	ra := ruleOf(ratelimit.GCRA, 300, time.Hour)
	rb := ruleOf(ratelimit.FixedWindow, 200, time.Hour)
	requests := [][]ratelimit.Item{
		{{Key: ka, Rule: ra, Cost: 1}},
		{{Key: ka, Rule: ra, Cost: 1}, {Key: kb, Rule: rb, Cost: 1}},
		{{Key: kb, Rule: rb, Cost: 2}},
		{{Key: kb, Rule: rb, Cost: 1}, {Key: ka, Rule: ra, Cost: 2}},
	}
	var usedA, usedB atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				items := requests[(g+i)%len(requests)]
				ds, err := e.store.Decide(t.Context(), nil, items)
				if err != nil || len(ds) != len(items) {
					t.Errorf("Decide: %v, %d decisions", err, len(ds))
					return
				}
				if !ratelimit.Allowed(ds) {
					continue
				}
				for _, it := range items {
					if it.Key == ka {
						usedA.Add(it.Cost)
					} else {
						usedB.Add(it.Cost)
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if got, want := e.remaining(ka, ra), 300-usedA.Load(); got != want {
		t.Errorf("a: %d remaining, want %d (300 - %d admitted)", got, want, usedA.Load())
	}
	if got, want := e.remaining(kb, rb), 200-usedB.Load(); got != want {
		t.Errorf("b: %d remaining, want %d (200 - %d admitted)", got, want, usedB.Load())
	}
}

// An admission is a cost admitted at an instant.
type admission struct {
	at   time.Time
	cost int64
}

// boundsRule is the rule of testBounds and testTimeBackwardsBounds: 20 per
// second, and a burst of 10 for GCRA and LeakyBucket.
func boundsRule(alg ratelimit.Algorithm) *ratelimit.Rule {
	r := ruleOf(alg, 20, time.Second)
	if alg == ratelimit.GCRA || alg == ratelimit.LeakyBucket {
		r.Burst = 10
	}
	return r
}

// randomStep returns a random time step and cost for rule r: often no
// time or about one emission interval, sometimes a good part of the
// period; costs are mostly small, sometimes 0 or the whole capacity.
func randomStep(rng *rand.Rand, r *ratelimit.Rule) (time.Duration, int64) {
	p := int64(r.Period)
	var dt int64
	switch n := rng.IntN(10); {
	case n < 2:
	case n < 6:
		dt = rng.Int64N(p/r.Quota + 1)
	case n < 9:
		dt = rng.Int64N(p / 2)
	default:
		dt = rng.Int64N(2 * p)
	}
	c := r.Capacity()
	var cost int64
	switch n := rng.IntN(10); {
	case n < 1:
	case n < 8:
		cost = 1 + rng.Int64N(min(5, c))
	default:
		cost = 1 + rng.Int64N(c)
	}
	return time.Duration(dt), cost
}

// testBounds decides random sequences of (time step, cost), seeded, and
// checks what each algorithm promises over every window (see checkBounds),
// and that RetryAfter is exact: a denied cost is still denied one
// nanosecond before RetryAfter has passed and admitted once it has.
func testBounds(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := boundsRule(alg)
		rng := rand.New(rand.NewPCG(uint64(alg)+1, 42))
		now := Start
		var adm []admission
		probes := 0
		for range 1000 {
			dt, cost := randomStep(rng, r)
			now = now.Add(dt)
			e.clock.Set(now)
			d := e.one(k, r, cost)
			checkDecision(t, r, cost, d)
			if d.Allowed {
				if cost > 0 {
					adm = append(adm, admission{now, cost})
				}
				continue
			}
			if d.Reason != ratelimit.ReasonLimited || rng.IntN(3) != 0 {
				continue
			}
			probes++
			now = now.Add(d.RetryAfter - 1)
			e.clock.Set(now)
			if early := e.one(k, r, cost); early.Allowed {
				t.Fatalf("cost %d denied at %v with RetryAfter %v, admitted 1ns before that: %+v",
					cost, now.Sub(Start)-d.RetryAfter+1, d.RetryAfter, early)
			}
			now = now.Add(1)
			e.clock.Set(now)
			later := e.one(k, r, cost)
			if !later.Allowed {
				t.Fatalf("cost %d denied at %v with RetryAfter %v, denied again after it: %+v",
					cost, now.Sub(Start)-d.RetryAfter, d.RetryAfter, later)
			}
			adm = append(adm, admission{now, cost})
		}
		if probes < 20 || len(adm) < 100 {
			t.Errorf("the sequence was too tame: %d admissions, %d RetryAfter probes", len(adm), probes)
		}
		checkBounds(t, r, adm)
	})
}

// testTimeBackwardsBounds is testBounds with a clock that sometimes goes
// back: measured on the newest instant at which the store admitted a cost,
// nothing more than the promise is admitted.
func testTimeBackwardsBounds(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := boundsRule(alg)
		rng := rand.New(rand.NewPCG(uint64(alg)+1, 43))
		now, newest := Start, Start
		var adm []admission
		for range 600 {
			dt, cost := randomStep(rng, r)
			if rng.IntN(4) == 0 {
				dt = -dt
			}
			now = now.Add(dt)
			e.clock.Set(now)
			d := e.one(k, r, cost)
			checkDecision(t, r, cost, d)
			if d.Allowed && cost > 0 {
				if now.After(newest) {
					newest = now
				}
				adm = append(adm, admission{newest, cost})
			}
		}
		checkBounds(t, r, adm)
	})
}

// checkDecision checks what holds for every decision.
func checkDecision(t *testing.T, r *ratelimit.Rule, cost int64, d ratelimit.Decision) {
	t.Helper()
	c := r.Capacity()
	fail := func(what string) {
		t.Helper()
		t.Fatalf("cost %d: %s: %+v", cost, what, d)
	}
	switch {
	case d.Capacity != c || d.Rule != r.Name:
		fail("wrong Limit or Rule")
	case d.Remaining < 0 || d.Remaining > c:
		fail("Remaining out of [0, capacity]")
	case d.ResetAfter < 0:
		fail("negative ResetAfter")
	case d.Allowed && (d.Reason != ratelimit.ReasonOK || d.RetryAfter != 0):
		fail("allowed with a reason or a RetryAfter")
	case d.Allowed && cost > 0 && d.Remaining > c-cost:
		fail("more remaining than capacity minus cost")
	case !d.Allowed && cost > c && (d.Reason != ratelimit.ReasonExceedsCapacity || d.RetryAfter != ratelimit.Never):
		fail("cost above capacity not denied as such")
	case !d.Allowed && cost <= c && (d.Reason != ratelimit.ReasonLimited || d.RetryAfter <= 0 || d.RetryAfter == ratelimit.Never):
		fail("denied without a finite positive RetryAfter")
	}
}

// checkBounds checks that the admissions (in order of time) stay within
// what the rule's algorithm promises:
//
//   - GCRA and LeakyBucket: from any admission to any later one, at most
//     Capacity + ⌊elapsed / interval⌋, where interval is Period/Quota
//     rounded up to a nanosecond;
//   - FixedWindow: at most Quota in each window (aligned to the Unix
//     epoch), hence at most 2×Quota in any span of Period;
//   - SlidingLog: at most Quota in any span of Period;
//   - SlidingWindow: at most Quota in each epoch-aligned window, and in the
//     span of Period that ends at an instant t, elapsed e into its window,
//     at most Quota + ⌊prev × e / Period⌋, prev being the cost admitted in
//     the previous window (so always less than 2×Quota). The estimate
//     counts prev × (Period−e)/Period of the previous window, rounded up,
//     while up to all of prev may lie in the span.
func checkBounds(t *testing.T, r *ratelimit.Rule, adm []admission) {
	t.Helper()
	p := int64(r.Period)
	windowSums := map[int64]int64{}
	for _, a := range adm {
		windowSums[a.at.UnixNano()/p] += a.cost
	}
	for j, last := range adm {
		tj := last.at.UnixNano()
		k := tj / p
		switch r.Algorithm {
		case ratelimit.GCRA, ratelimit.LeakyBucket:
			iv := (p + r.Quota - 1) / r.Quota
			var sum int64
			for i := j; i >= 0; i-- {
				sum += adm[i].cost
				elapsed := tj - adm[i].at.UnixNano()
				if sum > r.Capacity()+elapsed/iv {
					t.Fatalf("%d admitted from %v to %v: more than capacity %d + %v/%v",
						sum, adm[i].at.Sub(Start), last.at.Sub(Start), r.Capacity(), time.Duration(elapsed), time.Duration(iv))
				}
			}
			continue
		case ratelimit.FixedWindow, ratelimit.SlidingWindow:
			if s := windowSums[k]; s > r.Quota {
				t.Fatalf("%d admitted in the window of %v: more than %d", s, last.at.Sub(Start), r.Quota)
			}
		}
		var span int64 // admitted in (tj-p, tj]
		for i := j; i >= 0 && adm[i].at.UnixNano() > tj-p; i-- {
			span += adm[i].cost
		}
		bound := r.Quota
		switch r.Algorithm {
		case ratelimit.FixedWindow:
			bound = 2 * r.Quota
		case ratelimit.SlidingWindow:
			bound = r.Quota + windowSums[k-1]*(tj-k*p)/p
		}
		if span > bound {
			t.Fatalf("%d admitted in the %v up to %v: more than %d", span, r.Period, last.at.Sub(Start), bound)
		}
	}
}

// testSaturation asks for twice the limit all the time, for four periods,
// and checks that at least 99% of what the algorithm promises is admitted
// (and no more than it promises).
func testSaturation(t *testing.T, newStore NewStore) {
	const (
		limit = 1000
		cost  = 5
		steps = 1600
		dt    = time.Second / 400 // 400 × 5 per second: twice the limit
	)
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := ruleOf(alg, limit, time.Second)
		var adm []admission
		var total int64
		for i := range steps {
			now := Start.Add(time.Duration(i) * dt)
			e.clock.Set(now)
			d := e.one(k, r, cost)
			if d.Allowed {
				adm = append(adm, admission{now, cost})
				total += cost
			}
		}
		checkBounds(t, r, adm)
		elapsed := time.Duration(steps-1) * dt
		var promise int64
		switch alg {
		case ratelimit.GCRA, ratelimit.LeakyBucket:
			iv := (int64(r.Period) + limit - 1) / limit
			promise = r.Capacity() + int64(elapsed)/iv
		default:
			// Four whole periods from an epoch-aligned start.
			promise = limit * int64(elapsed/r.Period+1)
		}
		if total*100 < promise*99 {
			t.Errorf("%d admitted under saturation in %v: less than 99%% of the %d promised", total, elapsed, promise)
		}
		if total > promise {
			t.Errorf("%d admitted under saturation in %v: more than the %d promised", total, elapsed, promise)
		}
	})
}
