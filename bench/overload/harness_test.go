package overload

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	fspriority "github.com/failsafe-go/failsafe-go/priority"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/priority"
)

// The harness. A server of cfg.workers goroutines takes requests from a
// queue without bound, in arrival order, and serves each for its service
// time with time.Sleep. An arrival
// goroutine replays a trace: an open-loop Poisson process that sleeps each
// exponential gap and then offers one request, never waiting for answers.
// A contender's admission sits between the arrivals and the queue; a
// permit it grants is held until the server has finished the request (the
// middleware of a real server returns when its handler does), and ends as
// a completion if the answer came within the client's deadline and as a
// drop if not. The server does not know that a client gave up: it serves
// every request it queued, late or not — the wasted work that makes an
// unprotected server collapse.
//
// It all runs in a testing/synctest bubble, where time.Now and time.Sleep
// are virtual: failsafe-go reads time.Now internally and cannot be given a
// clock, so the bubble is what lets the two libraries run side by side on
// the same virtual time. Every random draw (gaps, priorities, service
// times, failsafe-go priority levels, Sluice's thinning coin) is made from
// seeded generators in one goroutine, and events happen at distinct
// instants, so a run is repeatable.

// config describes the server, the clients and the length of a run.
type config struct {
	workers  int           // server goroutines
	service  time.Duration // mean service time (lognormal)
	sigma    float64       // σ of the log of the service time
	deadline time.Duration // a client gives up after this
	duration time.Duration // of the run, virtual
	warmup   time.Duration // arrivals before this are not measured
	seed     uint64
}

// capacity is the server's throughput in requests a second.
func (c config) capacity() float64 { return float64(c.workers) / c.service.Seconds() }

// window returns the arrival times measured: from the warm-up to one
// deadline before the end, so that every measured request's fate (served
// in time, late, refused) is decided before the run stops.
func (c config) window() (from, to time.Duration) { return c.warmup, c.duration - c.deadline }

// An arrival is one request of a trace.
type arrival struct {
	at    time.Duration // since the start
	pri   priority.Priority
	level int // failsafe-go's priority level (0–499), drawn in pri's band
}

// The priority mix: 20% critical, 30% normal, 50% sheddable.
const (
	shareCritical = 0.2
	shareNormal   = 0.3
)

// trace draws the arrivals of one run at load × capacity.
func trace(c config, load float64) []arrival {
	rng := rand.New(rand.NewPCG(c.seed, math.Float64bits(load)))
	rate := load * c.capacity()
	var tr []arrival
	for at := time.Duration(rng.ExpFloat64() / rate * 1e9); at < c.duration; at += time.Duration(rng.ExpFloat64() / rate * 1e9) {
		a := arrival{at: at}
		var band fspriority.Priority
		switch x := rng.Float64(); {
		case x < shareCritical:
			a.pri, band = priority.Critical, fspriority.VeryHigh
		case x < shareCritical+shareNormal:
			a.pri, band = priority.Normal, fspriority.Medium
		default:
			a.pri, band = priority.Sheddable, fspriority.VeryLow
		}
		a.level = band.MinLevel() + rng.IntN(band.MaxLevel()-band.MinLevel()+1)
		tr = append(tr, a)
	}
	return tr
}

// A ticket is an admitted request's hold on its contender, ended once
// when the server has finished the request: ok if within the deadline.
type ticket interface{ finish(ok bool) }

// An admission decides requests for one run; it is built inside the
// bubble. try decides at once (in the arrival goroutine); wait, when set
// instead, may block until ctx (the client's deadline) ends, and is called
// in a goroutine of its own per request.
type admission struct {
	try  func(a *arrival) (ticket, bool)
	wait func(ctx context.Context, a *arrival) (t ticket, refused bool, err error)
	stop func()
}

// A contender is one kind of protection.
type contender struct {
	name  string
	build func(c config, seed uint64) admission
}

// The outcomes of a request.
const (
	late    = iota // admitted, not answered within the deadline (the zero value: never served)
	good           // answered within the deadline
	refused        // refused at once with an overload answer
)

