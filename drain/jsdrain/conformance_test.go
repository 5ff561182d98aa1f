package jsdrain_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluicehq/sluice/drain/draintest"
	"github.com/sluicehq/sluice/drain/jsdrain"
	"github.com/sluicehq/sluice/internal/natstest"
)

// TestConformance runs drain's Source suite on embedded JetStream
// servers: each consumer on a connection of its own, so that Crash is a
// connection gone without a word.
func TestConformance(t *testing.T) {
	draintest.Run(t, func(t *testing.T) draintest.Queue {
		srv := natstest.Start(t) // a fresh queue for each test
		_, js := queue(t, srv.URL(), 1)
		return &jsQueue{url: srv.URL(), js: js}
	})
}

type jsQueue struct {
	url string
	js  jetstream.JetStream
}

func (q *jsQueue) Publish(ctx context.Context, r draintest.Record) error {
	return jsdrain.Publish(ctx, q.js, "work.conformance", r.Key, r.Tenant, r.Partition, r.Data)
}

func (q *jsQueue) Open(t testing.TB, o draintest.Options) draintest.Consumer {
	nc, js, err := connect(q.url)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := jsdrain.New(ctx, js, jsdrain.Options{
		Stream: "WORK", Consumer: "group", AckWait: o.AckWait, Window: o.Window, DeadLetter: "dead.work",
	})
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	c := &jsConsumer{Source: src, nc: nc}
	t.Cleanup(c.Crash)
	return c
}

func (q *jsQueue) DeadLetters(ctx context.Context) ([]draintest.Dead, error) {
	st, err := q.js.Stream(ctx, "DEAD")
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	var dead []draintest.Dead
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		dead = append(dead, draintest.Dead{Key: m.Header.Get(jsdrain.HeaderKey), Reason: m.Header.Get(jsdrain.HeaderError), Data: m.Data})
	}
	return dead, nil
}

// jsConsumer is a Source on a connection of its own.
type jsConsumer struct {
	*jsdrain.Source
	nc   *nats.Conn
	once sync.Once
}

// Crash closes the connection without acknowledging or putting back
// anything: the server delivers what it held again after the ack wait.
func (c *jsConsumer) Crash() {
	c.once.Do(func() {
		c.Source.Stop()
		c.nc.Close()
	})
}
