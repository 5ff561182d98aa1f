package adaptive

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// The simulator: a server with a fixed number of workers and a FIFO queue
// in front of them, service times drawn from a lognormal distribution,
// fed by an open-loop Poisson arrival process (arrivals do not wait for
// answers, so overload is not hidden), each request given up by its client
// at a deadline. It is a discrete-event simulation on a virtual clock that
// the Guard is given through its *At methods, so a run is fast and exactly
// repeatable from its seed. A request the client gave up on is still
// served by the server, which cannot know: wasted work, as in life.

type simConfig struct {
	workers  int
	service  time.Duration // mean service time
	sigma    float64       // of the lognormal
	deadline time.Duration
	duration time.Duration
	// load returns the offered load at t, as a multiple of capacity.
	load func(t time.Duration) float64
	// slow returns the service-time multiplier at t (nil: 1).
	slow func(t time.Duration) float64
	// mix draws a request's priority (nil: Normal).
	mix  func(r *rand.Rand) priority.Priority
	seed uint64
	// admit decides a request at now; nil admits everything.
	admit func(now time.Time, p priority.Priority) (Permit, bool)
	// probe is called every 50ms of simulated time.
	probe func(t time.Duration)
}

func (c simConfig) capacity() float64 { return float64(c.workers) / c.service.Seconds() }

type simReq struct {
	arrive   int64
	pri      priority.Priority
	permit   Permit
	admitted bool
	gaveUp   bool
	finished bool
}

const (
	evArrive = iota
	evFinish
	evDeadline
	evProbe
)

type simEvent struct {
	at   int64
	kind int
	id   int
}

type eventHeap []simEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].kind < h[j].kind
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// simResult holds per-second counts, by priority, and the latencies of
// admitted requests (a request given up counts with its deadline).
type simResult struct {
	cfg     simConfig
	offered [][priority.Levels]int
	refused [][priority.Levels]int
	good    [][priority.Levels]int // completed within the deadline
	lat     []simLat
}

type simLat struct {
	at  int64 // arrival
	lat time.Duration
}

var simEpoch = time.Unix(1_700_000_000, 0)

func runSim(c simConfig) *simResult {
	rng := rand.New(rand.NewPCG(c.seed, 0x5eed))
	secs := int(c.duration / time.Second)
	res := &simResult{cfg: c,
		offered: make([][priority.Levels]int, secs+1),
		refused: make([][priority.Levels]int, secs+1),
		good:    make([][priority.Levels]int, secs+1),
	}
	mu := math.Log(c.service.Seconds()) - c.sigma*c.sigma/2
	var reqs []simReq
	var h eventHeap
	var queue []int
	busy := 0
	capacity := c.capacity()
	end := int64(c.duration)
	interarrival := func(t int64) int64 {
		rate := c.load(time.Duration(t)) * capacity
		return int64(rng.ExpFloat64() / rate * 1e9)
	}
	serve := func(t int64, id int) {
		busy++
		st := math.Exp(mu + c.sigma*rng.NormFloat64())
		if c.slow != nil {
			st *= c.slow(time.Duration(t))
		}
		heap.Push(&h, simEvent{at: t + int64(st*1e9), kind: evFinish, id: id})
	}
	heap.Push(&h, simEvent{at: interarrival(0), kind: evArrive})
	if c.probe != nil {
		heap.Push(&h, simEvent{at: 0, kind: evProbe})
	}
	for h.Len() > 0 {
		e := heap.Pop(&h).(simEvent)
		if e.at > end {
			break
		}
		now := simEpoch.Add(time.Duration(e.at))
		sec := int(e.at / int64(time.Second))
		switch e.kind {
		case evProbe:
			c.probe(time.Duration(e.at))
			heap.Push(&h, simEvent{at: e.at + int64(50*time.Millisecond), kind: evProbe})
		case evArrive:
			heap.Push(&h, simEvent{at: e.at + interarrival(e.at), kind: evArrive})
			p := priority.Normal
			if c.mix != nil {
				p = c.mix(rng)
			}
			id := len(reqs)
			reqs = append(reqs, simReq{arrive: e.at, pri: p})
			res.offered[sec][p.Index()]++
			r := &reqs[id]
			if c.admit != nil {
				pm, ok := c.admit(now, p)
				if !ok {
					res.refused[sec][p.Index()]++
					continue
				}
				r.permit = pm
			}
			r.admitted = true
			heap.Push(&h, simEvent{at: e.at + int64(c.deadline), kind: evDeadline, id: id})
			if busy < c.workers {
				serve(e.at, id)
			} else {
				queue = append(queue, id)
			}
		case evDeadline:
			r := &reqs[e.id]
			if !r.finished {
				r.gaveUp = true
				r.permit.DroppedAt(now)
				res.lat = append(res.lat, simLat{r.arrive, c.deadline})
			}
		case evFinish:
			busy--
			r := &reqs[e.id]
			r.finished = true
			if !r.gaveUp {
				r.permit.DoneAt(now)
				res.good[sec][r.pri.Index()]++
				res.lat = append(res.lat, simLat{r.arrive, time.Duration(e.at - r.arrive)})
			}
			if len(queue) > 0 {
				next := queue[0]
				queue = queue[1:]
				serve(e.at, next)
			}
		}
	}
	return res
}

