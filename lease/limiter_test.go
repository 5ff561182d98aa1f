package lease

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// scriptedGate is a Holder as its Limiter sees it (a gate), whose looks
// follow a script.
type scriptedGate struct {
	lim                   *ratelimit.Limiter
	turns                 []func(now time.Time) turn
	holds                 []time.Duration // what take answers, in turn
	entered, left, blocks int
	reserves, takes       int
}

func (g *scriptedGate) limitAt(time.Time) (ratelimit.Limit, int) { return g.lim.Limit(), g.lim.Burst() }
func (g *scriptedGate) allowN(now time.Time, n int) bool         { return g.lim.AllowN(now, n) }
func (g *scriptedGate) maxBurst() int                            { return g.lim.Burst() }
func (g *scriptedGate) enter(n int)                              { g.entered += n }
func (g *scriptedGate) leave(n int)                              { g.left += n }
func (g *scriptedGate) block()                                   { g.blocks++ }
func (g *scriptedGate) current() (float64, float64, chan struct{}) {
	return float64(g.lim.Limit()), float64(g.lim.Limit()), make(chan struct{})
}

func (g *scriptedGate) reserve(now time.Time, n int) turn {
	g.reserves++
	return g.turns[g.reserves-1](now)
}

func (g *scriptedGate) take(time.Time, int, float64) (bool, time.Duration) {
	g.takes++
	return false, g.holds[g.takes-1]
}

// TestLimiterWaitNGate walks WaitN through its Holder's answers, on a
// scripted gate: a retry hint's pause is waited out, a look without
// capacity is followed by another once the rate changes, a turn in the
// future is waited for, and the window's guard holds the units until
// they fit. The caller's units count as waiting throughout, and the call
// as blocked once.
func TestLimiterWaitNGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		closed := make(chan struct{})
		close(closed)
		lim := ratelimit.NewLimiter(10, 1)
		g := &scriptedGate{lim: lim, holds: []time.Duration{50 * time.Millisecond, 0}}
		g.turns = []func(time.Time) turn{
			func(now time.Time) turn { return turn{pause: now.Add(300 * time.Millisecond)} },
			func(time.Time) turn { return turn{changed: closed} }, // no rate: look again
			func(now time.Time) turn {
				lim.AllowN(now, 1) // the bucket is empty: a turn in 100 ms
				return turn{r: *lim.ReserveN(now, 1), rate: 10, limit: 10, changed: make(chan struct{})}
			},
		}
		l := &Limiter{h: g}
		if err := l.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, want := time.Since(start), 450*time.Millisecond; got != want {
			t.Errorf("Wait took %v, want %v (pause, turn, guard)", got, want)
		}
		if g.entered != 1 || g.left != 1 || g.blocks != 1 || g.reserves != 3 || g.takes != 2 {
			t.Errorf("entered %d left %d blocks %d reserves %d takes %d; want 1, 1, 1, 3, 2",
				g.entered, g.left, g.blocks, g.reserves, g.takes)
		}
	})
}
