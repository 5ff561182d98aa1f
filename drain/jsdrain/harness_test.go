package jsdrain_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/jsdrain"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestMain(m *testing.M) {
	natstest.ChildMain()
	drainChildMain()
	rssChildMain()
	os.Exit(m.Run())
}

// sink is an idempotent loopback HTTP sink: it applies each
// Idempotency-Key once, answers 2xx to a key it applied before, and may
// throttle (a rate, or a random share of requests answered 429).
type sink struct {
	t     testing.TB
	srv   *httptest.Server
	limit *ratelimit.Limiter // nil: no rate limit
	share float64            // of requests answered 429 at random
	// retryAfter, when set, is the one retry hint of a 429 (the
	// Retry-After field, in seconds); else Retry-After: 1 with
	// Retry-After-Ms: 20.
	retryAfter string
	want       int // close done when this many keys are applied

	mu        sync.Mutex
	applied   map[string]int // key → order of application (from 1)
	order     []string       // keys in the order applied
	requests  int
	repeats   int // requests for a key already applied
	throttled int
	done      chan struct{}
	doneAt    time.Time
	notify    map[int]chan struct{} // closed when that many keys are applied
}

func newSink(t testing.TB, want int) *sink {
	s := &sink{t: t, want: want, applied: make(map[string]int), done: make(chan struct{}), notify: make(map[int]chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(drain.IdempotencyKeyHeader)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if key == "" {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if (s.limit != nil && !s.limit.Allow()) || (s.share > 0 && rand.Float64() < s.share) {
		s.throttled++
		if s.retryAfter != "" {
			w.Header().Set("Retry-After", s.retryAfter)
		} else {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Retry-After-Ms", "20")
		}
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	if _, ok := s.applied[key]; ok {
		s.repeats++
		w.WriteHeader(http.StatusOK)
		return
	}
	s.order = append(s.order, key)
	s.applied[key] = len(s.order)
	if ch, ok := s.notify[len(s.order)]; ok {
		close(ch)
	}
	if len(s.order) == s.want {
		s.doneAt = time.Now()
		close(s.done)
	}
	w.WriteHeader(http.StatusNoContent)
}

// at returns a channel closed once n keys are applied.
func (s *sink) at(n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if len(s.order) >= n {
		close(ch)
		return ch
	}
	s.notify[n] = ch
	return ch
}

// wait waits until every wanted key is applied, or fails after limit.
func (s *sink) wait(limit time.Duration) {
	s.t.Helper()
	tm := time.NewTimer(limit)
	defer tm.Stop()
	select {
	case <-s.done:
	case <-tm.C:
		s.mu.Lock()
		defer s.mu.Unlock()
		s.t.Fatalf("after %v: %d of %d applied (%d requests, %d throttled)", limit, len(s.order), s.want, s.requests, s.throttled)
	}
}

// check asserts that exactly the keys key(0..n-1) were applied, each once.
func (s *sink) check(n int) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.applied) != n {
		s.t.Errorf("%d keys applied, want %d", len(s.applied), n)
	}
	for i := range n {
		if _, ok := s.applied[key(i)]; !ok {
			s.t.Errorf("record %s lost", key(i))
			return
		}
	}
}

func key(i int) string { return fmt.Sprintf("rec-%07d", i) }

// queue connects to url and makes the stream WORK (work.>) and the
// dead-letter stream DEAD (dead.>) with replicas copies.
func queue(t testing.TB, url string, replicas int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for name, subj := range map[string]string{"WORK": "work.>", "DEAD": "dead.>"} {
		// A new cluster elects its JetStream leader after its nodes
		// accept clients: ask again until it answers.
		for {
			actx, acancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := js.CreateOrUpdateStream(actx, jetstream.StreamConfig{
				Name: name, Subjects: []string{subj}, Storage: jetstream.FileStorage, Replicas: replicas,
				Duplicates: 10 * time.Minute,
			})
			acancel()
			if err == nil {
				break
			}
			t.Logf("stream %s: %v", name, err)
			if ctx.Err() != nil {
				t.Fatalf("stream %s: %v", name, err)
			}
			tm := time.NewTimer(200 * time.Millisecond)
			select {
			case <-tm.C:
			case <-ctx.Done():
			}
		}
	}
	return nc, js
}

// enqueue publishes records from..to-1 (keys key(i)) on subject, tenant
// i%tenants, confirmed.
func enqueue(t testing.TB, js jetstream.JetStream, subject string, from, to, tenants int) {
	t.Helper()
	enqueueParts(t, js, subject, from, to, tenants, 0)
}

// enqueueParts is enqueue with partition i%partitions (none when 0).
func enqueueParts(t testing.TB, js jetstream.JetStream, subject string, from, to, tenants, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const batch = 2000
	for lo := from; lo < to; lo += batch {
		var futs []jetstream.PubAckFuture
		for i := lo; i < min(to, lo+batch); i++ {
			msg := nats.NewMsg(subject)
			msg.Data = []byte(`{"record":` + fmt.Sprint(i) + `}`)
			msg.Header.Set(jetstream.MsgIDHeader, key(i))
			msg.Header.Set(drain.HeaderTenant, fmt.Sprint("t", i%max(1, tenants)))
			if partitions > 0 {
				msg.Header.Set(drain.HeaderPartition, fmt.Sprint("p", i%partitions))
			}
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				t.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish: %v", err)
			case <-ctx.Done():
				t.Fatal("publish: timed out")
			}
		}
	}
}

// connect connects to url, reconnecting for ever.
func connect(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// source makes a JetStream source on subject.
func source(t testing.TB, js jetstream.JetStream, consumer, subject string, ackWait time.Duration) *jsdrain.Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := jsdrain.New(ctx, js, jsdrain.Options{
		Stream: "WORK", Consumer: consumer, Subject: subject, AckWait: ackWait, DeadLetter: "dead.work",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Stop)
	return src
}

// run runs d until the returned stop is called; stop waits for Run.
func run(t testing.TB, d *drain.Drainer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// deadCount is the number of messages in the dead-letter stream.
func deadCount(t testing.TB, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "DEAD")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}