func sumP(a [priority.Levels]int) int {
	n := 0
	for _, x := range a {
		n += x
	}
	return n
}

// goodput returns the completions within the deadline per second over
// [from, to) seconds, as a fraction of capacity.
func (r *simResult) goodput(from, to int) float64 {
	n := 0
	for s := from; s < to; s++ {
		n += sumP(r.good[s])
	}
	return float64(n) / float64(to-from) / r.cfg.capacity()
}

// quantile returns the q-quantile of the latencies of requests admitted
// in [from, to) seconds.
func (r *simResult) quantile(q float64, from, to int) time.Duration {
	var ls []time.Duration
	for _, l := range r.lat {
		if s := int(l.at / int64(time.Second)); s >= from && s < to {
			ls = append(ls, l.lat)
		}
	}
	if len(ls) == 0 {
		return 0
	}
	slices.Sort(ls)
	return ls[min(len(ls)-1, int(math.Ceil(q*float64(len(ls))))-1)]
}

// refusedRatio returns the fraction of offered requests refused over
// [from, to) seconds, for priority i (or all, i < 0).
func (r *simResult) refusedRatio(i, from, to int) float64 {
	var off, ref int
	for s := from; s < to; s++ {
		if i < 0 {
			off += sumP(r.offered[s])
			ref += sumP(r.refused[s])
		} else {
			off += r.offered[s][i]
			ref += r.refused[s][i]
		}
	}
	if off == 0 {
		return 0
	}
	return float64(ref) / float64(off)
}

// successRatio returns, for priority i over [from, to) seconds, the
// fraction of offered requests that completed within the deadline.
func (r *simResult) successRatio(i, from, to int) float64 {
	var off, good int
	for s := from; s < to; s++ {
		off += r.offered[s][i]
		good += r.good[s][i]
	}
	if off == 0 {
		return 1
	}
	return float64(good) / float64(off)
}

// rejectionCV returns the coefficient of variation of the per-second
// rejection ratio over [from, to) seconds.
func (r *simResult) rejectionCV(from, to int) float64 {
	var xs []float64
	for s := from; s < to; s++ {
		xs = append(xs, r.refusedRatio(-1, s, s+1))
	}
	var mean, v float64
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		v += (x - mean) * (x - mean)
	}
	v /= float64(len(xs))
	if mean == 0 {
		return 0
	}
	return math.Sqrt(v) / mean
}

// staticGuard returns an admit function for a Guard like simGuard's
// whose limit is fixed at n.
func staticGuard(t testing.TB, n int) func(time.Time, priority.Priority) (Permit, bool) {
	rng := rand.New(rand.NewPCG(4, 7))
	g, err := NewGuard(GuardOptions{
		Concurrency: ConcurrencyOptions{Max: n, Min: n, Initial: n},
		Shedder:     &ShedderOptions{Objective: Objective{Quantile: 0.99, Latency: simObj}, Float64: rng.Float64},
	})
	if err != nil {
		t.Fatal(err)
	}
	return func(now time.Time, p priority.Priority) (Permit, bool) {
		pm, r := g.TryAcquireAt(now, p)
		return pm, !r.Refused()
	}
}