// run is the outcome of one contender at one load: per request of the
// trace, its outcome and latency.
type run struct {
	cfg     config
	load    float64
	trace   []arrival
	outcome []uint8
	latency []time.Duration // of a good request
	done    []time.Duration // when a good request was answered, since the start
}

// simulate runs contender k against trace tr in a synctest bubble of
// t's (a subtest each, so that a bubble's goroutines never outlive it).
func simulate(t *testing.T, c config, load float64, tr []arrival, k contender) *run {
	r := &run{cfg: c, load: load, trace: tr, outcome: make([]uint8, len(tr)), latency: make([]time.Duration, len(tr)), done: make([]time.Duration, len(tr))}
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		adm := k.build(c, c.seed)
		kick := make(chan struct{}, 1)
		// The queue holds admitted requests in arrival order. A dispatcher
		// hands them to idle workers, but only once every goroutine that has
		// something to do at the current instant has done it
		// (synctest.Wait): failsafe-go wakes several of its waiters at once
		// when its limit grows, and they would otherwise enter the queue in
		// the order the scheduler happens to run them.
		var qmu sync.Mutex
		var queue jobHeap
		push := func(j job) {
			qmu.Lock()
			heap.Push(&queue, j)
			qmu.Unlock()
			select {
			case kick <- struct{}{}:
			default:
			}
		}
		stop := make(chan struct{})
		work := make(chan servedJob, c.workers)
		idleCh := make(chan struct{}, c.workers)
		var wg sync.WaitGroup
		// The service times belong to the server, not to the requests: the
		// n-th request to start service takes the n-th draw, whoever it is,
		// so that a saturated server does the same work whatever a
		// contender admits, and contenders differ only by idle workers and
		// late answers, not by which service times they happened to draw.
		svcRng := rand.New(rand.NewPCG(c.seed, 2))
		mu := math.Log(c.service.Seconds()) - c.sigma*c.sigma/2
		wg.Go(func() {
			defer close(work)
			idle := c.workers
			for {
				select {
				case <-stop:
					return
				case <-kick:
				case <-idleCh:
					idle++
				}
				synctest.Wait()
				for drained := false; !drained; {
					select {
					case <-idleCh:
						idle++
					default:
						drained = true
					}
				}
				qmu.Lock()
				for ; idle > 0 && queue.Len() > 0; idle-- {
					j := heap.Pop(&queue).(job)
					work <- servedJob{j, time.Duration(math.Exp(mu+c.sigma*svcRng.NormFloat64()) * 1e9)}
				}
				qmu.Unlock()
			}
		})
		for range c.workers {
			wg.Go(func() {
				for sj := range work {
					if time.Since(start) >= c.duration {
						return // the run is over; what is left is never served
					}
					time.Sleep(sj.service)
					a := &tr[sj.id]
					lat := time.Since(start) - a.at
					ok := lat <= c.deadline
					if ok {
						r.outcome[sj.id], r.latency[sj.id], r.done[sj.id] = good, lat, time.Since(start)
					}
					if sj.t != nil {
						sj.t.finish(ok)
					}
					idleCh <- struct{}{}
				}
			})
		}
		for id := range tr {
			a := &tr[id]
			time.Sleep(a.at - time.Since(start))
			switch {
			case adm.wait != nil:
				wg.Go(func() {
					ctx, cancel := context.WithDeadline(context.Background(), start.Add(a.at+c.deadline))
					defer cancel()
					tk, ref, err := adm.wait(ctx, a)
					switch {
					case ref:
						r.outcome[id] = refused
					case err == nil:
						push(job{id, tk})
					}
				})
			case adm.try != nil:
				tk, ok := adm.try(a)
				if !ok {
					r.outcome[id] = refused
					continue
				}
				push(job{id, tk})
			default:
				push(job{id, nil})
			}
		}
		time.Sleep(c.duration - time.Since(start))
		close(stop)
		if adm.stop != nil {
			adm.stop()
		}
		wg.Wait()
	})
	return r
}

// A job is an admitted request: its index in the trace and its ticket.
type job struct {
	id int
	t  ticket
}

// A servedJob is a job given to a worker with its service time.
type servedJob struct {
	job
	service time.Duration
}

