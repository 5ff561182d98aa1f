package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
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
