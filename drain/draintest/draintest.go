// Package draintest is the conformance suite of drain.Source, in the
// spirit of testing/fstest: every queue adapter under drain/ passes Run,
// on a real queue (a server or an in-process broker its test starts).
//
// The suite holds a Source to the contract drain.Drainer relies on:
//
//   - Delivered: each message published is delivered with its key, data,
//     tenant and partition, and once acknowledged is never delivered
//     again, to this consumer or another of its group that takes over
//     from it. (A queue that records acknowledgements in batches, as a
//     Kafka group commits offsets, may deliver the last ones again after
//     a crash: delivery is at least once, and the suite checks no crash
//     here.)
//   - Window: a Source delivers at most Window messages that were not
//     acknowledged, put back or dead-lettered (the drainer's bounded
//     memory), and delivers one more as soon as one is settled.
//   - InProgress: a message whose holder keeps calling InProgress is not
//     delivered to another consumer, however long past the ack wait. (A
//     queue without a deadline per message, such as a Kafka group, meets
//     this through its member's session, and, when another member joins,
//     by holding the rebalance while the message is out, for a bound of
//     its own.)
//   - Crash: the messages a consumer held when it stopped without a word
//     (as a process killed with SIGKILL) are delivered to another within
//     its ack wait and a margin.
//   - Nak: a message put back with a delay comes back no sooner than the
//     delay (and later messages are not held up behind it), with
//     Deliveries grown by one.
//   - DeadLetter: a dead-lettered message reaches the dead-letter
//     destination with its key and the reason, and is not delivered again.
//   - Backlog: the messages published and not acknowledged, delivered or
//     not.
//   - Drainer: a drain.Drainer on the Source applies every message once at
//     a sink that throttles some (never a failure) and fails one always
//     (dead-lettered after MaxFailures with the last error).
//
// Checks that wait on the queue (a redelivery, the backlog) wait in real
// time, bounded by a few ack waits; the suite's ack wait is short.
package draintest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
)

// A Record is a message as published.
type Record struct {
	Key, Tenant, Partition string
	Data                   []byte
}

// A Dead is a dead-lettered message as its destination holds it.
type Dead struct {
	Key    string
	Reason string // the error passed to DeadLetter, whole or cut short
	Data   []byte
}

// Options are what the suite asks of a consumer.
type Options struct {
	// AckWait is how long a delivered message stays its holder's
	// without a word before it is delivered again (for a queue without
	// per-message acks, the time a silent consumer keeps its share).
	AckWait time.Duration
	// Window is the Source's Window.
	Window int
}

// A Queue is one queue (stream, topic) under test, fresh and empty, and
// the consumer group that the suite's consumers share.
type Queue interface {
	// Publish enqueues r, durably: once it returns nil, r is in the queue.
	Publish(ctx context.Context, r Record) error
	// Open starts a consumer of the group with o and returns it; the
	// queue stops it when t ends.
	Open(t testing.TB, o Options) Consumer
	// DeadLetters returns what the group has dead-lettered so far, in
	// order.
	DeadLetters(ctx context.Context) ([]Dead, error)
}

// A Consumer is a Source of the group that can be stopped as a crash.
type Consumer interface {
	drain.Source
	// Crash stops the consumer as SIGKILL would stop its process: nothing
	// it holds is acknowledged or put back, and it takes no more.
	Crash()
}

// NewQueue returns a fresh, empty Queue for one test.
type NewQueue func(t *testing.T) Queue

// ackWait is the suite's ack wait: short, so that waiting for a
// redelivery takes little time, and long enough for a loaded machine's
// round trips.
const ackWait = 2 * time.Second

