package topk

import (
	"fmt"
	"testing"
)

// BenchmarkObserve: one decision recorded, over keys that fit the sketch
// (every key tracked), over far more keys than it has counters in turn
// (every decision takes a counter over: the worst case), and over a Zipf
// stream of a million keys (s = 1.2: most decisions are of tracked keys);
// with the default FullRate (at the benchmark's rate, sampled) and
// counting every decision (FullRate −1).
func BenchmarkObserve(b *testing.B) {
	for _, c := range []struct {
		name string
		keys []string
	}{
		{"fit/keys=100", seqKeys(100)},
		{"turnover/keys=10000", seqKeys(10_000)},
		{"turnover/keys=1000000", seqKeys(1_000_000)},
		{"zipf/keys=1000000", zipfKeys(9, 1_000_000, 1_000_000)},
	} {
		for _, every := range []bool{false, true} {
			name, opts := "sampled/"+c.name, Options{}
			if every {
				name, opts = "every/"+c.name, Options{FullRate: -1}
			}
			b.Run(name, func(b *testing.B) {
				tr, _ := New(opts)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						tr.Observe(c.keys[i%len(c.keys)], &admitted)
						i++
					}
				})
			})
		}
	}
}

func seqKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant:%d:user:%d", i%1000, i)
	}
	return keys
}
