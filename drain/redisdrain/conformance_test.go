package redisdrain_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain/draintest"
	"github.com/sluicehq/sluice/drain/redisdrain"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestConformance runs drain's Source suite on a standalone redis-server
// and on a three-master Cluster, a fresh stream for each test, each
// consumer on a client of its own, so that Crash is a client gone without
// a word.
func TestConformance(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) {
		srv := redistest.Standalone(t)
		draintest.Run(t, newQueue([]string{srv.Addr()}))
	})
	t.Run("Cluster", func(t *testing.T) {
		c := redistest.Cluster(t)
		draintest.Run(t, newQueue(c.Addrs()))
	})
}

// streams numbers the streams of this process's tests.
var streams atomic.Int64

func newQueue(addrs []string) draintest.NewQueue {
	return func(t *testing.T) draintest.Queue {
		c := client(t, addrs)
		name := fmt.Sprintf("work-%d", streams.Add(1))
		p, err := redisdrain.NewPublisher(c, redisdrain.PublishOptions{Stream: name})
		if err != nil {
			t.Fatal(err)
		}
		st, err := redisstore.NewStream(c, name, redisstore.StreamOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &queue{addrs: addrs, name: name, pub: p, stream: st}
	}
}

// client returns a client of addrs (a Cluster's when there are several),
// closed when t ends.
func client(t testing.TB, addrs []string) redisstore.Client {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: addrs, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type queue struct {
	addrs     []string
	name      string
	pub       *redisdrain.Publisher
	stream    *redisstore.Stream
	consumers atomic.Int64
}

func (q *queue) Publish(ctx context.Context, r draintest.Record) error {
	added, err := q.pub.Publish(ctx, redisdrain.Record{Key: r.Key, Tenant: r.Tenant, Partition: r.Partition, Data: r.Data})
	if err == nil && !added {
		err = fmt.Errorf("%s dropped as a duplicate", r.Key)
	}
	return err
}

func (q *queue) Open(t testing.TB, o draintest.Options) draintest.Consumer {
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: q.addrs, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := redisdrain.New(ctx, c, redisdrain.Options{
		Stream: q.name, Group: "group", Consumer: fmt.Sprintf("consumer-%d", q.consumers.Add(1)),
		AckWait: o.AckWait, Window: o.Window,
	})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	k := &consumer{Source: src, c: c}
	t.Cleanup(k.Crash)
	return k
}

func (q *queue) DeadLetters(ctx context.Context) ([]draintest.Dead, error) {
	recs, err := q.stream.DeadLetters(ctx, redisstore.MaxStreamCount)
	if err != nil {
		return nil, err
	}
	dead := make([]draintest.Dead, 0, len(recs))
	for _, r := range recs {
		dead = append(dead, draintest.Dead{Key: r.Key, Reason: r.Error, Data: r.Data})
	}
	return dead, nil
}

// consumer is a Source on a client of its own.
type consumer struct {
	*redisdrain.Source
	c    redisstore.Client
	once sync.Once
}

// Crash closes the client without settling or handing back anything:
// what the consumer held is claimed by another after the ack wait.
func (k *consumer) Crash() { k.once.Do(func() { k.c.Close() }) }
