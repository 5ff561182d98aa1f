package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// BenchmarkDecide measures one decision on an existing key, single-threaded,
// at a fixed instant, for every algorithm.
func BenchmarkDecide(b *testing.B) {
	fixed := time.Unix(1_800_000_000, 0)
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.FixedWindow, ratelimit.SlidingLog, ratelimit.SlidingWindow, ratelimit.LeakyBucket} {
		r := &ratelimit.Rule{Name: "b", Algorithm: alg, Quota: 1 << 16, Period: time.Nanosecond << 15} // twice the rate the loop asks for
		b.Run(alg.String(), func(b *testing.B) {
			now := fixed
			s := New(Options{Now: func() time.Time { return now }, JanitorInterval: -1})
			defer s.Close()
			items := []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}
			dst := make([]ratelimit.Decision, 0, 1)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Nanosecond) // refills exactly one unit: never denied
				dst, _ = s.Decide(ctx, dst[:0], items)
			}
			if !dst[0].Allowed {
				b.Fatal("denied")
			}
		})
	}
}

// BenchmarkAlgorithm measures the pure decision functions, without a store.
func BenchmarkAlgorithm(b *testing.B) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.FixedWindow, ratelimit.SlidingLog, ratelimit.SlidingWindow, ratelimit.LeakyBucket} {
		r := &ratelimit.Rule{Name: "b", Algorithm: alg, Quota: 1 << 16, Period: time.Nanosecond << 15} // twice the rate the loop asks for
		b.Run(alg.String(), func(b *testing.B) {
			var st ratelimit.State
			now := time.Unix(1_800_000_000, 0)
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Nanosecond)
				if d := r.Decide(&st, now, 1); !d.Allowed {
					b.Fatal("denied")
				}
			}
		})
	}
}

func BenchmarkDecideMany(b *testing.B) {
	r := &ratelimit.Rule{Name: "b", Quota: 1 << 30, Period: time.Second}
	s := New(Options{JanitorInterval: -1})
	defer s.Close()
	var items []ratelimit.Item
	for i := range 3 {
		items = append(items, ratelimit.Item{Key: fmt.Sprint("k", i), Rule: r, Cost: 1})
	}
	dst := make([]ratelimit.Decision, 0, 3)
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = s.Decide(context.Background(), dst[:0], items)
	}
}

// BenchmarkDecideNewKey measures one decision on a new key in a full store
// (1,024 keys, 8 in each of 128 shards), which makes room by evicting one
// of the sampled keys: the path a flood of fresh keys takes. The only
// allocation is the new key's entry.
func BenchmarkDecideNewKey(b *testing.B) {
	keys := make([]string, 1<<16) // far more than the store holds: every key is new again when it comes back
	for i := range keys {
		keys[i] = fmt.Sprint("flood:", i)
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.FixedWindow} {
		r := &ratelimit.Rule{Name: "b", Algorithm: alg, Quota: 10, Period: time.Hour}
		b.Run(alg.String(), func(b *testing.B) {
			now := time.Unix(1_800_000_000, 0).Truncate(time.Hour)
			s := New(Options{MaxKeys: 1024, Shards: 128, Now: func() time.Time { return now }, JanitorInterval: -1})
			defer s.Close()
			items := []ratelimit.Item{{Rule: r, Cost: 1}}
			dst := make([]ratelimit.Decision, 0, 1)
			ctx := context.Background()
			for i := range 4096 { // fill the store
				items[0].Key = keys[i]
				s.Decide(ctx, dst[:0], items)
			}
			i := 4096
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Nanosecond)
				items[0].Key = keys[i%len(keys)]
				i++
				dst, _ = s.Decide(ctx, dst[:0], items)
			}
		})
	}
}

// BenchmarkSettle: storetest.BenchSettle on a memory store with the
// default bound of its ledger, which the benchmark fills (then each new
// record forgets the oldest).
func BenchmarkSettle(b *testing.B) {
	s := New(Options{JanitorInterval: -1})
	defer s.Close()
	storetest.BenchSettle(b, s, s)
}
