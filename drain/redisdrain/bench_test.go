package redisdrain_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/draintest"
	"github.com/sluicehq/sluice/drain/redisdrain"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// serverStats is the CPU time (user + system) the server has used and
// the commands it has run, from INFO cpu stats: its own count, which
// sees the commands of the connection ReadNow reads on, as go-redis's
// hooks do not.
func serverStats(b *testing.B, c redisstore.Client) (time.Duration, int64) {
	info, err := c.Info(context.Background(), "cpu", "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	var cmds int64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case ok && (k == "used_cpu_sys" || k == "used_cpu_user"):
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		case ok && k == "total_commands_processed":
			if cmds, err = strconv.ParseInt(v, 10, 64); err != nil {
				b.Fatal(err)
			}
		}
	}
	return time.Duration(total * float64(time.Second)), cmds
}

// enqueue publishes n records of 64 bytes with keys to stream, from 8
// goroutines.
func enqueue(b *testing.B, c redisstore.Client, stream string, n int) {
	p, err := redisdrain.NewPublisher(c, redisdrain.PublishOptions{Stream: stream})
	if err != nil {
		b.Fatal(err)
	}
	data := []byte(strings.Repeat("x", 64))
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if _, err := p.Publish(context.Background(), redisdrain.Record{Key: fmt.Sprint("k", i), Tenant: "t", Data: data}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

var drainProfile = flag.String("drain.cpuprofile", "", "BenchmarkCost writes a CPU profile of each loop's drain phase alone (after the records were added) to this path, its name appended")

// profile starts a CPU profile of the drain phase if asked for, and
// returns its stop.
func profile(b *testing.B) func() {
	if *drainProfile == "" {
		return func() {}
	}
	f, err := os.Create(*drainProfile + "." + strings.ReplaceAll(b.Name(), "/", "."))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCost drains b.N messages as fast as possible, with no limiter
// and a sink that does nothing, through a drain.Drainer on the Redis
// Source and through bare XREADGROUP + XACK loops (a read of the default
// window, then an XACK of each record, or one of them all), on one
// redis-server in its own process,
// a fresh stream each, and reports this process's CPU time per message,
// the server's, the commands sent per message (each a round trip) and
// the rate. Run with -benchtime Nx.
func BenchmarkCost(b *testing.B) {
	srv := redistest.Standalone(b)
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr()}, Timeout: 5 * time.Second, PoolSize: 128})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var runs atomic.Int64
	run := func(b *testing.B, drainIt func(b *testing.B, stream string, n int)) {
		stream := fmt.Sprint("cost-", runs.Add(1))
		n := b.N
		enqueue(b, c, stream, n)
		b.ReportAllocs()
		b.ResetTimer()
		stop := profile(b)
		srv0, trips0 := serverStats(b, c)
		cpu0, begin := draintest.CPUTime(b), time.Now()
		drainIt(b, stream, n)
		stop()
		cpu, took := draintest.CPUTime(b)-cpu0, time.Since(begin)
		srv1, trips1 := serverStats(b, c)
		b.StopTimer()
		// The commands run, less the first INFO (counted once it ran).
		b.ReportMetric(float64(trips1-trips0-1)/float64(n), "trips/msg")
		b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(n), "cpu-µs/msg")
		b.ReportMetric(float64((srv1-srv0).Nanoseconds())/1e3/float64(n), "redis-cpu-µs/msg")
		b.ReportMetric(float64(n)/took.Seconds(), "msgs/s")
	}
	b.Run("drainer", func(b *testing.B) {
		run(b, func(b *testing.B, stream string, n int) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			src, err := redisdrain.New(ctx, c, redisdrain.Options{Stream: stream, Group: "g", Consumer: "c"})
			if err != nil {
				b.Fatal(err)
			}
			var done atomic.Int64
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
			if got := d.Stats().Done; got != int64(n) {
				b.Fatalf("done %d of %d", got, n)
			}
		})
	})
	// The bare loops: XREADGROUP of the default window, then an XACK of
	// each record in turn (as the Drainer settles them), or of the whole
	// read at once (the floor).
	for _, batch := range []bool{false, true} {
		name := "xreadgroup-xack"
		if batch {
			name = "xreadgroup-xack-batch"
		}
		b.Run(name, func(b *testing.B) {
			run(b, func(b *testing.B, stream string, n int) {
				ctx := context.Background()
				st, err := redisstore.NewStream(c, stream, redisstore.StreamOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if err := st.CreateGroup(ctx, "g"); err != nil {
					b.Fatal(err)
				}
				ids := make([]string, 0, redisdrain.DefaultWindow/2)
				for got := 0; got < n; {
					res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{
						Group: "g", Consumer: "c", Streams: []string{st.Key(), ">"}, Count: redisdrain.DefaultWindow / 2, Block: time.Second,
					}).Result()
					if err != nil {
						b.Fatal(err)
					}
					ids = ids[:0]
					for _, m := range res[0].Messages {
						ids = append(ids, m.ID)
					}
					if batch {
						if err := c.XAck(ctx, st.Key(), "g", ids...).Err(); err != nil {
							b.Fatal(err)
						}
					} else {
						for _, id := range ids {
							if err := c.XAck(ctx, st.Key(), "g", id).Err(); err != nil {
								b.Fatal(err)
							}
						}
					}
					got += len(ids)
				}
			})
		})
	}
}