// Run runs the suite on queues from newQueue, one per test.
func Run(t *testing.T, newQueue NewQueue) {
	t.Run("Delivered", func(t *testing.T) { testDelivered(t, newQueue(t)) })
	t.Run("Window", func(t *testing.T) { testWindow(t, newQueue(t)) })
	t.Run("InProgress", func(t *testing.T) { testInProgress(t, newQueue(t)) })
	t.Run("Crash", func(t *testing.T) { testCrash(t, newQueue(t)) })
	t.Run("Nak", func(t *testing.T) { testNak(t, newQueue(t)) })
	t.Run("DeadLetter", func(t *testing.T) { testDeadLetter(t, newQueue(t)) })
	t.Run("Backlog", func(t *testing.T) { testBacklog(t, newQueue(t)) })
	t.Run("Drainer", func(t *testing.T) { testDrainer(t, newQueue(t)) })
}

func record(i int) Record {
	return Record{
		Key:       fmt.Sprintf("rec-%04d", i),
		Tenant:    fmt.Sprintf("tenant-%d", i%3),
		Partition: fmt.Sprintf("part-%d", i%5),
		Data:      fmt.Appendf(nil, `{"n":%d}`, i),
	}
}

func publish(t testing.TB, q Queue, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := from; i < to; i++ {
		if err := q.Publish(ctx, record(i)); err != nil {
			t.Fatalf("publishing %s: %v", record(i).Key, err)
		}
	}
}

// next returns the Source's next message, failing t when none comes
// within limit.
func next(t testing.TB, s drain.Source, limit time.Duration) drain.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		m, err := s.Next(ctx)
		if err == nil {
			return m
		}
		if ctx.Err() != nil {
			t.Fatalf("no message within %v: %v", limit, err)
		}
		t.Logf("Next: %v (asked again)", err) // a Source's error is transient, as the Drainer treats it
	}
}

// none fails t when the Source delivers a message within d.
func none(t testing.TB, s drain.Source, d time.Duration, why string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		m, err := s.Next(ctx)
		if err == nil {
			t.Fatalf("%s: delivered %s (deliveries %d)", why, m.Key(), m.Deliveries())
		}
		if ctx.Err() != nil {
			return
		}
	}
}

func settle(t testing.TB, what string, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f(ctx); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// backlog waits up to limit for the Source's backlog to be want, and
// fails t with the last figure otherwise.
func backlog(t testing.TB, s drain.Source, want int64, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := s.Backlog(ctx)
		cancel()
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Backlog: %d, %v; want %d within %v", n, err, want, limit)
		}
		<-tick.C // polling a queue's figure, which it updates on its own time
	}
}

func testDelivered(t *testing.T, q Queue) {
	const n = 20
	publish(t, q, 0, n)
	c := q.Open(t, Options{AckWait: ackWait, Window: 64})
	seen := make(map[string]bool)
	for range n {
		m := next(t, c, 10*time.Second)
		want := record(-1)
		for i := range n {
			if record(i).Key == m.Key() {
				want = record(i)
			}
		}
		if want.Key != m.Key() || seen[m.Key()] {
			t.Fatalf("delivered %q: unknown or twice (seen %d)", m.Key(), len(seen))
		}
		seen[m.Key()] = true
		if string(m.Data()) != string(want.Data) || m.Tenant() != want.Tenant || m.Partition() != want.Partition {
			t.Errorf("%s: data %q tenant %q partition %q, want %q %q %q", m.Key(), m.Data(), m.Tenant(), m.Partition(), want.Data, want.Tenant, want.Partition)
		}
		if m.Deliveries() != 1 {
			t.Errorf("%s: Deliveries %d on its first delivery", m.Key(), m.Deliveries())
		}
		settle(t, "Ack "+m.Key(), m.Ack)
	}
	backlog(t, c, 0, 5*ackWait)
	// Acknowledged: never again, to this consumer or another.
	other := q.Open(t, Options{AckWait: ackWait, Window: 64})
	none(t, c, 2*ackWait, "after every message was acknowledged")
	none(t, other, ackWait/2, "to a second consumer after every message was acknowledged")
}

