package lease

import (
	"math"
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

// TestPacer steps a pacer through fixed instants: the bucket is sized by
// pacing for the rate and the window, new capacity starts empty, the
// same rate changes nothing, and a new window sizes it again.
func TestPacer(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	p := newPacer(t0, time.Second)
	if !p.unsized() || p.lim.Limit() != 0 || p.lim.Burst() != 0 {
		t.Fatalf("new pacer: unsized %v limit %v burst %d, want true, 0, 0", p.unsized(), p.lim.Limit(), p.lim.Burst())
	}
	for _, s := range []struct {
		at      time.Duration
		rate    float64
		old     float64
		changed bool
		limit   float64 // the bucket's
		burst   int
		tokens  float64 // in the bucket at the instant, after set
	}{
		{0, 1000, -1, true, 980, 10, 0},                         // new capacity starts empty
		{10 * time.Millisecond, 1000, 980, false, 980, 10, 9.8}, // unchanged: it fills
		{20 * time.Millisecond, 500, 980, true, 490, 5, 5},      // a smaller burst is full
		{20 * time.Millisecond, 0, 490, true, 0, 0, 0},
	} {
		old, changed := p.set(at(s.at), s.rate)
		if old != s.old || changed != s.changed || p.rate != s.rate || p.limit != s.limit ||
			float64(p.lim.Limit()) != s.limit || p.lim.Burst() != s.burst {
			t.Fatalf("set(%v, %v): old %v changed %v, rate %v limit %v (bucket %v, burst %d); want %v %v, %v %v (burst %d)",
				s.at, s.rate, old, changed, p.rate, p.limit, p.lim.Limit(), p.lim.Burst(), s.old, s.changed, s.rate, s.limit, s.burst)
		}
		// The emission interval is rounded up to a nanosecond.
		if got := p.lim.TokensAt(at(s.at)); math.Abs(got-s.tokens) > 1e-4 {
			t.Errorf("set(%v, %v): %v tokens, want %v", s.at, s.rate, got, s.tokens)
		}
	}
	// The same window changes nothing; another one sizes the bucket
	// again at the next set, even at the same limit (500/s over 2 s: a
	// burst of 10, 500 − 10/2 − 5 = 490).
	p.set(at(time.Second), 500)
	if p.setWindow(at(time.Second), time.Second) || p.unsized() {
		t.Error("the same window changed the pacer")
	}
	if !p.setWindow(at(time.Second), 2*time.Second) || !p.unsized() {
		t.Error("a new window left the bucket sized")
	}
	if old, changed := p.set(at(time.Second), 500); old != -1 || !changed || p.limit != 490 || p.lim.Burst() != 10 {
		t.Errorf("set after a new window: old %v changed %v limit %v burst %d; want -1, true, 490, 10", old, changed, p.limit, p.lim.Burst())
	}
	if b := p.maxBurst(1000); b != 20 {
		t.Errorf("maxBurst(1000) over 2 s = %d, want 20", b)
	}
	// The guard: its window starts with the credit of the rate it had
	// (500/s over 2 s: 1000 units, 995 allowed); what is admitted counts.
	now := at(time.Second)
	if d := p.wait(now, 995); d != 0 {
		t.Errorf("995 units held %v, want 0", d)
	}
	p.admit(now, 995)
	if n := p.sent(now); n != 995 {
		t.Errorf("sent %v, want 995", n)
	}
	if d := p.wait(now, 1); d <= 0 {
		t.Error("the 996th unit of the window was not held")
	}
	// Without a window: no guard, no count, a burst of a tenth.
	if !p.setWindow(now, 0) {
		t.Fatal("no window: unchanged")
	}
	p.set(now, 500)
	if p.lim.Limit() != 500 || p.lim.Burst() != 50 {
		t.Errorf("no window: limit %v burst %d, want 500 and 50", p.lim.Limit(), p.lim.Burst())
	}
	p.admit(now, 1000)
	if d := p.wait(now, 1000); d != 0 || p.sent(now) != 0 {
		t.Errorf("no window: held %v, sent %v; want 0 and 0", d, p.sent(now))
	}
}
