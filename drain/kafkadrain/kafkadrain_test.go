package kafkadrain_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/kafkadrain"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestOptionsInvalid(t *testing.T) {
	ok := kafkadrain.Options{Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g"}
	for _, tt := range []struct {
		name string
		edit func(*kafkadrain.Options)
		want string
	}{
		{"no brokers", func(o *kafkadrain.Options) { o.Brokers = nil }, "needs Brokers"},
		{"no topic", func(o *kafkadrain.Options) { o.Topic = "" }, "needs Brokers, Topic"},
		{"no group", func(o *kafkadrain.Options) { o.Group = "" }, "Group"},
		{"dead letters to itself", func(o *kafkadrain.Options) { o.DeadLetterTopic = "t" }, "DeadLetterTopic"},
		{"negative window", func(o *kafkadrain.Options) { o.Window = -1 }, "negative Window"},
		{"uncommitted below window", func(o *kafkadrain.Options) { o.Window, o.MaxUncommitted = 8, 4 }, "below Window"},
		{"negative session", func(o *kafkadrain.Options) { o.SessionTimeout = -time.Second }, "SessionTimeout is negative"},
		{"negative revoke wait", func(o *kafkadrain.Options) { o.RevokeWait = -time.Second }, "RevokeWait is negative"},
		{"negative commit period", func(o *kafkadrain.Options) { o.CommitEvery = -time.Second }, "CommitEvery is negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.edit(&o)
			s, err := kafkadrain.New(o)
			if err == nil {
				s.Close(context.Background())
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to say %q", err, tt.want)
			}
		})
	}
}

