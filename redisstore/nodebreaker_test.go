package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// testLog returns a logger writing text lines without times into a
// buffer safe for concurrent use, and a function that returns what it
// holds.
func testLog() (*slog.Logger, func() string) {
	var mu sync.Mutex
	var buf bytes.Buffer
	h := slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})
	return slog.New(h), func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestBreakersByNode: on a Cluster each master has a breaker of its own,
// by an explicit clock: one node's failures open its breaker and not
// another's, the outage's log lines name the node, and the map of
// breakers stays bounded as nodes come and go, keeping the counts of
// those it drops and the breakers of nodes that are down.
func TestBreakersByNode(t *testing.T) {
	now := time.Unix(0, 0)
	log, logged := testLog()
	var bs breakers
	bs.make = func(node, _ string) *breaker {
		return &breaker{threshold: 3, cooldown: time.Second, now: func() time.Time { return now }, log: log, node: node, openNow: &bs.openNow}
	}
	a, b := bs.add("10.0.0.1:6379", "ka"), bs.add("10.0.0.2:6379", "kb")
	if bs.add("10.0.0.1:6379", "other") != a {
		t.Fatal("a node's second lookup made another breaker")
	}
	for range 3 {
		if !a.allow() {
			t.Fatal("closed breaker refused a call")
		}
		a.done(errDown)
	}
	if a.allow() || !a.down() || !bs.anyOpen() {
		t.Fatalf("node a's breaker not open after 3 failures (anyOpen %v)", bs.anyOpen())
	}
	if !b.allow() || b.down() {
		t.Fatal("node a's failures opened node b's breaker")
	}
	b.done(nil)
	if trips, _, open := bs.stats(); trips != 1 || !open {
		t.Fatalf("stats: trips %d, open %v; want 1, true", trips, open)
	}
	now = now.Add(1500 * time.Millisecond)
	if !a.allow() {
		t.Fatal("no probe after the cooldown")
	}
	a.done(nil)
	if bs.anyOpen() {
		t.Fatal("anyOpen after the only open breaker closed")
	}
	want := `level=WARN msg="Redis does not answer; deciding by each rule's failure mode until it does" node=10.0.0.1:6379 failures=3 err="connection refused"
level=INFO msg="Redis answers again; decisions are back on Redis" node=10.0.0.1:6379 outage=1.5s
`
	if got := logged(); got != want {
		t.Fatalf("log:\n%s\nwant:\n%s", got, want)
	}

	// Nodes come and go: b is down, a and the rest answer.
	for range 3 {
		b.done(errDown)
	}
	for i := 0; len(*bs.nodes.Load()) < maxNodeBreakers; i++ {
		bs.add(fmt.Sprintf("10.1.%d.%d:6379", i/256, i%256), "k")
	}
	c := bs.add("10.9.9.9:6379", "kc") // one past the bound
	nodes := *bs.nodes.Load()
	if len(nodes) != 2 || nodes["10.0.0.2:6379"] != b || nodes["10.9.9.9:6379"] != c {
		t.Fatalf("after passing the bound: %d breakers, want the down one and the new one", len(nodes))
	}
	if bs.add("10.0.0.1:6379", "ka") == a {
		t.Fatal("a dropped node's breaker came back")
	}
	if trips, _, _ := bs.stats(); trips != 2 {
		t.Fatalf("trips %d after dropping breakers, want 2 (a's, dropped, and b's)", trips)
	}
}

// keysOn returns n keys whose Redis keys are on the master at addr, and
// n on other masters, each master in turn.
func keysOn(t *testing.T, s *Store, addr string, n int) (on, off []string) {
	t.Helper()
	cc := s.c.(*redis.ClusterClient)
	for i := 0; (len(on) < n || len(off) < n) && i < 10000; i++ {
		k := fmt.Sprint("nb", i)
		m, err := cc.MasterForKey(context.Background(), s.redisKey(k))
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == addr {
			if len(on) < n {
				on = append(on, k)
			}
		} else if len(off) < n {
			off = append(off, k)
		}
	}
	if len(on) < n || len(off) < n {
		t.Fatalf("keys: %d on %s, %d elsewhere; want %d each", len(on), addr, len(off), n)
	}
	return on, off
}

