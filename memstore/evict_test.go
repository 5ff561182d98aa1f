package memstore

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestFloodKeepsExhaustedKeys is the attack, scaled to run in
// seconds: 50 fixed-window keys spend their limit, then a flood of fresh
// keys, each charged once, fills the store many times over. Every fixed-
// window key of one window expires at the same instant, so choosing the
// victim by expiry alone let the flood evict spent keys as readily as its
// own, and a spent key forgotten is a spent key reset. No spent key may
// lose its state while the flood's own keys are there to evict, and the
// store must stay within MaxKeys.
func TestFloodKeepsExhaustedKeys(t *testing.T) {
	const (
		maxKeys = 128
		spent   = 50
		flood   = 50_000
		limit   = 10
	)
	s, c := newStore(t, Options{MaxKeys: maxKeys, Shards: 2, JanitorInterval: -1})
	hourly := &ratelimit.Rule{Name: "hourly", Algorithm: ratelimit.FixedWindow, Quota: limit, Period: time.Hour}
	for i := range spent {
		for range limit {
			if d := decide(t, s, ratelimit.Item{Key: fmt.Sprint("spent", i), Rule: hourly, Cost: 1})[0]; !d.Allowed {
				t.Fatalf("spent%d denied within its limit", i)
			}
		}
	}
	for i := range flood {
		if i%1000 == 0 {
			c.Advance(time.Second) // the flood takes time, all within the window
		}
		decide(t, s, ratelimit.Item{Key: fmt.Sprint("flood", i), Rule: hourly, Cost: 1})
		if n := s.Stats().Keys; i%997 == 0 && n > maxKeys {
			t.Fatalf("after %d flood keys the store holds %d keys, bound %d", i+1, n, maxKeys)
		}
	}
	reset, extra := 0, 0
	for i := range spent {
		admitted := 0
		for range limit {
			if decide(t, s, ratelimit.Item{Key: fmt.Sprint("spent", i), Rule: hourly, Cost: 1})[0].Allowed {
				admitted++
			}
		}
		if admitted > 0 {
			reset++
			extra += admitted
		}
	}
	if reset > 0 {
		t.Errorf("the flood reset %d of %d spent keys, which then admitted %d requests over their limit", reset, spent, extra)
	}
	st := s.Stats()
	if st.Keys > maxKeys {
		t.Errorf("store holds %d keys, bound %d", st.Keys, maxKeys)
	}
	if st.Evictions == 0 {
		t.Error("the flood evicted nothing: the store was never full")
	}
	if st.EvictedExhausted != 0 {
		t.Errorf("%d exhausted keys evicted", st.EvictedExhausted)
	}
	// Every key forgotten was a flood key with 1 unit in use.
	if st.Evictions+st.Unkept != flood-(maxKeys-spent) || st.GaveBack != st.Evictions+st.Unkept {
		t.Errorf("stats %+v: want evictions + unkept = %d flood keys not held, each giving back 1", st, flood-(maxKeys-spent))
	}
	t.Logf("stats after the flood: %+v", st)
}

// TestEvictionWeighsWhatForgettingGivesBack: the victim is the key with the
// least share of its capacity in use, as it stands now (a bucket refills),
// and a new key is not kept rather than evict a key that has used a larger
// share than it.
func TestEvictionWeighsWhatForgettingGivesBack(t *testing.T) {
	s, c := newStore(t, Options{MaxKeys: 2, Shards: 1, JanitorInterval: -1})
	bucket := &ratelimit.Rule{Name: "bucket", Quota: 10, Period: 10 * time.Second}
	window := &ratelimit.Rule{Name: "window", Algorithm: ratelimit.FixedWindow, Quota: 10, Period: time.Hour}
	decide(t, s, ratelimit.Item{Key: "bucket", Rule: bucket, Cost: 10}) // all 10 in use, one back per second
	decide(t, s, ratelimit.Item{Key: "window", Rule: window, Cost: 5})  // 5 in use until the hour ends

	// 3 of 10 is less than either: not kept, and both keep their state.
	if d := decide(t, s, ratelimit.Item{Key: "a", Rule: window, Cost: 3})[0]; !d.Allowed {
		t.Fatalf("new key denied: %+v", d)
	}
	if _, ok := s.State("a"); ok {
		t.Error("a new key evicted a costlier one")
	}
	want := Stats{Keys: 2, Unkept: 1, GaveBack: 3}
	if st := s.Stats(); st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}

	// 8 s later the bucket has 2 of 10 in use, the window still 5: the
	// bucket goes, giving back 2.
	c.Advance(8 * time.Second)
	decide(t, s, ratelimit.Item{Key: "b", Rule: window, Cost: 3})
	if _, ok := s.State("bucket"); ok {
		t.Error("the bucket, cheapest to forget, was kept")
	}
	if _, ok := s.State("window"); !ok {
		t.Error("the window, 5 of 10 in use, was evicted for a key with 3")
	}
	want = Stats{Keys: 2, Evictions: 1, Unkept: 1, GaveBack: 3 + 2}
	if st := s.Stats(); st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}
}

