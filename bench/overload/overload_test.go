package overload

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

var plotPath = flag.String("overload.plot", "", "write TestOverload's plot (goodput, critical goodput and p99 against offered load) to this PNG file")

// The loads offered, as multiples of capacity.
var loads = []float64{0.5, 1, 2, 3, 5, 10}

// The static limits swept for the best one (the server has 10 workers,
// so 10 means no queue at all and 200 a queue 400 ms deep).
var staticLimits = []int{10, 15, 20, 30, 40, 60, 80, 100, 120, 150, 200}

// tolerance is by how much (a fraction of capacity) another contender's
// goodput may exceed Sluice's before the test fails: 1%. Under overload
// every contender that keeps the workers busy and answers in time scores
// the same to the request (the service times belong to the server's
// sequence, not to the requests, and goodput is counted by completion
// time), so what is left are refusals of bursts a little below capacity
// and late answers — 1% is 5 requests a second, the size of effect that
// is a matter of tuning, not of protection working or failing.
const tolerance = 0.01

// benchConfig is the server of the comparison: 10 workers, lognormal
// service times of mean 20 ms (σ 0.5), so a capacity of 500 requests a
// second; clients give up after 1 s; 20 s of virtual time a run, the
// first 8 s (failsafe-go's windows last at least 1 s, its baseline ten of
// them) not measured.
func benchConfig() config {
	return config{workers: 10, service: 20 * time.Millisecond, sigma: 0.5, deadline: time.Second,
		duration: 20 * time.Second, warmup: 8 * time.Second, seed: 1}
}

// sluiceTuned is the Sluice contender the assertions are about: the
// default Guard with the Shedder's objective (p99 ≤ 250 ms) and a
// Gradient controller aiming its p90 at 150 ms, below the Shedder's
// setpoint (80% of the objective, 200 ms), so that the Concurrency limit, not the
// Shedder, does the refusing under overload while the queue it allows
// absorbs the bursts of a load near capacity.
func sluiceTuned() contender {
	return sluiceWith("Gradient Target 150ms", adaptive.ConcurrencyOptions{Max: 200, Controller: &adaptive.Gradient{Target: 150 * time.Millisecond}})
}

// The bounded queue in front of the Concurrency limit, for the Sluice contenders
// that wait (Guard.Acquire). MaxWait is a fifth of the objective: the
// tuned Guard's p99 without a queue is about 180 ms, so a wait of at most
// 50 ms keeps the p99 of what is admitted within 250 ms. QueueSize is
// what the server drains in MaxWait at capacity (500/s × 50 ms): a waiter
// further back would time out anyway.
const (
	sluiceQueue   = 25
	sluiceMaxWait = 50 * time.Millisecond
)

// sluiceQueued is sluiceTuned with the bounded queue: Guard.Acquire
// waits (at most sluiceMaxWait) when the limit is reached, to absorb the
// bursts of a Poisson load at capacity that the Concurrency limit refuses.
func sluiceQueued() contender {
	return sluiceWith("Gradient Target 150ms, queue 25 / 50ms", adaptive.ConcurrencyOptions{Max: 200, Controller: &adaptive.Gradient{Target: 150 * time.Millisecond},
		QueueSize: sluiceQueue, MaxWait: sluiceMaxWait})
}

