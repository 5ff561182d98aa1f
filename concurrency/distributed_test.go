package concurrency

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
)

// testTTL is the permit TTL of the shared tests: short, so that expiry is
// quick on a real Redis too.
const testTTL = time.Second

var testOpts = DistributedOptions{TTL: testTTL, MinBackoff: 2 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}

// backendCase is one Backend under the shared tests. With bubble set, each
// test runs in a synctest bubble, in fake time.
type backendCase struct {
	name   string
	bubble bool
	make   func(t *testing.T) Store
}

func backendCases() []backendCase {
	return []backendCase{
		{"memory", true, func(*testing.T) Store { return NewMemoryStore() }},
		{"redis", false, func(t *testing.T) Store {
			t.Helper()
			srv := redistest.Standalone(t)
			b, err := NewRedisBackend(srv.Client(), RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}},
	}
}

// TestDistributedBackends runs the same table of tests on every Backend.
func TestDistributedBackends(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, b Store, sem string)
	}{
		{"acquire up to the limit", testUpToLimit},
		{"release lets one in", testReleaseLetsOneIn},
		{"token isolation", testTokenIsolation},
		{"named semaphores are separate", testNamesSeparate},
		{"renewal keeps the permit", testRenewalKeeps},
		{"stalled holder expires", testStalledExpires},
		{"permit removed from the store is lost", testRemovedIsLost},
		{"limit zero", testLimitZero},
	}
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			b := bc.make(t)
			for i, tt := range tests {
				sem := fmt.Sprintf("test-%d", i)
				t.Run(tt.name, func(t *testing.T) {
					if bc.bubble {
						synctest.Test(t, func(t *testing.T) { tt.run(t, b, sem) })
						return
					}
					tt.run(t, b, sem)
				})
			}
		})
	}
}