func testWindow(t *testing.T, q Queue) {
	const window = 4
	publish(t, q, 0, 3*window)
	c := q.Open(t, Options{AckWait: 10 * ackWait, Window: window})
	if c.Window() != window {
		t.Fatalf("Window() = %d, want %d", c.Window(), window)
	}
	held := make([]drain.Message, 0, window)
	for range window {
		held = append(held, next(t, c, 10*time.Second))
	}
	none(t, c, ackWait, fmt.Sprintf("a %d-th message while %d are held", window+1, window))
	settle(t, "Ack", held[0].Ack)
	held = append(held[1:], next(t, c, 10*time.Second))
	none(t, c, ackWait/2, "one more after one of the window was acknowledged")
	settle(t, "Nak", func(ctx context.Context) error { return held[0].Nak(ctx, 0) })
	next(t, c, 10*time.Second)
}

func testInProgress(t *testing.T, q Queue) {
	publish(t, q, 0, 1)
	c := q.Open(t, Options{AckWait: ackWait, Window: 8})
	m := next(t, c, 10*time.Second)
	other := q.Open(t, Options{AckWait: ackWait, Window: 8})
	// Keep it for three ack waits, telling the queue every third of one.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(ackWait / 3)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				settle(t, "InProgress", m.InProgress)
			case <-stop:
				return
			}
		}
	})
	var wg2 sync.WaitGroup
	wg2.Go(func() { none(t, other, 3*ackWait, "a message its holder keeps in progress, to another consumer") })
	none(t, c, 3*ackWait, "a message its holder keeps in progress, to that holder")
	wg2.Wait()
	close(stop)
	wg.Wait()
	settle(t, "Ack", m.Ack)
	none(t, other, 2*ackWait, "an acknowledged message")
}

func testCrash(t *testing.T, q Queue) {
	const n = 5
	publish(t, q, 0, n)
	c := q.Open(t, Options{AckWait: ackWait, Window: 8})
	var keys []string
	for range n {
		keys = append(keys, next(t, c, 10*time.Second).Key())
	}
	c.Crash()
	other := q.Open(t, Options{AckWait: ackWait, Window: 8})
	var again []string
	start := time.Now()
	for range n {
		m := next(t, other, 10*ackWait)
		if m.Deliveries() < 1 {
			t.Errorf("%s: Deliveries %d", m.Key(), m.Deliveries())
		}
		again = append(again, m.Key())
		settle(t, "Ack", m.Ack)
	}
	t.Logf("the %d messages a crashed consumer held came back within %v (ack wait %v)", n, time.Since(start).Round(time.Millisecond), ackWait)
	slices.Sort(keys)
	slices.Sort(again)
	if !slices.Equal(keys, again) {
		t.Fatalf("held %v when it crashed; another consumer got %v", keys, again)
	}
	none(t, other, ackWait, "after the crashed consumer's messages were acknowledged")
}

func testNak(t *testing.T, q Queue) {
	publish(t, q, 0, 2)
	c := q.Open(t, Options{AckWait: 3 * ackWait, Window: 8})
	m := next(t, c, 10*time.Second)
	delay := ackWait / 2
	naked := time.Now()
	settle(t, "Nak", func(ctx context.Context) error { return m.Nak(ctx, delay) })
	// The other message is not held up behind it.
	m2 := next(t, c, 10*time.Second)
	if m2.Key() == m.Key() {
		t.Fatalf("%s came back at once after Nak(%v)", m.Key(), delay)
	}
	settle(t, "Ack", m2.Ack)
	back := next(t, c, 10*ackWait)
	if since := time.Since(naked); back.Key() != m.Key() || since < delay {
		t.Fatalf("after Nak(%v) of %s: %s after %v", delay, m.Key(), back.Key(), since)
	}
	if back.Deliveries() != m.Deliveries()+1 {
		t.Errorf("Deliveries %d after Nak, was %d", back.Deliveries(), m.Deliveries())
	}
	settle(t, "Ack", back.Ack)
	none(t, c, ackWait, "after both were acknowledged")
}

