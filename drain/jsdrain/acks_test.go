package jsdrain_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/internal/natstest"
)

// TestAckConfirmsGroup: 64 messages acknowledged at once go in groups of
// plain acks closed by one double ack; once every Ack has returned, the
// server has every acknowledgement (the consumer holds none pending), in
// each of 20 rounds. Were the double ack's answer not behind the plain
// acks, some would still be on their way.
func TestAckConfirmsGroup(t *testing.T) {
	const rounds, n = 20, 64
	srv := natstest.Start(t)
	_, js := queue(t, srv.URL(), 1)
	enqueue(t, js, "work.a", 0, rounds*n, 1)
	src := source(t, js, "acks", "", 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for r := range rounds {
		msgs := make([]drain.Message, n)
		for i := range msgs {
			m, err := src.NextUpTo(ctx, n-i)
			if err != nil {
				t.Fatal(err)
			}
			msgs[i] = m
		}
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i, m := range msgs {
			wg.Go(func() { errs[i] = m.Ack(ctx) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Ack of %s: %v", r, msgs[i].Key(), err)
			}
		}
		held, err := src.Held(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if held != 0 {
			t.Fatalf("round %d: %d of %d acknowledged messages still pending at the server", r, held, n)
		}
	}
}
