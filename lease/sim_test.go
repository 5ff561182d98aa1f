package lease

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// The simulation runs holders sharing a MemoryStore and a simulated
// service that enforces C per second, in the fake time of testing/synctest,
// and checks the properties of issue 6 at every step of simStep.

const simStep = 10 * time.Millisecond

// simSpec is one holder of a simulation.
type simSpec struct {
	name string
	// rate is an open-loop demand in units/s; records a closed-loop one:
	// that many units to send as fast as the holder allows.
	rate    float64
	records int
	// start and kill are offsets from the start; kill 0 means never. A
	// killed holder stops dead: its store calls fail from then on, so it
	// releases nothing.
	start, kill time.Duration
	// stopWhenDone shuts the holder down (releasing) once its records
	// are sent, as a processor that exits does.
	stopWhenDone bool
	weight       float64
	// loopers, when not 0, replaces the queue: that many goroutines
	// call Wait and send in a loop, as fast as the holder allows.
	loopers int
}

type simConfig struct {
	capacity   float64
	partitions int
	ttl        time.Duration
	duration   time.Duration
	holders    []simSpec
	// fixedWindow makes the service count in fixed one-second windows,
	// starting at windowOffset, answering 429 with the time left in the
	// window as its retry hint; otherwise it is a token bucket of C/s
	// with a burst of C/10, answering 429 without a hint.
	fixedWindow  bool
	windowOffset time.Duration
	// inject lists offsets at which the service refuses the next request
	// whatever its count, with the retry hint injectHint (none when 0).
	inject     []time.Duration
	injectHint time.Duration
	// mute makes the store's notifications never arrive.
	mute bool
	// probe, when set, is called at every step.
	probe func(el time.Duration, hs []*simHolder)
}

// simHolder is a running holder of the simulation.
type simHolder struct {
	spec   simSpec
	h      *Holder
	coord  *scripted // down once killed
	cancel context.CancelFunc
	done   chan struct{}
	notify chan struct{}

	mu        sync.Mutex
	queue     int     // units waiting to be sent
	acc       float64 // fractional arrivals
	served    []int   // per second of the simulation
	throttled int
	maxWait   time.Duration // longest WaitN after the warm-up
	finished  time.Duration // when the records were all sent; 0 if not
	started   bool
	killed    bool
	startedAt time.Time
}

type simResult struct {
	cfg     simConfig
	holders []*simHolder
	seconds int
	// violations of the capacity property, and the first one.
	overCapacity int
	firstOver    string
	throttled    int
	served       int
	storeCalls   uint64
	// firstShare is, per holder, when it first held at least
	// floor(P/active) valid leases after its start (-1: never).
	firstShare []time.Duration
	// freedAfterKill is, per killed holder, how long after its kill the
	// store stopped showing it as owner of any partition (-1: never).
	freedAfterKill []time.Duration
	// takenAfterKill is how long after the kill the others held all P
	// partitions again (-1: never).
	takenAfterKill []time.Duration
}

// simulate runs one simulation inside a synctest bubble.
func simulate(t *testing.T, cfg simConfig, warmup time.Duration) *simResult {
	t.Helper()
	var res *simResult
	synctest.Test(t, func(t *testing.T) { res = runSim(t, cfg, warmup) })
	return res
}

