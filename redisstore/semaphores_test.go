package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/storetest"
)

// TestSemaphoreStore runs the conformance suite of concurrency stores on a
// standalone server and on a three-master Cluster, where the suite's
// semaphores live on different nodes.
func TestSemaphoreStore(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Standalone(t)
		storetest.RunSemaphores(t, func(t *testing.T) concurrency.Store {
			s, err := NewSemaphoreStore(srv.Client(), SemaphoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, false)
	})
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a Redis Cluster")
		}
		cs := redistest.Cluster(t)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cs.Addrs()})
		t.Cleanup(func() { c.Close() })
		s, err := NewSemaphoreStore(c, SemaphoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodes := map[int64]bool{}
		for i := range 8 { // the suite's semaphore names
			slot, err := c.ClusterKeySlot(context.Background(), s.Key(fmt.Sprintf("test-%d", i))).Result()
			if err != nil {
				t.Fatal(err)
			}
			nodes[slot*3/16384] = true // which third of the slots: which node
		}
		if len(nodes) < 2 {
			t.Fatalf("the suite's semaphores all fall on one node")
		}
		storetest.RunSemaphores(t, func(*testing.T) concurrency.Store { return s }, false)
	})
}

// TestSemaphoreStoreRestartLosesPermit: a Redis restart without persistence
// forgets the permits; holders report Lost (they never re-create a permit
// by renewing) and can acquire again.
func TestSemaphoreStoreRestartLosesPermit(t *testing.T) {
	srv := redistest.Standalone(t)
	b, err := NewSemaphoreStore(srv.Client(), SemaphoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second
	d, err := concurrency.NewDistributed(b, "restart", 1, concurrency.DistributedOptions{TTL: ttl, MinBackoff: 2 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, err := d.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	srv.Start()
	select {
	case <-p.Lost():
	case <-time.After(2 * ttl):
		t.Fatalf("permit not lost %v after the restart", 2*ttl)
	}
	if !errors.Is(p.Err(), concurrency.ErrLost) {
		t.Fatalf("Err after the restart = %v, want ErrLost", p.Err())
	}
	actx, cancel := context.WithTimeout(ctx, ttl)
	defer cancel()
	q, err := d.Acquire(actx)
	if err != nil {
		t.Fatalf("Acquire after restart: %v", err)
	}
	q.Release(ctx)
}

func TestSemaphorePrefixWithBraceRejected(t *testing.T) {
	for _, p := range []string{"a{b}:", "x{", "}"} {
		if _, err := NewSemaphoreStore(nopClient(t), SemaphoreOptions{Prefix: p}); err == nil || !strings.Contains(err.Error(), "brace") {
			t.Errorf("prefix %q: err = %v, want one naming the brace", p, err)
		}
	}
}

func TestSemaphoreKey(t *testing.T) {
	b, err := NewSemaphoreStore(nopClient(t), SemaphoreOptions{Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	long := string(make([]byte, 200))
	tests := []struct{ name, want string }{
		{"", "p:{}"},
		{"api", "p:{YXBp}"},
		{"a}{b", "p:{YX17Yg}"},
		{long, "p:{~" + base64.RawURLEncoding.EncodeToString(sha(long)) + "}"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		got := b.Key(tt.name)
		if got != tt.want {
			t.Errorf("Key(%q) = %q, want %q", tt.name, got, tt.want)
		}
		if seen[got] {
			t.Errorf("Key %q repeated", got)
		}
		seen[got] = true
	}
}

func sha(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// BenchmarkSemaphoreStore measures round trips to a local redis-server: the store
// operations alone (acquire script, renew script, release) and a whole
// permit (acquire + release, two round trips). It reports round trips per
// second (rt/s); ns/op is per operation as named.
func BenchmarkSemaphoreStore(b *testing.B) {
	srv := redistest.Standalone(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64})
	b.Cleanup(func() { c.Close() })
	be, err := NewSemaphoreStore(c, SemaphoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var seq atomic.Int64
	token := func() string { return "t" + strconv.FormatInt(seq.Add(1), 10) }
	run := func(b *testing.B, rtPerOp int, body func() error) {
		b.Helper()
		b.ReportAllocs()
		b.SetParallelism(8) // keep several requests in flight, as many holders do
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := body(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N*rtPerOp)/time.Since(start).Seconds(), "rt/s")
	}
	b.Run("acquire+release", func(b *testing.B) {
		run(b, 2, func() error {
			tok := token()
			fence, err := be.Acquire(ctx, "bench", tok, 1<<30, time.Minute, 0)
			if err != nil || fence == 0 {
				return errors.Join(err, errors.New("not acquired"))
			}
			_, err = be.Release(ctx, "bench", tok)
			return err
		})
	})
	b.Run("renew", func(b *testing.B) {
		tok := token()
		if _, err := be.Acquire(ctx, "bench-renew", tok, 1, time.Minute, 0); err != nil {
			b.Fatal(err)
		}
		run(b, 1, func() error {
			_, err := be.Renew(ctx, "bench-renew", tok, time.Minute)
			return err
		})
	})
	b.Run("permit", func(b *testing.B) {
		d, err := concurrency.NewDistributed(be, "bench-permit", 1<<30, concurrency.DistributedOptions{})
		if err != nil {
			b.Fatal(err)
		}
		run(b, 2, func() error {
			p, err := d.TryAcquire(ctx)
			if err != nil {
				return err
			}
			return p.Release(ctx)
		})
	})
}

// TestSemaphoreWatch: the scripts publish, on the semaphore's channel, the
// token first in line (or, when nobody queues, the plain waiters recorded
// that there is room for, or "") when a release, the departure of the head
// or the reclaiming of an expired permit may open room, and nothing when a
// waiter behind the head leaves.
func TestSemaphoreWatch(t *testing.T) {
	srv := redistest.Standalone(t)
	// Without holds (TestSemaphoreHold has them): who is named, not who
	// may take the room.
	b, err := NewSemaphoreStore(srv.Client(), SemaphoreOptions{Hold: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	notes, err := b.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	next := func(step, want string) {
		t.Helper()
		select {
		case got, ok := <-notes:
			if !ok || got != want {
				t.Fatalf("%s: message %q (open %v), want %q", step, got, ok, want)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no message", step)
		}
	}
	fair := func(token string, want concurrency.FairResult) {
		t.Helper()
		if got, _, err := b.AcquireFair(ctx, "w", token, 1, 1, time.Minute, 10*time.Second); err != nil || got != want {
			t.Fatalf("AcquireFair(%s) = %v, %v; want %v", token, got, err, want)
		}
	}
	fair("a", concurrency.Granted)
	if _, err := b.Release(ctx, "w", "a"); err != nil {
		t.Fatal(err)
	}
	next("release, nobody queued", "")

	fair("a", concurrency.Granted)
	fair("b", concurrency.First)
	fair("c", concurrency.Queued)
	fair("d", concurrency.Queued)
	if err := b.Dequeue(ctx, "w", "c"); err != nil { // behind the head: nothing
		t.Fatal(err)
	}
	if _, err := b.Release(ctx, "w", "a"); err != nil {
		t.Fatal(err)
	}
	next("release, b first in line", "b")
	if err := b.Dequeue(ctx, "w", "b"); err != nil {
		t.Fatal(err)
	}
	next("the head leaves", "d")
	fair("d", concurrency.Granted)
	if _, err := b.Release(ctx, "w", "d"); err != nil {
		t.Fatal(err)
	}
	next("release, nobody queued", "")

	// Plain waiters: an Acquire refused with a wait is recorded, and a
	// release names as many of them as the weight it frees, the one that
	// asked least recently first, one message each; each change's
	// messages come before the next change's, so a message that follows
	// shows that no other came between.
	acquire := func(token string, limit int64, ttl, wait time.Duration) bool {
		t.Helper()
		fence, err := b.Acquire(ctx, "w", token, limit, ttl, wait)
		if err != nil {
			t.Fatal(err)
		}
		return fence != 0
	}
	release := func(token string) {
		t.Helper()
		if ok, err := b.Release(ctx, "w", token); err != nil || !ok {
			t.Fatalf("Release(%s) = %v, %v", token, ok, err)
		}
	}
	const wait = 10 * time.Second
	if !acquire("g", 1, time.Minute, 0) {
		t.Fatal("g not granted")
	}
	if acquire("x", 1, time.Minute, wait) || acquire("y", 1, time.Minute, wait) || acquire("n", 1, time.Minute, 0) {
		t.Fatal("granted above the limit")
	}
	release("g")
	next("release of weight 1, x and y waiting", "x")
	if !acquire("x", 1, time.Minute, wait) {
		t.Fatal("x not granted")
	}
	release("x")
	next("release of weight 1, y waiting", "y")
	if !acquire("z", 1, time.Minute, 0) {
		t.Fatal("z not granted")
	}
	release("z")
	next("release, nobody recorded (n asked with no wait)", "")

	// A release of weight 2 names two waiters.
	if got, _, err := b.AcquireFair(ctx, "w", "h", 2, 2, time.Minute, 0); err != nil || got != concurrency.Granted {
		t.Fatalf("AcquireFair(h, weight 2) = %v, %v", got, err)
	}
	for _, tok := range []string{"p", "q", "r"} {
		if acquire(tok, 2, time.Minute, wait) {
			t.Fatalf("%s granted above the limit", tok)
		}
	}
	release("h")
	next("release of weight 2, first waiter", "p")
	next("release of weight 2, second waiter", "q")

	// A permit that expires while another is held (so that the set
	// lives) is noticed by the next acquire, which names as many waiters
	// as the room it leaves: e, of weight 2, expires, f takes one unit of
	// the two, and r, still recorded, is named for the other.
	if !acquire("g", 3, time.Minute, 0) {
		t.Fatal("g not granted")
	}
	if got, _, err := b.AcquireFair(ctx, "w", "e", 2, 3, 20*time.Millisecond, 0); err != nil || got != concurrency.Granted {
		t.Fatalf("AcquireFair(e, weight 2) = %v, %v", got, err)
	}
	for !acquire("f", 3, time.Minute, 0) {
	}
	next("expired permits reclaimed, room for one", "r")
	release("g")
	next("release, nobody recorded", "")
	select {
	case m := <-notes:
		t.Fatalf("unexpected message %q", m)
	default:
	}
}

// TestSemaphoreHold: a waiter named when room opens has that room to
// itself while its hold lasts: an acquire by any other token, plain or
// fair, is refused (and recorded) and the waiter's own is granted,
// consuming the hold; a waiter that gives up (Dequeue) passes its hold
// to the next one recorded; a hold lasts no longer than its waiter's
// place, and one that lapses is room again, which the next script to
// find it passes on: to the next waiter recorded, with a hold, or to the
// first acquire that asks. The permits never exceed the limit.
func TestSemaphoreHold(t *testing.T) {
	srv := redistest.Standalone(t)
	rc := srv.Client()
	b, err := NewSemaphoreStore(rc, SemaphoreOptions{Hold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "h"
	holds := b.Key(name) + ":hold"
	notes, err := b.Watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	next := func(step, want string) {
		t.Helper()
		select {
		case got, ok := <-notes:
			if !ok || got != want {
				t.Fatalf("%s: message %q (open %v), want %q", step, got, ok, want)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no message", step)
		}
	}
	acquire := func(token string, limit int64, wait time.Duration) bool {
		t.Helper()
		fence, err := b.Acquire(ctx, name, token, limit, time.Minute, wait)
		if err != nil {
			t.Fatal(err)
		}
		return fence != 0
	}
	release := func(token string) {
		t.Helper()
		if ok, err := b.Release(ctx, name, token); err != nil || !ok {
			t.Fatalf("Release(%s) = %v, %v", token, ok, err)
		}
	}
	held := func(token string) (lapse int64, ok bool) {
		t.Helper()
		ms, err := rc.ZScore(ctx, holds, token).Result()
		if errors.Is(err, redis.Nil) {
			return 0, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return int64(ms), true
	}
	serverMillis := func() int64 {
		t.Helper()
		tm, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	const wait = 10 * time.Second

	// A release names w and holds the room for it: c (plain) and y
	// (fair) are refused, w is granted and its hold is gone.
	if !acquire("g", 1, 0) {
		t.Fatal("g not granted")
	}
	if acquire("w", 1, wait) {
		t.Fatal("w granted above the limit")
	}
	release("g")
	next("release, w waiting", "w")
	if _, ok := held("w"); !ok {
		t.Fatal("no hold for w after the release named it")
	}
	if acquire("c", 1, wait) {
		t.Fatal("c granted the room held for w")
	}
	if res, _, err := b.AcquireFair(ctx, name, "y", 1, 1, time.Minute, 0); err != nil || res == concurrency.Granted {
		t.Fatalf("AcquireFair(y) = %v, %v over w's hold", res, err)
	}
	if !acquire("w", 1, wait) {
		t.Fatal("w refused the room held for it")
	}
	if _, ok := held("w"); ok {
		t.Fatal("w's hold outlived its grant")
	}

	// w releases: c, recorded first, is named and held for (places that
	// lapse in the same millisecond go in the order of their tokens: c
	// before v); c gives up, and its hold goes to v, the next recorded.
	if acquire("v", 1, wait) {
		t.Fatal("v granted above the limit")
	}
	release("w")
	next("release, c and v waiting", "c")
	if err := b.Dequeue(ctx, name, "c"); err != nil {
		t.Fatal(err)
	}
	next("c gave up its hold", "v")
	if _, ok := held("c"); ok {
		t.Fatal("c's hold outlived its Dequeue")
	}
	if acquire("x", 1, 0) {
		t.Fatal("x granted the room held for v")
	}
	if !acquire("v", 1, wait) {
		t.Fatal("v refused the room held for it")
	}

	// A hold lasts no longer than its waiter's place: u, recorded for
	// 300 ms, is named; x is refused until the hold lapses and granted
	// after it, never before, by the server's clock.
	if acquire("u", 1, 300*time.Millisecond) {
		t.Fatal("u granted above the limit")
	}
	release("v")
	next("release, u waiting", "u")
	lapse, ok := held("u")
	if !ok {
		t.Fatal("no hold for u")
	}
	if now := serverMillis(); lapse > now+300 {
		t.Fatalf("u's hold lapses %d ms from now, after its place (300 ms)", lapse-now)
	}
	for {
		granted := acquire("x", 1, 0)
		after := serverMillis()
		if granted {
			if after < lapse {
				t.Fatalf("x granted at %d ms or before, u's hold lapses at %d", after, lapse)
			}
			break
		}
		if after > lapse+5000 {
			t.Fatal("x still refused 5 s after u's hold lapsed")
		}
	}

	// Limit 2: x holds one unit, s the other; q (recorded for 300 ms)
	// and r (for 10 s) wait. s releases: q is named and held for; q
	// never comes, and the first script to find its hold lapsed (x's
	// renewal by Acquire, polled) passes the room on to r, with a hold.
	if !acquire("s", 2, 0) {
		t.Fatal("s not granted")
	}
	if acquire("q", 2, 300*time.Millisecond) || acquire("r", 2, wait) {
		t.Fatal("granted above the limit")
	}
	release("s")
	next("release, q and r waiting", "q")
	for named := false; !named; {
		if !acquire("x", 2, 0) {
			t.Fatal("x's renewal refused")
		}
		select {
		case m := <-notes:
			if m != "r" {
				t.Fatalf("after q's hold lapsed: message %q, want \"r\"", m)
			}
			named = true
		case <-ctx.Done():
			t.Fatal("r never named after q's hold lapsed")
		default:
		}
	}
	if _, ok := held("q"); ok {
		t.Fatal("q's hold still there after r was named")
	}
	if _, ok := held("r"); !ok {
		t.Fatal("no hold for r")
	}
	if acquire("p", 2, 0) {
		t.Fatal("p granted the room held for r")
	}
	if !acquire("r", 2, wait) {
		t.Fatal("r refused the room held for it")
	}
	l, err := b.Holders(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if l.Used() != 2 {
		t.Fatalf("%d units held, want x's and r's", l.Used())
	}
}

// TestSemaphoreHoldersWithoutSince: a holder written by a Sluice that
// recorded no grant instant (no entry in Key + ":since") is listed with
// concurrency.HeldForUnknown, and its renewals and the acquires of the
// same token keep it so (a renewal is not a grant); a holder granted
// now is listed with its time held.
func TestSemaphoreHoldersWithoutSince(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := NewSemaphoreStore(srv.Client(), SemaphoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := s.Key("old")
	for _, tok := range []string{"old-holder", "new-holder"} {
		if f, err := s.Acquire(ctx, "old", tok, 3, time.Minute, 0); err != nil || f == 0 {
			t.Fatalf("Acquire = %d, %v", f, err)
		}
	}
	if err := srv.Client().HDel(ctx, key+":since", "old-holder").Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Renew(ctx, "old", "old-holder", time.Minute); !ok || err != nil {
		t.Fatalf("Renew = %v, %v", ok, err)
	}
	if res, _, err := s.AcquireFair(ctx, "old", "old-holder", 1, 3, time.Minute, 0); err != nil || res != concurrency.Granted {
		t.Fatalf("AcquireFair by the holder = %v, %v", res, err)
	}
	l, err := s.Holders(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Holders) != 2 || l.Holders[0].HeldFor != concurrency.HeldForUnknown || l.Holders[1].HeldFor < 0 {
		t.Fatalf("Holders = %+v, want the old holder's time held unknown, the new one's known", l)
	}
	if n, err := srv.Client().HExists(ctx, key+":since", "old-holder").Result(); err != nil || n {
		t.Fatalf("a renewal recorded a grant instant for the old holder (%v, %v)", n, err)
	}
}
