package topk

import (
	"fmt"
	"testing"
)

// BenchmarkObserve: one decision recorded, over keys that fit the sketch
// and over far more keys than it has counters.
func BenchmarkObserve(b *testing.B) {
	for _, n := range []int{100, 10_000, 1_000_000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("tenant:%d:user:%d", i%1000, i)
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			tr, _ := New(Options{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					tr.Observe(keys[i%len(keys)], &admitted)
					i++
				}
			})
		})
	}
}