// TestOrdered checks Options.Ordered on one Kafka partition: one record
// out at a time, and a record put back comes before the next.
func TestOrdered(t *testing.T) {
	c := newCluster(t)
	prod := c.producer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 3 {
		// One downstream partition, so one Kafka partition.
		if err := kafkadrain.Publish(ctx, prod, c.topic, key(i), "", "p", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	src := c.open(t, kafkadrain.Options{Window: 8, Ordered: true, SessionTimeout: c.session(2 * time.Second)})
	next := func(limit time.Duration) (drain.Message, error) {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		return src.Next(ctx)
	}
	m, err := next(30 * time.Second)
	if err != nil || m.Key() != key(0) || m.Partition() != "p" {
		t.Fatalf("first: %v, %v; want %s of partition p", m, err, key(0))
	}
	if m2, err := next(500 * time.Millisecond); err == nil {
		t.Fatalf("%s delivered while %s of its partition is out", m2.Key(), m.Key())
	}
	if err := m.Nak(ctx, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	again, err := next(10 * time.Second)
	if err != nil || again.Key() != key(0) || again.Deliveries() != 2 {
		t.Fatalf("after Nak: %v, %v; want %s again, its second delivery", again, err, key(0))
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := again.Ack(ctx); err == nil {
		t.Error("a second Ack of one delivery succeeded")
	}
	for i := 1; i < 3; i++ {
		m, err := next(10 * time.Second)
		if err != nil || m.Key() != key(i) {
			t.Fatalf("then: %v, %v; want %s", m, err, key(i))
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeyDefaults checks a record published without headers: its key is
// topic/partition/offset and its partition its Kafka key, else
// topic/partition.
func TestKeyDefaults(t *testing.T) {
	c := newCluster(t)
	prod := c.producer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &kgo.Record{Topic: c.topic, Partition: 0, Value: []byte("bare")}
	if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	src := c.open(t, kafkadrain.Options{SessionTimeout: c.session(2 * time.Second)})
	m, err := src.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantKey := c.topic + "/" + itoa(r.Partition) + "/" + itoa64(r.Offset)
	if m.Key() != wantKey || m.Partition() != c.topic+"/"+itoa(r.Partition) || m.Tenant() != "" || string(m.Data()) != "bare" {
		t.Fatalf("key %q partition %q tenant %q data %q; want %q, %q, none, bare", m.Key(), m.Partition(), m.Tenant(), m.Data(), wantKey, c.topic+"/"+itoa(r.Partition))
	}
}

func itoa(p int32) string   { return strconv.Itoa(int(p)) }
func itoa64(o int64) string { return strconv.FormatInt(o, 10) }

// heldOnePerPartition publishes one record to each partition and returns
// them as delivered to a Source of the cluster's group with o.
func heldOnePerPartition(t *testing.T, c *cluster, o kafkadrain.Options) (*consumer, map[int32]drain.Message) {
	t.Helper()
	prod, err := kafkadrain.NewProducer(c.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p := range int32(partitions) {
		r := &kgo.Record{Topic: c.topic, Partition: p, Value: []byte("x")}
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	src := c.open(t, o)
	held := make(map[int32]drain.Message)
	for range partitions {
		m, err := src.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The default key is topic/partition/offset.
		p, _ := strconv.Atoi(strings.Split(m.Key(), "/")[1])
		held[int32(p)] = m
	}
	return src, held
}

// TestRevokeWaits: a member joins while another holds a record of every
// partition; the rebalance waits for them (RevokeWait), so the newcomer
// gets none of them, and once they are acknowledged it gets nothing.
func TestRevokeWaits(t *testing.T) {
	c := newCluster(t)
	o := kafkadrain.Options{SessionTimeout: c.session(2 * time.Second), RevokeWait: time.Minute}
	_, held := heldOnePerPartition(t, c, o)
	other := c.open(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 3*o.SessionTimeout)
	if m, err := other.Next(ctx); err == nil {
		t.Fatalf("the newcomer got %s, held by the other member", m.Key())
	}
	cancel()
	for _, m := range held {
		if err := m.Ack(context.Background()); err != nil {
			t.Fatalf("Ack %s: %v", m.Key(), err)
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 2*o.SessionTimeout)
	defer cancel()
	if m, err := other.Next(ctx); err == nil {
		t.Fatalf("the newcomer got %s, acknowledged by the other member", m.Key())
	}
}

// TestRevokeDrops: with a short RevokeWait, the partition that moves to a
// newcomer is let go with its record still out: that record's Ack fails
// and commits nothing, the newcomer gets it, and the acks of the others
// hold.
func TestRevokeDrops(t *testing.T) {
	c := newCluster(t)
	o := kafkadrain.Options{SessionTimeout: c.session(2 * time.Second), RevokeWait: time.Millisecond}
	_, held := heldOnePerPartition(t, c, o)
	other := c.open(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	moved, err := other.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if moved.Deliveries() != 1 {
		t.Errorf("Deliveries %d at the new owner, want 1", moved.Deliveries())
	}
	var failed int
	for _, m := range held {
		err := m.Ack(ctx)
		switch {
		case m.Key() == moved.Key() && err == nil:
			t.Errorf("Ack of %s, whose partition moved, succeeded", m.Key())
		case m.Key() == moved.Key():
			failed++
		case err != nil:
			t.Errorf("Ack %s: %v", m.Key(), err)
		}
	}
	if failed != 1 {
		t.Fatalf("the newcomer got %s, not one of the records held", moved.Key())
	}
	if err := moved.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// Every record settled once, by its partition's owner: the group's
	// committed offsets reach the end.
	committedAll(t, c, 30*time.Second)
}

// TestMaxUncommitted: a record put back for long holds its partition's
// commit point; the records settled behind it stay tracked, and once
// MaxUncommitted are, the Source takes no more from the topic.
func TestMaxUncommitted(t *testing.T) {
	const bound = 6
	c := newCluster(t)
	prod := c.producer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 3 * bound {
		if err := kafkadrain.Publish(ctx, prod, c.topic, key(i), "", "one", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	src := c.open(t, kafkadrain.Options{Window: bound, MaxUncommitted: bound, SessionTimeout: c.session(2 * time.Second)})
	first, err := src.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Nak(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	for range bound - 1 {
		m, err := src.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// bound records tracked: the one put back and those settled behind it.
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	if m, err := src.Next(wctx); err == nil {
		t.Fatalf("delivered %s with %d records tracked past the commit point", m.Key(), bound)
	}
	n, err := src.Backlog(ctx)
	if err != nil || n != 2*bound+1 {
		t.Fatalf("Backlog %d, %v; want %d (the %d not settled)", n, err, 2*bound+1, 2*bound+1)
	}
}

// TestOrderedDrainer drains records of four downstream partitions (so at
// most four Kafka partitions) through a Drainer of eight workers on an
// Ordered Source, with one record throttled twice: each partition's
// records are applied in the order they were published.
func TestOrderedDrainer(t *testing.T) {
	const n = 120
	c := newCluster(t)
	prod := c.producer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range n {
		if err := kafkadrain.Publish(ctx, prod, c.topic, key(i), "", "k"+strconv.Itoa(i%4), []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	src := c.open(t, kafkadrain.Options{Window: 16, Ordered: true, SessionTimeout: c.session(2 * time.Second)})
	var mu sync.Mutex
	last := make(map[string]int) // partition → the last record applied
	throttled := 0
	done := make(chan struct{})
	applied := 0
	sink := func(_ context.Context, m drain.Message) error {
		mu.Lock()
		defer mu.Unlock()
		i, _ := strconv.Atoi(string(m.Data()))
		if i == 41 && throttled < 2 {
			throttled++
			return drain.Throttle(5*time.Millisecond, errors.New("429"))
		}
		if prev, ok := last[m.Partition()]; ok && i <= prev {
			t.Errorf("partition %s: record %d applied after %d", m.Partition(), i, prev)
		}
		last[m.Partition()] = i
		if applied++; applied == n {
			close(done)
		}
		return nil
	}
	d, err := drain.New(drain.Options{Inputs: []drain.Input{{Source: src}}, Sink: sink, Workers: 8,
		DefaultPause: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(rctx) }()
	await(t, done, 60*time.Second, "every record applied")
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if throttled != 2 {
		t.Errorf("record 41 throttled %d times, want 2", throttled)
	}
}
