package adaptive

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"time"
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
	mix  func(r *rand.Rand) Priority
	seed uint64
	// admit decides a request at now; nil admits everything.
	admit func(now time.Time, p Priority) (Permit, bool)
	// probe is called every 50ms of simulated time.
	probe func(t time.Duration)
}

func (c simConfig) capacity() float64 { return float64(c.workers) / c.service.Seconds() }

type simReq struct {
	arrive   int64
	pri      Priority
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
	offered [][NumPriorities]int
	refused [][NumPriorities]int
	good    [][NumPriorities]int // completed within the deadline
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
		offered: make([][NumPriorities]int, secs+1),
		refused: make([][NumPriorities]int, secs+1),
		good:    make([][NumPriorities]int, secs+1),
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
			p := Normal
			if c.mix != nil {
				p = c.mix(rng)
			}
			id := len(reqs)
			reqs = append(reqs, simReq{arrive: e.at, pri: p})
			res.offered[sec][p.index()]++
			r := &reqs[id]
			if c.admit != nil {
				pm, ok := c.admit(now, p)
				if !ok {
					res.refused[sec][p.index()]++
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
				res.good[sec][r.pri.index()]++
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

func sumP(a [NumPriorities]int) int {
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
