package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/jsdrain"
	"github.com/sluicehq/sluice/drain/kafkadrain"
	"github.com/sluicehq/sluice/drain/redisdrain"
	"github.com/sluicehq/sluice/internal/natsembed"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The queues sluice enqueue, sluice drain and the ingestion demo run on
// (-source).
const (
	sourceJetStream = "jetstream"
	sourceRedis     = "redis"
	sourceKafka     = "kafka"
)

// queueFlags are the flags that say where the queue is, shared by drain,
// enqueue and the ingestion demo's processes.
type queueFlags struct {
	source        string
	natsURL, data string
	redis         string
	redisUser     string
	redisPassword string // a file's name; empty: $SLUICE_REDIS_PASSWORD
	redisTLS      bool
	redisCA       string
	kafka         string
	stream        string
	subject       string // JetStream: what sluice enqueue publishes to, under the stream's subjects
}

func (q *queueFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&q.source, "source", sourceJetStream, "the queue: jetstream (NATS JetStream), redis (Redis Streams) or kafka")
	fs.StringVar(&q.natsURL, "nats-url", "", "with -source jetstream: an external NATS server or cluster (comma-separated URLs); empty: the embedded server")
	fs.StringVar(&q.data, "data", "sluice-data", "with -source jetstream: the embedded server's data directory")
	fs.StringVar(&q.redis, "redis", "", "with -source redis: the Redis address (host:port; several, comma-separated, for a Cluster)")
	fs.StringVar(&q.redisUser, "redis-username", "", "with -source redis or drain -lease-redis: Redis ACL user (default: the default user)")
	fs.StringVar(&q.redisPassword, "redis-password-file", "", "with -source redis or drain -lease-redis: `file` holding the Redis password (default: $"+redisPasswordEnv+")")
	fs.BoolVar(&q.redisTLS, "redis-tls", false, "with -source redis or drain -lease-redis: connect over TLS, verified with the system's roots")
	fs.StringVar(&q.redisCA, "redis-tls-ca", "", "with -source redis or drain -lease-redis: PEM `file` of the CAs that verify Redis's certificate (implies -redis-tls)")
	fs.StringVar(&q.kafka, "kafka-brokers", "", "with -source kafka: the seed brokers (host:port, comma-separated)")
	fs.StringVar(&q.stream, "stream", "RECORDS", "the stream (JetStream: subjects <lower-case name>.>, dead letters <lower-case name>-dead.>; Redis: the stream's name, dead letters beside it; Kafka: the topic, dead letters to <name>-dead)")
}

// check validates the flags together; it is the one place that does.
func (q *queueFlags) check() error {
	if q.stream == "" || len(q.stream) > 200 {
		return errors.New("-stream must have 1 to 200 bytes")
	}
	switch q.source {
	case sourceJetStream:
	case sourceRedis:
		if q.redis == "" {
			return errors.New("-source redis needs -redis")
		}
	case sourceKafka:
		if q.kafka == "" {
			return errors.New("-source kafka needs -kafka-brokers (no Kafka broker is embedded)")
		}
	default:
		return fmt.Errorf("-source %q: want jetstream, redis or kafka", q.source)
	}
	return nil
}

// args are the flags that name the same queue, for a child process.
func (q *queueFlags) args() []string {
	a := []string{"-source", q.source}
	switch q.source {
	case sourceJetStream:
		a = append(a, "-nats-url", q.natsURL)
	case sourceRedis:
		a = append(a, "-redis", q.redis, "-redis-username", q.redisUser, "-redis-password-file", q.redisPassword,
			fmt.Sprintf("-redis-tls=%t", q.redisTLS), "-redis-tls-ca", q.redisCA)
	case sourceKafka:
		a = append(a, "-kafka-brokers", q.kafka)
	}
	return a
}

// A queueRecord is a record as enqueued.
type queueRecord struct {
	key, tenant, partition string
	data                   []byte
}