// TestShardOfExhaustedKeys: in a shard that holds only exhausted keys, a
// new key charged part of its capacity is admitted but not kept; one that
// its own first request exhausts takes the place of one of them.
func TestShardOfExhaustedKeys(t *testing.T) {
	s, _ := newStore(t, Options{MaxKeys: 4, Shards: 1, JanitorInterval: -1})
	r := &ratelimit.Rule{Name: "r", Algorithm: ratelimit.FixedWindow, Quota: 2, Period: time.Hour}
	for i := range 4 {
		decide(t, s, ratelimit.Item{Key: fmt.Sprint("spent", i), Rule: r, Cost: 2})
	}
	for i := range 100 {
		if d := decide(t, s, ratelimit.Item{Key: fmt.Sprint("fresh", i), Rule: r, Cost: 1})[0]; !d.Allowed {
			t.Fatalf("fresh%d denied: %+v", i, d)
		}
	}
	for i := range 4 {
		if d := decide(t, s, ratelimit.Item{Key: fmt.Sprint("spent", i), Rule: r, Cost: 1})[0]; d.Allowed {
			t.Errorf("spent%d forgot its state", i)
		}
	}
	want := Stats{Keys: 4, Unkept: 100, GaveBack: 100}
	if st := s.Stats(); st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}
	decide(t, s, ratelimit.Item{Key: "greedy", Rule: r, Cost: 2})
	if _, ok := s.State("greedy"); !ok {
		t.Error("a new key exhausted by its first request was not kept")
	}
	want = Stats{Keys: 4, Evictions: 1, EvictedExhausted: 1, Unkept: 100, GaveBack: 102}
	if st := s.Stats(); st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}
}

// TestUnkeptKeyInManyItems: a request whose new key finds no room is still
// admitted and consumed on its other keys, all or nothing.
func TestUnkeptKeyInManyItems(t *testing.T) {
	s, _ := newStore(t, Options{MaxKeys: 2, Shards: 1, JanitorInterval: -1})
	r := &ratelimit.Rule{Name: "r", Algorithm: ratelimit.FixedWindow, Quota: 10, Period: time.Hour}
	decide(t, s, ratelimit.Item{Key: "spent", Rule: r, Cost: 10})
	decide(t, s, ratelimit.Item{Key: "live", Rule: r, Cost: 1})
	ds := decide(t, s, ratelimit.Item{Key: "live", Rule: r, Cost: 1}, ratelimit.Item{Key: "new", Rule: r, Cost: 1})
	if !ratelimit.Allowed(ds) {
		t.Fatalf("request denied: %+v", ds)
	}
	if _, ok := s.State("new"); ok {
		t.Error("the new key evicted the exhausted one (the other key, its own request's, may not be evicted)")
	}
	if d := decide(t, s, ratelimit.Item{Key: "live", Rule: r, Cost: 0})[0]; d.Remaining != 8 {
		t.Errorf("live has %d left, want 8", d.Remaining)
	}
	want := Stats{Keys: 2, Unkept: 1, GaveBack: 1}
	if st := s.Stats(); st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}
}

