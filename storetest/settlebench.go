package storetest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// BenchSettle measures, on s and its ledger l, what a reservation with
// settlement costs beside a plain decision, with 8 callers per GOMAXPROCS
// (b.RunParallel), each on a key of its own, on a GCRA rule that never
// denies:
//
//   - decide: one Decide of cost 10, the baseline;
//   - reserve: ratelimit.Reservations.Reserve of 10 (a decision and a
//     record kept);
//   - reserve+settle: Reserve of 10, then Settle at 5 (a record taken and
//     a refund decided): the whole life of one reservation.
//
// Stores run it from their own benchmarks.
func BenchSettle(b *testing.B, s ratelimit.Store, l ratelimit.Ledger) {
	r := &ratelimit.Rule{Name: "bench", Quota: 1 << 40, Period: time.Hour}
	rs := &ratelimit.Reservations{Store: s, Ledger: l}
	var worker atomic.Int64
	run := func(name string, op func(ctx context.Context, items []ratelimit.Item) error) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				items := []ratelimit.Item{{Key: fmt.Sprint("bench/", worker.Add(1)), Rule: r, Cost: 10}}
				ctx := context.Background()
				for pb.Next() {
					if err := op(ctx, items); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
	run("decide", func(ctx context.Context, items []ratelimit.Item) error {
		ds, err := s.Decide(ctx, nil, items)
		if err == nil && !ds[0].Allowed {
			err = fmt.Errorf("denied: %+v", ds[0])
		}
		return err
	})
	reserve := func(ctx context.Context, items []ratelimit.Item) (string, error) {
		id, ds, err := rs.Reserve(ctx, nil, items)
		if err == nil && id == "" {
			err = fmt.Errorf("denied: %+v", ds)
		}
		return id, err
	}
	run("reserve", func(ctx context.Context, items []ratelimit.Item) error {
		_, err := reserve(ctx, items)
		return err
	})
	run("reserve+settle", func(ctx context.Context, items []ratelimit.Item) error {
		id, err := reserve(ctx, items)
		if err != nil {
			return err
		}
		_, err = rs.Settle(ctx, id, func(int, *ratelimit.Reserved) (int64, error) { return 5, nil })
		return err
	})
}
