package drain_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/ratelimit"
)

// memQueue is a Source kept in memory, for the example: a real one is a
// durable queue (drain.JetStream), which keeps what is not acknowledged
// across a crash.
type memQueue struct {
	ch    chan drain.Message
	acked atomic.Int64
	total int64
}

func newMemQueue(bodies ...string) *memQueue {
	q := &memQueue{ch: make(chan drain.Message, len(bodies)), total: int64(len(bodies))}
	for i, b := range bodies {
		q.ch <- &memMessage{q: q, key: fmt.Sprintf("msg-%d", i+1), data: b}
	}
	return q
}

func (q *memQueue) Next(ctx context.Context) (drain.Message, error) {
	select {
	case m := <-q.ch:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (q *memQueue) Backlog(context.Context) (int64, error) { return q.total - q.acked.Load(), nil }
func (q *memQueue) Window() int                            { return 8 }

type memMessage struct {
	q         *memQueue
	key, data string
	n         int
}

func (m *memMessage) Key() string       { return m.key }
func (m *memMessage) Data() []byte      { return []byte(m.data) }
func (m *memMessage) Tenant() string    { return "" }
func (m *memMessage) Partition() string { return "" }
func (m *memMessage) Deliveries() int   { return m.n + 1 }
func (m *memMessage) Ack(context.Context) error {
	m.q.acked.Add(1)
	return nil
}
func (m *memMessage) Nak(context.Context, time.Duration) error { // deliver again
	m.n++
	m.q.ch <- m
	return nil
}
func (m *memMessage) InProgress(context.Context) error { return nil }
func (m *memMessage) DeadLetter(context.Context, error) error {
	m.q.acked.Add(1)
	return nil
}

func ExampleDrainer() {
	queue := newMemQueue("a", "b", "c", "d", "e")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	var calls atomic.Int64
	d, err := drain.New(drain.Options{
		Inputs: []drain.Input{{Source: queue}}, // priority Normal
		// The work: here it prints; HTTPSink calls an HTTP endpoint. A
		// Sink may answer drain.Throttle(after, err) to pause the drainer.
		Sink: func(ctx context.Context, m drain.Message) error {
			fmt.Printf("%s: %s\n", m.Key(), m.Data())
			if calls.Add(1) == 5 {
				stop() // the queue is empty: end Run
			}
			return nil
		},
		// No faster than 200 messages a second.
		Limiter: ratelimit.NewLimiter(200, 1),
		Workers: 1, // one call at a time, so the output is in order
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Run returns once ctx ends, after the calls in flight are settled.
	if err := d.Run(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println("done:", d.Stats().Done, "backlog:", queue.total-queue.acked.Load())
	// Output:
	// msg-1: a
	// msg-2: b
	// msg-3: c
	// msg-4: d
	// msg-5: e
	// done: 5 backlog: 0
}
