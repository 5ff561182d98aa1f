package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// BenchmarkDecide measures one GCRA decision on a local redis-server, with
// 8 callers per GOMAXPROCS, coalesced and not. See bench/redisload for
// latency percentiles and the comparison with redis_rate.
func BenchmarkDecide(b *testing.B) {
	srv := redistest.Standalone(b)
	r := &ratelimit.Rule{Name: "b", Quota: 1 << 30, Period: time.Second}
	for _, bc := range []struct {
		name       string
		noCoalesce bool
	}{{"coalesce", false}, {"direct", true}} {
		b.Run(bc.name, func(b *testing.B) {
			s := newTestStore(b, []string{srv.Addr()}, nil, func(o *testConfig) { o.NoCoalesce = bc.noCoalesce })
			var worker atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				items := []ratelimit.Item{{Key: fmt.Sprint("k", worker.Add(1)), Rule: r, Cost: 1}}
				ds := make([]ratelimit.Decision, 0, 1)
				var err error
				for pb.Next() {
					if ds, err = s.Decide(context.Background(), ds[:0], items); err != nil || ds[0].Reason != ratelimit.ReasonOK {
						b.Fatalf("%v %+v", err, ds)
					}
				}
			})
		})
	}
}

// BenchmarkBuild measures what Decide does before it calls Redis: check the
// items' rules and encode the request's KEYS and ARGV. No server is
// contacted.
func BenchmarkBuild(b *testing.B) {
	s, err := New(nopClient(b), Options{NoCoalesce: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	gcra := &ratelimit.Rule{Name: "gcra", Quota: 100, Period: time.Second}
	fixed := &ratelimit.Rule{Name: "fixed", Algorithm: ratelimit.FixedWindow, Quota: 100, Period: time.Minute}
	log := &ratelimit.Rule{Name: "log", Algorithm: ratelimit.SlidingLog, Quota: 10, Period: time.Second}
	for _, bc := range []struct {
		name  string
		items []ratelimit.Item
	}{
		{"1item", []ratelimit.Item{{Key: "{t}a", Rule: gcra, Cost: 1}}},
		{"3items", []ratelimit.Item{{Key: "{t}a", Rule: gcra, Cost: 1}, {Key: "{t}b", Rule: fixed, Cost: 1}, {Key: "{t}c", Rule: log, Cost: 1}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, err := s.build(bc.items)
				if err != nil {
					b.Fatal(err)
				}
				req.release()
			}
		})
	}
}

// BenchmarkDecideCounted measures one decision of a batched or approximate
// rule, decided in process (8 callers per GOMAXPROCS on 64 keys), with the
// reconciler and the leases running against a local redis-server.
func BenchmarkDecideCounted(b *testing.B) {
	srv := redistest.Standalone(b)
	for _, counting := range []ratelimit.Counting{ratelimit.Batched, ratelimit.Approximate} {
		r := &ratelimit.Rule{Name: "b", Quota: 1 << 30, Period: time.Second, Counting: counting}
		b.Run(counting.String(), func(b *testing.B) {
			s := newTestStore(b, []string{srv.Addr()}, nil, nil)
			var worker atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				items := []ratelimit.Item{{Key: fmt.Sprint("k", worker.Add(1)%64), Rule: r, Cost: 1}}
				ds := make([]ratelimit.Decision, 0, 1)
				var err error
				for pb.Next() {
					if ds, err = s.Decide(context.Background(), ds[:0], items); err != nil || !ds[0].Allowed {
						b.Fatalf("%v %+v", err, ds)
					}
				}
			})
		})
	}
}

// BenchmarkReconcile measures one reconciliation that sends the hits of
// 1,000 approximate keys (a flush: none kept back), in script calls of
// many keys, in a pipeline to a local redis-server.
func BenchmarkReconcile(b *testing.B) {
	srv := redistest.Standalone(b)
	s := newTestStore(b, []string{srv.Addr()}, nil, func(o *testConfig) { o.ReconcileInterval = time.Hour })
	r := &ratelimit.Rule{Name: "r", Quota: 1000, Period: time.Second, Counting: ratelimit.Approximate}
	items := make([]ratelimit.Item, 1000)
	for i := range items {
		items[i] = ratelimit.Item{Key: fmt.Sprint("k", i), Rule: r, Cost: 1}
	}
	touch := func() {
		for i := range items {
			if _, err := s.Decide(context.Background(), nil, items[i:i+1]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		touch()
		b.StartTimer()
		s.counting.approximate.flush()
	}
}

// BenchmarkSettle: storetest.BenchSettle on a local redis-server.
func BenchmarkSettle(b *testing.B) {
	srv := redistest.Standalone(b)
	s := newTestStore(b, []string{srv.Addr()}, nil, nil)
	storetest.BenchSettle(b, s, s)
}

// BenchmarkDecideCluster measures one decision on a three-master Cluster of
// local redis-servers (8 callers per GOMAXPROCS, each on a key of its own,
// the keys spread over the masters): a strict GCRA rule (coalesced, one
// pipeline per node, and the key's breaker found by its slot's master) and
// an approximate one (decided in process; the view is used unless its
// node's breaker is open).
func BenchmarkDecideCluster(b *testing.B) {
	cl := redistest.Cluster(b)
	for _, counting := range []ratelimit.Counting{ratelimit.Strict, ratelimit.Approximate} {
		r := &ratelimit.Rule{Name: "b", Quota: 1 << 30, Period: time.Second, Counting: counting}
		b.Run(counting.String(), func(b *testing.B) {
			s := newTestStore(b, cl.Addrs(), nil, nil)
			var worker atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				items := []ratelimit.Item{{Key: fmt.Sprint("k", worker.Add(1)), Rule: r, Cost: 1}}
				ds := make([]ratelimit.Decision, 0, 1)
				var err error
				for pb.Next() {
					if ds, err = s.Decide(context.Background(), ds[:0], items); err != nil || !ds[0].Allowed {
						b.Fatalf("%v %+v", err, ds)
					}
				}
			})
		})
	}
}

// BenchmarkBreakerFor measures finding the breaker of a decision's key: a
// standalone server's (its one breaker) and a Cluster master's (the
// slot's master from go-redis's slot table, then the map of breakers).
func BenchmarkBreakerFor(b *testing.B) {
	srv, cl := redistest.Standalone(b), redistest.Cluster(b)
	for _, bc := range []struct {
		name  string
		addrs []string
	}{{"standalone", []string{srv.Addr()}}, {"cluster", cl.Addrs()}} {
		b.Run(bc.name, func(b *testing.B) {
			s := newTestStore(b, bc.addrs, nil, nil)
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = s.redisKey(fmt.Sprint("k", i))
				s.brks.forKey(context.Background(), keys[i]) // the slot table loaded, the breakers made
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if s.brks.forKey(context.Background(), keys[i%len(keys)]) == nil {
					b.Fatal("no breaker")
				}
				i++
			}
		})
	}
}
