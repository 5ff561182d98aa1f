package redisstore

import (
	"context"
	"testing"
	"time"
)

// TestClockSample: a sample's lower bound is never after the server's
// clock, however the server's reading falls within the round trip; a
// tighter sample replaces a looser one, a looser one that agrees does not,
// and one that contradicts the kept one (the server's clock stepped back)
// replaces it.
func TestClockSample(t *testing.T) {
	const offset = 5 * time.Second // the server's clock is ahead by this much
	base := time.Now()
	server := func(x time.Time) int64 { return x.Add(offset).UnixNano() }
	// A round trip of rtt whose TIME is read at frac of it.
	for _, rtt := range []time.Duration{0, time.Microsecond, 3 * time.Millisecond} {
		for _, frac := range []float64{0, 0.5, 1} {
			c := clockSample{sent: base, recv: base.Add(rtt)}
			c.server = server(base.Add(time.Duration(frac * float64(rtt))))
			for _, later := range []time.Duration{0, time.Millisecond, time.Second, time.Minute} {
				x := c.recv.Add(later)
				if lo, hi := c.lower(x), c.upper(x); lo > server(x) || hi < server(x) {
					t.Errorf("rtt %v, read at %v of it, %v later: bounds [%d, %d] miss the server's %d", rtt, frac, later, lo, hi, server(x))
				}
			}
		}
	}

	// Samples taken a second later: a round trip of 0, of 20 ms (read at
	// its middle), and of 0 after the server's clock stepped back 1 s.
	old := clockSample{sent: base, recv: base, server: server(base)}
	at := base.Add(time.Second)
	tight := clockSample{sent: at, recv: at, server: server(at)}
	loose := clockSample{sent: at, recv: at.Add(20 * time.Millisecond), server: server(at.Add(10 * time.Millisecond))}
	stepped := clockSample{sent: at, recv: at, server: server(at) - int64(time.Second)}
	if !tight.replaces(&old) {
		t.Error("a tighter sample did not replace an older one")
	}
	if loose.replaces(&old) {
		t.Error("a looser sample that agrees replaced a tighter one")
	}
	if !stepped.replaces(&old) {
		t.Error("a sample of a clock stepped back did not replace the one it contradicts")
	}
	// And through nodeClock.sample: the kept sample is the tighter one.
	n := &nodeClock{measure: func(context.Context, string) (time.Time, error) { return time.Now().Add(offset), nil }}
	n.best.Store(&loose)
	s, err := n.sample(context.Background(), "")
	if err != nil || s == &loose || n.best.Load() != s {
		t.Fatalf("sample kept %+v (err %v), not the new, tighter one", n.best.Load(), err)
	}
}

// TestCutoffReadTimeout: a client that gives up on a reply after its read
// timeout, before the caller's deadline, gets the cutoff of that instant.
func TestCutoffReadTimeout(t *testing.T) {
	now := time.Now()
	sc := &serverClock{readTimeout: 10 * time.Millisecond, single: &nodeClock{}}
	sc.single.best.Store(&clockSample{sent: now, recv: now, server: now.UnixNano()})
	got, err := sc.cutoff(context.Background(), "k", now, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(10 * time.Millisecond).UnixNano(); got > want || got < want-int64(time.Millisecond) {
		t.Fatalf("cutoff %d ns after now, want just under %d", got-now.UnixNano(), want-now.UnixNano())
	}
}
