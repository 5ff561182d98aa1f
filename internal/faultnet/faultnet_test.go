package faultnet_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
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
