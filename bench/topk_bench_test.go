package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/topk"
)

// BenchmarkTopK measures what the top-K trackers add to a decision, top
// off against top on in the same run: a memory store decision alone
// (Decide, then Observe), and the middleware (one policy by client IP,
// memstore, RateLimit fields), admitted and denied, over 10,000 keys
// and, for the store, a million (far more keys than the sketch has
// counters: every decision of a new key takes a counter over).
func BenchmarkTopK(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		ks := benchKeys(n)
		for _, top := range []bool{false, true} {
			b.Run(fmt.Sprintf("memstore/keys=%d/top=%v", n, top), func(b *testing.B) {
				store := memstore.New(memstore.Options{JanitorInterval: -1, MaxKeys: 2 * n})
				defer store.Close()
				var tr *topk.Tracker
				if top {
					tr, _ = topk.New(topk.Options{})
				}
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					x := seedCounter.Add(7919) * 104729
					items := []ratelimit.Item{{Rule: &benchRule, Cost: 1}}
					ds := make([]ratelimit.Decision, 0, 1)
					for pb.Next() {
						items[0].Key = nextKey(&x, ks, false)
						var err error
						if ds, err = store.Decide(context.Background(), ds[:0], items); err != nil {
							b.Fatal(err)
						}
						if tr != nil {
							tr.Observe(items[0].Key, &ds[0])
						}
					}
				})
			})
		}
	}
	addrs := make([]string, 10_000)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.%d.%d.%d:4000", i>>16, (i>>8)&255, i&255)
	}
	open := ratelimit.Rule{Name: "per_ip", Quota: 1e9, Period: 1e9, Burst: 1 << 40}
	closed := ratelimit.Rule{Name: "per_ip", Quota: 1, Period: 3600e9}
	for _, c := range []struct {
		name string
		rule ratelimit.Rule
	}{{"allowed", open}, {"denied", closed}} {
		for _, top := range []bool{false, true} {
			b.Run(fmt.Sprintf("middleware/%s/top=%v", c.name, top), func(b *testing.B) {
				store := memstore.New(memstore.Options{JanitorInterval: -1})
				defer store.Close()
				cfg := httplimit.Options{Store: store, Policies: []httplimit.Policy{{Rule: c.rule, Keys: []httplimit.Key{httplimit.ByIP()}}}}
				if top {
					cfg.Top = &topk.Options{}
				}
				m, err := httplimit.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				h := m.Handler(bareHandler)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					x := seedCounter.Add(7919) * 104729
					req := httptest.NewRequest("GET", "/items", nil)
					w := &discardWriter{h: make(http.Header)}
					for pb.Next() {
						req.RemoteAddr = nextKey(&x, addrs, false)
						clear(w.h)
						h.ServeHTTP(w, req)
					}
				})
			})
		}
	}
}

