package jsdrain

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ackTimeout bounds the wait for the server's answer to a group of
// acknowledgements; each caller of Ack waits no longer than its own
// context besides.
const ackTimeout = 30 * time.Second

// acks confirms acknowledgements in groups, one round trip for many
// messages. The acknowledgements asked for while a group is on its way
// to the server make the next group, sent at once when the answer comes:
// each but the last as a plain ack, the last as a double ack. The server
// handles a consumer's acknowledgements in the order they arrive from one
// connection, so its answer to the last confirms the whole group; a group
// whose answer does not come is an error for each of its messages (which
// the server then delivers again, unless the acknowledgement did arrive).
//
// A goroutine sends the groups while acknowledgements wait, and ends when
// none does; the zero value is ready. It is safe for concurrent use.
type acks struct {
	mu      sync.Mutex
	queue   []ackCall
	sending bool // the goroutine runs
}

// ackCall is one caller's acknowledgement, answered on done.
type ackCall struct {
	m    jetstream.Msg
	done chan error // capacity one
}

// ack acknowledges m and waits for the server to confirm it, or for ctx.
func (a *acks) ack(ctx context.Context, m jetstream.Msg) error {
	c := ackCall{m: m, done: make(chan error, 1)}
	a.mu.Lock()
	a.queue = append(a.queue, c)
	start := !a.sending
	a.sending = true
	a.mu.Unlock()
	if start {
		go a.send()
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send sends the waiting groups, one at a time, until none waits.
func (a *acks) send() {
	var group []ackCall
	for {
		a.mu.Lock()
		group, a.queue = a.queue, group[:0]
		if len(group) == 0 {
			a.sending = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		errs := make([]error, len(group))
		last := len(group) - 1
		for i, c := range group[:last] {
			errs[i] = c.m.Ack()
		}
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		confirmed := group[last].m.DoubleAck(ctx)
		cancel()
		for i, c := range group {
			err := errs[i]
			if err == nil {
				err = confirmed
			}
			c.done <- err
		}
		clear(group)
	}
}