func testDeadLetter(t *testing.T, q Queue) {
	publish(t, q, 0, 2)
	c := q.Open(t, Options{AckWait: ackWait, Window: 8})
	m := next(t, c, 10*time.Second)
	reason := errors.New("POST http://db/write: 400 Bad Request: \"no such table\"")
	settle(t, "DeadLetter", func(ctx context.Context) error { return m.DeadLetter(ctx, reason) })
	m2 := next(t, c, 10*time.Second)
	settle(t, "Ack", m2.Ack)
	none(t, c, 2*ackWait, "after one was dead-lettered and the other acknowledged")
	backlog(t, c, 0, 5*ackWait)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dead, err := q.DeadLetters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Key != m.Key() || !strings.Contains(dead[0].Reason, "no such table") || string(dead[0].Data) != string(m.Data()) {
		t.Fatalf("dead letters %+v, want %s with its data and the reason %q", dead, m.Key(), reason)
	}
}

func testBacklog(t *testing.T, q Queue) {
	const n = 10
	publish(t, q, 0, n)
	c := q.Open(t, Options{AckWait: 10 * ackWait, Window: 8})
	backlog(t, c, n, 5*ackWait)
	var held []drain.Message
	for range 3 {
		held = append(held, next(t, c, 10*time.Second))
	}
	backlog(t, c, n, 5*ackWait) // delivered, not acknowledged: still to do
	for _, m := range held {
		settle(t, "Ack", m.Ack)
	}
	backlog(t, c, n-3, 5*ackWait)
}

// testDrainer drains the queue with a drain.Drainer: every message is
// applied once at a sink that throttles one message twice and fails
// another always.
func testDrainer(t *testing.T, q Queue) {
	const n = 40
	publish(t, q, 0, n)
	c := q.Open(t, Options{AckWait: ackWait, Window: 16})
	throttled, failing := record(7).Key, record(13).Key
	var mu sync.Mutex
	applied := make(map[string]int)
	calls := make(map[string]int)
	done, failedTwice := make(chan struct{}), make(chan struct{})
	sink := func(ctx context.Context, m drain.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls[m.Key()]++
		switch {
		case m.Key() == failing:
			if calls[m.Key()] == 2 {
				close(failedTwice)
			}
			return fmt.Errorf("attempt %d: no such table", calls[m.Key()])
		case m.Key() == throttled && calls[m.Key()] <= 2:
			return drain.Throttle(10*time.Millisecond, errors.New("429"))
		}
		applied[m.Key()]++
		if len(applied) == n-1 && applied[m.Key()] == 1 {
			close(done)
		}
		return nil
	}
	d, err := drain.New(drain.Options{
		Inputs: []drain.Input{{Source: c}}, Sink: sink,
		MaxFailures: 2, BaseBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		DefaultPause: 10 * time.Millisecond, Workers: 4, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	limit := time.After(60 * time.Second)
	for _, ch := range []chan struct{}{done, failedTwice} {
		select {
		case <-ch:
		case <-limit:
			t.Error("not every message applied and the failing one tried twice within 60 s")
		}
	}
	// Run returns once the work in flight is settled: the failing
	// message dead-lettered after its second failure.
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		k := record(i).Key
		if want := map[bool]int{true: 0, false: 1}[k == failing]; applied[k] != want {
			t.Errorf("%s applied %d times, want %d", k, applied[k], want)
		}
	}
	if calls[throttled] != 3 || calls[failing] != 2 {
		t.Errorf("sink calls: throttled message %d (want 3: throttling is not failure), failing message %d (want MaxFailures 2)", calls[throttled], calls[failing])
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	dead, err := q.DeadLetters(dctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Key != failing || !strings.Contains(dead[0].Reason, "attempt 2: no such table") {
		t.Fatalf("dead letters %+v, want %s with the last error", dead, failing)
	}
	if s := d.Stats(); s.DeadLettered != 1 || s.Throttled != 2 || s.Failed != 2 {
		t.Errorf("Stats %+v: want 1 dead-lettered, 2 throttled, 2 failed", s)
	}
}
