package concurrency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// errTimeout is a store call past its timeout, as go-redis reports one: a
// net.Error whose Timeout is true.
var errTimeout = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

// failing is a FairStore whose acquire attempts fail while fails is above
// 0 (each failure counts it down; a negative fails fails them all), with
// err. With lost set, a failing attempt is run by the store first: its
// answer is lost, as when Redis ran a call whose caller timed out.
type failing struct {
	*MemoryStore
	lost bool
	err  error

	mu       sync.Mutex
	fails    int
	attempts int
}

// fail reports whether this attempt fails, and counts it.
func (f *failing) fail() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts++
	if f.fails == 0 {
		return false
	}
	if f.fails > 0 {
		f.fails--
	}
	return true
}

func (f *failing) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	if !f.fail() {
		return f.MemoryStore.Acquire(ctx, name, token, limit, ttl, wait)
	}
	if f.lost {
		f.MemoryStore.Acquire(ctx, name, token, limit, ttl, wait) //nolint:errcheck // the answer is lost
	}
	return 0, fmt.Errorf("store: %w", f.err)
}

func (f *failing) AcquireFair(ctx context.Context, name, token string, weight, limit int64, ttl, wait time.Duration) (FairResult, uint64, error) {
	if !f.fail() {
		return f.MemoryStore.AcquireFair(ctx, name, token, weight, limit, ttl, wait)
	}
	if f.lost {
		f.MemoryStore.AcquireFair(ctx, name, token, weight, limit, ttl, wait) //nolint:errcheck // the answer is lost
	}
	return Queued, 0, fmt.Errorf("store: %w", f.err)
}

func (f *failing) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts
}

// acquireModes are the blocked acquires: Acquire, and AcquireN (the fair
// queue).
var acquireModes = []struct {
	name    string
	fair    bool
	acquire func(d *Distributed, ctx context.Context) (*Permit, error)
}{
	{"Acquire", false, func(d *Distributed, ctx context.Context) (*Permit, error) { return d.Acquire(ctx) }},
	{"AcquireN", true, func(d *Distributed, ctx context.Context) (*Permit, error) { return d.AcquireN(ctx, 1) }},
}

// TestAcquireWaitsThroughStoreErrors checks, in fake time, that a blocked
// acquire whose first attempts time out, each after the store granted it
// (the answer lost), is granted within its deadline: the permit the lost
// answers granted, with its fence, and no other; that OnStoreError
// heard each failure; and that the backoff spaced the attempts.
func TestAcquireWaitsThroughStoreErrors(t *testing.T) {
	for _, m := range acquireModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const fails = 4
				b := &failing{MemoryStore: NewMemoryStore(), lost: true, err: errTimeout, fails: fails}
				var heard []error
				o := DistributedOptions{TTL: time.Minute, Fair: m.fair, OnStoreError: func(err error) { heard = append(heard, err) }}
				d, err := NewDistributed(b, "s", 1, o)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				start := time.Now()
				p, err := m.acquire(d, ctx)
				if err != nil {
					t.Fatalf("after %d store timeouts within the wait: %v", fails, err)
				}
				defer p.Release(context.Background())
				if took := time.Since(start); took < DefaultMinBackoff/2 || took > time.Second {
					t.Errorf("granted after %v; want the backoff of %d failed attempts", took, fails)
				}
				if len(heard) != fails || !errors.Is(heard[0], errTimeout) {
					t.Errorf("OnStoreError heard %v; want the %d timeouts", heard, fails)
				}
				if got := b.count(); got != fails+1 {
					t.Errorf("%d attempts; want %d", got, fails+1)
				}
				// The first lost answer granted fence 1; the retries under
				// the same token found it.
				if p.Fence() != 1 {
					t.Errorf("fence %d; want 1, the lost grant's", p.Fence())
				}
				if n := b.HoldersAt(time.Now(), "s"); n != 1 {
					t.Errorf("%d holders; want 1", n)
				}
			})
		})
	}
}

