package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/concurrency"
)

// NewSemaphoreStore returns a store of semaphores for the calling test.
type NewSemaphoreStore func(t *testing.T) concurrency.Store

// RunSemaphores runs the conformance suite of concurrency.Store against a
// store that newStore returns, through concurrency.Distributed: permits up
// to the limit and no more, a release that lets exactly one waiter in,
// tokens that never touch each other's permits, separate names, renewal
// that keeps a permit past its TTL, a stalled holder that loses its permit
// within a TTL while the store hands the slot on, a permit removed from the
// store reported lost, limit 0, and fences (each grant of a name takes the
// name's next fence, whatever other names do; a renewal keeps it; it never
// goes back, not even after every holder expired), and the listing of
// holders (Store.Holders: fence, weight, held for and expires in, by the
// store's clock, ordered by fence; a renewal keeps the time held; no
// expired holder and no token listed); and, for a
// concurrency.FairStore, waiters of separate Distributeds (as of separate
// processes) granted in arrival order, weighted permits that never add up
// to more than the limit, a weight kept by renewals past a TTL, the
// fences of the fair path, and the listing of weighted holders and of the
// waiters queued.
//
// With fakeTime, each test runs in a testing/synctest bubble: for stores
// that take their time from time.Now in this process. A store on a server's
// clock (Redis) runs in real time; the suite then takes a few seconds.
func RunSemaphores(t *testing.T, newStore NewSemaphoreStore, fakeTime bool) {
	tests := []struct {
		name string
		run  func(t *testing.T, b concurrency.Store, sem string)
	}{
		{"acquire up to the limit", testUpToLimit},
		{"release lets one in", testReleaseLetsOneIn},
		{"token isolation", testTokenIsolation},
		{"named semaphores are separate", testNamesSeparate},
		{"renewal keeps the permit", testRenewalKeeps},
		{"stalled holder expires", testStalledExpires},
		{"permit removed from the store is lost", testRemovedIsLost},
		{"limit zero", testLimitZero},
		{"waiters in arrival order", testArrivalOrder},
		{"weights never exceed the limit", testWeights},
		{"renewal keeps the weight", testWeightRenewed},
		{"fences increase per name", testFences},
		{"fences survive expiry", testFencesSurviveExpiry},
		{"fences of the fair path", testFairFences},
		{"plain acquire yields to the queue", testPlainYieldsToQueue},
		{"holders listed", testHolders},
		{"holders listed, fair", testHoldersFair},
	}
	b := newStore(t)
	for i, tt := range tests {
		sem := fmt.Sprintf("test-%d", i)
		t.Run(tt.name, func(t *testing.T) {
			if fakeTime {
				synctest.Test(t, func(t *testing.T) { tt.run(t, b, sem) })
				return
			}
			tt.run(t, b, sem)
		})
	}
}

// testTTL is the permit TTL of the shared tests: short, so that expiry is
// quick on a real Redis too.
const testTTL = time.Second

var testOpts = concurrency.DistributedOptions{TTL: testTTL, MinBackoff: 2 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}