// TestOverload runs every contender at every load on the same arrivals,
// picks the best static limit by a sweep, prints the table and asserts
// that Sluice's goodput and critical-tier goodput match or beat every
// other contender's at every load point (see tolerance), and that it
// holds the objective.
func TestOverload(t *testing.T) {
	c := benchConfig()
	start := time.Now()
	traces := make([][]arrival, len(loads))
	for i, load := range loads {
		traces[i] = trace(c, load)
	}
	runAll := func(k contender) []figure {
		fs := make([]figure, len(loads))
		for i, load := range loads {
			fs[i] = simulate(t, c, load, traces[i], k).figure()
		}
		return fs
	}

	// The sweep: the best static limit is the one with the most goodput
	// summed over the loads among those that hold the objective (p99 ≤
	// 250 ms) at every load — the limit an operator who knew the
	// capacity would configure. A larger one buys a little goodput near
	// capacity with latency beyond the objective; the sweep shows those
	// too.
	var sweep strings.Builder
	fmt.Fprintf(&sweep, "static limit sweep (goodput / p99 by load %v):\n", loads)
	best, bestSum := 0, -1.0
	var bestFigs []figure
	for _, n := range staticLimits {
		fs := runAll(static(n))
		sum, worst := 0.0, time.Duration(0)
		fmt.Fprintf(&sweep, "  %4d:", n)
		for _, f := range fs {
			sum += f.goodput
			worst = max(worst, f.p99)
			fmt.Fprintf(&sweep, " %.3f/%v", f.goodput, f.p99.Round(time.Millisecond))
		}
		ok := worst <= sluiceObjective
		fmt.Fprintf(&sweep, "  sum %.3f, worst p99 %v, holds the objective %v\n", sum, worst.Round(time.Millisecond), ok)
		if ok && sum > bestSum {
			best, bestSum, bestFigs = n, sum, fs
		}
	}
	t.Log(sweep.String())
	if bestFigs == nil {
		t.Fatal("no static limit of the sweep holds the objective")
	}

	type row struct {
		name   string
		figs   []figure
		sluice bool // a Sluice variant: shown, not compared with the asserted one
	}
	bestStatic := static(best)
	rows := []row{
		{unprotected().name, runAll(unprotected()), false},
		{bestStatic.name + " (best of the sweep)", bestFigs, false},
		{failsafeDefault().name, runAll(failsafeDefault()), false},
		{failsafePriority().name, runAll(failsafePriority()), false},
		{sluice().name + " (defaults)", runAll(sluice()), true},
		{sluiceQueued().name, runAll(sluiceQueued()), true},
		{sluiceTuned().name, runAll(sluiceTuned()), true},
	}
	sl := rows[len(rows)-1]

	var tab strings.Builder
	fmt.Fprintf(&tab, "capacity %.0f/s (%d workers, mean service %v), deadline %v, %v a run (measured from %v), objective p99 ≤ %v\n",
		c.capacity(), c.workers, c.service, c.deadline, c.duration, c.warmup, sluiceObjective)
	fmt.Fprintf(&tab, "| load | contender | goodput | critical goodput | critical answered | p99 | refused |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for i, load := range loads {
		for _, r := range rows {
			f := r.figs[i]
			fmt.Fprintf(&tab, "| %v× | %s | %.3f | %.3f | %.3f | %v | %.3f |\n", load, r.name, f.goodput, f.critical, f.critOK, f.p99.Round(time.Millisecond), f.refused)
		}
	}
	t.Log(tab.String())
	t.Logf("%d runs in %v", len(loads)*(len(staticLimits)+len(rows)-1), time.Since(start).Round(time.Millisecond))

	if *plotPath != "" {
		series := make([]plotSeries, len(rows))
		for i, r := range rows {
			series[i] = plotSeries{name: r.name, figs: r.figs}
		}
		if err := writePlot(*plotPath, c, series); err != nil {
			t.Fatal(err)
		}
		t.Logf("plot written to %s", *plotPath)
	}

	for i, load := range loads {
		s := sl.figs[i]
		if s.p99 > sluiceObjective {
			t.Errorf("%v×: %s p99 %v, above the objective %v", load, sl.name, s.p99, sluiceObjective)
		}
		for _, r := range rows[:len(rows)-1] {
			if r.sluice {
				continue
			}
			o := r.figs[i]
			if o.critical > s.critical+tolerance {
				t.Errorf("%v×: critical-tier goodput of %s %.3f, of %s %.3f: more than %.0f%% of capacity better", load, r.name, o.critical, sl.name, s.critical, tolerance*100)
			}
			if o.goodput <= s.goodput+tolerance {
				continue
			}
			// The one exemption: a contender that misses the objective
			// may buy goodput with latency (near capacity, a queue deep
			// enough to refuse no burst). Sluice holds the objective
			// instead; the loss is logged and recorded in RESULTS.md.
			if o.p99 > sluiceObjective && s.p99 <= sluiceObjective {
				t.Logf("%v×: %s goodput %.3f beats %s %.3f by %.3f, with p99 %v, beyond the objective (Sluice: %v)",
					load, r.name, o.goodput, sl.name, s.goodput, o.goodput-s.goodput, o.p99.Round(time.Millisecond), s.p99.Round(time.Millisecond))
				continue
			}
			t.Errorf("%v×: goodput of %s %.3f (p99 %v), of %s %.3f: more than %.0f%% of capacity better",
				load, r.name, o.goodput, o.p99.Round(time.Millisecond), sl.name, s.goodput, tolerance*100)
		}
	}
	// The harness itself must show overload: without protection the
	// server collapses from 2× on, and with Sluice it stays at capacity.
	for i, load := range loads {
		if load >= 2 && rows[0].figs[i].goodput > 0.1 {
			t.Errorf("%v×: unprotected goodput %.3f; the harness should collapse without protection", load, rows[0].figs[i].goodput)
		}
		if load >= 2 && sl.figs[i].goodput < 0.95 {
			t.Errorf("%v×: %s goodput %.3f, want >= 0.95 of capacity", load, sl.name, sl.figs[i].goodput)
		}
	}
}

// TestOverloadRepeatable runs contenders (one that decides at once, two
// that wait in a queue) twice each on the same trace: the
// bubble's virtual time and the seeded draws make the figures identical,
// which is what lets TestOverload assert on them.
func TestOverloadRepeatable(t *testing.T) {
	c := benchConfig()
	c.duration, c.warmup = 6*time.Second, 2*time.Second
	tr := trace(c, 3)
	for _, k := range []contender{sluiceTuned(), sluiceQueued(), failsafePriority()} {
		a, b := simulate(t, c, 3, tr, k), simulate(t, c, 3, tr, k)
		for i := range tr {
			if a.outcome[i] != b.outcome[i] || a.latency[i] != b.latency[i] {
				t.Fatalf("%s: request %d: outcome %d latency %v, then %d %v", k.name, i, a.outcome[i], a.latency[i], b.outcome[i], b.latency[i])
			}
		}
	}
}
