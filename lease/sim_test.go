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

var simDebug func(time.Duration, []*simHolder)

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
}

type simConfig struct {
	capacity   float64
	partitions int
	ttl        time.Duration
	duration   time.Duration
	holders    []simSpec
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
	send := func(sh *simHolder, now time.Time) bool {
		svcMu.Lock()
		defer svcMu.Unlock()
		ok := svc.AllowN(now, 1)
		if ok {
			sec := int(now.Sub(begin) / time.Second)
			if sec < seconds {
				sh.served[sec]++
			}
		} else {
			res.throttled++
		}
		return ok
	}
	for i, sp := range cfg.holders {
		sh := &simHolder{spec: sp, served: make([]int, seconds), notify: make(chan struct{}, 1), done: make(chan struct{})}
		sh.coord = &scripted{Store: mem}
		h, err := NewHolder(sh.coord, Config{
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
		go func() {
			defer func() { <-runDone; close(sh.done) }()
			lim := sh.h.Limiter()
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
				if !send(sh, now) {
					sh.mu.Lock()
					sh.throttled++
					sh.mu.Unlock()
					sh.h.ThrottledAt(now)
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
		res.check(now, el, mem, killAt)
		if simDebug != nil {
			simDebug(el, res.holders)
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
// starting at once. Sending all takes at least 15,000 / 500 = 30 s. Run
// with -v for the table.
func TestPublishedExample(t *testing.T) {
	cfg := simConfig{capacity: 500, partitions: 20, ttl: 3 * time.Second, duration: 40 * time.Second,
		holders: []simSpec{
			{name: "A", records: 10000, stopWhenDone: true},
			{name: "B", records: 5000, stopWhenDone: true},
		}}
	r := simulate(t, cfg, 0)
	r.commonChecks(t)
	a, b := r.holders[0].finished, r.holders[1].finished
	t.Logf("A finished at %v, B at %v (lower bound 30 s; B alone at its fair half: 20 s)\n%s", a, b, r.table(int(a/time.Second)+1))
	if a <= 0 || a > 33*time.Second {
		t.Errorf("A finished at %v, want within 10%% of 30 s", a)
	}
	if b <= 0 || b > 22*time.Second {
		t.Errorf("B finished at %v, want within 10%% of 20 s (half the capacity)", b)
	}
}
