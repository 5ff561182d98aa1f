package memstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newStore(t *testing.T, opts Options) (*Store, *storetest.Clock) {
	t.Helper()
	c := storetest.NewClock(t0)
	if opts.Now == nil {
		opts.Now = c.Now
	}
	s := New(opts)
	t.Cleanup(func() { s.Close() })
	return s, c
}

func decide(t *testing.T, s *Store, items ...ratelimit.Item) []ratelimit.Decision {
	t.Helper()
	ds, err := s.Decide(context.Background(), nil, items)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if len(ds) != len(items) {
		t.Fatalf("got %d decisions for %d items", len(ds), len(items))
	}
	return ds
}

func TestBoundedKeysEvictExpiredFirst(t *testing.T) {
	s, c := newStore(t, Options{MaxKeys: 4, Shards: 1, JanitorInterval: -1})
	short := &ratelimit.Rule{Name: "short", Quota: 1, Period: time.Second}
	long := &ratelimit.Rule{Name: "long", Quota: 1, Period: time.Hour}
	decide(t, s, ratelimit.Item{Key: "expiring", Rule: short, Cost: 1})
	for i := range 3 {
		decide(t, s, ratelimit.Item{Key: fmt.Sprint("live", i), Rule: long, Cost: 1})
	}
	c.Advance(2 * time.Second) // "expiring" is now equivalent to fresh
	decide(t, s, ratelimit.Item{Key: "new", Rule: long, Cost: 1})
	st := s.Stats()
	if st.Keys != 4 || st.Reclaimed != 1 || st.Evictions != 0 {
		t.Fatalf("stats = %+v, want 4 keys, 1 reclaimed, 0 evicted", st)
	}
	for i := range 3 {
		if d := decide(t, s, ratelimit.Item{Key: fmt.Sprint("live", i), Rule: long, Cost: 1})[0]; d.Allowed {
			t.Errorf("live%d forgot its state", i)
		}
	}
}

func TestBoundedKeysUnderAttack(t *testing.T) {
	s, _ := newStore(t, Options{MaxKeys: 64, Shards: 4, JanitorInterval: -1})
	r := &ratelimit.Rule{Quota: 10, Period: time.Minute}
	for i := range 10_000 {
		decide(t, s, ratelimit.Item{Key: fmt.Sprint("attacker", i), Rule: r, Cost: 1})
	}
	st := s.Stats()
	if st.Keys > 64 {
		t.Fatalf("store holds %d keys, bound is 64", st.Keys)
	}
	if st.Evictions == 0 {
		t.Fatal("no eviction counted")
	}
}

// TestBoundedKeysManyNewInOneRequest: a request with several new keys in
// one full shard (the same key twice counting once) makes room for all of
// them, so the bound holds after it too.
func TestBoundedKeysManyNewInOneRequest(t *testing.T) {
	s, _ := newStore(t, Options{MaxKeys: 4, Shards: 1, JanitorInterval: -1})
	r := &ratelimit.Rule{Quota: 10, Period: time.Minute}
	for i := range 4 {
		decide(t, s, ratelimit.Item{Key: fmt.Sprint("old", i), Rule: r, Cost: 1})
	}
	decide(t, s,
		ratelimit.Item{Key: "a", Rule: r, Cost: 1},
		ratelimit.Item{Key: "old0", Rule: r, Cost: 1},
		ratelimit.Item{Key: "b", Rule: r, Cost: 1},
		ratelimit.Item{Key: "a", Rule: r, Cost: 1},
	)
	if st := s.Stats(); st.Keys != 4 || st.Evictions != 2 {
		t.Fatalf("stats = %+v, want 4 keys after 2 evictions", st)
	}
}

func TestChecksAndDenialsOnUnknownKeysStoreNothing(t *testing.T) {
	s, _ := newStore(t, Options{JanitorInterval: -1})
	r := &ratelimit.Rule{Quota: 5, Period: time.Second}
	decide(t, s, ratelimit.Item{Key: "check", Rule: r, Cost: 0})
	decide(t, s, ratelimit.Item{Key: "refund", Rule: r, Cost: -3})
	if d := decide(t, s, ratelimit.Item{Key: "huge", Rule: r, Cost: 6})[0]; d.Reason != ratelimit.ReasonExceedsCapacity {
		t.Fatalf("cost 6 on a 5-capacity rule: reason %v", d.Reason)
	}
	if n := s.Stats().Keys; n != 0 {
		t.Fatalf("store holds %d keys after checks, refunds and impossible costs", n)
	}
}

