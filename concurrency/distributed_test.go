package concurrency

import (
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The conformance suite of stores (storetest.RunSemaphores) runs on
// MemoryStore in store_test.go and on Redis in package redisstore.

// stalled is a store whose renewals never answer, as for a holder cut off
// from the store or paused.
type stalled struct{ Store }

func (stalled) Renew(ctx context.Context, _, _ string, _ time.Duration) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
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
			MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff, QueueTTL: time.Second, FairAfter: DefaultFairAfter}},
		{"renew capped at TTL/2", DistributedOptions{TTL: time.Second, RenewEvery: time.Hour}, false, DistributedOptions{
			TTL: time.Second, RenewEvery: time.Second / 2, Margin: time.Second / 50,
			MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff, QueueTTL: time.Second, FairAfter: DefaultFairAfter}},
		{"max backoff raised to min", DistributedOptions{TTL: time.Second, MinBackoff: time.Second, MaxBackoff: time.Millisecond}, false, DistributedOptions{
			TTL: time.Second, RenewEvery: time.Second / 3, Margin: time.Second / 50,
			MinBackoff: time.Second, MaxBackoff: time.Second, QueueTTL: 4 * time.Second, FairAfter: DefaultFairAfter}},
		{"fair after, never", DistributedOptions{TTL: time.Second, FairAfter: -1}, false, DistributedOptions{
			TTL: time.Second, RenewEvery: time.Second / 3, Margin: time.Second / 50,
			MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff, QueueTTL: time.Second, FairAfter: -1}},
		{"negative", DistributedOptions{TTL: -1}, true, DistributedOptions{}},
		{"negative queue TTL", DistributedOptions{QueueTTL: -1}, true, DistributedOptions{}},
		{"tiny TTL", DistributedOptions{TTL: time.Microsecond}, true, DistributedOptions{}},
		{"margin too large", DistributedOptions{TTL: time.Second, Margin: time.Second}, true, DistributedOptions{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NewDistributed(b, "x", 1, tt.o)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && !reflect.DeepEqual(d.o, tt.want) {
				t.Fatalf("options = %+v, want %+v", d.o, tt.want)
			}
		})
	}
	if _, err := NewDistributed(nil, "x", 1, DistributedOptions{}); err == nil {
		t.Error("nil backend accepted")
	}
}

// counting is a store that counts acquire attempts.
type counting struct {
	Store
	acquires atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	c.acquires.Add(1)
	return c.Store.Acquire(ctx, name, token, limit, ttl, wait)
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
		p, err := d.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
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

// TestErrDecidesAtTheCall: a holder that resumes past its permit's
// validity (a process stopped by SIGSTOP, a goroutine descheduled), before
// the Permit's timer or renewal goroutine has had a chance to run, is told
// by Err at once, and finds Lost closed.
func TestErrDecidesAtTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		const ttl = time.Hour // no timer of the Permit's fires in this test
		d, err := NewDistributed(NewMemoryStore(), "paused", 1, DistributedOptions{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		sent := time.Now() // fake time stands still until every goroutine blocks
		p, err := d.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release(ctx)
		until := sent.Add(ttl - d.o.Margin)
		if err := p.errAt(until.Add(-time.Nanosecond)); err != nil {
			t.Fatalf("Err a nanosecond before the validity ends = %v, want nil", err)
		}
		select {
		case <-p.lost:
			t.Fatal("Lost closed before the validity ended")
		default:
		}
		if err := p.errAt(until); !errors.Is(err, ErrLost) {
			t.Fatalf("Err as the validity ends = %v, want ErrLost", err)
		}
		select {
		case <-p.lost:
		default:
			t.Fatal("Lost still open after Err reported the loss")
		}
		if err := p.Err(); !errors.Is(err, ErrLost) {
			t.Fatalf("Err once lost = %v, want it to stay ErrLost", err)
		}
		if p.extend(time.Now()) {
			t.Fatal("a renewal revived a lost permit")
		}
	})
}

