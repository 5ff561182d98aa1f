package adaptive

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// TestSimREADMEGuardHealthyStart: a Guard configured exactly as docs/library.md
// shows (Concurrency Max 512, a Shedder with the objective p99 ≤ 250 ms, every
// other option its default) in front of a healthy server from t = 0: 200
// workers with service times of mean 50 ms (σ 0.3, p99 about 100 ms),
// offered 2,000 requests a second (1× its normal load, half its capacity:
// about 100 in flight, a fifth of Max). Nothing is refused, in the first
// second or after. Before the warm-up (Initial defaulted to a tenth of
// Max, 52) about half of it was refused for the first six seconds, while
// the limit climbed from 52 to what was in flight.
func TestSimREADMEGuardHealthyStart(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 7))
	g, err := NewGuard(GuardOptions{
		Concurrency: ConcurrencyOptions{Max: 512},
		Shedder:     &ShedderOptions{Objective: Objective{Quantile: 0.99, Latency: 250 * time.Millisecond}, Float64: rng.Float64},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := simConfig{workers: 200, service: 50 * time.Millisecond, sigma: 0.3, deadline: time.Second,
		duration: 10 * time.Second, load: constLoad(0.5), seed: 11}
	c.admit = func(now time.Time, p priority.Priority) (Permit, bool) {
		pm, r := g.TryAcquireAt(now, p)
		return pm, !r.Refused()
	}
	r := runSim(c)
	first, after := r.refusedRatio(-1, 0, 1), r.refusedRatio(-1, 1, 10)
	t.Logf("README Guard, healthy load from t=0: refused %.3f in the first second, %.3f after; p99 %v; limit %.0f",
		first, after, r.quantile(0.99, 0, 10).Round(time.Millisecond), g.Concurrency().Limit())
	if first != 0 || after != 0 {
		t.Errorf("refused %.3f of healthy requests in the first second and %.3f after, want none", first, after)
	}
	if p := r.quantile(0.99, 0, 10); p > 250*time.Millisecond {
		t.Errorf("p99 %v, above the objective: the server is not healthy, the test is wrong", p)
	}
}

// TestWarmUpOverloadedFromStart: a default Concurrency (warm-up at Max) that
// refuses requests in its first window — demand above Max from the
// start — falls at once to Min + (Max-Min)/10, and hands the limit to
// its Controller only once every permit it let in before has ended; an
// explicit Initial has no warm-up.
func TestWarmUpOverloadedFromStart(t *testing.T) {
	rec := &recorder{}
	l, err := NewConcurrency(ConcurrencyOptions{Max: 100, Controller: rec, Window: time.Millisecond, MinSamples: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Limit(); got != 100 {
		t.Fatalf("limit at the start %v, want Max 100", got)
	}
	now := simEpoch
	var held []Permit
	for range 100 {
		p, r := l.TryAcquireAt(now, priority.Critical)
		if r.Refused() {
			t.Fatalf("refused %v below Max", r)
		}
		held = append(held, p)
	}
	if _, r := l.TryAcquireAt(now, priority.Critical); !r.Refused() {
		t.Fatal("admitted above Max")
	}
	now = now.Add(2 * time.Millisecond)
	held[0].DoneAt(now) // closes the window with its refusal
	held = held[1:]
	if got := l.Limit(); got != 10 {
		t.Errorf("after a warm-up window with refusals: limit %v, want 1 + 99/10 = 10", got)
	}
	if rec.n != 0 {
		t.Errorf("the Controller was fed %d windows during the warm-up, want none", rec.n)
	}
	// Still 99 held: the windows while they drain to the limit are not the
	// Controller's.
	for len(held) > 10 {
		now = now.Add(2 * time.Millisecond)
		held[0].DoneAt(now)
		held = held[1:]
	}
	if rec.n != 0 {
		t.Errorf("the Controller was fed %d windows while the queue drained, want none", rec.n)
	}
	// The last ten fit in the limit, but they were let in at Max: the
	// windows in which they end are not the Controller's either.
	for _, p := range held {
		now = now.Add(2 * time.Millisecond)
		p.DoneAt(now)
	}
	if rec.n != 0 {
		t.Errorf("the Controller was fed %d windows in which permits let in during the warm-up ended, want none", rec.n)
	}
	now = now.Add(2 * time.Millisecond)
	if p, r := l.TryAcquireAt(now, priority.Critical); !r.Refused() {
		now = now.Add(2 * time.Millisecond)
		p.DoneAt(now)
	}
	if rec.n == 0 {
		t.Error("the Controller was never fed after the queue drained")
	}

	l2, err := NewConcurrency(ConcurrencyOptions{Max: 100, Initial: 7})
	if err != nil {
		t.Fatal(err)
	}
	if got := l2.Limit(); got != 7 {
		t.Errorf("explicit Initial 7: limit %v", got)
	}
}

// recorder is a Controller that counts its windows and keeps the limit.
type recorder struct{ n int }

func (r *recorder) Update(s Sample) float64 { r.n++; return s.Limit }