func runSim(t *testing.T, cfg simConfig, warmup time.Duration) *simResult {
	mem := NewMemoryStore()
	svc := ratelimit.NewLimiter(ratelimit.Limit(cfg.capacity), int(cfg.capacity/10))
	begin := time.Now()
	seconds := int(cfg.duration / time.Second)
	res := &simResult{cfg: cfg, seconds: seconds}
	var svcMu sync.Mutex
	var window int64 = -1 // the fixed window's number, and its count
	var inWindow int
	inject := cfg.inject
	// send sends one unit at now; on a refusal it returns the retry hint
	// (0 for none).
	send := func(sh *simHolder, now time.Time) (ok bool, hint time.Duration) {
		svcMu.Lock()
		defer svcMu.Unlock()
		el := now.Sub(begin)
		switch {
		case len(inject) > 0 && el >= inject[0]:
			inject = inject[1:]
			ok, hint = false, cfg.injectHint
		case cfg.fixedWindow:
			w := int64((el - cfg.windowOffset + 100*time.Second) / time.Second)
			if w != window {
				window, inWindow = w, 0
			}
			ok = float64(inWindow) < cfg.capacity
			if ok {
				inWindow++
			} else {
				end := begin.Add(cfg.windowOffset - 100*time.Second + time.Duration(w+1)*time.Second)
				hint = end.Sub(now)
			}
		default:
			ok = svc.AllowN(now, 1)
		}
		if ok {
			sec := int(now.Sub(begin) / time.Second)
			if sec < seconds {
				sh.served[sec]++
			}
		} else {
			res.throttled++
		}
		return ok, hint
	}
	for i, sp := range cfg.holders {
		sh := &simHolder{spec: sp, served: make([]int, seconds), notify: make(chan struct{}, 1), done: make(chan struct{})}
		sh.coord = &scripted{Store: mem, mute: cfg.mute}
		h, err := NewHolder(sh.coord, Options{
			ID: sp.name, Capacity: cfg.capacity, Partitions: cfg.partitions,
			TTL: cfg.ttl, Weight: sp.weight, Seed: uint64(i + 1),
		})
		if err != nil {
			t.Fatal(err)
		}
		sh.h = h
		sh.queue = sp.records
		res.holders = append(res.holders, sh)
		res.firstShare = append(res.firstShare, -1)
	}
	startHolder := func(sh *simHolder) {
		ctx, cancel := context.WithCancel(context.Background())
		sh.cancel = cancel
		sh.started, sh.startedAt = true, time.Now()
		sh.h.SetBacklog(sh.queue)
		runDone := make(chan struct{})
		go func() {
			defer close(runDone)
			sh.h.Run(ctx) //nolint:errcheck // a killed holder's release fails, as meant
		}()
		lim := sh.h.Limiter()
		if sh.spec.loopers > 0 {
			var wg sync.WaitGroup
			for range sh.spec.loopers {
				wg.Go(func() {
					for lim.Wait(ctx) == nil {
						if ok, hint := send(sh, time.Now()); !ok {
							sh.mu.Lock()
							sh.throttled++
							sh.mu.Unlock()
							sh.h.ThrottledAfterAt(time.Now(), hint)
						}
					}
				})
			}
			go func() { wg.Wait(); <-runDone; close(sh.done) }()
			return
		}
		go func() {
			defer func() { <-runDone; close(sh.done) }()
			for {
				sh.mu.Lock()
				q := sh.queue
				sh.mu.Unlock()
				if q == 0 {
					if sh.spec.records > 0 {
						sh.mu.Lock()
						sh.finished = time.Since(begin)
						sh.mu.Unlock()
						if sh.spec.stopWhenDone {
							cancel()
						}
						<-ctx.Done()
						return
					}
					select {
					case <-sh.notify:
						continue
					case <-ctx.Done():
						return
					}
				}
				t0 := time.Now()
				if err := lim.Wait(ctx); err != nil {
					return
				}
				now := time.Now()
				sh.mu.Lock()
				if w := now.Sub(t0); now.Sub(begin) >= warmup && w > sh.maxWait {
					sh.maxWait = w
				}
				sh.mu.Unlock()
				if ok, hint := send(sh, now); !ok {
					sh.mu.Lock()
					sh.throttled++
					sh.mu.Unlock()
					sh.h.ThrottledAfterAt(now, hint)
					continue
				}
				sh.mu.Lock()
				sh.queue--
				sh.h.SetBacklog(sh.queue)
				sh.mu.Unlock()
			}
		}()
	}

	killAt := map[int]time.Duration{}
	for step := 0; ; step++ {
		el := time.Duration(step) * simStep
		if el >= cfg.duration {
			break
		}
		now := time.Now()
		for i, sh := range res.holders {
			if !sh.started && el >= sh.spec.start {
				startHolder(sh)
			}
			if sh.started && !sh.killed && sh.spec.kill > 0 && el >= sh.spec.kill {
				sh.killed = true
				sh.coord.down.Store(true)
				sh.cancel()
				killAt[i] = el
			}
			if sh.started && !sh.killed && sh.spec.rate > 0 {
				sh.mu.Lock()
				sh.acc += sh.spec.rate * simStep.Seconds()
				n := int(sh.acc)
				sh.acc -= float64(n)
				sh.queue += n
				sh.h.SetBacklog(sh.queue)
				sh.mu.Unlock()
				select {
				case sh.notify <- struct{}{}:
				default:
				}
			}
		}
		// The check reads the holders' tables one after another; it
		// must see them all at one point of the simulation, not while a
		// holder woken at this instant drops a partition that another
		// then acquires between two reads.
		synctest.Wait()
		res.check(now, el, mem, killAt)
		if cfg.probe != nil {
			cfg.probe(el, res.holders)
		}

		time.Sleep(simStep)
	}
	for _, sh := range res.holders {
		if sh.started {
			sh.cancel()
			<-sh.done
			res.storeCalls += sh.h.StatsAt(time.Now()).StoreCalls
		}
	}
	for _, sh := range res.holders {
		for _, n := range sh.served {
			res.served += n
		}
	}
	return res
}

