package kafkadrain_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain/kafkadrain"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// brokersEnv names the environment variable that points the tests at a
// real Kafka cluster ("host:port,host:port") instead of kfake.
const brokersEnv = "SLUICE_KAFKA_BROKERS"

// partitions is the partition count of the topics the tests drain.
const partitions = 3

// minRealSession is the least session timeout a real broker takes by
// default (group.min.session.timeout.ms).
const minRealSession = 6 * time.Second

// cluster is where a test's topics live: a fresh kfake cluster, or the
// real brokers of $SLUICE_KAFKA_BROKERS with fresh topic and group names.
type cluster struct {
	brokers []string
	fake    *kfake.Cluster // nil on real brokers
	topic   string
	dead    string
	group   string
}

var fresh atomic.Int64

// newCluster returns a cluster with the topics topic and its dead-letter
// topic, partitions each, empty.
func newCluster(t testing.TB, kopts ...kfake.Opt) *cluster {
	t.Helper()
	n := fresh.Add(1)
	c := &cluster{
		topic: fmt.Sprintf("work-%d-%d", time.Now().UnixNano(), n),
		group: fmt.Sprintf("group-%d-%d", time.Now().UnixNano(), n),
	}
	c.dead = c.topic + ".dead"
	if env := os.Getenv(brokersEnv); env != "" {
		c.brokers = strings.Split(env, ",")
	} else {
		opts := append([]kfake.Opt{
			kfake.NumBrokers(3),
			kfake.GroupMinSessionTimeout(100 * time.Millisecond),
		}, kopts...)
		fc, err := kfake.NewCluster(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fc.Close)
		c.fake, c.brokers = fc, fc.ListenAddrs()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, partitions, -1, nil, c.topic, c.dead)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("creating topics: %v", err)
	}
	return c
}

// session maps an ack wait to a session timeout the brokers take.
func (c *cluster) session(ackWait time.Duration) time.Duration {
	if c.fake == nil {
		return max(ackWait, minRealSession)
	}
	return ackWait
}

// producer returns a client for Publish, closed when t ends.
func (c *cluster) producer(t testing.TB) *kgo.Client {
	t.Helper()
	cl, err := kafkadrain.NewProducer(c.brokers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// open starts a Source of the cluster's group, on a network of its own
// that crash cuts; it is closed when t ends.
func (c *cluster) open(t testing.TB, o kafkadrain.Options) *consumer {
	t.Helper()
	o.Brokers, o.Topic, o.Group, o.DeadLetterTopic = c.brokers, c.topic, c.group, c.dead
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	n := &netCut{}
	o.ClientOptions = append(o.ClientOptions, kgo.Dialer(n.dial))
	src, err := kafkadrain.New(o)
	if err != nil {
		t.Fatal(err)
	}
	cons := &consumer{Source: src, net: n}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cons.close(ctx)
	})
	return cons
}

// deadLetters reads the dead-letter topic from its start to its end.
func (c *cluster) deadLetters(ctx context.Context) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.ConsumeTopics(c.dead),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, c.dead)
	if err != nil {
		return nil, err
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, e := range fs.Errors() {
			return nil, e.Err
		}
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
		})
	}
	slices.SortFunc(out, func(a, b *kgo.Record) int { return a.Timestamp.Compare(b.Timestamp) })
	return out, nil
}

// consumer is a Source whose process can crash.
type consumer struct {
	*kafkadrain.Source
	net  *netCut
	once sync.Once
}

// Crash cuts the member off the network and abandons it, as SIGKILL would:
// nothing more is committed and no leave is sent; the group hands its
// partitions on after the session timeout.
func (c *consumer) Crash() {
	c.net.cut()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	c.close(done)
}

func (c *consumer) close(ctx context.Context) {
	c.once.Do(func() { _ = c.Source.Close(ctx) })
}

// netCut dials TCP until it is cut, then closes every connection it made
// and dials no more.
type netCut struct {
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func (n *netCut) dial(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		conn.Close()
		return nil, errors.New("network cut")
	}
	n.conns = append(n.conns, conn)
	return conn, nil
}

func (n *netCut) cut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for _, c := range n.conns {
		c.Close()
	}
}