// bestLimit returns the best static limit for the simulated server with
// service times multiplied by slow, at 3× its original capacity, and the
// goodput and p99 it gives, and the best goodput of any static limit
// (sampled from the workers to 200). Goodput is flat from a little above
// the workers up to where p99 reaches the objective, so goodput alone does
// not name one limit; the best is the largest limit on that plateau
// (goodput within 2% of the best) whose latency p90 stays within tol
// times the p90 of the server without queueing — the point Gradient with
// Tolerance tol is designed to hold.
// It is found by bisection over static limits in the same simulator, each
// in a Guard with the same Shedder in front, each run 40s: in 6s runs the
// p90 measured moved the answer by two either way.
func bestLimit(t testing.TB, slow, tol float64) (best int, good, bestGood float64, p99 time.Duration) {
	const secs = 40
	run := func(admit func(time.Time, priority.Priority) (Permit, bool), load float64) *simResult {
		c := baseSim(constLoad(load), nil)
		c.duration = secs * time.Second
		c.slow = func(time.Duration) float64 { return slow }
		c.admit = admit
		return runSim(c)
	}
	for _, n := range []int{simWorkers, 25, 30, 40, 60, 100, 200} {
		bestGood = max(bestGood, run(staticGuard(t, n), 3).goodput(2, secs))
	}
	aim := time.Duration(tol * float64(run(nil, 0.2/slow).quantile(0.9, 1, secs)))
	lo, hi := simWorkers, 200 // ok(lo), not ok(hi)
	for hi-lo > 1 {
		m := (lo + hi) / 2
		if r := run(staticGuard(t, m), 3); r.quantile(0.9, 2, secs) <= aim && r.goodput(2, secs) >= 0.98*bestGood {
			lo = m
		} else {
			hi = m
		}
	}
	r := run(staticGuard(t, lo), 3)
	return lo, r.goodput(2, secs), bestGood, r.quantile(0.99, 2, secs)
}

// slowdown runs 3× the original capacity for 30s while the server
// becomes 2× slower at 10s (every service time doubles, the workers stay)
// and recovers at 20s, with arrivals from seed and the Guard's randomness
// from seed+3. It returns the run; settle, which tells how long after the
// slowdown and after the recovery the limit — its mean over the last
// second, sampled every 50ms — entered for good the band of relative
// width band around the best static limit of the moment (best[0] at full
// speed, best[1] at half); and the mean limit over the last second before
// each change and at the end.
func slowdown(t testing.TB, seed uint64, best [2]int) (r *simResult, settle func(band float64) (slowIn, fastIn time.Duration), means [3]float64) {
	// The scenario measures how the Controller settles after a change of
	// speed, not how a Concurrency starts: it starts at an explicit Initial
	// (a tenth of Max), so that the first second's draws, and with them
	// every later one of the simulator's single random stream, do not
	// depend on the warm-up (TestWarmUp* test that). With the warm-up,
	// 76 of 80 seeds held the band; without, 79.
	g := simGuardAt(t, seed+3, nil, 20)
	cfg := baseSim(constLoad(3), g)
	cfg.seed = seed
	cfg.duration = 30 * time.Second
	cfg.slow = func(t time.Duration) float64 {
		if t >= 10*time.Second && t < 20*time.Second {
			return 2
		}
		return 1
	}
	const perSec = 20 // probes a second
	var limits []float64
	cfg.probe = func(d time.Duration) { limits = append(limits, g.Concurrency().Limit()) }
	r = runSim(cfg)
	mean := func(i int) float64 { // over the second ending at probe i
		var s float64
		for _, x := range limits[i-perSec+1 : i+1] {
			s += x
		}
		return s / perSec
	}
	in := func(from, to time.Duration, best int, band float64) time.Duration {
		last := from
		for i := int(from/time.Second) * perSec; i < int(to/time.Second)*perSec && i < len(limits); i++ {
			if math.Abs(mean(i)/float64(best)-1) > band {
				last = time.Duration(i+1) * time.Second / perSec
			}
		}
		return last - from
	}
	settle = func(band float64) (time.Duration, time.Duration) {
		return in(10*time.Second, 20*time.Second, best[1], band), in(20*time.Second, 30*time.Second, best[0], band)
	}
	means = [3]float64{mean(10*perSec - 1), mean(20*perSec - 1), mean(30*perSec - 1)}
	return r, settle, means
}