// BenchmarkTopKExtra measures the extra cost of the trackers paired: every
// goroutine alternates blocks of 128 decisions without and with a
// tracker, timing each block, so that a load that drifts on a shared
// machine falls on both alike. It reports the medians over the blocks of
// the time a decision takes without (ns-off/decision) and with
// (ns-on/decision) the tracker, and the median of the differences of
// adjacent blocks, ns-extra/decision: medians, so that a block that lost
// its core to another process or held a garbage collection's work does
// not weigh in (ns/op mixes the two).
func BenchmarkTopKExtra(b *testing.B) {
	const block = 128
	run := func(b *testing.B, decide func(x *uint64, top bool)) {
		var mu sync.Mutex
		var offs, ons, extras []float64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			x := seedCounter.Add(7919) * 104729
			var off, on, extra []float64
			for mode := 0; ; mode ^= 1 {
				start := time.Now()
				i := 0
				for ; i < block && pb.Next(); i++ {
					decide(&x, mode == 1)
				}
				if i < block {
					break
				}
				ns := float64(time.Since(start)) / block
				if mode == 0 {
					off = append(off, ns)
				} else {
					on = append(on, ns)
					extra = append(extra, ns-off[len(off)-1])
				}
			}
			mu.Lock()
			offs, ons, extras = append(offs, off...), append(ons, on...), append(extras, extra...)
			mu.Unlock()
		})
		if len(extras) == 0 {
			return
		}
		b.ReportMetric(median(offs), "ns-off/decision")
		b.ReportMetric(median(ons), "ns-on/decision")
		b.ReportMetric(median(extras), "ns-extra/decision")
	}
	for _, c := range []struct {
		name string
		ks   []string
	}{
		{"memstore/keys=10000", benchKeys(10_000)},
		{"memstore/keys=1000000", benchKeys(1_000_000)},
		{"memstore/zipf/keys=1000000", zipfStream(1_000_000, 1<<20)},
	} {
		ks, n := c.ks, len(c.ks)
		b.Run(c.name, func(b *testing.B) {
			store := memstore.New(memstore.Options{JanitorInterval: -1, MaxKeys: 2 * n})
			defer store.Close()
			tr, _ := topk.New(topk.Options{})
			run(b, func(x *uint64, top bool) {
				items := [1]ratelimit.Item{{Key: nextKey(x, ks, false), Rule: &benchRule, Cost: 1}}
				var dsa [1]ratelimit.Decision
				now := store.Now() // as sluice serve: one clock reading for both
				ds, err := store.DecideAt(context.Background(), now, dsa[:0], items[:])
				if err != nil {
					b.Fatal(err)
				}
				if top {
					tr.ObserveAt(now, items[0].Key, &ds[0])
				}
			})
		})
	}
	addrs := make([]string, 10_000)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.%d.%d.%d:4000", i>>16, (i>>8)&255, i&255)
	}
	for _, c := range []struct {
		name string
		rule ratelimit.Rule
	}{{"allowed", ratelimit.Rule{Name: "per_ip", Quota: 1e9, Period: 1e9, Burst: 1 << 40}}, {"denied", ratelimit.Rule{Name: "per_ip", Quota: 1, Period: 3600e9}}} {
		b.Run("middleware/"+c.name, func(b *testing.B) {
			// One store for both middlewares, so that the pair differs
			// in the tracker alone (two stores of 10,000 keys each, used
			// in alternate blocks, differ in where their data is cached).
			store := memstore.New(memstore.Options{JanitorInterval: -1})
			defer store.Close()
			var hs [2]http.Handler
			for i := range hs {
				cfg := httplimit.Options{Store: store, Policies: []httplimit.Policy{{Rule: c.rule, Keys: []httplimit.Key{httplimit.ByIP()}}}}
				if i == 1 {
					cfg.Top = &topk.Options{}
				}
				m, err := httplimit.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				hs[i] = m.Handler(bareHandler)
			}
			var pool sync.Pool
			pool.New = func() any {
				return &struct {
					req *http.Request
					w   *discardWriter
				}{httptest.NewRequest("GET", "/items", nil), &discardWriter{h: make(http.Header)}}
			}
			run(b, func(x *uint64, top bool) {
				rw := pool.Get().(*struct {
					req *http.Request
					w   *discardWriter
				})
				rw.req.RemoteAddr = nextKey(x, addrs, false)
				clear(rw.w.h)
				h := hs[0]
				if top {
					h = hs[1]
				}
				h.ServeHTTP(rw.w, rw.req)
				pool.Put(rw)
			})
		})
	}
}

// zipfStream returns n keys drawn from the first keys of benchKeys with a
// Zipf distribution (s = 1.1): a skewed stream, where most decisions are of
// keys the sketch tracks, as is typical of the traffic of many principals.
func zipfStream(keys, n int) []string {
	ks := benchKeys(keys)
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, uint64(keys-1))
	out := make([]string, n)
	for i := range out {
		out[i] = ks[z.Uint64()]
	}
	return out
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}
