package kafkadrain_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/draintest"
	"github.com/sluicehq/sluice/drain/kafkadrain"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkCost drains b.N records as fast as possible, with no limiter,
// through a Drainer on a Source and through a bare loop of a group member
// that polls and commits each poll's records, on the same kind of kfake
// cluster (in this process: the CPU time counted is the broker's too),
// and reports the CPU time per record and the rate.
func BenchmarkCost(b *testing.B) {
	run := func(b *testing.B, drainIt func(b *testing.B, c *cluster, n int)) {
		c := newCluster(b)
		n := b.N
		prod := c.producer(b)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		const chunk = 1000
		for i := 0; i < n; i += chunk {
			var recs []*kgo.Record
			for j := i; j < min(n, i+chunk); j++ {
				recs = append(recs, &kgo.Record{Topic: c.topic, Value: fmt.Appendf(nil, `{"n":%d}`, j),
					Headers: []kgo.RecordHeader{{Key: drain.IdempotencyKeyHeader, Value: []byte(key(j))}}})
			}
			if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				b.Fatal(err)
			}
		}
		// The producer's garbage is collected now, not in either loop's
		// time.
		runtime.GC()
		b.ReportAllocs()
		b.ResetTimer()
		cpu0, begin := draintest.CPUTime(b), time.Now()
		drainIt(b, c, n)
		cpu, took := draintest.CPUTime(b)-cpu0, time.Since(begin)
		b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/msg")
		b.ReportMetric(float64(n)/took.Seconds(), "msgs/s")
	}
	b.Run("drainer", func(b *testing.B) {
		run(b, func(b *testing.B, c *cluster, n int) {
			src := c.open(b, kafkadrain.Options{SessionTimeout: 10 * time.Second})
			var done atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			d, err := drain.New(drain.Options{
				Inputs: []drain.Input{{Source: src}},
				Sink: func(context.Context, drain.Message) error {
					if done.Add(1) == int64(n) {
						cancel()
					}
					return nil
				},
				Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Run(ctx); err != nil {
				b.Fatal(err)
			}
			cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer ccancel()
			if err := src.Close(cctx); err != nil { // the last commit
				b.Fatal(err)
			}
		})
	})
	b.Run("poll-commit", func(b *testing.B) {
		run(b, func(b *testing.B, c *cluster, n int) {
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.ConsumerGroup(c.group),
				kgo.ConsumeTopics(c.topic), kgo.DisableAutoCommit(),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			ctx := context.Background()
			for got := 0; got < n; {
				fs := cl.PollRecords(ctx, kafkadrain.DefaultWindow)
				if errs := fs.Errors(); len(errs) > 0 {
					b.Fatal(errs[0].Err)
				}
				recs := fs.Records()
				got += len(recs)
				if err := cl.CommitRecords(ctx, recs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