// check verifies the capacity property at now and records the instants
// the other properties are measured by.
func (r *simResult) check(now time.Time, el time.Duration, mem *MemoryStore, killAt map[int]time.Duration) {
	P := r.cfg.partitions
	owner := make([]int, P)
	for i := range owner {
		owner[i] = -1
	}
	total, active := 0, 0
	held := make([]int, len(r.holders))
	for i, sh := range r.holders {
		if !sh.started {
			continue
		}
		if !sh.killed {
			active++
		}
		for _, l := range sh.h.LeasesAt(now) {
			total++
			held[i]++
			if o := owner[l.Partition]; o >= 0 {
				r.overCapacity++
				if r.firstOver == "" {
					r.firstOver = fmt.Sprintf("at %v partition %d held by %s and %s", el, l.Partition, r.holders[o].spec.name, sh.spec.name)
				}
			}
			owner[l.Partition] = i
		}
	}
	if total > P {
		r.overCapacity++
		if r.firstOver == "" {
			r.firstOver = fmt.Sprintf("at %v %d partitions held of %d", el, total, P)
		}
	}
	for i, sh := range r.holders {
		if sh.started && !sh.killed && r.firstShare[i] < 0 && active > 0 && held[i] >= P/active {
			r.firstShare[i] = now.Sub(sh.startedAt)
		}
	}
	if len(killAt) == 0 {
		return
	}
	if r.freedAfterKill == nil {
		r.freedAfterKill = []time.Duration{-1}
		r.takenAfterKill = []time.Duration{-1}
	}
	owners := mem.owners(P)
	for i, at := range killAt {
		owns := false
		for _, o := range owners {
			if o == r.holders[i].spec.name {
				owns = true
			}
		}
		if !owns && r.freedAfterKill[0] < 0 {
			r.freedAfterKill[0] = el - at
		}
		if r.takenAfterKill[0] < 0 && total-held[i] == P {
			r.takenAfterKill[0] = el - at
		}
	}
}

// guardCount returns the units the window's guard counts at now.
func (h *Holder) guardCount(now time.Time) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pace.guard.count(now)
}

// owners returns the owner of each of the first p partitions by the
// store's clock, "" when free: a view that, unlike a heartbeat, tells no
// watcher.
func (s *MemoryStore) owners(p int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := make([]string, p)
	for i := range out {
		if q := s.parts[i]; q.expiry.After(now) {
			out[i] = q.owner
		}
	}
	return out
}

