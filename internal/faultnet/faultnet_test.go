package faultnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
)

func TestWindows(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(100, ms*int64(time.Millisecond)) }
	op := func(start, end int64, o faultnet.Outcome) faultnet.Op {
		return faultnet.Op{Start: at(start), End: at(end), Outcome: o}
	}
	ops := []faultnet.Op{
		op(0, 10, faultnet.Admitted),
		op(100, 200, faultnet.Admitted),
		op(300, 310, faultnet.Denied),     // never counts
		op(990, 1010, faultnet.Admitted),  // spans two windows: possible in both
		op(1500, 1600, faultnet.Admitted), // second window
		op(1700, 1800, faultnet.Failed),
	}
	ws := faultnet.Windows(ops, time.Second)
	if len(ws) != 2 {
		t.Fatalf("%d windows, want 2: %+v", len(ws), ws)
	}
	for i, want := range []faultnet.Window{{Start: at(0), Certain: 2, Possible: 3}, {Start: at(1000), Certain: 1, Possible: 2}} {
		if !ws[i].Start.Equal(want.Start) || ws[i].Certain != want.Certain || ws[i].Possible != want.Possible {
			t.Errorf("window %d: %+v, want %+v", i, ws[i], want)
		}
	}
	r := faultnet.CheckWindows(ops, time.Second, 1)
	if r.Worst != 2 || !r.WorstAt.Equal(at(0)) || r.Over != 1 {
		t.Errorf("CheckWindows: %+v, want worst 2 at the first window, 100%% over", r)
	}
	if r := faultnet.CheckWindows(ops, time.Second, 2); r.Over != 0 {
		t.Errorf("CheckWindows within the limit: %+v", r)
	}
	l := faultnet.CheckLatency(ops, 50*time.Millisecond)
	if l.N != 6 || l.Max != 100*time.Millisecond || l.Over != 3 {
		t.Errorf("CheckLatency: %+v, want 6 ops, max 100ms, 3 over 50ms", l)
	}
}

func TestPeak(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(100, ms*int64(time.Millisecond)) }
	ts := []time.Time{at(0), at(400), at(900), at(1000), at(1100), at(1200), at(2500)}
	if n, from := faultnet.Peak(ts, time.Second); n != 5 || !from.Equal(at(400)) {
		t.Errorf("Peak: %d from %v, want 5 from 400 ms (the window [400, 1400))", n, from)
	}
	if n, _ := faultnet.Peak(nil, time.Second); n != 0 {
		t.Errorf("Peak of none: %d", n)
	}
}

func TestGauge(t *testing.T) {
	var g faultnet.Gauge
	g.Enter()
	g.Enter()
	g.Exit()
	g.Enter()
	g.Exit()
	g.Exit()
	if g.Max() != 2 {
		t.Errorf("Max %d, want 2", g.Max())
	}
}

// TestNet: two hosts reach each other from inside, a partition drops
// what crosses it (a dial times out instead of being refused) and Heal
// restores it; a process runs inside a host, pauses and resumes.
func TestNet(t *testing.T) {
	n := faultnet.New(t)
	a, b := n.Host("a"), n.Host("b")
	l, err := b.Listen("tcp", b.Addr(0))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi")) //nolint:errcheck // the dialer checks what it reads
			c.Close()
		}
	}()
	dial := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		c, err := a.DialContext(ctx, "tcp", l.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		got, err := io.ReadAll(c)
		if err == nil && string(got) != "hi" {
			err = errors.New("read " + strconv.Quote(string(got)))
		}
		return err
	}
	if err := dial(5 * time.Second); err != nil {
		t.Fatalf("a to b: %v", err)
	}
	// This process's own namespace has no route to the hosts.
	if c, err := net.DialTimeout("tcp", l.Addr().String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Error("reached a host from outside its network")
	}
	a.Partition(b)
	var nerr net.Error
	if err := dial(300 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &nerr) && nerr.Timeout()) {
		t.Errorf("a to b across a partition: %v, want a timeout", err)
	}
	a.Heal(b)
	if err := dial(5 * time.Second); err != nil {
		t.Fatalf("a to b after healing: %v", err)
	}

	p := a.Start("sleep", "60")
	state := func() string {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID()) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		return f[0]
	}
	// A signal is acted on when the process next runs: wait for the state.
	await := func(stopped bool) {
		deadline := time.Now().Add(5 * time.Second)
		for (state() == "T") != stopped {
			if time.Now().After(deadline) {
				t.Fatalf("process state %s, want stopped %v", state(), stopped)
			}
			time.Sleep(time.Millisecond)
		}
	}
	p.Pause()
	await(true)
	p.Resume()
	await(false)
	p.Kill()
	select {
	case <-p.Exited():
	default:
		t.Error("Kill returned before the process exited")
	}
}

