package jsdrain_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestDrainSlow: 20 records drained at 4/s from a consumer whose ack
// wait is 1 s, so most wait in the drainer far longer than the ack wait:
// each is POSTed exactly once, and none is delivered twice. Before, the
// drainer took half the window at once and told only the records in the
// sink InProgress: the server delivered the waiting ones again and both
// copies were sent (40 records at 2/s with a 5 s ack wait made 103 POSTs).
func TestDrainSlow(t *testing.T) {
	const n, rate = 20, 4
	srv := natstest.Start(t)
	_, js := queue(t, srv.URL(), 1)
	enqueue(t, js, "work.a", 0, n, 1)
	sk := newSink(t, n)
	src := source(t, js, "slow", "", time.Second)
	h := &drain.HTTPSink{URL: sk.srv.URL}
	d := newDrainer(t, drain.Options{
		Inputs:     []drain.Input{{Source: src}},
		Sink:       h.Send,
		Limiter:    ratelimit.NewLimiter(rate, 1),
		StatsEvery: 100 * time.Millisecond,
	})
	stop := run(t, d)
	sk.wait(30 * time.Second)
	// Until the consumer has nothing left, so that a second copy, if
	// any, is sent too.
	st := emptied(t, d, sk.doneAt, 30*time.Second)
	stop()
	sk.check(n)
	t.Logf("%d requests, %d repeats; stats %+v", sk.requests, sk.repeats, st)
	if sk.requests != n || sk.repeats != 0 {
		t.Errorf("%d requests (%d for keys already applied), want %d", sk.requests, sk.repeats, n)
	}
	if st.Done != n || st.Duplicates != 0 || st.Redelivered != 0 || st.AckErrors != 0 {
		t.Errorf("stats %+v: want %d done, no duplicates, redeliveries or ack errors", st, n)
	}
}

// TestRandom429Partitions: a sink that answers 20% of requests 429 with
// Retry-After: 1, its partitions independent, drained at 200/s with
// pauses per partition: every record written once, and while a backlog
// remains (the first three quarters) records are written at 70% of the
// rate at least (a 429 spends a grant, so 80% is the most; the last
// records then wait out their own Retry-After, once or more). With the
// sink-wide pause every 429 stopped all partitions for a second: 3–9
// records/s.
func TestRandom429Partitions(t *testing.T) {
	longtest.Run(t)
	const n, rate, parts = 2000, 200, 100
	srv := natstest.Start(t)
	_, js := queue(t, srv.URL(), 1)
	enqueueParts(t, js, "work.a", 0, n, 1, parts)
	sk := newSink(t, n)
	sk.share = 0.2
	sk.retryAfter = "1"
	src := source(t, js, "random429", "", 0)
	h := &drain.HTTPSink{URL: sk.srv.URL}
	d := newDrainer(t, drain.Options{
		Inputs:     []drain.Input{{Source: src}},
		Sink:       h.Send,
		Limiter:    ratelimit.NewLimiter(rate, 1),
		PauseScope: drain.PausePartition,
		Workers:    16,
	})
	quarters := sk.at(n * 3 / 4)
	begin := time.Now()
	stop := run(t, d)
	var took time.Duration
	select {
	case <-quarters:
		took = time.Since(begin)
	case <-time.After(60 * time.Second):
	}
	sk.wait(60 * time.Second)
	all := sk.doneAt.Sub(begin)
	stop()
	sk.check(n)
	st := d.Stats()
	got := float64(n*3/4) / took.Seconds()
	t.Logf("%d records in %v, three quarters in %v: %.0f/s written (%.0f%% of %d/s); %d requests, %d throttled, %d repeats; stats %+v",
		n, all, took, got, 100*got/rate, rate, sk.requests, sk.throttled, sk.repeats, st)
	if sk.repeats != 0 || st.Duplicates != 0 {
		t.Errorf("%d requests for records already written (duplicates %d)", sk.repeats, st.Duplicates)
	}
	if got < 0.7*rate {
		t.Errorf("%.0f records/s written, want at least 70%% of %d/s", got, rate)
	}
}

// TestSinkWideQuota: a sink with one quota for all its partitions (200/s,
// Retry-After to the next token), drained at that rate with the
// sink-wide pause: at most 1% of requests answered 429, every record
// written once.
func TestSinkWideQuota(t *testing.T) {
	longtest.Run(t)
	const n, rate, parts = 1000, 200, 100
	srv := natstest.Start(t)
	_, js := queue(t, srv.URL(), 1)
	enqueueParts(t, js, "work.a", 0, n, 1, parts)
	sk := newSink(t, n)
	sk.limit = ratelimit.NewLimiter(rate, rate/10)
	sk.limit.AllowN(time.Now(), rate/10) // an empty bucket, as the drainer's
	src := source(t, js, "sinkwide", "", 0)
	h := &drain.HTTPSink{URL: sk.srv.URL}
	d := newDrainer(t, drain.Options{
		Inputs:     []drain.Input{{Source: src}},
		Sink:       h.Send,
		Limiter:    ratelimit.NewLimiter(rate, 1),
		PauseScope: drain.PauseAll,
		Workers:    16,
	})
	stop := run(t, d)
	sk.wait(60 * time.Second)
	stop()
	sk.check(n)
	st := d.Stats()
	t.Logf("%d requests, %d throttled, %d repeats; stats %+v", sk.requests, sk.throttled, sk.repeats, st)
	if sk.throttled*100 > sk.requests {
		t.Errorf("%d of %d requests answered 429, want at most 1%%", sk.throttled, sk.requests)
	}
	if sk.repeats != 0 {
		t.Errorf("%d requests for records already written", sk.repeats)
	}
}

// emptied returns d's Stats once a backlog poll after since found the
// consumer empty and d holds nothing, or fails after limit.
func emptied(t *testing.T, d *drain.Drainer, since time.Time, limit time.Duration) drain.Stats {
	t.Helper()
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		st := d.Stats()
		if st.BacklogAt.After(since) && st.Backlog == 0 && st.Waiting == 0 && st.InFlight == 0 {
			return st
		}
		select {
		case <-tk.C:
		case <-deadline.C:
			t.Fatalf("the consumer not empty after %v: %+v", limit, st)
		}
	}
}
