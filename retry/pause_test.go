package retry_test

import (
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/retry"
)

func TestPauses(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) func() time.Time { return func() time.Time { return t0.Add(d) } }
	var p retry.Pauses
	noClock := func() time.Time { t.Fatal("Left read the clock without a pause"); return time.Time{} }
	if d := p.Left("a", noClock); d != 0 {
		t.Errorf("zero value: %v left, want 0", d)
	}
	p.Extend("a", t0, t0.Add(5*time.Second))
	if d := p.Left("a", at(time.Second)); d != 4*time.Second {
		t.Errorf("a: %v left, want 4s", d)
	}
	if d := p.Left("b", noClock); d != 0 {
		t.Errorf("b, never paused: %v left, want 0", d)
	}
	// Never shortened; lengthened.
	p.Extend("a", t0, t0.Add(2*time.Second))
	if d := p.Left("a", at(0)); d != 5*time.Second {
		t.Errorf("after a shorter refusal: %v left, want 5s", d)
	}
	p.Extend("a", t0, t0.Add(7*time.Second))
	if d := p.Left("a", at(0)); d != 7*time.Second {
		t.Errorf("after a longer refusal: %v left, want 7s", d)
	}
	// Over, and then forgotten at the next refusal of any scope.
	if d := p.Left("a", at(8*time.Second)); d != 0 {
		t.Errorf("after the pause: %v left, want 0", d)
	}
	p.Extend("b", t0.Add(8*time.Second), t0.Add(9*time.Second))
	if d := p.Left("a", noClock); d != 0 {
		t.Errorf("a, ended: %v left, want 0 without reading the clock", d)
	}
	if d := p.Left("b", at(8*time.Second)); d != time.Second {
		t.Errorf("b: %v left, want 1s", d)
	}
}

// TestPausesConcurrent is for the race detector: refusals and waiters of
// several scopes at once.
func TestPausesConcurrent(t *testing.T) {
	var p retry.Pauses
	t0 := time.Unix(1_000_000, 0)
	var wg sync.WaitGroup
	for i := range 8 {
		scope := string(rune('a' + i%3))
		wg.Go(func() {
			for j := range 100 {
				now := t0.Add(time.Duration(j) * time.Millisecond)
				p.Extend(scope, now, now.Add(time.Second))
				if d := p.Left(scope, func() time.Time { return now }); d < 0 || d > time.Second+100*time.Millisecond {
					t.Errorf("%v left", d)
				}
			}
		})
	}
	wg.Wait()
}