func newDist(t *testing.T, b Store, sem string, limit int64) *Distributed {
	t.Helper()
	d, err := NewDistributed(b, sem, limit, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustTry(t *testing.T, d *Distributed) *Permit {
	t.Helper()
	p, err := d.TryAcquire(context.Background())
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	t.Cleanup(func() { p.Release(context.Background()) })
	return p
}

func wantFull(t *testing.T, d *Distributed) {
	t.Helper()
	p, err := d.TryAcquire(context.Background())
	if !errors.Is(err, ErrNoPermit) {
		if p != nil {
			p.Release(context.Background())
		}
		t.Fatalf("TryAcquire on a full semaphore = %v, want ErrNoPermit", err)
	}
}

func testUpToLimit(t *testing.T, b Store, sem string) {
	d := newDist(t, b, sem, 3)
	var ps []*Permit
	for range 3 {
		ps = append(ps, mustTry(t, d))
	}
	wantFull(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if p, err := d.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a full semaphore = %v, %v; want DeadlineExceeded", p, err)
	}
	seen := map[string]bool{}
	for _, p := range ps {
		if seen[p.Token()] || p.Token() == "" {
			t.Fatalf("token %q repeated or empty", p.Token())
		}
		seen[p.Token()] = true
		if err := p.Release(context.Background()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if !errors.Is(p.Err(), ErrReleased) {
			t.Fatalf("Err after Release = %v, want ErrReleased", p.Err())
		}
	}
	for range 3 {
		mustTry(t, d)
	}
}

func testReleaseLetsOneIn(t *testing.T, b Store, sem string) {
	d := newDist(t, b, sem, 2)
	p1 := mustTry(t, d)
	mustTry(t, d)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		p   *Permit
		err error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			p, err := d.Acquire(ctx)
			results <- result{p, err}
		}()
	}
	if err := p1.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := <-results
	if first.err != nil {
		t.Fatalf("first waiter after a release: %v", first.err)
	}
	t.Cleanup(func() { first.p.Release(context.Background()) })
	wantFull(t, d) // the freed slot went to exactly one waiter
	cancel()
	second := <-results
	if !errors.Is(second.err, context.Canceled) {
		if second.p != nil {
			second.p.Release(context.Background())
		}
		t.Fatalf("second waiter = %v, want context.Canceled", second.err)
	}
}

func testTokenIsolation(t *testing.T, b Store, sem string) {
	ctx := context.Background()
	d := newDist(t, b, sem, 1)
	p := mustTry(t, d)
	if ok, err := b.Release(ctx, sem, "not-a-token"); ok || err != nil {
		t.Fatalf("Release with a wrong token = %v, %v; want false, nil", ok, err)
	}
	if ok, err := b.Renew(ctx, sem, "not-a-token", testTTL); ok || err != nil {
		t.Fatalf("Renew with a wrong token = %v, %v; want false, nil", ok, err)
	}
	wantFull(t, d) // neither freed a slot nor created one
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := mustTry(t, d)
	// Releasing p again, or with its token directly, leaves q alone.
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Release(ctx, sem, p.Token()); ok || err != nil {
		t.Fatalf("Release of a released token = %v, %v; want false, nil", ok, err)
	}
	wantFull(t, d)
	if ok, err := b.Renew(ctx, sem, q.Token(), testTTL); !ok || err != nil {
		t.Fatalf("Renew of the holder's token = %v, %v; want true, nil", ok, err)
	}
	if q.Err() != nil {
		t.Fatalf("holder's Err = %v, want nil", q.Err())
	}
}

func testNamesSeparate(t *testing.T, b Store, sem string) {
	a := newDist(t, b, sem+"/a", 1)
	c := newDist(t, b, sem+"/c", 1)
	mustTry(t, a)
	mustTry(t, c)
	wantFull(t, a)
	wantFull(t, c)
}

// waitLost waits for p's loss, failing after limit.
func waitLost(t *testing.T, p *Permit, limit time.Duration) {
	t.Helper()
	select {
	case <-p.Lost():
	case <-time.After(limit):
		t.Fatalf("permit not lost after %v", limit)
	}
	if !errors.Is(p.Err(), ErrLost) {
		t.Fatalf("Err after loss = %v, want ErrLost", p.Err())
	}
}

func testRenewalKeeps(t *testing.T, b Store, sem string) {
	d := newDist(t, b, sem, 1)
	p := mustTry(t, d)
	select {
	case <-p.Lost():
		t.Fatalf("permit lost while renewing: %v", p.Err())
	case <-time.After(testTTL * 3 / 2): // longer than one TTL
	}
	wantFull(t, d)
	if p.Err() != nil {
		t.Fatalf("Err = %v, want nil", p.Err())
	}
}

// stalled is a Backend whose renewals never answer, as for a holder cut off
// from the store or paused.
type stalled struct{ Store }

func (stalled) Renew(ctx context.Context, _, _ string, _ time.Duration) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

func testStalledExpires(t *testing.T, b Store, sem string) {
	ctx := context.Background()
	stuck := newDist(t, stalled{b}, sem, 1)
	sent := time.Now()
	p := mustTry(t, stuck)
	waitLost(t, p, 3*testTTL)
	if lostAfter := time.Since(sent); lostAfter > testTTL {
		t.Fatalf("stalled holder lost its permit after %v, want at most TTL %v", lostAfter, testTTL)
	}
	// Others get the slot once the store expires it, one TTL after the
	// acquire, plus at most a backoff.
	d := newDist(t, b, sem, 1)
	actx, cancel := context.WithTimeout(ctx, 3*testTTL)
	defer cancel()
	q, err := d.Acquire(actx)
	if err != nil {
		t.Fatalf("Acquire after the holder stalled: %v", err)
	}
	defer q.Release(ctx)
	if took := time.Since(sent); took > testTTL+testOpts.MaxBackoff+200*time.Millisecond {
		t.Errorf("slot returned %v after the stalled acquire, want about TTL %v", took, testTTL)
	}
	// The stalled holder's release does not free the new holder's slot.
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantFull(t, d)
}

func testRemovedIsLost(t *testing.T, b Store, sem string) {
	d := newDist(t, b, sem, 1)
	p := mustTry(t, d)
	if ok, err := b.Release(context.Background(), sem, p.Token()); !ok || err != nil {
		t.Fatalf("removing the permit: %v, %v", ok, err)
	}
	// The next renewal, at most 1.1 × RenewEvery later, finds it gone.
	waitLost(t, p, testTTL/2)
}

func testLimitZero(t *testing.T, b Store, sem string) {
	d := newDist(t, b, sem, 0)
	if _, err := d.Acquire(context.Background()); !errors.Is(err, ErrExceedsLimit) {
		t.Fatalf("Acquire with limit 0 = %v, want ErrExceedsLimit", err)
	}
}

// TestPermitLostExactly checks, in fake time, the instants at which a
// permit is renewed and lost.
func TestPermitLostExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := NewMemoryStore()
		o := DistributedOptions{TTL: 3 * time.Second, Margin: 30 * time.Millisecond}
		stuck, err := NewDistributed(stalled{b}, "s", 1, o)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		p, err := stuck.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		<-p.Lost()
		if got, want := time.Since(start), o.TTL-o.Margin; got != want {
			t.Errorf("lost after %v, want TTL - Margin = %v", got, want)
		}
		if n := b.HoldersAt(time.Now(), "s"); n != 1 {
			t.Errorf("store holders just before expiry = %d, want 1", n)
		}
		if n := b.HoldersAt(start.Add(o.TTL), "s"); n != 0 {
			t.Errorf("store holders at TTL = %d, want 0", n)
		}
		p.Release(context.Background())
	})
}