// TestAcquireStoreFailingPastDeadline checks, in fake time, that a
// blocked acquire whose every attempt times out (each granted, its answer
// lost) asks again until its deadline, then fails with an error that
// wraps the deadline, ErrStoreFailing and the store's error, and leaves
// no permit in the store.
func TestAcquireStoreFailingPastDeadline(t *testing.T) {
	for _, m := range acquireModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &failing{MemoryStore: NewMemoryStore(), lost: true, err: errTimeout, fails: -1}
				d, err := NewDistributed(b, "s", 1, DistributedOptions{TTL: time.Minute, Fair: m.fair})
				if err != nil {
					t.Fatal(err)
				}
				const wait = 2 * time.Second
				ctx, cancel := context.WithTimeout(t.Context(), wait)
				defer cancel()
				start := time.Now()
				p, err := m.acquire(d, ctx)
				if p != nil {
					t.Fatal("granted by a store that always fails")
				}
				// An attempt timing out within deadlineSlack of the
				// deadline ends the wait.
				if took := time.Since(start); took < wait-deadlineSlack || took > wait {
					t.Errorf("failed after %v; want the whole wait, %v", took, wait)
				}
				for _, want := range []error{context.DeadlineExceeded, ErrStoreFailing, errTimeout, os.ErrDeadlineExceeded} {
					if !errors.Is(err, want) {
						t.Errorf("error %q does not wrap %q", err, want)
					}
				}
				// Polled at the backoff: a few attempts a second.
				if n := b.count(); n < 5 || n > 40 {
					t.Errorf("%d attempts in %v", n, wait)
				}
				if n := b.HoldersAt(time.Now(), "s"); n != 0 {
					t.Errorf("%d holders after the wait was given up; want 0", n)
				}
			})
		})
	}
}

// TestAcquireStoreRecovered: a wait that ends after the store failed, but
// answered its last attempt (no room), is a plain wait ended.
func TestAcquireStoreRecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &failing{MemoryStore: NewMemoryStore(), err: errTimeout}
		d, err := NewDistributed(b, "s", 1, DistributedOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		held, err := d.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(context.Background())
		b.mu.Lock()
		b.fails = 3
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err = d.Acquire(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStoreFailing) || errors.Is(err, errTimeout) {
			t.Errorf("error %q; want the deadline alone", err)
		}
	})
}

// TestAcquireStoreErrorNotTransient: an error that is not Transient ends
// a blocked acquire at once, as does any error TryAcquire meets.
func TestAcquireStoreErrorNotTransient(t *testing.T) {
	errWrongType := errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")
	for _, m := range acquireModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &failing{MemoryStore: NewMemoryStore(), lost: true, err: errWrongType, fails: -1}
				d, err := NewDistributed(b, "s", 1, DistributedOptions{TTL: time.Minute, Fair: m.fair})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				start := time.Now()
				if _, err := m.acquire(d, ctx); !errors.Is(err, errWrongType) || errors.Is(err, ErrStoreFailing) {
					t.Errorf("error %q; want the store's", err)
				}
				if took := time.Since(start); took != 0 || b.count() != 1 {
					t.Errorf("failed after %v and %d attempts; want at once", took, b.count())
				}
				if n := b.HoldersAt(time.Now(), "s"); n != 0 {
					t.Errorf("%d holders; want 0", n)
				}
			})
		})
	}
	synctest.Test(t, func(t *testing.T) {
		b := &failing{MemoryStore: NewMemoryStore(), err: errTimeout, fails: 1}
		d, err := NewDistributed(b, "s", 1, DistributedOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.TryAcquire(t.Context()); !errors.Is(err, errTimeout) {
			t.Errorf("TryAcquire: %v; want the store's timeout at once", err)
		}
	})
}

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("WRONGTYPE"), false},
		{context.Canceled, false},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{errTimeout, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{fmt.Errorf("x: %w", io.EOF), true},
		{io.ErrUnexpectedEOF, true},
		{markedTransient{}, true},
	} {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

type markedTransient struct{}

func (markedTransient) Error() string   { return "busy" }
func (markedTransient) Transient() bool { return true }

// TestAcquireCutOffByDeadline: an attempt that times out just before the
// wait's deadline (a store that gives up a little early, as redisstore's
// cutoff does) ends the wait as the deadline would: no ErrStoreFailing,
// nothing left in the store.
func TestAcquireCutOffByDeadline(t *testing.T) {
	for _, m := range acquireModes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &failing{MemoryStore: NewMemoryStore(), lost: true, err: context.DeadlineExceeded, fails: -1}
				var heard int
				d, err := NewDistributed(b, "s", 1, DistributedOptions{TTL: time.Minute, Fair: m.fair, OnStoreError: func(error) { heard++ }})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
				defer cancel()
				start := time.Now()
				_, err = m.acquire(d, ctx)
				if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStoreFailing) {
					t.Errorf("error %q; want the deadline alone", err)
				}
				if took := time.Since(start); took != 0 || heard != 0 {
					t.Errorf("ended after %v, %d failures waited through; want at once, none", took, heard)
				}
				if n := b.HoldersAt(time.Now(), "s"); n != 0 {
					t.Errorf("%d holders; want 0", n)
				}
			})
		})
	}
}
