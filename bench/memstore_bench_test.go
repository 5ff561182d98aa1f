package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// The baseline: what most Go services write by hand, a mutex-guarded map of
// x/time/rate limiters, one per key.
type rateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (r *rateMap) allow(key string, now time.Time) bool {
	r.mu.Lock()
	l := r.m[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(1e6), 1<<40)
		r.m[key] = l
	}
	r.mu.Unlock()
	return l.AllowN(now, 1)
}

var (
	keysOnce sync.Once
	keys     []string
)

func benchKeys(n int) []string {
	keysOnce.Do(func() {
		keys = make([]string, 1_000_000)
		for i := range keys {
			keys[i] = fmt.Sprintf("tenant:%d:user:%d", i%1000, i)
		}
	})
	return keys[:n]
}

// A rule whose burst no benchmark can exhaust, even at a fixed instant, so
// that every call does the full work of an admission (x/time/rate gets the
// same rate and burst).
var benchRule = ratelimit.Rule{Name: "bench", Quota: 1e6, Period: time.Second, Burst: 1 << 40}

func fixedNow() time.Time { return time.Unix(1_800_000_000, 0) }

// nextKey returns the next key of a goroutine's walk over the key set: in
// order from its own starting point (the keys' memory is read in order, as a
// request's key would be at hand, so only the stores' own lookups are
// random), or at random (every key read is also a cache miss, the same for
// both stores, which dilutes the difference between them).
func nextKey(x *uint64, ks []string, random bool) string {
	if random {
		*x ^= *x << 13
		*x ^= *x >> 7
		*x ^= *x << 17
	} else {
		*x++
	}
	return ks[*x%uint64(len(ks))]
}

var seedCounter atomic.Uint64

func BenchmarkKeyed(b *testing.B) {
	for _, kc := range []struct {
		n     int
		order string
	}{{1, "same"}, {1_000_000, "seq"}, {1_000_000, "random"}} {
		nkeys, random := kc.n, kc.order == "random"
		ks := benchKeys(nkeys)
		for _, clockName := range []string{"fixed", "time.Now"} {
			now := fixedNow
			if clockName == "time.Now" {
				now = time.Now
			}
			b.Run(fmt.Sprintf("keys=%d/order=%s/clock=%s/impl=sluice-memstore", nkeys, kc.order, clockName), func(b *testing.B) {
				s := memstore.New(memstore.Options{Now: now, MaxKeys: 2_000_000, JanitorInterval: -1})
				defer s.Close()
				for _, k := range ks { // existing keys: measure decisions, not inserts
					s.Decide(context.Background(), nil, []ratelimit.Item{{Key: k, Rule: &benchRule, Cost: 1}})
				}
				benchParallel(b, ks, random, func(key string, items []ratelimit.Item, dst []ratelimit.Decision) bool {
					items[0].Key = key
					dst, _ = s.Decide(context.Background(), dst[:0], items)
					return dst[0].Allowed
				})
			})
			b.Run(fmt.Sprintf("keys=%d/order=%s/clock=%s/impl=xrate-mutex-map", nkeys, kc.order, clockName), func(b *testing.B) {
				m := &rateMap{m: make(map[string]*rate.Limiter, nkeys)}
				for _, k := range ks {
					m.allow(k, now())
				}
				benchParallel(b, ks, random, func(key string, _ []ratelimit.Item, _ []ratelimit.Decision) bool {
					return m.allow(key, now())
				})
			})
		}
	}
}

// benchParallel runs decide over ks from GOMAXPROCS goroutines.
func benchParallel(b *testing.B, ks []string, random bool, decide func(string, []ratelimit.Item, []ratelimit.Decision) bool) {
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		x := seedCounter.Add(uint64(len(ks))/7 + 1)
		items := []ratelimit.Item{{Rule: &benchRule, Cost: 1}}
		dst := make([]ratelimit.Decision, 0, 1)
		denied := 0
		for pb.Next() {
			if !decide(nextKey(&x, ks, random), items, dst) {
				denied++
			}
		}
		deniedTotal.Add(int64(denied))
	})
	b.ReportMetric(float64(deniedTotal.Swap(0))/float64(b.N), "denied/op")
}

var deniedTotal atomic.Int64

// BenchmarkFlood is the key-flood attack at full size: 50 keys spend their
// limit (10 an hour), then 2,000,000 fresh keys, each charged once on the
// same rule, go through a store that holds 1,024 keys (8 in each of 128
// shards), on a clock that moves 1 µs per flood key, all within one hour.
// It reports how many of the 50 spent keys the flood reset ("reset"), how
// many requests they then admitted over their limit when each asked 10
// more ("over-limit"), the keys held at the end and the time per flood
// decision (key formatting included). Run it with -benchtime 1x: one
// iteration is a whole flood.
func BenchmarkFlood(b *testing.B) {
	const (
		spent   = 50
		flood   = 2_000_000
		limit   = 10
		maxKeys = 1024
	)
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.GCRA} {
		b.Run(alg.String(), func(b *testing.B) {
			r := &ratelimit.Rule{Name: "hourly", Algorithm: alg, Quota: limit, Period: time.Hour}
			ctx := context.Background()
			var reset, over, held, evictions int
			for b.Loop() {
				now := time.Unix(1_800_000_000, 0).Truncate(time.Hour)
				s := memstore.New(memstore.Options{MaxKeys: maxKeys, Shards: 128, Now: func() time.Time { return now }, JanitorInterval: -1})
				items := []ratelimit.Item{{Rule: r, Cost: 1}}
				dst := make([]ratelimit.Decision, 0, 1)
				admitted := func(key string) bool {
					items[0].Key = key
					dst, _ = s.Decide(ctx, dst[:0], items)
					return dst[0].Allowed
				}
				for i := range spent {
					for range limit {
						admitted(fmt.Sprint("spent:", i))
					}
				}
				for i := range flood {
					now = now.Add(time.Microsecond)
					admitted(fmt.Sprint("flood:", i))
				}
				for i := range spent {
					n := 0
					for range limit {
						if admitted(fmt.Sprint("spent:", i)) {
							n++
						}
					}
					if n > 0 {
						reset++
						over += n
					}
				}
				st := s.Stats()
				held += st.Keys
				evictions += int(st.Evictions)
				s.Close()
			}
			n := float64(b.N)
			b.ReportMetric(float64(reset)/n, "reset")
			b.ReportMetric(float64(over)/n, "over-limit")
			b.ReportMetric(float64(held)/n, "keys")
			b.ReportMetric(float64(evictions)/n, "evictions")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n/flood, "ns/flood-key")
		})
	}
}