// echoServer starts an echo server on b and returns its address.
func echoServer(t *testing.T, b *faultnet.Host) string {
	t.Helper()
	l, err := b.Listen("tcp", b.Addr(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() //nolint:errcheck // ends with the connection
		}
	}()
	return l.Addr().String()
}

// roundTrip dials addr from a and returns the time one byte takes to
// come back, the least of five.
func roundTrip(t *testing.T, a *faultnet.Host, addr string) time.Duration {
	t.Helper()
	c, err := a.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	best := time.Duration(1 << 62)
	b := make([]byte, 1)
	for range 5 {
		start := time.Now()
		if _, err := c.Write([]byte{'x'}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(start))
	}
	return best
}

// TestRelay: a round trip through a relay takes at least twice its
// one-way delay, and SetDelay changes it.
func TestRelay(t *testing.T) {
	n := faultnet.New(t)
	a, mid, b := n.Host("a"), n.Host("mid"), n.Host("b")
	r := mid.Relay(9000, echoServer(t, b), 20*time.Millisecond)
	if rtt := roundTrip(t, a, r.Addr()); rtt < 40*time.Millisecond {
		t.Errorf("round trip %v through a relay of 20 ms each way", rtt)
	}
	r.SetDelay(0)
	if rtt := roundTrip(t, a, r.Addr()); rtt >= 40*time.Millisecond {
		t.Errorf("round trip %v through a relay of no delay", rtt)
	}
}

// TestNetem: a host's link shaped with 10 ms of delay makes a round trip
// to it take at least 20 ms (the delay is added in both directions). It
// runs only where the kernel has sch_netem.
func TestNetem(t *testing.T) {
	if !faultnet.NetemSupported() {
		t.Skip("this kernel has no tc netem (CONFIG_NET_SCH_NETEM): Host.Relay delays instead")
	}
	n := faultnet.New(t)
	a, b := n.Host("a"), n.Host("b")
	addr := echoServer(t, b)
	if err := b.Netem("delay", "10ms"); err != nil {
		t.Fatal(err)
	}
	if rtt := roundTrip(t, a, addr); rtt < 20*time.Millisecond {
		t.Errorf("round trip %v through a link with 10 ms of netem delay", rtt)
	}
	if err := b.Netem(); err != nil {
		t.Fatal(err)
	}
}

