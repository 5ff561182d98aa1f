package lease

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// benchHolder returns a holder with all partitions of a large capacity, so
// that the limiter's cost is measured, not its waits.
func benchHolder(b *testing.B) *Holder {
	b.Helper()
	h, err := NewHolder(NewMemoryStore(), Config{ID: "bench", Capacity: 1e9, Partitions: 20, TTL: time.Minute, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	h.SetBacklog(1 << 40)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }() //nolint:errcheck // benchmark
	b.Cleanup(func() { cancel(); <-done })
	for {
		// The first tick acquires every partition.
		h.mu.Lock()
		rate, changed := h.rate, h.changed
		h.mu.Unlock()
		if rate >= 1e9 {
			return h
		}
		<-changed
	}
}

func BenchmarkLimiterAllow(b *testing.B) {
	lim := benchHolder(b).Limiter()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			lim.Allow()
		}
	})
}

func BenchmarkLimiterWait(b *testing.B) {
	lim := benchHolder(b).Limiter()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := lim.Wait(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchCoordinator measures one period's store work of a holder of 10
// leases among 20: a heartbeat and a renewal.
func benchCoordinator(b *testing.B, c Store) {
	ctx := context.Background()
	parts := make([]int, 10)
	for i := range parts {
		parts[i] = i
	}
	gs, err := c.Acquire(ctx, "a", parts, time.Minute)
	if err != nil || len(gs) != 10 {
		b.Fatalf("acquire: %v %v", gs, err)
	}
	if _, err := c.Heartbeat(ctx, Member{ID: "b", Weight: 1, Want: 10}, time.Minute, 20); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Heartbeat(ctx, Member{ID: "a", Weight: 1, Want: 10}, time.Minute, 20); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Renew(ctx, "a", gs, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCoordinatorPeriod(b *testing.B) {
	b.Run("memory", func(b *testing.B) { benchCoordinator(b, NewMemoryStore()) })
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Standalone(b)
		r, err := NewRedis(srv.Client(), fmt.Sprint("bench-", time.Now().UnixNano()), RedisOptions{})
		if err != nil {
			b.Fatal(err)
		}
		benchCoordinator(b, r)
	})
}
