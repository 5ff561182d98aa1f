package faultnet_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/jsdrain"
	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/natsembed"
	"github.com/sluicehq/sluice/ratelimit"
)

// The NATS server of TestFaultDrain is a copy of the test binary run
// with natsEnv set to its address (TestMain runs natsMain instead of the
// tests): a JetStream server (internal/natsembed, file storage in
// natsDir) on a host of its own.
const (
	natsEnv  = "FAULTNET_NATS"     // host:port to listen on
	natsDir  = "FAULTNET_NATS_DIR" // its storage
	natsPort = 4300
)

// natsMain serves JetStream until killed.
func natsMain() int {
	host, port, err := net.SplitHostPort(os.Getenv(natsEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if _, err := natsembed.Start(os.Getenv(natsDir), host, p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("READY")
	select {}
}

// hostDialer dials NATS from inside a host (nats.SetCustomDialer).
type hostDialer struct{ h *faultnet.Host }

func (d hostDialer) Dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return d.h.DialContext(ctx, network, addr)
}

// keySink is the drainer's sink on a host of its own: it counts the
// requests for each Idempotency-Key.
type keySink struct {
	url string
	mu  sync.Mutex
	n   map[string]int
}

func startKeySink(t *testing.T, h *faultnet.Host) *keySink {
	t.Helper()
	l, err := h.Listen("tcp", h.Addr(httpPort))
	if err != nil {
		t.Fatal(err)
	}
	s := &keySink{url: "http://" + h.Addr(httpPort), n: map[string]int{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.mu.Lock()
		s.n[req.Header.Get(drain.IdempotencyKeyHeader)]++
		s.mu.Unlock()
	})}
	go srv.Serve(l) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return s
}

// counts returns the keys applied and the requests beyond the first for
// a key (duplicates).
func (s *keySink) counts() (keys, dups int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.n {
		keys++
		dups += c - 1
	}
	return keys, dups
}

// The drain: drainRecords records at drainRate a second, an ack wait of
// drainAckWait; the drainer is cut from NATS for drainCut, twice the ack
// wait.
const (
	drainRecords = 2000
	drainRate    = 200
	drainAckWait = 2 * time.Second
	drainCut     = 2 * drainAckWait
	drainWorkers = 16
)

// TestFaultDrain: a drainer (drain.Drainer on a jsdrain.Source, in the
// test process, its sockets on a host of its own) drains a JetStream
// stream served on a second host into an HTTP sink on a third, which
// counts requests per Idempotency-Key. 3 s in, the drainer is cut from
// NATS (not from the sink) for twice the ack wait, then healed. Promises
// (README, "Draining a queue"): every record applied; a record reaches
// the sink twice only in the cases stated there, none of which is a
// partition. Measured: the duplicates, against what the drainer may hold
// (its rate for half the ack wait, Options.Limiter's bound on what it
// holds, plus its workers): the messages whose acknowledgement the cut
// lost are delivered again after the ack wait.
func TestFaultDrain(t *testing.T) {
	inMakeFaults(t)
	n := faultnet.New(t)
	nh, dh, sh := n.Host("nats"), n.Host("drainer"), n.Host("sink")
	cmd := nh.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), natsEnv+"="+nh.Addr(natsPort), natsDir+"="+t.TempDir())
	nh.StartCmd("nats", cmd)
	sink := startKeySink(t, sh)

	url := "nats://" + nh.Addr(natsPort)
	var nc *nats.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		nc, err = nats.Connect(url, nats.SetCustomDialer(hostDialer{dh}), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats: %v", err)
		}
		<-time.After(100 * time.Millisecond) // the server's start, polled
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for i := range drainRecords {
		if err := jsdrain.Publish(ctx, js, "work.a", "r"+strconv.Itoa(i), "", "", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	src, err := jsdrain.New(ctx, js, jsdrain.Options{Stream: "WORK", Consumer: "faults", AckWait: drainAckWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Stop)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext, tr.MaxIdleConnsPerHost = dh.DialContext, drainWorkers
	d, err := drain.New(drain.Options{Inputs: []drain.Input{{Source: src}}, Workers: drainWorkers,
		Sink:    (&drain.HTTPSink{URL: sink.url, HTTP: &http.Client{Transport: tr, Timeout: 5 * time.Second}}).Send,
		Limiter: ratelimit.NewLimiter(drainRate, 1)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(runCtx) }()

	// The phases are the scenario's own durations, not synchronisation.
	begin := time.Now()
	<-time.After(3 * time.Second)
	cutKeys, _ := sink.counts()
	dh.Partition(nh)
	<-time.After(drainCut)
	healKeys, cutDups := sink.counts()
	dh.Heal(nh)
	healed := time.Now()
	for n, _ := sink.counts(); n < drainRecords && time.Since(healed) < 60*time.Second; n, _ = sink.counts() {
		<-time.After(50 * time.Millisecond) // the sink's count, polled
	}
	done := time.Now()
	<-time.After(drainAckWait + time.Second) // any redelivery still due
	keys, dups := sink.counts()
	stop()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	st := d.Stats()
	bound := drainRate*int(drainAckWait/time.Second)/2 + drainWorkers
	t.Logf("applied %d of %d keys before the cut, %d by the heal (%d duplicates by then); all %d by %v after the start (%v after the heal); %d duplicates in all (bound %d); stats %+v",
		cutKeys, drainRecords, healKeys, cutDups, keys, done.Sub(begin).Round(time.Millisecond), done.Sub(healed).Round(time.Millisecond), dups, bound, st)
	row(t, fmt.Sprintf("drain: a drainer (JetStream, ack wait %v, %d/s) cut from its NATS server for %v (not from its sink), then healed", drainAckWait, drainRate, drainCut),
		fmt.Sprintf("records applied %d of %d; duplicates %d (bound: the rate for half the ack wait plus the workers, %d); applied during the cut %d; all applied %v after the heal",
			keys, drainRecords, dups, bound, healKeys-cutKeys, done.Sub(healed).Round(time.Millisecond)))
	if keys != drainRecords {
		t.Errorf("%d of %d records applied", keys, drainRecords)
	}
	if dups > bound {
		t.Errorf("%d duplicates, above %d", dups, bound)
	}
}