// utilisation returns the lowest utilisation of any window of w seconds
// starting at or after from.
func (r *simResult) utilisation(from, w int) (low float64, at int) {
	low, at = math.Inf(1), -1
	for s := from; s+w <= r.seconds; s++ {
		n := 0
		for _, sh := range r.holders {
			for _, x := range sh.served[s : s+w] {
				n += x
			}
		}
		if u := float64(n) / (r.cfg.capacity * float64(w)); u < low {
			low, at = u, s
		}
	}
	return low, at
}

// fairness returns Jain's index of the holders' served units in [from, to)
// seconds.
func (r *simResult) fairness(from, to int) float64 {
	xs := make([]float64, len(r.holders))
	for i, sh := range r.holders {
		for _, x := range sh.served[from:to] {
			xs[i] += float64(x)
		}
	}
	return jain(xs)
}

// jain returns Jain's fairness index of xs: (Σx)² / (n Σx²), 1 when all
// are equal, 1/n when one has everything.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 1
	}
	return s * s / (float64(len(xs)) * s2)
}

// table renders the served units per second of each holder and the total.
func (r *simResult) table(upto int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%4s", "t(s)")
	for _, sh := range r.holders {
		fmt.Fprintf(&b, " %6s", sh.spec.name)
	}
	fmt.Fprintf(&b, " %6s\n", "total")
	for s := 0; s < min(upto, r.seconds); s++ {
		fmt.Fprintf(&b, "%4d", s)
		tot := 0
		for _, sh := range r.holders {
			fmt.Fprintf(&b, " %6d", sh.served[s])
			tot += sh.served[s]
		}
		fmt.Fprintf(&b, " %6d\n", tot)
	}
	return b.String()
}

func (r *simResult) commonChecks(t *testing.T) {
	t.Helper()
	if r.overCapacity > 0 {
		t.Errorf("valid leased capacity exceeded C %d times, first %s", r.overCapacity, r.firstOver)
	}
	if r.served > 0 && float64(r.throttled) > 0.01*float64(r.served) {
		t.Errorf("throttled %d of %d sent (> 1%%)", r.throttled, r.served)
	}
	t.Logf("served %d, throttled %d, store calls %.1f/s per holder", r.served, r.throttled,
		float64(r.storeCalls)/r.cfg.duration.Seconds()/float64(len(r.holders)))
}

func TestSimSaturated(t *testing.T) {
	for _, n := range []int{2, 3, 4, 7} {
		t.Run(fmt.Sprint(n, " holders"), func(t *testing.T) {
			cfg := simConfig{capacity: 500, partitions: 20, ttl: 3 * time.Second, duration: 40 * time.Second}
			for i := range n {
				// Unequal demands, all above C/n.
				cfg.holders = append(cfg.holders, simSpec{name: fmt.Sprint("h", i), rate: 600 + 100*float64(i)})
			}
			r := simulate(t, cfg, 5*time.Second)
			r.commonChecks(t)
			if u, at := r.utilisation(5, 10); u < 0.95 {
				t.Errorf("utilisation %.3f over [%d s, %d s), want ≥ 0.95", u, at, at+10)
			} else {
				t.Logf("lowest utilisation over 10 s after 5 s: %.4f", u)
			}
			if j := r.fairness(5, r.seconds); j < 0.95 {
				t.Errorf("Jain's fairness %.4f, want ≥ 0.95\n%s", j, r.table(r.seconds))
			} else {
				t.Logf("Jain's fairness: %.4f", j)
			}
		})
	}
}

