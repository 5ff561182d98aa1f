package kafkadrain_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/drain/draintest"
	"github.com/sluicehq/sluice/drain/kafkadrain"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConformance runs drain's Source suite on a fresh kfake cluster per
// test (three brokers, a topic of three partitions), or, with
// $SLUICE_KAFKA_BROKERS set, on fresh topics and a fresh group of those
// brokers. The suite's ack wait is the group's session timeout (at least
// the 6 s a real broker takes by default); each consumer dials through a
// network of its own, so that Crash is a member gone without a word.
func TestConformance(t *testing.T) {
	draintest.Run(t, func(t *testing.T) draintest.Queue {
		c := newCluster(t)
		return &kafkaQueue{c: c, prod: c.producer(t)}
	})
}

type kafkaQueue struct {
	c    *cluster
	prod *kgo.Client
}

func (q *kafkaQueue) Publish(ctx context.Context, r draintest.Record) error {
	return kafkadrain.Publish(ctx, q.prod, q.c.topic, r.Key, r.Tenant, r.Partition, r.Data)
}

func (q *kafkaQueue) Open(t testing.TB, o draintest.Options) draintest.Consumer {
	return q.c.open(t, kafkadrain.Options{Window: o.Window, SessionTimeout: q.c.session(o.AckWait)})
}

func (q *kafkaQueue) DeadLetters(ctx context.Context) ([]draintest.Dead, error) {
	recs, err := q.c.deadLetters(ctx)
	if err != nil {
		return nil, err
	}
	var dead []draintest.Dead
	for _, r := range recs {
		d := draintest.Dead{Data: r.Value}
		for _, h := range r.Headers {
			switch h.Key {
			case kafkadrain.HeaderKey:
				d.Key = string(h.Value)
			case kafkadrain.HeaderError:
				d.Reason = string(h.Value)
			}
		}
		dead = append(dead, d)
	}
	return dead, nil
}
