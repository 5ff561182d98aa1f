package jsdrain_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/ratelimit"
)

// BenchmarkRequests drains records into an idempotent loopback sink at
// 2/s, 20/s, 200/s and 2,000/s (40, 200, 2,000 and 10,000 records), with
// the consumer's ack wait at 5 s, without throttling and with 20% of
// requests answered 429 (Retry-After: 1) on 100 independent partitions,
// pausing all records or the partition alone, and reports the sink's 2xx
// answers per record written (above 1: a record sent again), its 429s
// per record written, the records written per second (until the last,
// or the end of the run) and while three quarters are written (before
// the last records wait out their own Retry-After). A run stops when the
// consumer is empty, or after 20 s (60 s at 2/s, where a copy sent again
// comes after every original). Run with -benchtime=1x; the server runs
// in its own process.
func BenchmarkRequests(b *testing.B) {
	for _, c := range []struct {
		rate, n int
	}{{2, 40}, {20, 200}, {200, 2000}, {2000, 10000}} {
		for _, share := range []float64{0, 0.2} {
			scopes := []string{"all"}
			if share > 0 {
				scopes = pauseScopes
			}
			for _, scope := range scopes {
				b.Run(fmt.Sprintf("rate=%d/429=%.0f%%/scope=%s", c.rate, 100*share, scope), func(b *testing.B) {
					for b.Loop() {
						requests(b, c.rate, c.n, share, scope)
					}
				})
			}
		}
	}
}

func requests(b *testing.B, rate, n int, share float64, scope string) {
	limit := 20 * time.Second
	if rate < 10 {
		limit = 60 * time.Second
	}
	srv := natstest.StartCluster(b, 1)
	_, js := queue(b, srv.URLs(), 1)
	enqueueParts(b, js, "work.a", 0, n, 1, 100)
	sk := newSink(b, n)
	sk.share = share
	sk.retryAfter = "1"
	src := source(b, js, "requests", "", 5*time.Second)
	quarters := sk.at(n * 3 / 4)
	h := &drain.HTTPSink{URL: sk.srv.URL}
	opts := drain.Options{
		Inputs:     []drain.Input{{Source: src}},
		Sink:       h.Send,
		Limiter:    ratelimit.NewLimiter(ratelimit.Limit(rate), max(1, rate/100)),
		Logger:     slog.New(slog.DiscardHandler),
		StatsEvery: 100 * time.Millisecond,
	}
	setPauseScope(&opts, scope)
	d := newDrainer(b, opts)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	begin := time.Now()
	go func() { errc <- d.Run(ctx) }()
	tk := time.NewTicker(20 * time.Millisecond)
	deadline := time.NewTimer(limit)
	var q3 time.Duration
	for stop := false; !stop; {
		select {
		case <-quarters:
			q3, quarters = time.Since(begin), nil
		case <-tk.C:
			st := d.Stats()
			stop = st.BacklogAt.After(begin) && st.Backlog == 0 && st.Waiting == 0 && st.InFlight == 0
		case <-deadline.C:
			stop = true
		}
	}
	tk.Stop()
	took := time.Since(begin)
	cancel()
	<-errc
	sk.mu.Lock()
	defer sk.mu.Unlock()
	written := len(sk.applied)
	if written == 0 {
		b.Fatalf("nothing written in %v", took)
	}
	end := took
	if written == n {
		end = sk.doneAt.Sub(begin)
	}
	b.ReportMetric(float64(sk.requests-sk.throttled)/float64(written), "2xx/rec")
	b.ReportMetric(float64(sk.throttled)/float64(written), "429/rec")
	b.ReportMetric(float64(written)/end.Seconds(), "rec/s")
	b.ReportMetric(float64(written), "written")
	if q3 > 0 {
		b.ReportMetric(float64(n*3/4)/q3.Seconds(), "rec/s-3/4")
	}
}