// TestChecksOnUnknownKeysStoreNothingInManyItems: in a request of several
// items, a new key that no item charges (cost 0 or a refund) neither takes
// a place nor makes room for one.
func TestChecksOnUnknownKeysStoreNothingInManyItems(t *testing.T) {
	s, _ := newStore(t, Options{MaxKeys: 2, Shards: 1, JanitorInterval: -1})
	r := &ratelimit.Rule{Quota: 5, Period: time.Minute}
	decide(t, s, ratelimit.Item{Key: "old0", Rule: r, Cost: 1})
	decide(t, s, ratelimit.Item{Key: "old1", Rule: r, Cost: 1})
	decide(t, s,
		ratelimit.Item{Key: "check", Rule: r, Cost: 0},
		ratelimit.Item{Key: "old0", Rule: r, Cost: 1},
		ratelimit.Item{Key: "refund", Rule: r, Cost: -1},
		ratelimit.Item{Key: "check", Rule: r, Cost: 0},
	)
	if st := s.Stats(); st.Keys != 2 || st.Evictions != 0 {
		t.Fatalf("stats = %+v, want the 2 old keys and no eviction", st)
	}
	for _, k := range []string{"check", "refund"} {
		if _, ok := s.State(k); ok {
			t.Errorf("%q was stored", k)
		}
	}
	// A key checked first and charged later in the same request is kept.
	decide(t, s,
		ratelimit.Item{Key: "new", Rule: r, Cost: 0},
		ratelimit.Item{Key: "new", Rule: r, Cost: 2},
	)
	if st, ok := s.State("new"); !ok || st.T == 0 {
		t.Fatalf("charged key: state %+v, stored %v", st, ok)
	}
	if st := s.Stats(); st.Keys != 2 || st.Evictions != 1 {
		t.Fatalf("stats = %+v, want 2 keys after 1 eviction", st)
	}
}

func TestJanitorReclaimsExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{JanitorInterval: time.Minute}) // time.Now is the bubble's fake clock
		defer s.Close()
		r := &ratelimit.Rule{Quota: 1, Period: time.Second}
		for i := range 100 {
			decide(t, s, ratelimit.Item{Key: fmt.Sprint(i), Rule: r, Cost: 1})
		}
		time.Sleep(time.Minute + time.Second) // fake time: one janitor pass
		synctest.Wait()
		if st := s.Stats(); st.Keys != 0 || st.Reclaimed != 100 {
			t.Fatalf("after one janitor pass: %+v, want 0 keys, 100 reclaimed", st)
		}
	})
}

func TestCloseStopsJanitorAndDecide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{JanitorInterval: time.Second})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil { // idempotent
			t.Fatal(err)
		}
		r := &ratelimit.Rule{Quota: 1, Period: time.Second}
		if _, err := s.Decide(context.Background(), nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}); err != ErrClosed {
			t.Fatalf("Decide after Close: %v, want ErrClosed", err)
		}
		// synctest.Test fails if the janitor goroutine were still running.
	})
}

func TestAllOrNothingRollsBackEveryKind(t *testing.T) {
	s, _ := newStore(t, Options{JanitorInterval: -1})
	log := &ratelimit.Rule{Name: "log", Algorithm: ratelimit.SlidingLog, Quota: 3, Period: time.Second}
	gcra := &ratelimit.Rule{Name: "gcra", Quota: 3, Period: time.Second}
	tight := &ratelimit.Rule{Name: "tight", Algorithm: ratelimit.FixedWindow, Quota: 1, Period: time.Second}
	decide(t, s, ratelimit.Item{Key: "log", Rule: log, Cost: 1})
	decide(t, s, ratelimit.Item{Key: "tight", Rule: tight, Cost: 1})
	before, _ := s.State("log")

	ds := decide(t, s,
		ratelimit.Item{Key: "log", Rule: log, Cost: 1},
		ratelimit.Item{Key: "fresh", Rule: gcra, Cost: 2},
		ratelimit.Item{Key: "tight", Rule: tight, Cost: 1},
		ratelimit.Item{Key: "after", Rule: gcra, Cost: 1},
	)
	if ratelimit.Allowed(ds) {
		t.Fatal("request allowed although tight is exhausted")
	}
	want := []struct {
		allowed   bool
		remaining int64
	}{{true, 2}, {true, 3}, {false, 0}, {true, 3}}
	for i, w := range want {
		if ds[i].Allowed != w.allowed || ds[i].Remaining != w.remaining {
			t.Errorf("item %d: allowed %v remaining %d, want %v %d", i, ds[i].Allowed, ds[i].Remaining, w.allowed, w.remaining)
		}
	}
	after, _ := s.State("log")
	if len(after.Log) != len(before.Log) || after.N != before.N {
		t.Errorf("sliding log changed by a denied request: %+v → %+v", before, after)
	}
	if _, ok := s.State("fresh"); ok {
		t.Error("a key created by a denied request was kept")
	}
}