// jobHeap orders jobs by arrival (container/heap).
type jobHeap []job

func (h jobHeap) Len() int           { return len(h) }
func (h jobHeap) Less(i, j int) bool { return h[i].id < h[j].id }
func (h jobHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *jobHeap) Push(x any)        { *h = append(*h, x.(job)) }
func (h *jobHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// A figure is what one run measured. Goodput counts answers given within
// the deadline by when they were given, over [warmup, duration): a rate
// of completions, as a server's throughput is measured. The other figures
// are over the requests that arrived in window(): the latency quantile,
// the fraction refused and the fraction of critical requests answered in
// time.
type figure struct {
	goodput  float64       // answers within the deadline a second, over capacity
	critical float64       // the same, critical requests only
	critOK   float64       // the fraction of critical requests answered in time
	p99      time.Duration // of the requests admitted (a late one counts as the deadline)
	refused  float64       // the fraction of requests refused
}

func (r *run) figure() figure {
	var goodN, critGood int
	for i, a := range r.trace {
		if d := r.done[i]; r.outcome[i] == good && d >= r.cfg.warmup && d < r.cfg.duration {
			goodN++
			if a.pri == priority.Critical {
				critGood++
			}
		}
	}
	secs := (r.cfg.duration - r.cfg.warmup).Seconds()
	f := figure{
		goodput:  float64(goodN) / secs / r.cfg.capacity(),
		critical: float64(critGood) / secs / r.cfg.capacity(),
	}
	from, to := r.cfg.window()
	var n, ref, critN, critOK int
	var lats []time.Duration
	for i, a := range r.trace {
		if a.at < from || a.at >= to {
			continue
		}
		n++
		if a.pri == priority.Critical {
			critN++
		}
		switch r.outcome[i] {
		case refused:
			ref++
		case good:
			if a.pri == priority.Critical {
				critOK++
			}
			lats = append(lats, r.latency[i])
		default:
			lats = append(lats, r.cfg.deadline)
		}
	}
	f.refused = float64(ref) / float64(max(n, 1))
	f.critOK = float64(critOK) / float64(max(critN, 1))
	if len(lats) > 0 {
		slices.Sort(lats)
		f.p99 = lats[min(len(lats)-1, int(math.Ceil(0.99*float64(len(lats))))-1)]
	}
	return f
}

// The contenders.

// unprotected admits everything into the unbounded queue.
func unprotected() contender {
	return contender{name: "no protection", build: func(config, uint64) admission { return admission{} }}
}

// staticLimit is a fixed concurrency limit: at most n requests admitted
// and not yet finished (queued or in service).
type staticLimit struct {
	n        int64
	inflight atomic.Int64
}

func (s *staticLimit) finish(bool) { s.inflight.Add(-1) }

func static(n int) contender {
	return contender{name: fmt.Sprintf("static limit %d", n), build: func(config, uint64) admission {
		s := &staticLimit{n: int64(n)}
		return admission{try: func(*arrival) (ticket, bool) {
			if s.inflight.Add(1) > s.n {
				s.inflight.Add(-1)
				return nil, false
			}
			return s, true
		}}
	}}
}

// fsTicket ends a failsafe-go permit.
type fsTicket struct{ p adaptivelimiter.Permit }

func (f fsTicket) finish(ok bool) {
	if ok {
		f.p.Record()
	} else {
		f.p.Drop()
	}
}

// failsafeDefault is failsafe-go's AdaptiveLimiter with its defaults
// (limits 1–200, initial 20, max limit factor 5, p90 over windows of 1–30 s
// and ≥ 50 samples, no queueing): TryAcquirePermit refuses at once when
// the limit is reached.
func failsafeDefault() contender {
	return contender{name: "failsafe-go adaptivelimiter (defaults)", build: func(config, uint64) admission {
		l := adaptivelimiter.NewWithDefaults[any]()
		return admission{try: func(*arrival) (ticket, bool) {
			p, ok := l.TryAcquirePermit()
			if !ok {
				return nil, false
			}
			return fsTicket{p}, true
		}}
	}}
}

// failsafePriority is failsafe-go's PriorityLimiter with its defaults
// (BuildPrioritized: the limiter's defaults, queueing with rejection
// factors 2 and 3) and a Prioritizer calibrated every second, each request
// carrying the level drawn in its priority's band (critical VeryHigh,
// normal Medium, sheddable VeryLow). It queues a request when the limit is
// reached, until the client's deadline.
func failsafePriority() contender {
	return contender{name: "failsafe-go prioritylimiter (defaults)", build: func(config, uint64) admission {
		pz := adaptivelimiter.NewPrioritizer()
		l := adaptivelimiter.NewBuilder[any]().BuildPrioritized(pz)
		stop := pz.ScheduleCalibrations(context.Background(), time.Second)
		return admission{
			wait: func(ctx context.Context, a *arrival) (ticket, bool, error) {
				p, err := l.AcquirePermitWithLevel(ctx, a.level)
				switch {
				case errors.Is(err, adaptivelimiter.ErrExceeded):
					return nil, true, err
				case err != nil:
					return nil, false, err // the client's deadline passed in the queue
				}
				return fsTicket{p}, false, nil
			},
			stop: stop,
		}
	}}
}

// sluiceTicket ends a Sluice permit.
type sluiceTicket struct{ p adaptive.Permit }

func (s *sluiceTicket) finish(ok bool) {
	if ok {
		s.p.Done()
	} else {
		s.p.Dropped()
	}
}

// sluiceObjective is the latency objective Sluice's Shedder is given.
const sluiceObjective = 250 * time.Millisecond

// sluice is adaptive.NewGuard with a Concurrency of Max 200 and otherwise its
// defaults (Gradient controller with a latency baseline, 100 ms windows,
// p90, default shares by priority, no queue) and a Shedder with the
// objective p99 ≤ 250 ms (its defaults otherwise), its coin seeded.
func sluice() contender { return sluiceWith("", adaptive.ConcurrencyOptions{Max: 200}) }

// sluiceWith is sluice with other ConcurrencyOptions. With
// Options.QueueSize > 0 a request is admitted by Guard.Acquire (waiting in
// the Concurrency's queue, at most MaxWait, in a goroutine of its own);
// otherwise by TryAcquireAt, which never waits.
func sluiceWith(variant string, lo adaptive.ConcurrencyOptions) contender {
	name := "Sluice adaptive.Guard"
	if variant != "" {
		name += " (" + variant + ")"
	}
	return contender{name: name, build: func(_ config, seed uint64) admission {
		rng := rand.New(rand.NewPCG(seed, 7))
		lo := lo
		if g, ok := lo.Controller.(*adaptive.Gradient); ok {
			g2 := *g
			lo.Controller = &g2
		}
		if a, ok := lo.Controller.(*adaptive.AIMD); ok {
			a2 := *a
			lo.Controller = &a2
		}
		g, err := adaptive.NewGuard(adaptive.GuardOptions{
			Concurrency: lo,
			Shedder: &adaptive.ShedderOptions{
				Objective: adaptive.Objective{Quantile: 0.99, Latency: sluiceObjective},
				Float64:   rng.Float64,
			},
		})
		if err != nil {
			panic(err)
		}
		return sluiceAdmission(g, lo.QueueSize > 0)
	}}
}

// sluiceAdmission admits through g: with wait, by Guard.Acquire, which
// waits in the Concurrency's queue (at most ConcurrencyOptions.MaxWait) when the limit
// is reached; otherwise by TryAcquireAt, which never waits.
func sluiceAdmission(g *adaptive.Guard, wait bool) admission {
	if wait {
		return admission{wait: func(ctx context.Context, a *arrival) (ticket, bool, error) {
			p, err := g.Acquire(priority.NewContext(ctx, a.pri))
			var rf adaptive.Refusal
			switch {
			case errors.As(err, &rf):
				return nil, true, err
			case err != nil:
				return nil, false, err // the client's deadline passed in the queue
			}
			return &sluiceTicket{p}, false, nil
		}}
	}
	return admission{try: func(a *arrival) (ticket, bool) {
		p, r := g.TryAcquireAt(time.Now(), a.pri)
		if r.Refused() {
			return nil, false
		}
		return &sluiceTicket{p}, true
	}}
}