// TestClusterBreakerPerNode freezes one master of three (SIGSTOP) under
// load with the store's own breakers (the defaults): the frozen master's
// keys go to the failure mode (local) and its breaker opens, naming the
// node, while the other masters' keys are decided by Redis throughout,
// each decision within the timeout and a margin. A request whose items
// span the frozen master and a live one is decided part by Redis, part by
// local, all or nothing: once local denies its part, the live part is
// given back. After SIGCONT the frozen master's keys are back on Redis
// and the log says so, naming it.
func TestClusterBreakerPerNode(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes a redis-server")
	}
	cl := redistest.Cluster(t)
	start := time.Now()
	log, logged := testLog()
	const timeout = 3 * faultTimeout // live nodes answer within it on a loaded machine
	s := newStoreOn(t, ClientOptions{Addrs: cl.Addrs(), Timeout: timeout}, Options{Timeout: timeout, Logger: log})
	ref := newStoreOn(t, ClientOptions{Addrs: cl.Addrs(), Timeout: slack}, Options{Timeout: slack, Prefix: s.prefix})
	victim := cl.Nodes[1]
	on, off := keysOn(t, s, victim.Addr(), 2)
	wide := &ratelimit.Rule{Name: "wide", Algorithm: ratelimit.FixedWindow, Quota: 1 << 40, Period: time.Hour}
	tight := &ratelimit.Rule{Name: "tight", Algorithm: ratelimit.FixedWindow, Quota: 2, Period: time.Hour}
	fixed := &ratelimit.Rule{Name: "fixed", Algorithm: ratelimit.FixedWindow, Quota: 100, Period: time.Hour}
	hit := ratelimit.Item{Key: on[0], Rule: wide, Cost: 1}
	live := ratelimit.Item{Key: off[0], Rule: wide, Cost: 1}
	crossLive := ratelimit.Item{Key: off[1], Rule: fixed, Cost: 1}
	crossHit := ratelimit.Item{Key: on[1], Rule: tight, Cost: 1}
	ready(t, s, hit, live, crossLive)
	warm(t, s, 4, hit, live)

	victim.Freeze()
	frozen := true
	defer func() {
		if frozen {
			victim.Thaw()
		}
	}()
	// Four callers until the victim's breaker has been open for half a
	// second (or 10 s have passed).
	var opened time.Time
	deadline := time.Now().Add(10 * time.Second)
	type tally struct{ live, liveRedis, hit, hitLocal, slow int }
	tallies := make([]tally, 4)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range tallies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl := &tallies[w]
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, it := range []ratelimit.Item{live, hit} {
					t0 := time.Now()
					ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{it})
					if err != nil {
						t.Error(err)
						return
					}
					if time.Since(t0) > timeout+margin {
						tl.slow++
					}
					if it.Key == live.Key {
						tl.live++
						if ds[0].Reason == ratelimit.ReasonOK {
							tl.liveRedis++
						}
					} else {
						tl.hit++
						if ds[0].Reason == ratelimit.ReasonLocal {
							tl.hitLocal++
						}
					}
				}
			}
		}()
	}
	for {
		if s.Stats().Trips > 0 && opened.IsZero() {
			opened = time.Now()
		}
		if (!opened.IsZero() && time.Since(opened) > 500*time.Millisecond) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the store's counters, bounded by deadline
	}
	// The cross-slot request while the victim's breaker is open: admitted
	// twice (the victim's part by local, at its share of 2), denied the
	// third time, when the live part is given back.
	for i := range 3 {
		ds := timed(t, s, timeout+margin, crossLive, crossHit)
		if ds[0].Reason != ratelimit.ReasonOK || ds[1].Reason != ratelimit.ReasonLocal {
			t.Errorf("cross-slot request %d: live part %v, frozen part %v; want ok and local", i+1, ds[0].Reason, ds[1].Reason)
		}
		if got, want := ratelimit.Allowed(ds), i < 2; got != want {
			t.Errorf("cross-slot request %d: admitted %v, want %v", i+1, got, want)
		}
	}
	close(stop)
	wg.Wait()
	if opened.IsZero() {
		t.Fatal("the frozen master's breaker never opened")
	}
	var sum tally
	for _, tl := range tallies {
		sum.live += tl.live
		sum.liveRedis += tl.liveRedis
		sum.hit += tl.hit
		sum.hitLocal += tl.hitLocal
		sum.slow += tl.slow
	}
	t.Logf("live master's key: %d of %d decided by Redis; frozen master's key: %d of %d by local; %d past the bound",
		sum.liveRedis, sum.live, sum.hitLocal, sum.hit, sum.slow)
	if sum.live == 0 || sum.liveRedis != sum.live {
		t.Errorf("live master's key: %d of %d decisions by Redis, want all", sum.liveRedis, sum.live)
	}
	if sum.hit == 0 || sum.hitLocal != sum.hit {
		t.Errorf("frozen master's key: %d of %d decisions by local, want all", sum.hitLocal, sum.hit)
	}
	if sum.slow != 0 {
		t.Errorf("%d decisions took longer than the timeout and a margin", sum.slow)
	}
	nodes := *s.brks.nodes.Load()
	for addr, b := range nodes {
		if got, want := b.down(), addr == victim.Addr(); got != want {
			t.Errorf("breaker of %s: down %v, want %v", addr, got, want)
		}
	}
	if !strings.Contains(logged(), `msg="Redis does not answer; deciding by each rule's failure mode until it does" node=`+victim.Addr()) {
		t.Errorf("no outage line naming %s:\n%s", victim.Addr(), logged())
	}

	victim.Thaw()
	frozen = false
	awaitRedis(t, s, hit, 10*time.Second)
	if !strings.Contains(logged(), `msg="Redis answers again; decisions are back on Redis" node=`+victim.Addr()) {
		t.Errorf("no end of outage naming %s:\n%s", victim.Addr(), logged())
	}
	if got := drain(t, ref, crossLive); got != 98 {
		t.Errorf("cross-slot request's live key: %d left, want 98 (two admitted, the denied one given back)", got)
	}
	sameHour(t, start)
}