// A queue is a connection to where records wait: it publishes records to
// a stream (a topic) and makes drain.Sources on one. It is safe for
// concurrent use (the ingestion demo's API publishes from every request).
type queue interface {
	// publish enqueues recs on stream, durably: once it returns nil,
	// every one is stored. It reports which of them the queue already
	// held (by key), as far as the queue tells.
	publish(ctx context.Context, stream string, recs []queueRecord) (dups []bool, err error)
	// source returns a Source of consumer (a durable consumer, or a
	// consumer group) on stream, and what stops it (an error there means
	// what was settled may be delivered again: Kafka's last commit).
	source(ctx context.Context, stream, consumer string, window int, ackWait time.Duration) (drain.Source, func() error, error)
	close()
}

// A heldSource tells what other consumers hold of its queue: a drainer
// that starts says so, and until when (jsdrain's Source).
type heldSource interface {
	Held(ctx context.Context) (int64, error)
	AckWait() time.Duration
}

// open connects to the queue, starting the embedded NATS server when
// -source jetstream names no external one.
func (q *queueFlags) open(ctx context.Context) (queue, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	switch q.source {
	case sourceRedis:
		o, err := q.redisOptions(splitList(q.redis))
		if err != nil {
			return nil, err
		}
		c, err := redisstore.NewClient(o)
		if err != nil {
			return nil, err
		}
		return &redisQueue{c: c, pubs: map[string]*redisdrain.Publisher{}}, nil
	case sourceKafka:
		// Topics are made at their first record, where the brokers allow
		// it (Kafka's default).
		p, err := kafkadrain.NewProducer(splitList(q.kafka), kgo.AllowAutoTopicCreation())
		if err != nil {
			return nil, err
		}
		return &kafkaQueue{brokers: splitList(q.kafka), prod: p}, nil
	}
	url := q.natsURL
	var srv *server.Server
	if url == "" {
		var err error
		if srv, err = natsembed.Start(filepath.Clean(q.data), "127.0.0.1", -1); err != nil {
			return nil, err
		}
		url = srv.ClientURL()
	}
	stop := func() {
		if srv != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		stop()
		return nil, fmt.Errorf("connecting to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		stop()
		return nil, err
	}
	subject := q.subject
	if subject == "" {
		subject = "records"
	}
	return &jsQueue{js: js, subject: subject, bases: map[string]string{}, closeFn: func() { _ = nc.Drain(); nc.Close(); stop() }}, nil
}

// redisOptions are the options of a client of the Redis at addrs, with
// the -redis-username, -redis-password-file and -redis-tls flags' say:
// those of -source redis, and of drain's -lease-redis.
func (q *queueFlags) redisOptions(addrs []string) (redisstore.ClientOptions, error) {
	password, err := secret(q.redisPassword, redisPasswordEnv)
	if err != nil {
		return redisstore.ClientOptions{}, fmt.Errorf("reading the Redis password: %w", err)
	}
	tlsConfig, err := redisTLSConfig(q.redisTLS, q.redisCA)
	if err != nil {
		return redisstore.ClientOptions{}, err
	}
	return redisstore.ClientOptions{Addrs: addrs, Username: q.redisUser, Password: password, TLS: tlsConfig}, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// jsQueue is a JetStream queue: stream NAME with the subjects
// <lower-case name>.>, and NAME-DEAD with <lower-case name>-dead.>.
type jsQueue struct {
	js      jetstream.JetStream
	subject string
	closeFn func()
	mu      sync.Mutex
	bases   map[string]string // stream → its subjects' base, once ensured
}

// ensure makes sure stream and its dead letters' stream exist, once.
func (q *jsQueue) ensure(ctx context.Context, stream string) (string, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if base, ok := q.bases[stream]; ok {
		return base, nil
	}
	base, err := ensureStream(ctx, q.js, stream)
	if err == nil {
		q.bases[stream] = base
	}
	return base, err
}

func (q *jsQueue) close() { q.closeFn() }

// ensureStream makes sure that the file-backed stream name, with the
// subjects <lower-case name>.>, and its dead-letter stream exist, and
// returns the subjects' base.
func ensureStream(ctx context.Context, js jetstream.JetStream, name string) (base string, err error) {
	base = strings.ToLower(name)
	for n, subj := range map[string]string{name: base + ".>", name + "-DEAD": base + "-dead.>"} {
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: n, Subjects: []string{subj}, Storage: jetstream.FileStorage, Duplicates: time.Hour,
		}); err != nil {
			return "", fmt.Errorf("stream %s: %w", n, err)
		}
	}
	return base, nil
}

