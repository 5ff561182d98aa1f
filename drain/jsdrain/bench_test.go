package jsdrain_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/draintest"
	"github.com/sluicehq/sluice/drain/jsdrain"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/ratelimit"
)

// BenchmarkRate drains for 10 s at 2,000/s and 20,000/s into a sink that
// does nothing, the server in its own process, and reports the rate
// achieved and its error against the target. Run with -benchtime=1x.
func BenchmarkRate(b *testing.B) {
	for _, rate := range []int{2000, 20000} {
		b.Run(fmt.Sprint(rate), func(b *testing.B) {
			const over = 10 * time.Second
			c := natstest.StartCluster(b, 1)
			_, js := queue(b, c.URLs(), 1)
			n := rate * int(over/time.Second) * 12 / 10
			enqueue(b, js, "work.a", 0, n, 1)
			for b.Loop() {
				src := source(b, js, fmt.Sprint("rate", rate, "-", time.Now().UnixNano()), "", 0)
				var done atomic.Int64
				d := newDrainer(b, drain.Options{
					Inputs:  []drain.Input{{Source: src}},
					Sink:    func(context.Context, drain.Message) error { done.Add(1); return nil },
					Limiter: ratelimit.NewLimiter(ratelimit.Limit(rate), max(1, rate/100)),
					Logger:  slog.New(slog.DiscardHandler),
				})
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				begin := time.Now()
				go func() { errc <- d.Run(ctx) }()
				tm := time.NewTimer(over)
				<-tm.C
				got := done.Load()
				took := time.Since(begin)
				cancel()
				<-errc
				achieved := float64(got) / took.Seconds()
				b.ReportMetric(achieved, "msgs/s")
				b.ReportMetric(100*(achieved-float64(rate))/float64(rate), "err%")
			}
		})
	}
}

// BenchmarkCost drains b.N messages as fast as possible, with no limiter,
// through the Drainer and through a plain JetStream pull-and-ack loop,
// the server in its own process, and reports this process's CPU time per
// message and the rate.
func BenchmarkCost(b *testing.B) {
	run := func(b *testing.B, drainIt func(b *testing.B, js jetstream.JetStream, n int)) {
		c := natstest.StartCluster(b, 1)
		_, js := queue(b, c.URLs(), 1)
		n := b.N
		enqueue(b, js, "work.a", 0, n, 1)
		b.ResetTimer()
		cpu0, begin := draintest.CPUTime(b), time.Now()
		drainIt(b, js, n)
		cpu, took := draintest.CPUTime(b)-cpu0, time.Since(begin)
		b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/msg")
		b.ReportMetric(float64(n)/took.Seconds(), "msgs/s")
	}
	b.Run("drainer", func(b *testing.B) {
		run(b, func(b *testing.B, js jetstream.JetStream, n int) {
			src := source(b, js, "cost", "", 0)
			var done atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			d := newDrainer(b, drain.Options{
				Inputs: []drain.Input{{Source: src}},
				Sink: func(context.Context, drain.Message) error {
					if done.Add(1) == int64(n) {
						cancel()
					}
					return nil
				},
				Logger: slog.New(slog.DiscardHandler),
			})
			if err := d.Run(ctx); err != nil {
				b.Fatal(err)
			}
		})
	})
	// The bare loops: a continuous pull (Messages) with plain acks, the
	// least a consumer can do; the same with acknowledgements confirmed as
	// the Source confirms them, in groups (plain acks, the group's last a
	// double ack, whose answer confirms the rest), a group of
	// confirmGroup; and with a double ack of each message.
	bare := func(confirmEvery int) func(b *testing.B, js jetstream.JetStream, n int) {
		return func(b *testing.B, js jetstream.JetStream, n int) {
			ctx := context.Background()
			cons, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{
				Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: jsdrain.DefaultWindow,
			})
			if err != nil {
				b.Fatal(err)
			}
			it, err := cons.Messages(jetstream.PullMaxMessages(jsdrain.DefaultWindow))
			if err != nil {
				b.Fatal(err)
			}
			defer it.Stop()
			for i := range n {
				m, err := it.Next()
				if err != nil {
					b.Fatal(err)
				}
				if confirmEvery > 0 && ((i+1)%confirmEvery == 0 || i == n-1) {
					err = m.DoubleAck(ctx)
				} else {
					err = m.Ack()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("pull-ack", func(b *testing.B) { run(b, bare(0)) })
	b.Run("fetch-ack", func(b *testing.B) {
		run(b, func(b *testing.B, js jetstream.JetStream, n int) {
			ctx := context.Background()
			cons, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{
				Durable: "fetch", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: jsdrain.DefaultWindow,
			})
			if err != nil {
				b.Fatal(err)
			}
			for got := 0; got < n; {
				batch, err := cons.Fetch(jsdrain.DefaultWindow/2, jetstream.FetchMaxWait(5*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				for m := range batch.Messages() {
					if err := m.Ack(); err != nil {
						b.Fatal(err)
					}
					got++
				}
			}
		})
	})
	b.Run("pull-ack-confirmed", func(b *testing.B) { run(b, bare(confirmGroup)) })
	b.Run("pull-doubleack", func(b *testing.B) { run(b, bare(1)) })
}

// confirmGroup is the bare loop's group of acknowledgements confirmed by
// one double ack. The Source's groups are every acknowledgement asked for
// while the last group's confirmation is on its way: about 94 on average
// in BenchmarkCost/drainer (1,062 groups for 100,000 messages, counted
// once), so 64 asks no less of the bare loop.
const confirmGroup = 64
