package adaptive

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// BenchmarkAcquireDone measures Acquire + Done on a Concurrency with room,
// from one goroutine and from parallel ones, and TryAcquireAt + DoneAt.
func BenchmarkAcquireDone(b *testing.B) {
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		l, _ := NewConcurrency(ConcurrencyOptions{Max: 1 << 20, Initial: 1 << 20})
		b.ReportAllocs()
		for b.Loop() {
			p, err := l.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			p.Done()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		l, _ := NewConcurrency(ConcurrencyOptions{Max: 1 << 20, Initial: 1 << 20})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, err := l.Acquire(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				p.Done()
			}
		})
	})
	b.Run("guard-at", func(b *testing.B) {
		g, _ := NewGuard(GuardOptions{Concurrency: ConcurrencyOptions{Max: 1 << 20, Initial: 1 << 20},
			Shedder: &ShedderOptions{Objective: Objective{Latency: time.Second}}})
		now := time.Now()
		b.ReportAllocs()
		for b.Loop() {
			p, _ := g.TryAcquireAt(now, priority.Normal)
			p.DoneAt(now)
		}
	})
}
