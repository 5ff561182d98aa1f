package drain_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
)

// oneSource delivers one message, again each time it is put back.
type oneSource struct{ ch chan drain.Message }

func (s *oneSource) Next(ctx context.Context) (drain.Message, error) {
	select {
	case m := <-s.ch:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (s *oneSource) Backlog(context.Context) (int64, error) { return int64(len(s.ch)), nil }
func (s *oneSource) Window() int                            { return 1 }

// recMsg records how it was settled.
type recMsg struct {
	src   *oneSource
	mu    sync.Mutex
	naks  []time.Duration
	acked chan struct{}
	n     int
}

func (m *recMsg) Key() string       { return "k" }
func (m *recMsg) Data() []byte      { return []byte("x") }
func (m *recMsg) Tenant() string    { return "" }
func (m *recMsg) Partition() string { return "" }
func (m *recMsg) Deliveries() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}
func (m *recMsg) Ack(context.Context) error { close(m.acked); return nil }
func (m *recMsg) Nak(_ context.Context, d time.Duration) error {
	m.mu.Lock()
	m.naks = append(m.naks, d)
	m.n++
	m.mu.Unlock()
	m.src.ch <- m // delivered again at once: the test measures the drainer's pause, not the queue's delay
	return nil
}
func (m *recMsg) InProgress(context.Context) error        { return nil }
func (m *recMsg) DeadLetter(context.Context, error) error { return nil }

// TestOneThrottledAnswerOnePause: in the path of sluice drain (an
// HTTPSink under a Drainer), one 429 with a retry hint is acted on once:
// one pause of the length asked (Stats.Pauses, OnThrottle), one NAK with
// that delay, and the next request only after it. Before, the sink's
// httplimit.Client paused the host as well, and the sink and the drainer
// each read the hint: three actors for one answer.
func TestOneThrottledAnswerOnePause(t *testing.T) {
	const hint = 300 * time.Millisecond
	var reqs atomic.Int32
	var first, second atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch reqs.Add(1) {
		case 1:
			first.Store(time.Now().UnixNano())
			w.Header().Set("Retry-After-Ms", "300")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			second.CompareAndSwap(0, time.Now().UnixNano())
		}
	}))
	t.Cleanup(srv.Close)
	src := &oneSource{ch: make(chan drain.Message, 1)}
	m := &recMsg{src: src, acked: make(chan struct{}), n: 1}
	src.ch <- m
	var mu sync.Mutex
	var told []time.Duration
	d, err := drain.New(drain.Options{
		Inputs:     []drain.Input{{Source: src}},
		Sink:       (&drain.HTTPSink{URL: srv.URL}).Send,
		OnThrottle: func(p time.Duration) { mu.Lock(); told = append(told, p); mu.Unlock() },
		Workers:    4,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, d)
	select {
	case <-m.acked:
	case <-time.After(30 * time.Second):
		t.Fatal("the message was not acknowledged within 30 s")
	}
	stop()
	st := d.Stats()
	if st.Throttled != 1 || st.Pauses != 1 || st.Done != 1 || st.Failed != 0 {
		t.Errorf("stats: throttled %d, pauses %d, done %d, failed %d; want 1, 1, 1, 0", st.Throttled, st.Pauses, st.Done, st.Failed)
	}
	mu.Lock()
	if len(told) != 1 || told[0] != hint {
		t.Errorf("OnThrottle told %v, want [%v]", told, hint)
	}
	mu.Unlock()
	m.mu.Lock()
	if len(m.naks) != 1 || m.naks[0] != hint {
		t.Errorf("NAKs %v, want one of %v", m.naks, hint)
	}
	m.mu.Unlock()
	if n := reqs.Load(); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
	if gap := time.Duration(second.Load() - first.Load()); gap < hint {
		t.Errorf("the second request came %v after the 429, want at least the %v asked", gap, hint)
	}
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
