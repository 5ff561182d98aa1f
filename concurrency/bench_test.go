package concurrency

import (
	"context"
	"strconv"
	"testing"
)

// BenchmarkSemaphore measures one Acquire and Release of a local semaphore
// by parallel goroutines, with room for all of them and with room for one.
func BenchmarkSemaphore(b *testing.B) {
	for _, size := range []int64{1 << 30, 1} {
		b.Run("size="+strconv.FormatInt(size, 10), func(b *testing.B) {
			s := NewSemaphore(size)
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := s.Acquire(ctx, 1); err != nil {
						b.Error(err)
						return
					}
					s.Release(1)
				}
			})
		})
	}
}

// BenchmarkSemaphoreTry measures TryAcquire and Release.
func BenchmarkSemaphoreTry(b *testing.B) {
	s := NewSemaphore(1 << 30)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if s.TryAcquire(1) {
				s.Release(1)
			}
		}
	})
}

// BenchmarkDistributedMemory measures a whole permit's life on the memory
// backend: acquire (token, validity timer, renewal goroutine) and release.
func BenchmarkDistributedMemory(b *testing.B) {
	d, err := NewDistributed(NewMemoryStore(), "bench", 1<<30, DistributedOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := d.TryAcquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			p.Release(ctx)
		}
	})
}