func newDist(t *testing.T, b concurrency.Store, sem string, limit int64) *concurrency.Distributed {
	t.Helper()
	d, err := concurrency.NewDistributed(b, sem, limit, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustTry(t *testing.T, d *concurrency.Distributed) *concurrency.Permit {
	t.Helper()
	p, err := d.TryAcquire(context.Background())
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	t.Cleanup(func() { p.Release(context.Background()) })
	return p
}

func wantFull(t *testing.T, d *concurrency.Distributed) {
	t.Helper()
	p, err := d.TryAcquire(context.Background())
	if !errors.Is(err, concurrency.ErrNoPermit) {
		if p != nil {
			p.Release(context.Background())
		}
		t.Fatalf("TryAcquire on a full semaphore = %v, want concurrency.ErrNoPermit", err)
	}
}

func testUpToLimit(t *testing.T, b concurrency.Store, sem string) {
	d := newDist(t, b, sem, 3)
	var ps []*concurrency.Permit
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
		if !errors.Is(p.Err(), concurrency.ErrReleased) {
			t.Fatalf("Err after Release = %v, want concurrency.ErrReleased", p.Err())
		}
	}
	for range 3 {
		mustTry(t, d)
	}
}

func testReleaseLetsOneIn(t *testing.T, b concurrency.Store, sem string) {
	d := newDist(t, b, sem, 2)
	p1 := mustTry(t, d)
	mustTry(t, d)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		p   *concurrency.Permit
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

func testTokenIsolation(t *testing.T, b concurrency.Store, sem string) {
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

func testNamesSeparate(t *testing.T, b concurrency.Store, sem string) {
	a := newDist(t, b, sem+"/a", 1)
	c := newDist(t, b, sem+"/c", 1)
	mustTry(t, a)
	mustTry(t, c)
	wantFull(t, a)
	wantFull(t, c)
}

// waitLost waits for p's loss, failing after limit.
func waitLost(t *testing.T, p *concurrency.Permit, limit time.Duration) {
	t.Helper()
	select {
	case <-p.Lost():
	case <-time.After(limit):
		t.Fatalf("permit not lost after %v", limit)
	}
	if !errors.Is(p.Err(), concurrency.ErrLost) {
		t.Fatalf("Err after loss = %v, want concurrency.ErrLost", p.Err())
	}
}

func testRenewalKeeps(t *testing.T, b concurrency.Store, sem string) {
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

// stalled is a store whose renewals never answer, as for a holder cut off
// from the store or paused.
type stalled struct{ concurrency.Store }

func (stalled) Renew(ctx context.Context, _, _ string, _ time.Duration) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

func testStalledExpires(t *testing.T, b concurrency.Store, sem string) {
	ctx := context.Background()
	stuck := newDist(t, stalled{b}, sem, 1)
	sent := time.Now()
	p := mustTry(t, stuck)
	waitLost(t, p, 3*testTTL)
	// Lost closes at TTL − Margin; on a loaded machine this goroutine
	// may see it some scheduling delay later (in fake time, exactly).
	if lostAfter := time.Since(sent); lostAfter > testTTL+250*time.Millisecond {
		t.Fatalf("stalled holder lost its permit after %v, want at most TTL %v (+ 250 ms of scheduling)", lostAfter, testTTL)
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

func testRemovedIsLost(t *testing.T, b concurrency.Store, sem string) {
	d := newDist(t, b, sem, 1)
	p := mustTry(t, d)
	if ok, err := b.Release(context.Background(), sem, p.Token()); !ok || err != nil {
		t.Fatalf("removing the permit: %v, %v", ok, err)
	}
	// The next renewal, at most 1.1 × RenewEvery later, finds it gone.
	waitLost(t, p, testTTL/2)
}

func testLimitZero(t *testing.T, b concurrency.Store, sem string) {
	d := newDist(t, b, sem, 0)
	if _, err := d.Acquire(context.Background()); !errors.Is(err, concurrency.ErrExceedsLimit) {
		t.Fatalf("Acquire with limit 0 = %v, want concurrency.ErrExceedsLimit", err)
	}
}

// joining is a FairStore that tells, once per token, when a waiter's
// first attempt to queue has returned: from then on it has its place.
type joining struct {
	concurrency.FairStore
	mu     sync.Mutex
	seen   map[string]bool
	joined chan struct{}
}

func (j *joining) AcquireFair(ctx context.Context, name, token string, weight, limit int64, ttl, wait time.Duration) (concurrency.FairResult, uint64, error) {
	res, fence, err := j.FairStore.AcquireFair(ctx, name, token, weight, limit, ttl, wait)
	j.mu.Lock()
	first := wait > 0 && !j.seen[token]
	j.seen[token] = true
	j.mu.Unlock()
	if first && err == nil && res != concurrency.Granted {
		j.joined <- struct{}{}
	}
	return res, fence, err
}

func fairOrSkip(t *testing.T, b concurrency.Store) concurrency.FairStore {
	t.Helper()
	fs, ok := b.(concurrency.FairStore)
	if !ok {
		t.Skip("not a concurrency.FairStore")
	}
	return fs
}

// testArrivalOrder queues four waiters, each on its own Distributed (as
// four processes would), of weights 2, 1, 2 and 2, behind two permits that
// fill a semaphore of limit 2. One permit released leaves room for one
// unit: the first waiter still waits, and neither the others nor a
// newcomer may pass it. They are served in the order they came.
func testArrivalOrder(t *testing.T, b concurrency.Store, sem string) {
	fs := fairOrSkip(t, b)
	j := &joining{FairStore: fs, seen: map[string]bool{}, joined: make(chan struct{}, 1)}
	fair := func() *concurrency.Distributed {
		o := testOpts
		o.Fair = true
		d, err := concurrency.NewDistributed(j, sem, 2, o)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	holder := fair()
	pa := mustTry(t, holder)
	pb := mustTry(t, holder)
	// Weights such that no two waiters can hold at once: each is granted
	// only after the one before has recorded its turn and released.
	weights := []int64{2, 1, 2, 2}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i, w := range weights {
		d := fair()
		wg.Go(func() {
			p, err := d.AcquireN(context.Background(), w)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			p.Release(context.Background()) //nolint:errcheck // the next one checks
		})
		select {
		case <-j.joined:
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d never queued", i)
		}
	}
	if err := pb.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p, err := fair().TryAcquire(context.Background()); !errors.Is(err, concurrency.ErrNoPermit) {
		p.Release(context.Background()) //nolint:errcheck // failing anyway
		t.Fatalf("a newcomer's TryAcquire with one unit free and others waiting: %v, want ErrNoPermit", err)
	}
	if err := pa.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if fmt.Sprint(order) != "[0 1 2 3]" {
		t.Fatalf("served in the order %v, want [0 1 2 3] (arrival order)", order)
	}
}

// testWeights runs goroutines that hold permits of weights 1 to 3 of a
// semaphore of limit 5 and checks that what they hold never adds up to
// more than 5, and that a weight above the limit fails at once.
func testWeights(t *testing.T, b concurrency.Store, sem string) {
	fairOrSkip(t, b)
	const limit = 5
	d := newDist(t, b, sem, limit)
	if _, err := d.AcquireN(context.Background(), limit+1); !errors.Is(err, concurrency.ErrExceedsLimit) {
		t.Fatalf("AcquireN(%d) of limit %d: %v, want ErrExceedsLimit", limit+1, limit, err)
	}
	var inUse, peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		w := int64(1 + g%3)
		dg := newDist(t, b, sem, limit)
		wg.Go(func() {
			for range 15 {
				p, err := dg.AcquireN(context.Background(), w)
				if err != nil {
					t.Error(err)
					return
				}
				n := inUse.Add(w)
				for {
					if m := peak.Load(); n <= m || peak.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Millisecond) // the work inside
				inUse.Add(-w)
				if err := p.Release(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if m := peak.Load(); m > limit || m < 3 {
		t.Fatalf("peak weight held %d, want at most %d (and at least 3: permits overlapped)", m, limit)
	}
}

// testWeightRenewed holds a permit of the whole limit's weight for longer
// than a TTL: renewed, it still weighs what it did, and nobody else is let
// in.
func testWeightRenewed(t *testing.T, b concurrency.Store, sem string) {
	fairOrSkip(t, b)
	d := newDist(t, b, sem, 3)
	p, err := d.AcquireN(context.Background(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Release(context.Background()) })
	passTime(testTTL * 3 / 2)
	if err := p.Err(); err != nil {
		t.Fatalf("Err after renewals = %v, want nil", err)
	}
	wantFull(t, d)
}

// passTime lets d pass, in fake time as in real time: what the tests
// that call it look at is the stores' expiry, not another goroutine.
func passTime(d time.Duration) { <-time.After(d) }

// acquire calls Store.Acquire and fails the test on an error.
func acquire(t *testing.T, b concurrency.Store, sem, token string, limit int64, ttl time.Duration) uint64 {
	t.Helper()
	f, err := b.Acquire(context.Background(), sem, token, limit, ttl, 0)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", sem, token, err)
	}
	return f
}

// testFences: each grant of a name takes the next fence of that name,
// whatever other names do; a renewal keeps it; a release does not take
// it back.
func testFences(t *testing.T, b concurrency.Store, sem string) {
	ctx := context.Background()
	d := newDist(t, b, sem, 2)
	other := newDist(t, b, sem+"/other", 10)
	p1 := mustTry(t, d)
	p2 := mustTry(t, d)
	if p1.Fence() == 0 || p2.Fence() != p1.Fence()+1 {
		t.Fatalf("fences of two grants: %d, %d; want n > 0, n+1", p1.Fence(), p2.Fence())
	}
	for range 3 { // grants of another name move nothing here
		if o := mustTry(t, other); o.Fence() == 0 {
			t.Fatal("a permit of fence 0")
		}
	}
	// Renewals, and an acquire by a token that holds a permit, keep it.
	if ok, err := b.Renew(ctx, sem, p1.Token(), testTTL); !ok || err != nil {
		t.Fatalf("Renew = %v, %v; want true, nil", ok, err)
	}
	if f := acquire(t, b, sem, p1.Token(), 2, testTTL); f != p1.Fence() {
		t.Fatalf("acquire by the holder's token: fence %d, want its own %d", f, p1.Fence())
	}
	if f := acquire(t, b, sem, "someone-else", 2, testTTL); f != 0 {
		t.Fatalf("acquire of a full semaphore: fence %d, want 0", f)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if p3 := mustTry(t, d); p3.Fence() != p2.Fence()+1 {
		t.Fatalf("fence after a release and grants of another name: %d, want %d", p3.Fence(), p2.Fence()+1)
	}
	if f := acquire(t, b, sem, p1.Token(), 3, testTTL); f != p2.Fence()+2 {
		t.Fatalf("a released token granted again: fence %d, want a new one, %d", f, p2.Fence()+2)
	}
}

// testFencesSurviveExpiry: a name whose every holder expired (the store
// free to forget it) goes on from its last fence, and a token granted
// again after its permit expired gets a new fence.
func testFencesSurviveExpiry(t *testing.T, b concurrency.Store, sem string) {
	const ttl = 50 * time.Millisecond
	a := acquire(t, b, sem, "a", 1, ttl)
	if a == 0 {
		t.Fatal("not granted")
	}
	passTime(3 * ttl)
	c := acquire(t, b, sem, "c", 1, ttl) // a expired: c takes its place
	if c <= a {
		t.Fatalf("fence after the holder expired: %d, want above %d", c, a)
	}
	passTime(3 * ttl)
	again := acquire(t, b, sem, "a", 1, ttl) // c expired too; a comes back
	if again <= c {
		t.Fatalf("fence of a token granted again after every holder expired: %d, want above %d", again, c)
	}
}

// testFairFences: the fair path takes its fences from the same counter as
// the plain one, and answers 0 when it grants nothing.
func testFairFences(t *testing.T, b concurrency.Store, sem string) {
	fs := fairOrSkip(t, b)
	ctx := context.Background()
	plain := newDist(t, b, sem, 3)
	o := testOpts
	o.Fair = true
	fair, err := concurrency.NewDistributed(b, sem, 3, o)
	if err != nil {
		t.Fatal(err)
	}
	p1 := mustTry(t, plain)
	p2, err := fair.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p2.Release(ctx) })
	if p2.Fence() != p1.Fence()+1 {
		t.Fatalf("fair grant after a plain one: fence %d, want %d", p2.Fence(), p1.Fence()+1)
	}
	res, f, err := fs.AcquireFair(ctx, sem, p2.Token(), 2, 3, testTTL, 0)
	if err != nil || res != concurrency.Granted || f != p2.Fence() {
		t.Fatalf("AcquireFair by the holder's token = %v, %d, %v; want Granted, its own fence %d", res, f, err, p2.Fence())
	}
	res, f, err = fs.AcquireFair(ctx, sem, "waiter", 1, 3, testTTL, 0)
	if err != nil || res == concurrency.Granted || f != 0 {
		t.Fatalf("AcquireFair of a full semaphore = %v, %d, %v; want not Granted, fence 0", res, f, err)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if p3 := mustTry(t, fair); p3.Fence() != p2.Fence()+1 {
		t.Fatalf("fair TryAcquire: fence %d, want %d", p3.Fence(), p2.Fence()+1)
	}
}

// list calls Store.Holders and fails the test on an error or on a
// listing that shows a token.
func list(t *testing.T, b concurrency.Store, sem string, tokens ...string) concurrency.Listing {
	t.Helper()
	l, err := b.Holders(context.Background(), sem)
	if err != nil {
		t.Fatalf("Holders(%q): %v", sem, err)
	}
	shown := fmt.Sprintf("%+v %#v", l, l)
	for _, tok := range tokens {
		if strings.Contains(shown, tok) {
			t.Fatalf("Holders(%q) shows the token %q: %s", sem, tok, shown)
		}
	}
	return l
}

// checkHolder fails the test unless h is the permit of fence and weight,
// granted at least minHeld and at most maxHeld ago (the store's clock
// counts milliseconds: a millisecond of slack each way), and kept for
// more than 0 and at most ttl from now.
func checkHolder(t *testing.T, what string, h concurrency.Holder, fence uint64, weight int64, minHeld, maxHeld, ttl time.Duration) {
	t.Helper()
	if h.Fence != fence || h.Weight != weight {
		t.Errorf("%s: fence %d weight %d, want fence %d weight %d", what, h.Fence, h.Weight, fence, weight)
	}
	if h.HeldFor < minHeld-time.Millisecond || h.HeldFor > maxHeld+time.Millisecond {
		t.Errorf("%s: held for %v, want within [%v, %v]", what, h.HeldFor, minHeld, maxHeld)
	}
	if h.ExpiresIn <= 0 || h.ExpiresIn > ttl {
		t.Errorf("%s: expires in %v, want within (0, %v]", what, h.ExpiresIn, ttl)
	}
}

// testHolders: Holders lists the unexpired permits by fence, with how
// long each has been held (a renewal or a second acquire by the holder
// keeps it) and how long it has left; never an expired one, never a
// token.
func testHolders(t *testing.T, b concurrency.Store, sem string) {
	ctx := context.Background()
	const long = 10 * testTTL
	const pause = 100 * time.Millisecond
	if l := list(t, b, sem); len(l.Holders) != 0 || l.Queued > 0 {
		t.Fatalf("Holders of an unused name = %+v, want none", l)
	}
	start := time.Now()
	fa := acquire(t, b, sem, "holders-token-a", 3, long)
	passTime(pause)
	fb := acquire(t, b, sem, "holders-token-b", 3, long)
	fc := acquire(t, b, sem, "holders-token-c", 3, 50*time.Millisecond)
	if fa == 0 || fb == 0 || fc == 0 {
		t.Fatalf("not granted: fences %d, %d, %d", fa, fb, fc)
	}
	passTime(pause) // c expires, and nothing has asked the store to forget it
	l := list(t, b, sem, "holders-token-a", "holders-token-b", "holders-token-c")
	el := time.Since(start)
	if len(l.Holders) != 2 {
		t.Fatalf("Holders = %+v, want a and b (c expired)", l)
	}
	checkHolder(t, "a", l.Holders[0], fa, 1, 2*pause, el, long)
	checkHolder(t, "b", l.Holders[1], fb, 1, pause, el-pause, long)
	if l.Queued > 0 {
		t.Errorf("Queued = %d, want none (nobody waits in a queue)", l.Queued)
	}
	if got := l.Used(); got != 2 {
		t.Errorf("Used = %d, want 2", got)
	}
	// A renewal and an acquire by the holder move its expiry, not the
	// instant it was granted.
	if ok, err := b.Renew(ctx, sem, "holders-token-a", long); !ok || err != nil {
		t.Fatalf("Renew = %v, %v", ok, err)
	}
	if f := acquire(t, b, sem, "holders-token-b", 3, long); f != fb {
		t.Fatalf("acquire by b's token: fence %d, want %d", f, fb)
	}
	passTime(pause)
	l = list(t, b, sem, "holders-token-a", "holders-token-b")
	el = time.Since(start)
	if len(l.Holders) != 2 {
		t.Fatalf("Holders after renewals = %+v, want a and b", l)
	}
	checkHolder(t, "a renewed", l.Holders[0], fa, 1, 3*pause, el, long)
	checkHolder(t, "b acquired again", l.Holders[1], fb, 1, 2*pause, el-pause, long)
	if ok, err := b.Release(ctx, sem, "holders-token-a"); !ok || err != nil {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	if ok, err := b.Release(ctx, sem, "holders-token-b"); !ok || err != nil {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	if l := list(t, b, sem); len(l.Holders) != 0 {
		t.Fatalf("Holders after the releases = %+v, want none", l)
	}
}

// testHoldersFair: the weights of a FairStore's permits are listed, and
// its queue is counted (the waiters whose place has not lapsed).
func testHoldersFair(t *testing.T, b concurrency.Store, sem string) {
	fs := fairOrSkip(t, b)
	ctx := context.Background()
	const long = 10 * testTTL
	start := time.Now()
	res, f, err := fs.AcquireFair(ctx, sem, "fair-token-a", 2, 3, long, 0)
	if err != nil || res != concurrency.Granted {
		t.Fatalf("AcquireFair = %v, %v", res, err)
	}
	for _, w := range []string{"fair-token-w1", "fair-token-w2"} {
		if res, _, err := fs.AcquireFair(ctx, sem, w, 2, 3, long, long); err != nil || res == concurrency.Granted {
			t.Fatalf("AcquireFair of a full semaphore = %v, %v; want a place in the queue", res, err)
		}
	}
	l := list(t, b, sem, "fair-token-a", "fair-token-w1", "fair-token-w2")
	if len(l.Holders) != 1 || l.Queued != 2 {
		t.Fatalf("Holders = %+v, want a (weight 2) and 2 queued", l)
	}
	checkHolder(t, "a", l.Holders[0], f, 2, 0, time.Since(start), long)
	if err := fs.Dequeue(ctx, sem, "fair-token-w1"); err != nil {
		t.Fatal(err)
	}
	// A waiter whose place lapsed is not counted.
	if res, _, err := fs.AcquireFair(ctx, sem, "fair-token-w3", 2, 3, long, 50*time.Millisecond); err != nil || res == concurrency.Granted {
		t.Fatalf("AcquireFair of a full semaphore = %v, %v; want a place in the queue", res, err)
	}
	passTime(100 * time.Millisecond)
	if l := list(t, b, sem); l.Queued != 1 || len(l.Holders) != 1 {
		t.Fatalf("Holders = %+v, want a and 1 queued (w1 left, w3 lapsed)", l)
	}
	for _, w := range []string{"fair-token-w2", "fair-token-w3"} {
		if err := fs.Dequeue(ctx, sem, w); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := fs.Release(ctx, sem, "fair-token-a"); !ok || err != nil {
		t.Fatalf("Release = %v, %v", ok, err)
	}
}

// testPlainYieldsToQueue: while a waiter keeps its place in the queue,
// Acquire grants nobody else, though there is room; once the waiter
// leaves the queue, Acquire grants again.
func testPlainYieldsToQueue(t *testing.T, b concurrency.Store, sem string) {
	fs := fairOrSkip(t, b)
	ctx := context.Background()
	// A holder of 2 in a semaphore of 2 makes the waiter queue.
	res, _, err := fs.AcquireFair(ctx, sem, "holder", 2, 2, testTTL, 0)
	if err != nil || res != concurrency.Granted {
		t.Fatalf("AcquireFair(holder, 2) = %v, %v; want Granted", res, err)
	}
	res, _, err = fs.AcquireFair(ctx, sem, "waiter", 2, 2, testTTL, testTTL)
	if err != nil || res != concurrency.First {
		t.Fatalf("AcquireFair(waiter, 2) = %v, %v; want First", res, err)
	}
	if _, err := b.Release(ctx, sem, "holder"); err != nil {
		t.Fatal(err)
	}
	// Room for 2, but the waiter (of weight 2) holds its place.
	if f, err := b.Acquire(ctx, sem, "barger", 2, testTTL, 0); err != nil || f != 0 {
		t.Fatalf("Acquire while a waiter queues = %d, %v; want 0 (refused)", f, err)
	}
	if err := fs.Dequeue(ctx, sem, "waiter"); err != nil {
		t.Fatal(err)
	}
	f, err := b.Acquire(ctx, sem, "barger", 2, testTTL, 0)
	if err != nil || f == 0 {
		t.Fatalf("Acquire once the waiter left = %d, %v; want a grant", f, err)
	}
	if _, err := b.Release(ctx, sem, "barger"); err != nil {
		t.Fatal(err)
	}
}