func TestSimNewcomer(t *testing.T) {
	const ttl = 3 * time.Second
	renew := ttl / 3
	for _, join := range []time.Duration{
		12 * time.Second,
		12*time.Second + 345*time.Millisecond,
		12*time.Second + 777*time.Millisecond,
	} {
		t.Run(fmt.Sprint("join at ", join), func(t *testing.T) {
			cfg := simConfig{capacity: 500, partitions: 20, ttl: ttl, duration: 25 * time.Second,
				holders: []simSpec{
					{name: "a", rate: 800},
					{name: "b", rate: 800},
					{name: "c", rate: 800},
					{name: "late", rate: 800, start: join},
				}}
			r := simulate(t, cfg, 5*time.Second)
			r.commonChecks(t)
			got := r.firstShare[3]
			if got < 0 || got > 2*renew {
				t.Errorf("newcomer had its share %v after joining, want within two renewal periods (%v)\n%s", got, 2*renew, r.table(r.seconds))
			}
			t.Logf("newcomer had its share (%d partitions) %v after joining", 20/4, got)
			if j := r.fairness(15, r.seconds); j < 0.95 {
				t.Errorf("Jain's fairness after the newcomer settled %.4f, want ≥ 0.95", j)
			}
			if u, at := r.utilisation(5, 10); u < 0.95 {
				t.Errorf("utilisation %.3f over [%d s, %d s), want ≥ 0.95", u, at, at+10)
			}
		})
	}
}

func TestSimKilled(t *testing.T) {
	const ttl = 3 * time.Second
	cfg := simConfig{capacity: 500, partitions: 20, ttl: ttl, duration: 25 * time.Second,
		holders: []simSpec{
			{name: "a", rate: 800},
			{name: "b", rate: 800},
			{name: "victim", rate: 800, kill: 10*time.Second + 123*time.Millisecond},
		}}
	r := simulate(t, cfg, 5*time.Second)
	r.commonChecks(t)
	if f := r.freedAfterKill[0]; f < 0 || f > ttl {
		t.Errorf("killed holder's partitions freed %v after the kill, want within the TTL %v", f, ttl)
	}
	// Taken back as soon as the store frees them: the holders wanting
	// more see that the leases missed their renewals.
	if g := r.takenAfterKill[0]; g < 0 || g > ttl {
		t.Errorf("others held all partitions %v after the kill, want within the TTL %v\n%s", g, ttl, r.table(r.seconds))
	}
	t.Logf("killed holder's partitions freed after %v; all taken by the others after %v", r.freedAfterKill[0], r.takenAfterKill[0])
	if u, at := r.utilisation(15, 10); u < 0.95 {
		t.Errorf("utilisation %.3f over [%d s, %d s) after recovery, want ≥ 0.95", u, at, at+10)
	}
}

func TestSimBelowCapacity(t *testing.T) {
	cfg := simConfig{capacity: 500, partitions: 20, ttl: 3 * time.Second, duration: 30 * time.Second,
		holders: []simSpec{
			{name: "a", rate: 100},
			{name: "b", rate: 150},
			{name: "c", rate: 50},
			{name: "d", rate: 120},
		}}
	r := simulate(t, cfg, 10*time.Second)
	r.commonChecks(t)
	t.Logf("\n%s", r.table(12))
	for _, sh := range r.holders {
		t.Logf("%s (demand %v/s): longest wait after 10 s: %v", sh.spec.name, sh.spec.rate, sh.maxWait)
		if sh.maxWait > 20*time.Millisecond {
			t.Errorf("%s (demand %v/s) waited up to %v after the warm-up, want nobody waiting", sh.spec.name, sh.spec.rate, sh.maxWait)
		}
		n := 0
		for _, x := range sh.served[15:] {
			n += x
		}
		if got := float64(n) / float64(r.seconds-15); math.Abs(got-sh.spec.rate) > 0.02*sh.spec.rate {
			t.Errorf("%s served %.1f/s, demand %v/s", sh.spec.name, got, sh.spec.rate)
		}
	}
}

func TestSimWeights(t *testing.T) {
	cfg := simConfig{capacity: 500, partitions: 20, ttl: 3 * time.Second, duration: 25 * time.Second,
		holders: []simSpec{
			{name: "w1", rate: 900, weight: 1},
			{name: "w3", rate: 900, weight: 3},
		}}
	r := simulate(t, cfg, 5*time.Second)
	r.commonChecks(t)
	var a, b int
	for s := 5; s < r.seconds; s++ {
		a += r.holders[0].served[s]
		b += r.holders[1].served[s]
	}
	if ratio := float64(b) / float64(a); math.Abs(ratio-3) > 0.1 {
		t.Errorf("weight 3 : weight 1 served %d : %d (%.2f), want 3", b, a, ratio)
	} else {
		t.Logf("weight 3 : weight 1 served %d : %d (%.2f)", b, a, ratio)
	}
}