// TestRelayJitter: with a jitter, a round trip through the relay takes
// its two one-way delays drawn apart, some shorter than twice the delay
// (which no load on the machine could make so: a delay only lengthens),
// none shorter than twice the delay less the jitter; and a stream of
// many writes comes back whole and in order.
func TestRelayJitter(t *testing.T) {
	n := faultnet.New(t)
	a, mid, b := n.Host("a"), n.Host("mid"), n.Host("b")
	const delay, jitter = 20 * time.Millisecond, 16 * time.Millisecond
	r := mid.Relay(9000, echoServer(t, b), delay)
	r.SetJitter(jitter)
	c, err := a.DialContext(t.Context(), "tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	one := make([]byte, 1)
	short, least := 0, time.Duration(1<<62)
	const trips = 60
	for range trips {
		start := time.Now()
		if _, err := c.Write([]byte{'x'}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			t.Fatal(err)
		}
		rtt := time.Since(start)
		least = min(least, rtt)
		if rtt < 2*delay-2*time.Millisecond {
			short++
		}
	}
	// Each one-way delay is uniform on 4…36 ms: a round trip is below
	// 38 ms with probability 0.44, and below 32 ms (6 ms of the loaded
	// machine's own on top) with 0.28, so 60 trips have about 17 such;
	// fewer than 5 has a probability below 1e-4.
	t.Logf("%d of %d round trips below %v; the least %v", short, trips, 2*delay-2*time.Millisecond, least)
	if short < 5 {
		t.Errorf("%d of %d round trips shorter than %v: the jitter did not shorten enough", short, trips, 2*delay-2*time.Millisecond)
	}
	if least < 2*(delay-jitter) {
		t.Errorf("a round trip of %v, below twice the least one-way delay %v", least, delay-jitter)
	}

	// Order: many small writes, each delayed apart, come back as sent.
	want := make([]byte, 0, 64<<10)
	for i := range 4096 {
		want = append(want, []byte(strconv.Itoa(i)+",")...)
	}
	errc := make(chan error, 1)
	go func() {
		for b := want; len(b) > 0; {
			k := min(len(b), 16)
			if _, err := c.Write(b[:k]); err != nil {
				errc <- err
				return
			}
			b = b[k:]
		}
		errc <- nil
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the stream came back through the jittered relay out of order")
	}
}

// TestLoss: with 20 % loss between a and b, datagrams a sends b and b
// echoes back are dropped each way at about that share (nftables'
// counters), b receives exactly what the table let through to it and a
// exactly what it let through back; after Heal every datagram arrives.
func TestLoss(t *testing.T) {
	n := faultnet.New(t)
	a, b := n.Host("a"), n.Host("b")
	srv, err := b.ListenPacket("udp", b.Addr(0))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var atB, atA atomic.Int64
	go func() {
		buf := make([]byte, 64)
		for {
			k, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			atB.Add(1)
			srv.WriteTo(buf[:k], from) //nolint:errcheck // a lost echo is what is counted
		}
	}()
	c, err := a.DialContext(t.Context(), "udp", srv.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			atA.Add(1)
		}
	}()
	// send sends k datagrams, one every 200 µs (so that neither reader's
	// socket buffer overflows: only the table drops).
	send := func(k int) {
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for i := range k {
			<-tick.C
			if _, err := c.Write([]byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// settle waits until b and a have received wantB and wantA.
	settle := func(wantB, wantA func() int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for atB.Load() != wantB() || atA.Load() != wantA() {
			if time.Now().After(deadline) {
				t.Fatalf("b received %d (want %d), a %d (want %d)", atB.Load(), wantB(), atA.Load(), wantA())
			}
			time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
		}
	}

	const sent, percent = 2000, 20
	loss := n.Loss(a, b, percent)
	send(sent)
	var counts faultnet.LossCounts
	settle(func() int64 { counts = loss.Counts(); return int64(counts.AB - counts.ABDropped) },
		func() int64 { return int64(counts.BA - counts.BADropped) })
	t.Logf("sent %d: %+v, %.1f%% dropped", sent, counts, 100*counts.Dropped())
	if counts.AB != sent || counts.BA != uint64(atB.Load()) {
		t.Errorf("the table counted %d out (want %d) and %d in (want b's %d echoes)", counts.AB, sent, counts.BA, atB.Load())
	}
	// 2,000 and ~1,600 draws at 20 %: a share outside 20 ± 6 % is more
	// than 5 standard deviations off.
	for _, share := range []float64{float64(counts.ABDropped) / float64(counts.AB), float64(counts.BADropped) / float64(counts.BA)} {
		if share < 0.14 || share > 0.26 {
			t.Errorf("dropped %.1f%% of a direction's packets, want about %d%%: %+v", 100*share, percent, counts)
		}
	}

	loss.Heal()
	loss.Heal() // a second Heal does nothing
	b0, a0 := atB.Load(), atA.Load()
	send(200)
	settle(func() int64 { return b0 + 200 }, func() int64 { return a0 + 200 })
}
