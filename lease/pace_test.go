package lease

import (
	"testing"
	"time"
)

// TestWindowLog steps a window's guard through fixed instants. Its credit
// is the rate integrated over the window: a holder whose rate falls (it
// yields partitions) goes on at the new rate at once, one whose rate
// rises earns the new capacity as time passes, and units bunched after a
// stall wait for the window to make room.
func TestWindowLog(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	const share = 1 - paceSlack/2 // as the Limiter asks
	w := time.Second
	slot := w / guardSlots

	t.Run("the rate falls", func(t *testing.T) {
		// A window at 98/s (the paced rate of 100/s), then the rate
		// halves and the holder goes on at 49/s: held back no more
		// than a slot now and then (the count's rounding), though the
		// window still holds ~98 units sent at the old rate (a guard
		// on the new rate alone would hold it half a window).
		var g windowLog
		g.reset(w, t0, 100)
		now := t0
		for range 98 {
			now = now.Add(w / 98)
			if d := g.wait(now, 1, share, 1); d != 0 {
				t.Fatalf("%v at 100/s: held %v", now.Sub(t0), d)
			}
			g.add(now, 1)
		}
		g.setRate(now, 50)
		var held time.Duration
		for i := range 49 {
			now = now.Add(w / 49)
			d := g.wait(now, 1, share, 1)
			if d > slot {
				t.Fatalf("unit %d at 50/s (%v): held %v, count %d, credit %.1f", i, now.Sub(t0), d, g.count(now), g.capacity(now))
			}
			now = now.Add(d)
			held += d
			g.add(now, 1)
		}
		if held > 3*slot {
			t.Errorf("held %v in all after the fall, want ≤ 3 slots", held)
		}
		if c := g.capacity(now); c < 49.5 || c > 50.5 {
			t.Errorf("credit a window after the fall %.2f, want 50", c)
		}
	})

	t.Run("the rate rises", func(t *testing.T) {
		// From no capacity to 100/s at t0: half a window later the
		// credit is 50, so 49 units fit (floor of 99.5 %) and 60 wait
		// until it is 60.3 (603 ms), at the next slot's start.
		var g windowLog
		g.reset(w, t0, 0)
		g.setRate(t0, 100)
		now := t0.Add(w / 2)
		if c := g.capacity(now); c < 49.99 || c > 50.01 {
			t.Errorf("credit %.2f, want 50", c)
		}
		if d := g.wait(now, 49, share, 1); d != 0 {
			t.Errorf("49 units held %v", d)
		}
		d := g.wait(now, 60, share, 1)
		if got := now.Add(d).Sub(t0); got < 603*time.Millisecond || got > 603*time.Millisecond+slot {
			t.Errorf("60 units fit at %v, want within a slot after 603ms", got)
		}
	})

	t.Run("a stall", func(t *testing.T) {
		// A window with nothing sent at 100/s, then 99 units at once:
		// they fit (the credit is 100); one more waits until they have
		// left the window — their slot's end plus a window.
		var g windowLog
		g.reset(w, t0, 100)
		now := t0.Add(w)
		if d := g.wait(now, 99, share, 1); d != 0 {
			t.Fatalf("99 units held %v", d)
		}
		g.add(now, 99)
		if d := g.wait(now, 1, share, 1); d != w+slot {
			t.Errorf("the 100th held %v, want %v", d, w+slot)
		}
		if d := g.wait(now.Add(w+slot), 99, share, 1); d != 0 {
			t.Errorf("a window and a slot later 99 units held %v", d)
		}
	})
}