// TestPublishedExample reproduces the published example: 500 req/s in 20
// partitions of 25; processor A has 10,000 records and B 5,000, both
// starting at once. Sending all takes at least 15,000 / 500 = 30 s, and B
// at its fair half at least 20 s. The service is a token bucket, or counts
// in fixed one-second windows that start wherever they like (answering 429
// with the time left as the retry hint). Run with -v for the table.
func TestPublishedExample(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fixed  bool
		offset time.Duration
	}{
		{"token bucket", false, 0},
		{"fixed windows", true, 0},
		{"fixed windows at +0.37s", true, 370 * time.Millisecond},
		{"fixed windows at +0.81s", true, 810 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := simConfig{capacity: 500, partitions: 20, ttl: 3 * time.Second, duration: 40 * time.Second,
				fixedWindow: tc.fixed, windowOffset: tc.offset,
				holders: []simSpec{
					{name: "A", records: 10000, stopWhenDone: true},
					{name: "B", records: 5000, stopWhenDone: true},
				}}
			r := simulate(t, cfg, 0)
			r.commonChecks(t)
			a, b := r.holders[0].finished, r.holders[1].finished
			t.Logf("A finished at %v, B at %v (lower bounds 30 s and 20 s)\n%s", a, b, r.table(int(a/time.Second)+1))
			if a <= 0 || a > 31500*time.Millisecond {
				t.Errorf("A finished at %v, want within 5%% of 30 s", a)
			}
			if b <= 0 || b > 21*time.Second {
				t.Errorf("B finished at %v, want within 5%% of 20 s (half the capacity)", b)
			}
			if float64(r.throttled) > 0.001*float64(r.served) {
				t.Errorf("throttled %d of %d, want ≤ 0.1%%", r.throttled, r.served)
			}
		})
	}
}

// TestSimColdStart starts two holders at once on idle capacity (100/s in
// 10 partitions), each with four goroutines looping on Wait and no
// backlog: within one renewal period (the store answers at once here, so
// no round trip to add) they use at least 95 % of the capacity, and share
// it evenly. With the notifications lost, the same.
func TestSimColdStart(t *testing.T) {
	for _, mute := range []bool{false, true} {
		t.Run(fmt.Sprint("notifications lost: ", mute), func(t *testing.T) {
			const period = time.Second // TTL/3
			var rates [][2]float64     // sum of the holders' limits, every step
			cfg := simConfig{capacity: 100, partitions: 10, ttl: 3 * time.Second, duration: 6 * time.Second, mute: mute,
				holders: []simSpec{{name: "A", loopers: 4}, {name: "B", loopers: 4}},
				probe: func(el time.Duration, hs []*simHolder) {
					rates = append(rates, [2]float64{float64(hs[0].h.Limiter().Limit()), float64(hs[1].h.Limiter().Limit())})
				}}
			r := simulate(t, cfg, 0)
			r.commonChecks(t)
			t.Logf("served per second:\n%s", r.table(r.seconds))
			pace, _ := pacing(100, time.Second)
			first := time.Duration(-1)
			for i, x := range rates {
				if x[0]+x[1] >= 0.95*pace {
					first = time.Duration(i) * simStep
					break
				}
			}
			t.Logf("the two limiters at ≥ 95%% of the capacity %v after the start", first)
			if first < 0 || first > period {
				t.Errorf("≥ 95%% of the capacity %v after the start, want within a period (%v)", first, period)
			}
			// The holder that looked first took everything; the other
			// has its half once the first has seen it: at once when
			// notified, at the first one's next period otherwise, and
			// then a tenth of a period of polling may be idle.
			from := 1
			if mute {
				from = 2
			}
			if u, at := r.utilisation(from, 1); u < 0.95 {
				t.Errorf("utilisation %.3f in second %d, want ≥ 0.95 from second %d on\n%s", u, at, from, r.table(r.seconds))
			}
			if j := r.fairness(2, r.seconds); j < 0.99 {
				t.Errorf("Jain's fairness %.4f from 2 s on, want ≥ 0.99", j)
			}
		})
	}
}