func (q *jsQueue) publish(ctx context.Context, stream string, recs []queueRecord) ([]bool, error) {
	base, err := q.ensure(ctx, stream)
	if err != nil {
		return nil, err
	}
	futs := make([]jetstream.PubAckFuture, 0, len(recs))
	for _, r := range recs {
		f, err := q.js.PublishMsgAsync(jsdrain.NewMsg(base+"."+q.subject, r.key, r.tenant, r.partition, r.data))
		if err != nil {
			return nil, err
		}
		futs = append(futs, f)
	}
	dups := make([]bool, len(recs))
	for i, f := range futs {
		select {
		case ack := <-f.Ok():
			dups[i] = ack.Duplicate
		case err := <-f.Err():
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return dups, nil
}

func (q *jsQueue) source(ctx context.Context, stream, consumer string, window int, ackWait time.Duration) (drain.Source, func() error, error) {
	base, err := q.ensure(ctx, stream)
	if err != nil {
		return nil, nil, err
	}
	src, err := jsdrain.New(ctx, q.js, jsdrain.Options{
		Stream: stream, Consumer: consumer, DeadLetter: base + "-dead.records", Window: window, AckWait: ackWait,
	})
	if err != nil {
		return nil, nil, err
	}
	return src, func() error { src.Stop(); return nil }, nil
}

// redisQueue is a Redis Streams queue: one stream per name, its dead
// letters beside it.
type redisQueue struct {
	c    redisstore.Client
	mu   sync.Mutex
	pubs map[string]*redisdrain.Publisher
}

func (q *redisQueue) close() { q.c.Close() }

func (q *redisQueue) publish(ctx context.Context, stream string, recs []queueRecord) ([]bool, error) {
	q.mu.Lock()
	p := q.pubs[stream]
	if p == nil {
		var err error
		if p, err = redisdrain.NewPublisher(q.c, redisdrain.PublishOptions{Stream: stream}); err != nil {
			q.mu.Unlock()
			return nil, err
		}
		q.pubs[stream] = p
	}
	q.mu.Unlock()
	dups := make([]bool, len(recs))
	for i, r := range recs {
		added, err := p.Publish(ctx, redisdrain.Record{Key: r.key, Tenant: r.tenant, Partition: r.partition, Data: r.data})
		if err != nil {
			return nil, err
		}
		dups[i] = !added
	}
	return dups, nil
}

func (q *redisQueue) source(ctx context.Context, stream, consumer string, window int, ackWait time.Duration) (drain.Source, func() error, error) {
	host, _ := os.Hostname()
	src, err := redisdrain.New(ctx, q.c, redisdrain.Options{
		Stream: stream, Group: consumer, Consumer: fmt.Sprintf("%s-%d", host, os.Getpid()), Window: window, AckWait: ackWait,
	})
	if err != nil {
		return nil, nil, err
	}
	return src, func() error {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return src.Close(cctx)
	}, nil
}

// kafkaQueue is a Kafka cluster: a topic per name, its dead letters to
// <name>-dead.
type kafkaQueue struct {
	brokers []string
	prod    *kgo.Client
}

func (q *kafkaQueue) close() { q.prod.Close() }

func (q *kafkaQueue) publish(ctx context.Context, stream string, recs []queueRecord) ([]bool, error) {
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = kafkadrain.NewRecord(stream, r.key, r.tenant, r.partition, r.data)
	}
	// Produced together, in order per partition, each acknowledged.
	if err := q.prod.ProduceSync(ctx, krs...).FirstErr(); err != nil {
		return nil, err
	}
	return make([]bool, len(recs)), nil // Kafka does not deduplicate by key
}

func (q *kafkaQueue) source(ctx context.Context, stream, consumer string, window int, ackWait time.Duration) (drain.Source, func() error, error) {
	src, err := kafkadrain.New(kafkadrain.Options{
		Brokers: q.brokers, Topic: stream, Group: consumer, DeadLetterTopic: stream + "-dead",
		Window: window, SessionTimeout: ackWait, ClientOptions: []kgo.Opt{kgo.AllowAutoTopicCreation()},
	})
	if err != nil {
		return nil, nil, err
	}
	return src, func() error {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return src.Close(cctx)
	}, nil
}
