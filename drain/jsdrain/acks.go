package jsdrain

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/sluicehq/sluice/drain"
)

// acks confirms acknowledgements in groups, one round trip for many
// messages. The acknowledgements asked for while a group is on its way
// to the server make the next group, sent at once when the answer comes:
// each but the last as a plain ack, the last as a double ack. The server
// handles a consumer's acknowledgements in the order they arrive from one
// connection, so its answer to the last confirms the whole group; a group
// whose answer does not come is an error for each of its messages (which
// the server then delivers again, unless the acknowledgement did arrive).
//
// A group's answer is waited for the consumer's ack wait at most (wait):
// once it has passed, the server has either taken the acknowledgements or
// will deliver the messages again whatever the drainer waits for, and the
// groups behind it must not wait on a server that lost it (a consumer
// leader killed or cut off, whose successor never saw it; without the
// bound, a three-node cluster's drain stood still for 30 s,
// docs/faults.md).
//
// A goroutine sends the groups while acknowledgements wait, and ends when
// none does; wait must be positive (the Source's AckWait). It is safe for
// concurrent use.
type acks struct {
	wait time.Duration // bounds the wait for a group's answer

	mu      sync.Mutex
	queue   []ackCall
	sending bool // the goroutine runs
}

// ackCall is one caller's acknowledgement, answered by done.
type ackCall struct {
	m    *nats.Msg
	ctx  context.Context
	done drain.Confirm
}

// ack acknowledges m and waits for the server to confirm it, or for ctx.
func (a *acks) ack(ctx context.Context, m *nats.Msg) error {
	c := make(chan error, 1)
	a.ackAsync(ctx, m, drain.ConfirmFunc(func(err error) { c <- err }))
	select {
	case err := <-c:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ackAsync acknowledges m and tells done once the server has confirmed
// it (nil) or the group's answer failed; the wait for the answer ends at
// ctx's deadline at the latest.
func (a *acks) ackAsync(ctx context.Context, m *nats.Msg, done drain.Confirm) {
	a.mu.Lock()
	a.queue = append(a.queue, ackCall{m: m, ctx: ctx, done: done})
	start := !a.sending
	a.sending = true
	a.mu.Unlock()
	if start {
		go a.send()
	}
}

// send sends the waiting groups, one at a time, until none waits.
func (a *acks) send() {
	var group []ackCall
	var errs []error
	var cs []drain.Confirm // confirmed by the group's answer
	for {
		a.mu.Lock()
		group, a.queue = a.queue, group[:0]
		if len(group) == 0 {
			a.sending = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		errs = append(errs[:0], make([]error, len(group))...)
		last := len(group) - 1
		deadline := time.Now().Add(a.wait)
		for i, c := range group {
			if i < last {
				errs[i] = c.m.Ack()
			}
			if d, ok := c.ctx.Deadline(); ok && d.Before(deadline) {
				deadline = d
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		confirmed := group[last].m.AckSync(nats.Context(ctx))
		cancel()
		cs = cs[:0]
		for i, c := range group {
			if errs[i] != nil {
				c.done.Confirmed(errs[i]) // never sent
				continue
			}
			cs = append(cs, c.done)
		}
		drain.ConfirmAll(cs, confirmed)
		clear(group)
		clear(cs)
	}
}