// TestSimSingle429 injects one 429 into a holder running alone at full
// capacity (four goroutines looping on Wait): without a hint, and with a
// hint of 300 ms. It may cost at most 0.5 s of the holder's throughput
// against the same run without it, and cuts no ceiling.
func TestSimSingle429(t *testing.T) {
	run := func(inject []time.Duration, hint time.Duration) (*simResult, Stats) {
		cfg := simConfig{capacity: 500, partitions: 20, ttl: 3 * time.Second, duration: 12 * time.Second,
			fixedWindow: true, windowOffset: 370 * time.Millisecond, inject: inject, injectHint: hint,
			holders: []simSpec{{name: "A", loopers: 4}}}
		var st Stats
		cfg.probe = func(el time.Duration, hs []*simHolder) {
			if el == cfg.duration-simStep {
				st = hs[0].h.Stats()
			}
		}
		return simulate(t, cfg, 0), st
	}
	base, _ := run(nil, 0)
	for _, hint := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprint("hint ", hint), func(t *testing.T) {
			r, st := run([]time.Duration{5*time.Second + 123*time.Millisecond}, hint)
			lost := float64(base.served-r.served) / 500
			t.Logf("served %d against %d without the 429: %.3f s of throughput lost; cuts %d, pauses %d", r.served, base.served, lost, st.Cuts, st.Pauses)
			if lost > 0.5 {
				t.Errorf("one 429 cost %.3f s of throughput, want ≤ 0.5 s\n%s", lost, r.table(r.seconds))
			}
			if st.Cuts != 0 || st.Throttled != 1 {
				t.Errorf("cuts %d throttled %d, want 0 and 1", st.Cuts, st.Throttled)
			}
			if r.throttled != 1 {
				t.Errorf("%d 429s, want the injected one only", r.throttled)
			}
		})
	}
}

// TestSimFreedCapacity: when B finishes and releases its partitions, A
// (which wants them) runs at the full rate within 100 ms when the store's
// notifications arrive, and within one renewal period when they are lost.
func TestSimFreedCapacity(t *testing.T) {
	for _, tc := range []struct {
		mute  bool
		bound time.Duration
	}{{false, 100 * time.Millisecond}, {true, time.Second}} {
		t.Run(fmt.Sprint("notifications lost: ", tc.mute), func(t *testing.T) {
			full, _ := pacing(500, time.Second)
			var bDone, aFull time.Duration = -1, -1
			cfg := simConfig{capacity: 500, partitions: 20, ttl: 3 * time.Second, duration: 14 * time.Second, mute: tc.mute,
				fixedWindow: true, windowOffset: 370 * time.Millisecond,
				holders: []simSpec{
					{name: "A", records: 6000, stopWhenDone: true},
					{name: "B", records: 1234, stopWhenDone: true},
				}}
			cfg.probe = func(el time.Duration, hs []*simHolder) {
				hs[1].mu.Lock()
				fin := hs[1].finished
				hs[1].mu.Unlock()
				if bDone < 0 && fin > 0 {
					bDone = fin
				}
				if bDone >= 0 && aFull < 0 && float64(hs[0].h.Limiter().Limit()) >= full {
					aFull = el
				}
			}
			r := simulate(t, cfg, 0)
			r.commonChecks(t)
			after := aFull - bDone
			t.Logf("B finished at %v; A at the full rate %v later", bDone, after)
			if bDone < 0 || aFull < 0 || after > tc.bound {
				t.Errorf("A at the full rate %v after B finished (B at %v), want within %v\n%s", after, bDone, tc.bound, r.table(r.seconds))
			}
		})
	}
}
