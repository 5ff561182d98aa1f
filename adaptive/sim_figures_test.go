package adaptive

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// The simulated server: 20 workers, lognormal service times with mean
// 20ms (σ 0.5), so a capacity of 1000 requests a second; clients give up
// after 1s; the objective is p99 ≤ 250ms.
const (
	simWorkers  = 20
	simService  = 20 * time.Millisecond
	simDeadline = time.Second
	simObj      = 250 * time.Millisecond
)

func simGuard(t testing.TB, seed uint64, ctrl Controller) *Guard {
	t.Helper()
	return simGuardAt(t, seed, ctrl, 0)
}

// simGuardAt is simGuard with its Concurrency's ConcurrencyOptions.Initial (0: the
// warm-up).
func simGuardAt(t testing.TB, seed uint64, ctrl Controller, initial int) *Guard {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	if ctrl == nil {
		ctrl = &Gradient{}
	}
	g, err := NewGuard(GuardOptions{
		Concurrency: ConcurrencyOptions{Max: 200, Initial: initial, Controller: ctrl},
		Shedder:     &ShedderOptions{Objective: Objective{Quantile: 0.99, Latency: simObj}, Float64: rng.Float64},
		Features:    []Feature{{Name: "recommendations", Off: 0.8, On: 0.6}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func constLoad(x float64) func(time.Duration) float64 {
	return func(time.Duration) float64 { return x }
}

func baseSim(load func(time.Duration) float64, g *Guard) simConfig {
	c := simConfig{
		workers: simWorkers, service: simService, sigma: 0.5, deadline: simDeadline,
		duration: 10 * time.Second, load: load, seed: 1,
	}
	if g != nil {
		c.admit = func(now time.Time, p priority.Priority) (Permit, bool) {
			pm, r := g.TryAcquireAt(now, p)
			return pm, !r.Refused()
		}
	}
	return c
}

// TestSimLoadPoints runs the Guard at 0.5× to 10× capacity: goodput stays
// at capacity under overload, p99 within the objective once converged
// (from 3s), the rejection ratio steady, nothing refused at 0.5×, and the
// limit never above its maximum. Unprotected, the same server's goodput
// collapses (checked too, so that the simulator is shown to overload).
func TestSimLoadPoints(t *testing.T) {
	for _, ctrl := range []string{"gradient", "aimd"} {
		for _, load := range []float64{0.5, 1, 2, 3, 5, 10} {
			var c Controller = &Gradient{}
			if ctrl == "aimd" {
				c = &AIMD{Target: 60 * time.Millisecond}
			}
			g := simGuard(t, 1, c)
			var maxLimit float64
			cfg := baseSim(constLoad(load), g)
			cfg.probe = func(time.Duration) { maxLimit = max(maxLimit, g.Concurrency().Limit()) }
			r := runSim(cfg)
			good, p99, ref, cv := r.goodput(3, 10), r.quantile(0.99, 3, 10), r.refusedRatio(-1, 3, 10), r.rejectionCV(3, 10)
			t.Logf("%s load %4.1f×: goodput %.3f of capacity, p99 %v, refused %.3f, per-second rejection CV %.3f, max limit %.1f",
				ctrl, load, good, p99.Round(time.Millisecond), ref, cv, maxLimit)
			if maxLimit > 200 {
				t.Errorf("%s %v×: limit reached %.1f, above the maximum 200", ctrl, load, maxLimit)
			}
			if p99 > simObj {
				t.Errorf("%s %v×: p99 %v above the objective %v", ctrl, load, p99, simObj)
			}
			switch {
			case load == 0.5 && ref != 0:
				t.Errorf("%s 0.5×: refused %.4f of requests, want none", ctrl, ref)
			case load >= 3 && good < 0.9:
				t.Errorf("%s %v×: goodput %.3f of capacity, want >= 0.9", ctrl, load, good)
			}
			if load >= 2 && cv > 0.1 {
				t.Errorf("%s %v×: per-second rejection ratio CV %.3f, want <= 0.1", ctrl, load, cv)
			}
		}
	}
	for _, load := range []float64{3, 10} {
		r := runSim(baseSim(constLoad(load), nil))
		if good := r.goodput(3, 10); good > 0.1 {
			t.Errorf("unprotected %v×: goodput %.3f; the simulator should collapse without protection", load, good)
		}
	}
}

// TestSimStep steps the load from 0.5× to 3× at 5s: nothing is refused
// before, goodput is back at capacity within a second after, and the
// refusals stop again when the load falls back at 10s.
func TestSimStep(t *testing.T) {
	g := simGuard(t, 2, nil)
	cfg := baseSim(func(t time.Duration) float64 {
		if t >= 5*time.Second && t < 10*time.Second {
			return 3
		}
		return 0.5
	}, g)
	cfg.duration = 15 * time.Second
	r := runSim(cfg)
	before, during, after := r.refusedRatio(-1, 1, 5), r.goodput(6, 10), r.refusedRatio(-1, 12, 15)
	t.Logf("step 0.5×→3×→0.5×: refused before %.3f, goodput during %.3f, p99 during %v, refused after %.3f",
		before, during, r.quantile(0.99, 6, 10).Round(time.Millisecond), after)
	if before != 0 || after != 0 {
		t.Errorf("refused %.4f before and %.4f after the step, want none", before, after)
	}
	if during < 0.9 {
		t.Errorf("goodput during the step %.3f, want >= 0.9", during)
	}
	if p := r.quantile(0.99, 6, 10); p > simObj {
		t.Errorf("p99 during the step %v, above %v", p, simObj)
	}
}

// TestSimPriorities offers 3× capacity of which critical is 20% of
// capacity, and then the mix 20% critical, 30% normal, 50% sheddable:
// with critical demand at 20% of capacity at least 99% of critical
// requests succeed, and in both sheddable is refused
// first (a larger share of it than of normal, of normal than of critical).
func TestSimPriorities(t *testing.T) {
	mixes := []struct {
		name                        string
		critical, normal, sheddable float64
	}{
		{"critical 20% of capacity", 0.2 / 3, 0.3 * (1 - 0.2/3) / 0.8, 0.5 * (1 - 0.2/3) / 0.8},
		{"20/30/50", 0.2, 0.3, 0.5},
	}
	for _, m := range mixes {
		g := simGuard(t, 3, nil)
		cfg := baseSim(constLoad(3), g)
		cfg.mix = func(r *rand.Rand) priority.Priority {
			switch x := r.Float64(); {
			case x < m.critical:
				return priority.Critical
			case x < m.critical+m.normal:
				return priority.Normal
			}
			return priority.Sheddable
		}
		r := runSim(cfg)
		crit, norm, shed := r.successRatio(priority.Critical.Index(), 3, 10), r.successRatio(priority.Normal.Index(), 3, 10), r.successRatio(priority.Sheddable.Index(), 3, 10)
		t.Logf("3× load, %s: success critical %.4f, normal %.3f, sheddable %.3f; refused critical %.4f normal %.3f sheddable %.3f; goodput %.3f",
			m.name, crit, norm, shed, r.refusedRatio(priority.Critical.Index(), 3, 10), r.refusedRatio(priority.Normal.Index(), 3, 10), r.refusedRatio(priority.Sheddable.Index(), 3, 10), r.goodput(3, 10))
		if m.name == "critical 20% of capacity" && crit < 0.99 {
			t.Errorf("%s: %.4f of critical requests succeeded, want >= 0.99", m.name, crit)
		}
		if !(shed < norm && norm <= crit) {
			t.Errorf("%s: success sheddable %.3f, normal %.3f, critical %.3f: want lowest priority refused first", m.name, shed, norm, crit)
		}
		if good := r.goodput(3, 10); good < 0.9 {
			t.Errorf("%s: goodput %.3f, want >= 0.9", m.name, good)
		}
	}
}