func TestNewDistributedOptions(t *testing.T) {
	b := NewMemoryStore()
	tests := []struct {
		name    string
		o       DistributedOptions
		wantErr bool
		want    DistributedOptions
	}{
		{"defaults", DistributedOptions{}, false, DistributedOptions{
			TTL: DefaultTTL, RenewEvery: DefaultTTL / 3, Margin: DefaultTTL / 50,
			MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff}},
		{"renew capped at TTL/2", DistributedOptions{TTL: time.Second, RenewEvery: time.Hour}, false, DistributedOptions{
			TTL: time.Second, RenewEvery: time.Second / 2, Margin: time.Second / 50,
			MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff}},
		{"max backoff raised to min", DistributedOptions{TTL: time.Second, MinBackoff: time.Second, MaxBackoff: time.Millisecond}, false, DistributedOptions{
			TTL: time.Second, RenewEvery: time.Second / 3, Margin: time.Second / 50,
			MinBackoff: time.Second, MaxBackoff: time.Second}},
		{"negative", DistributedOptions{TTL: -1}, true, DistributedOptions{}},
		{"tiny TTL", DistributedOptions{TTL: time.Microsecond}, true, DistributedOptions{}},
		{"margin too large", DistributedOptions{TTL: time.Second, Margin: time.Second}, true, DistributedOptions{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NewDistributed(b, "x", 1, tt.o)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && d.o != tt.want {
				t.Fatalf("options = %+v, want %+v", d.o, tt.want)
			}
		})
	}
	if _, err := NewDistributed(nil, "x", 1, DistributedOptions{}); err == nil {
		t.Error("nil backend accepted")
	}
}

// TestRedisRestartLosesPermit: a Redis restart without persistence forgets
// the permits; holders report Lost (they never re-create a permit by
// renewing) and can acquire again.
func TestRedisRestartLosesPermit(t *testing.T) {
	srv := redistest.Standalone(t)
	b, err := NewRedisBackend(srv.Client(), RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := newDist(t, b, "restart", 1)
	p := mustTry(t, d)
	srv.Stop()
	srv.Start()
	waitLost(t, p, 2*testTTL)
	ctx, cancel := context.WithTimeout(context.Background(), testTTL)
	defer cancel()
	q, err := d.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire after restart: %v", err)
	}
	q.Release(ctx)
}

func TestRedisPrefixWithBraceRejected(t *testing.T) {
	for _, p := range []string{"a{b}:", "x{", "}"} {
		if _, err := NewRedisBackend(redisNopClient(), RedisOptions{Prefix: p}); err == nil || !strings.Contains(err.Error(), "brace") {
			t.Errorf("prefix %q: err = %v, want one naming the brace", p, err)
		}
	}
}

func TestRedisKey(t *testing.T) {
	b, err := NewRedisBackend(redisNopClient(), RedisOptions{Prefix: "p:"})
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

// redisNopClient is a client that is never used to connect.
func redisNopClient() redis.UniversalClient {
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
}

func sha(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// TestRedisCluster: semaphores whose keys live on different Cluster nodes
// each admit their own limit.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cs := redistest.Cluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cs.Addrs()})
	t.Cleanup(func() { c.Close() })
	b, err := NewRedisBackend(c, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slots := map[int64]bool{}
	for i := range 6 {
		name := fmt.Sprintf("svc-%d", i)
		slot, err := c.ClusterKeySlot(context.Background(), b.Key(name)).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot*3/16384] = true // which third of the slots: which node
		d := newDist(t, b, name, 2)
		p := mustTry(t, d)
		mustTry(t, d)
		wantFull(t, d)
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustTry(t, d)
	}
	if len(slots) < 2 {
		t.Errorf("the test's names all fell on one node; choose others")
	}
}

// counting is a Backend that counts acquire attempts.
type counting struct {
	Store
	acquires atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, name, token string, limit int64, ttl time.Duration) (bool, error) {
	c.acquires.Add(1)
	return c.Store.Acquire(ctx, name, token, limit, ttl)
}

// TestAcquireBacksOff: a blocked Acquire polls at most once per
// MaxBackoff/2 once its backoff has grown, never in a tight loop.
func TestAcquireBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &counting{Store: NewMemoryStore()}
		o := DistributedOptions{TTL: time.Minute, MinBackoff: time.Millisecond, MaxBackoff: 100 * time.Millisecond}
		d, err := NewDistributed(b, "s", 1, o)
		if err != nil {
			t.Fatal(err)
		}
		p := mustTry(t, d)
		const wait = 10 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		b.acquires.Store(0)
		if _, err := d.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v, want DeadlineExceeded", err)
		}
		// Doubling from 1ms reaches 100ms in 7 steps; after that each wait
		// is drawn from [50ms, 100ms].
		n := b.acquires.Load()
		if lo, hi := int64(wait/o.MaxBackoff), int64(wait/(o.MaxBackoff/2))+8; n < lo || n > hi {
			t.Fatalf("%d attempts in %v, want %d..%d", n, wait, lo, hi)
		}
		p.Release(context.Background())
	})
}