func TestAllOrNothingSameKeyTwice(t *testing.T) {
	s, _ := newStore(t, Options{JanitorInterval: -1})
	r := &ratelimit.Rule{Name: "r", Algorithm: ratelimit.SlidingLog, Quota: 3, Period: time.Second}
	ds := decide(t, s, ratelimit.Item{Key: "k", Rule: r, Cost: 2}, ratelimit.Item{Key: "k", Rule: r, Cost: 2})
	if ratelimit.Allowed(ds) {
		t.Fatalf("2+2 admitted on one key of capacity 3: %+v", ds)
	}
	if ds[1].Allowed || ds[1].Reason != ratelimit.ReasonLimited {
		t.Errorf("second item: %+v, want limited", ds[1])
	}
	if d := decide(t, s, ratelimit.Item{Key: "k", Rule: r, Cost: 3})[0]; !d.Allowed {
		t.Errorf("the denied request consumed capacity: %+v", d)
	}
}

func TestConcurrentOneKeyExact(t *testing.T) {
	s, _ := newStore(t, Options{JanitorInterval: -1})
	r := &ratelimit.Rule{Quota: 1000, Period: time.Hour}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 8 {
		wg.Go(func() {
			n := 0
			for range 500 {
				ds, _ := s.Decide(context.Background(), nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}})
				if ds[0].Allowed {
					n++
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if admitted != 1000 {
		t.Fatalf("admitted %d of 4000 at one instant, want exactly 1000", admitted)
	}
}

func TestInvalidRule(t *testing.T) {
	s, _ := newStore(t, Options{JanitorInterval: -1})
	for _, it := range []ratelimit.Item{
		{Key: "nil"},
		{Key: "noperiod", Rule: &ratelimit.Rule{Quota: 1}},
		{Key: "negative", Rule: &ratelimit.Rule{Quota: -1, Period: time.Second}},
	} {
		if _, err := s.Decide(context.Background(), nil, []ratelimit.Item{it}); err == nil {
			t.Errorf("%s: no error", it.Key)
		}
	}
}

func TestNoAllocationOnExistingKey(t *testing.T) {
	s, _ := newStore(t, Options{JanitorInterval: -1})
	r := &ratelimit.Rule{Quota: 1 << 30, Period: time.Second}
	items := []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}
	dst := make([]ratelimit.Decision, 0, 1)
	ctx := context.Background()
	s.Decide(ctx, dst, items)
	if n := testing.AllocsPerRun(1000, func() { s.Decide(ctx, dst[:0], items) }); n != 0 {
		t.Fatalf("%v allocations per decision on an existing key", n)
	}
}

// TestDecideAt: DecideAt decides at the instant it is given, not at the
// store's clock, which Now reads and Decide uses.
func TestDecideAt(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := t0.Add(time.Hour)
	s := New(Options{JanitorInterval: -1, Now: func() time.Time { return clock }})
	defer s.Close()
	if got := s.Now(); !got.Equal(clock) {
		t.Fatalf("Now = %v, want the store's clock %v", got, clock)
	}
	rule := &ratelimit.Rule{Name: "one", Quota: 1, Period: time.Second}
	items := []ratelimit.Item{{Key: "k", Rule: rule, Cost: 1}}
	for _, step := range []struct {
		at    time.Time
		allow bool
	}{
		{t0, true},
		{t0, false},
		{t0.Add(999 * time.Millisecond), false},
		{t0.Add(time.Second), true},
	} {
		ds, err := s.DecideAt(t.Context(), step.at, nil, items)
		if err != nil || len(ds) != 1 || ds[0].Allowed != step.allow {
			t.Fatalf("DecideAt(%v) = %+v, %v; want allowed %v", step.at.Sub(t0), ds, err, step.allow)
		}
	}
	// The store's clock is an hour on: Decide finds the key whole again.
	if ds, err := s.Decide(t.Context(), nil, items); err != nil || !ds[0].Allowed || ds[0].Remaining != 0 {
		t.Errorf("Decide at the store's clock = %+v, %v; want one admitted, none remaining", ds, err)
	}
}
