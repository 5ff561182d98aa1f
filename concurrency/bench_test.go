package concurrency

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
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

// BenchmarkRedis measures round trips to a local redis-server: the backend
// operations alone (acquire script, renew script, release) and a whole
// permit (acquire + release, two round trips). It reports round trips per
// second (rt/s); ns/op is per operation as named.
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Standalone(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64})
	b.Cleanup(func() { c.Close() })
	be, err := NewRedisBackend(c, RedisOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var seq atomic.Int64
	token := func() string { return "t" + strconv.FormatInt(seq.Add(1), 10) }
	run := func(b *testing.B, rtPerOp int, body func() error) {
		b.Helper()
		b.ReportAllocs()
		b.SetParallelism(8) // keep several requests in flight, as many holders do
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := body(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N*rtPerOp)/time.Since(start).Seconds(), "rt/s")
	}
	b.Run("acquire+release", func(b *testing.B) {
		run(b, 2, func() error {
			tok := token()
			ok, err := be.Acquire(ctx, "bench", tok, 1<<30, time.Minute)
			if err != nil || !ok {
				return errors.Join(err, errors.New("not acquired"))
			}
			_, err = be.Release(ctx, "bench", tok)
			return err
		})
	})
	b.Run("renew", func(b *testing.B) {
		tok := token()
		if _, err := be.Acquire(ctx, "bench-renew", tok, 1, time.Minute); err != nil {
			b.Fatal(err)
		}
		run(b, 1, func() error {
			_, err := be.Renew(ctx, "bench-renew", tok, time.Minute)
			return err
		})
	})
	b.Run("permit", func(b *testing.B) {
		d, err := NewDistributed(be, "bench-permit", 1<<30, DistributedOptions{})
		if err != nil {
			b.Fatal(err)
		}
		run(b, 2, func() error {
			p, err := d.TryAcquire(ctx)
			if err != nil {
				return err
			}
			return p.Release(ctx)
		})
	})
}