// TestSimSlowdown runs slowdown on one seed. The best limit is bestLimit's
// at each speed — the same concurrency at both, within the one permit a
// bisection on a measured p90 can tell (the workers bound the work in
// progress, so Little's law gives the same limit at half the throughput
// and twice the latency): what must not happen is that a stale
// latency baseline takes the slowness for queueing and cuts the limit (or,
// forgetting upwards, lets it run away). The limit must settle within
// 10% of the best within 2s of the slowdown and within 5s of the
// recovery, and stay there until the next change; goodput must stay at
// the capacity of the moment. TestSimSlowdownSeeds runs other seeds.
func TestSimSlowdown(t *testing.T) {
	const tol = 1.5 // Gradient's default Tolerance
	bestFast, goodFast, plateauFast, p99Fast := bestLimit(t, 1, tol)
	bestSlow, goodSlow, plateauSlow, p99Slow := bestLimit(t, 2, tol)
	t.Logf("best static limit: %d at full speed (goodput %.3f of the best static %.3f, p99 %v), %d at half speed (goodput %.3f of %.3f, p99 %v)",
		bestFast, goodFast, plateauFast, p99Fast.Round(time.Millisecond), bestSlow, goodSlow, plateauSlow, p99Slow.Round(time.Millisecond))
	for _, b := range []struct {
		good, plateau float64
		p99           time.Duration
	}{{goodFast, plateauFast, p99Fast}, {goodSlow, plateauSlow, p99Slow}} {
		if b.good < 0.98*b.plateau || b.p99 > simObj {
			t.Fatalf("the best limit's goodput %.3f is not on the plateau %.3f, or its p99 %v is above %v", b.good, b.plateau, b.p99, simObj)
		}
	}
	if bestFast-bestSlow > 1 || bestSlow-bestFast > 1 {
		t.Fatalf("best static limits %d and %d at full and half speed: the scenario wants one", bestFast, bestSlow)
	}
	r, settle, m := slowdown(t, 1, [2]int{bestFast, bestSlow})
	slowIn, fastIn := settle(0.1)
	t.Logf("slowdown: mean limit before %.1f, slow %.1f, after recovery %.1f; settled within 10%% in %v after the slowdown, %v after the recovery; goodput %.3f, %.3f, %.3f of the original capacity",
		m[0], m[1], m[2], slowIn, fastIn, r.goodput(3, 10), r.goodput(12, 20), r.goodput(22, 30))
	if slowIn > 2*time.Second {
		t.Errorf("after the slowdown the limit settled within 10%% of %d in %v, want <= 2s", bestSlow, slowIn)
	}
	if fastIn > 5*time.Second {
		t.Errorf("after the recovery the limit settled within 10%% of %d in %v, want <= 5s", bestFast, fastIn)
	}
	if g := r.goodput(12, 20); g < 0.9*0.5 {
		t.Errorf("goodput while slow %.3f of the original capacity, want >= 0.45 (90%% of the halved capacity)", g)
	}
	if g := r.goodput(22, 30); g < 0.9 {
		t.Errorf("goodput after the recovery %.3f, want >= 0.9", g)
	}
}

// TestSimSlowdownSeeds runs slowdown on forty seeds, against the best
// limit TestSimSlowdown finds (43 at both speeds; the server is the
// same, only arrivals differ): every seed must settle within 10% of the
// best in the times TestSimSlowdown asks for. The window quantiles the
// controller reads are noisy (about a hundred completions each), so the
// band it holds differs by seed; RESULTS.md §11 has eighty seeds, of
// which one misses.
func TestSimSlowdownSeeds(t *testing.T) {
	best := [2]int{43, 43}
	var slow10, fast10 int
	for seed := uint64(1); seed <= 40; seed++ {
		_, settle, m := slowdown(t, seed, best)
		slowIn, fastIn := settle(0.1)
		if slowIn <= 2*time.Second {
			slow10++
		}
		if fastIn <= 5*time.Second {
			fast10++
		}
		if slowIn > 2*time.Second || fastIn > 5*time.Second {
			t.Errorf("seed %d: settled within 10%% of %v in %v after the slowdown (want <= 2s) and %v after the recovery (want <= 5s); mean limits %.1f", seed, best, slowIn, fastIn, m)
		}
		t.Logf("seed %2d: mean limit before %.1f, slow %.1f, after %.1f; within 10%% after %v and %v", seed, m[0], m[1], m[2], slowIn, fastIn)
	}
	t.Logf("settled within 10%%: %d of 40 seeds within 2s of the slowdown, %d within 5s of the recovery", slow10, fast10)
}

