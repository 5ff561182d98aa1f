package lease

import (
	"context"
	"testing"
	"time"
)

// benchHolder returns a holder with all partitions of a large capacity, so
// that the limiter's cost is measured, not its waits.
func benchHolder(b *testing.B) *Holder {
	b.Helper()
	h, err := NewHolder(NewMemoryStore(), Options{ID: "bench", Capacity: 1e9, Partitions: 20, TTL: time.Minute, Seed: 1})
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
		rate, changed := h.pace.rate, h.changed
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