// TestBoundIsMaxKeys: the bound is MaxKeys itself, whether or not it is a
// multiple of the number of shards, and when it is smaller than that.
func TestBoundIsMaxKeys(t *testing.T) {
	for _, opts := range []Options{{MaxKeys: 10, Shards: 4}, {MaxKeys: 3, Shards: 128}, {MaxKeys: 1}} {
		s, _ := newStore(t, Options{MaxKeys: opts.MaxKeys, Shards: opts.Shards, JanitorInterval: -1})
		r := &ratelimit.Rule{Quota: 10, Period: time.Minute}
		for i := range 1000 {
			decide(t, s, ratelimit.Item{Key: fmt.Sprint("k", i), Rule: r, Cost: 1})
		}
		if st := s.Stats(); st.Keys != opts.MaxKeys {
			t.Errorf("MaxKeys %d, %d shards asked: %d keys held", opts.MaxKeys, opts.Shards, st.Keys)
		}
	}
}

// TestInUseIsWhatForgettingGivesBack: the share weighed for a key is, at
// any instant before it expires, exactly the capacity its state has in use
// for the buckets and the fixed window, and never less for the sliding
// algorithms.
func TestInUseIsWhatForgettingGivesBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.SlidingLog} {
		exact := alg != ratelimit.SlidingWindow && alg != ratelimit.SlidingLog
		for _, r := range []*ratelimit.Rule{
			{Algorithm: alg, Quota: 10, Period: 10 * time.Second},
			{Algorithm: alg, Quota: 7, Period: time.Minute},
			{Algorithm: alg, Quota: 1000, Period: time.Second},
		} {
			s, c := newStore(t, Options{JanitorInterval: -1})
			k := s.ref("k")
			for range 200 {
				c.Advance(time.Duration(rng.Int64N(int64(r.Period) / 4)))
				decide(t, s, ratelimit.Item{Key: "k", Rule: r, Cost: rng.Int64N(r.Quota/3 + 1)})
				e := s.shardOf(&k).get(&k)
				if e == nil {
					continue
				}
				st := e.state
				for range 5 {
					at := c.Now().Add(time.Duration(rng.Int64N(int64(2 * r.Period))))
					if at.UnixNano() >= e.expires {
						continue
					}
					want := r.Capacity() - r.Peek(&st, at, 0).Remaining
					got := e.inUse(at.UnixNano())
					if got.of != r.Capacity() || got.used < want || exact && got.used != want {
						t.Fatalf("%v %d/%v: %v in use at +%v, weighed %+v", alg, r.Quota, r.Period, want, at.Sub(c.Now()), got)
					}
				}
			}
		}
	}
}

// TestFloodMemoryBounded: the heap a flood leaves behind is the bound's,
// not the flood's. 300,000 new keys into a store bounded at 4,096 may grow
// the live heap by what 4,096 keys take (about 132 bytes each) and some
// slack, far less than the 40 MB the flood's keys would take if kept.
func TestFloodMemoryBounded(t *testing.T) {
	const (
		maxKeys = 4096
		flood   = 300_000
		bound   = 8 << 20 // bytes: 4,096 keys and their map are under 1 MB
	)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	s, _ := newStore(t, Options{MaxKeys: maxKeys, JanitorInterval: -1})
	hourly := &ratelimit.Rule{Name: "hourly", Algorithm: ratelimit.FixedWindow, Quota: 10, Period: time.Hour}
	before := heap()
	key := make([]byte, 0, 32)
	for i := range flood {
		key = fmt.Appendf(key[:0], "flood-key-%d", i)
		decide(t, s, ratelimit.Item{Key: string(key), Rule: hourly, Cost: 1})
	}
	after := heap()
	grew := int64(after) - int64(before)
	t.Logf("live heap %d bytes before a flood of %d keys, %d after (%+d)", before, flood, after, grew)
	if grew > bound {
		t.Errorf("a flood of %d keys into a store of %d grew the live heap by %d bytes, want at most %d", flood, maxKeys, grew, bound)
	}
	if n := s.Stats().Keys; n > maxKeys {
		t.Errorf("the store holds %d keys, bound %d", n, maxKeys)
	}
	runtime.KeepAlive(s)
}