// TestPermitDetach checks, in fake time, that a detached permit is no
// longer renewed nor released by its Permit, stays in the store until its
// TTL, and can be renewed through the store by whoever has its token.
func TestPermitDetach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := NewMemoryStore()
		o := DistributedOptions{TTL: 3 * time.Second, Margin: 30 * time.Millisecond}
		d, err := NewDistributed(b, "s", 1, o)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		p, err := d.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if until := p.Detach(); !until.Equal(start.Add(o.TTL - o.Margin)) {
			t.Errorf("Detach = start + %v, want start + TTL - Margin = %v", until.Sub(start), o.TTL-o.Margin)
		}
		if err := p.Err(); !errors.Is(err, ErrDetached) {
			t.Errorf("Err after Detach = %v, want ErrDetached", err)
		}
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := b.HoldersAt(time.Now(), "s"); n != 1 {
			t.Errorf("holders after Release of a detached permit = %d, want 1", n)
		}
		// No renewal: the permit lapses at its TTL.
		time.Sleep(o.TTL - time.Nanosecond)
		if n := b.HoldersAt(time.Now(), "s"); n != 1 {
			t.Errorf("holders just before the TTL = %d, want 1", n)
		}
		if ok, err := b.Renew(context.Background(), "s", p.Token(), o.TTL); !ok || err != nil {
			t.Fatalf("Renew by token = %v, %v; want true", ok, err)
		}
		time.Sleep(o.TTL)
		if n := b.HoldersAt(time.Now(), "s"); n != 0 {
			t.Errorf("holders a TTL after the renewal by token = %d, want 0", n)
		}
		if p.Detach() != (time.Time{}) {
			t.Error("a second Detach returned a validity")
		}
	})
}

// TestNotify checks, in fake time, that Notify wakes a blocked Acquire at
// once after a permit is released through the store directly, where it
// would otherwise wait for its next poll.
func TestNotify(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := NewMemoryStore()
		d, err := NewDistributed(b, "s", 1, DistributedOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		p, err := d.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p.Detach()
		got := make(chan *Permit, 1)
		go func() {
			q, err := d.Acquire(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- q
		}()
		// Let the waiter back off to its longest pause.
		time.Sleep(2 * DefaultMaxBackoff)
		synctest.Wait()
		if !b.ReleaseToken("s", p.Token()) {
			t.Fatal("the detached permit was not in the store")
		}
		start := time.Now()
		d.Notify()
		q := <-got
		if el := time.Since(start); el != 0 {
			t.Errorf("granted %v after Notify; want at once", el)
		}
		q.Release(context.Background())
	})
}

// TestFairAfterBoundsBarging: a holder in another process that releases
// and acquires again at once wins every race for the permit against a
// waiter that polls (MemoryStore names no waiter); without FairAfter
// the waiter starves, with it the waiter queues after FairAfter and is
// served at the holder's next release.
func TestFairAfterBoundsBarging(t *testing.T) {
	const hold = 10 * time.Millisecond
	for _, tc := range []struct {
		name      string
		fairAfter time.Duration
	}{{"default", 0}, {"never", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := NewMemoryStore()
				barger, err := NewDistributed(store, "s", 1, DistributedOptions{TTL: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				waiter, err := NewDistributed(store, "s", 1, DistributedOptions{TTL: time.Minute, FairAfter: tc.fairAfter})
				if err != nil {
					t.Fatal(err)
				}
				ctx, stop := context.WithCancel(t.Context())
				held := make(chan struct{})
				bargerDone := make(chan struct{})
				go func() {
					defer close(bargerDone)
					for first := true; ; first = false {
						p, err := barger.Acquire(ctx)
						if err != nil {
							return
						}
						if first {
							close(held)
						}
						time.Sleep(hold)
						p.Release(context.Background())
					}
				}()
				<-held
				start := time.Now()
				wctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				p, err := waiter.Acquire(wctx)
				cancel()
				waited := time.Since(start)
				stop()
				if p != nil {
					p.Release(context.Background())
				}
				<-bargerDone
				if tc.fairAfter < 0 {
					if err == nil {
						t.Errorf("granted after %v to a waiter that never queues; want it starved for the 5 s", waited)
					}
					return
				}
				if err != nil {
					t.Fatalf("waiter: %v after %v", err, waited)
				}
				if limit := DefaultFairAfter + hold + DefaultMinBackoff; waited < DefaultFairAfter || waited > limit {
					t.Errorf("granted after %v, want between FairAfter %v and %v", waited, DefaultFairAfter, limit)
				}
			})
		})
	}
}