// TestSimSlowDependency covers the Shedder's latency loop on its own: the
// latency rises without the concurrency limit being the bottleneck. The
// server's work waits on a dependency with 40 slots (20ms, σ 0.2: 2000 a
// second), offered 600 a second (20% critical, 30% normal, 50%
// sheddable); the Concurrency's floor (Min 300) is far above what is in
// flight, so it refuses nothing. From 10s to 30s the dependency is 5×
// slower (100ms, p99 156ms without a queue; 400 a second): the Shedder
// must shed a growing fraction, lowest priorities first, hold p99 within
// the objective once converged (15s–30s), and shed nothing again after.
func TestSimSlowDependency(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 7))
	g, err := NewGuard(GuardOptions{
		Concurrency: ConcurrencyOptions{Max: 400, Min: 300},
		Shedder:     &ShedderOptions{Objective: Objective{Quantile: 0.99, Latency: simObj}, Float64: rng.Float64},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseSim(constLoad(0.3), g)
	cfg.workers, cfg.sigma, cfg.seed = 40, 0.2, 5
	cfg.duration = 45 * time.Second
	cfg.slow = func(t time.Duration) float64 {
		if t >= 10*time.Second && t < 30*time.Second {
			return 5
		}
		return 1
	}
	cfg.mix = func(r *rand.Rand) priority.Priority {
		switch x := r.Float64(); {
		case x < 0.2:
			return priority.Critical
		case x < 0.5:
			return priority.Normal
		}
		return priority.Sheddable
	}
	var fraction []float64 // every 50ms
	cfg.probe = func(time.Duration) { fraction = append(fraction, g.Shedder().Stats().Fraction) }
	r := runSim(cfg)
	at := func(d time.Duration) float64 { return fraction[int(d/(50*time.Millisecond))] }
	var peak float64
	for _, f := range fraction[10*20 : 30*20] {
		peak = max(peak, f)
	}
	p99 := r.quantile(0.99, 15, 30)
	ref := r.refusedRatio(-1, 15, 30)
	crit, norm, shed := r.refusedRatio(priority.Critical.Index(), 15, 30), r.refusedRatio(priority.Normal.Index(), 15, 30), r.refusedRatio(priority.Sheddable.Index(), 15, 30)
	t.Logf("slow dependency: shed fraction at 10s %.2f, 11s %.2f, 12s %.2f, peak %.2f, at 45s %.2f; 15–30s: p99 %v, refused %.3f (critical %.3f, normal %.3f, sheddable %.3f), critical success %.3f, goodput %.3f; refused 33–45s %.3f; limiter refusals %v",
		at(10*time.Second), at(11*time.Second), at(12*time.Second), peak, fraction[len(fraction)-1], p99.Round(time.Millisecond), ref, crit, norm, shed,
		r.successRatio(priority.Critical.Index(), 15, 30), r.goodput(15, 30), r.refusedRatio(-1, 33, 45), g.Concurrency().Stats().Refused)
	if lr := g.Concurrency().Stats().Refused; lr != ([priority.Levels]uint64{}) {
		t.Errorf("the limiter refused %v: the scenario wants it not to be the bottleneck", lr)
	}
	if b := r.refusedRatio(-1, 0, 10); b != 0 {
		t.Errorf("refused %.4f before the slowdown, want none", b)
	}
	if !(at(10*time.Second) == 0 && at(11*time.Second) > 0 && at(12*time.Second) > at(11*time.Second)) {
		t.Errorf("shed fraction at 10s, 11s, 12s: %.3f, %.3f, %.3f; want it to start at 0 and grow", at(10*time.Second), at(11*time.Second), at(12*time.Second))
	}
	// The dependency serves 400 of 600 a second: a third at least must go.
	if ref < 1.0/3 || ref > 0.6 {
		t.Errorf("refused %.3f of requests while slow, want between 1/3 (what the dependency cannot serve) and 0.6", ref)
	}
	if !(shed > norm && norm >= crit) || r.successRatio(priority.Critical.Index(), 15, 30) < 0.99 {
		t.Errorf("refused sheddable %.3f, normal %.3f, critical %.3f (critical success %.3f): want the lowest priority first and >= 99%% of critical served",
			shed, norm, crit, r.successRatio(priority.Critical.Index(), 15, 30))
	}
	if p99 > simObj {
		t.Errorf("p99 %v while slow, once converged, above the objective %v", p99, simObj)
	}
	if a := r.refusedRatio(-1, 33, 45); a != 0 || fraction[len(fraction)-1] != 0 {
		t.Errorf("after the dependency recovered: refused %.4f, shed fraction %.3f at the end; want 0", a, fraction[len(fraction)-1])
	}
}
