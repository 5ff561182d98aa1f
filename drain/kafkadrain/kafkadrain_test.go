package kafkadrain_test

import (
	"context"
	"strconv"
	"strings"
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
