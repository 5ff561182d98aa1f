package faultnet_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
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

// The nodes of the NATS cluster of TestFaultNATSCluster are copies of the
// test binary run with nodeEnv set to the node's name (TestMain runs
// nodeMain instead of the tests), each a JetStream server
// (natsembed.StartNode, file storage in nodeDir) on a host of its own,
// routed to the two others. The drainers are copies run with drainerEnv
// set (drainerMain), so that a drainer can be paused and killed by its
// process id.
const (
	nodeEnv    = "FAULTNET_NODE"        // the node's server name
	nodeAddr   = "FAULTNET_NODE_ADDR"   // its host, where it listens for clients (natsPort) and routes (routePort)
	nodeRoutes = "FAULTNET_NODE_ROUTES" // every node's route address, comma-separated
	nodeDir    = "FAULTNET_NODE_DIR"    // its storage, kept across a restart
	routePort  = 6300

	drainerEnv  = "FAULTNET_DRAINER"      // the drainer's name
	drainerNATS = "FAULTNET_DRAINER_NATS" // the NATS URLs, comma-separated, tried in order
	drainerSink = "FAULTNET_DRAINER_SINK" // the sink's URL
	drainerRate = "FAULTNET_DRAINER_RATE" // records a second
)

// The cluster's drain: clusterRecords records on a stream of 3 replicas,
// drained through the durable consumer clusterConsumer, ack wait
// clusterAckWait, by drainers of clusterWorkers workers each, at
// clusterRate a second in all.
const (
	clusterRecords  = 3000
	clusterRate     = 200
	clusterWorkers  = 8
	clusterAckWait  = 2 * time.Second
	clusterConsumer = "faults"
)

// nodeMain serves as one node of the cluster until killed.
func nodeMain() int {
	host := os.Getenv(nodeAddr)
	name := os.Getenv(nodeEnv)
	var routes []string
	for r := range strings.SplitSeq(os.Getenv(nodeRoutes), ",") {
		if !strings.HasPrefix(r, host+":") {
			routes = append(routes, r)
		}
	}
	if _, err := natsembed.StartNode(os.Getenv(nodeDir), host, natsPort,
		natsembed.Node{Cluster: "faults", Name: name, RouteHost: host, RoutePort: routePort, Routes: routes}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("READY")
	select {}
}

// drainerMain drains the cluster's consumer into the sink until killed:
// a drain.Drainer on a jsdrain.Source, connected as cmd/sluice's drain
// connects (reconnecting for ever, the client's other defaults), paced at
// drainerRate a second.
func drainerMain() int {
	rate, err := strconv.Atoi(os.Getenv(drainerRate))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	nc, err := nats.Connect(os.Getenv(drainerNATS), nats.MaxReconnects(-1), nats.DontRandomize())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	src, err := jsdrain.New(ctx, js, jsdrain.Options{Stream: "WORK", Consumer: clusterConsumer, AckWait: clusterAckWait})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = clusterWorkers
	d, err := drain.New(drain.Options{Inputs: []drain.Input{{Source: src}}, Workers: clusterWorkers,
		Sink:    (&drain.HTTPSink{URL: os.Getenv(drainerSink), HTTP: &http.Client{Transport: tr, Timeout: 5 * time.Second}}).Send,
		Limiter: ratelimit.NewLimiter(ratelimit.Limit(rate), 1)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("READY")
	if err := d.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// natsCluster is the three nodes, each on a host of its own.
type natsCluster struct {
	t     *testing.T
	hosts [3]*faultnet.Host
	dirs  [3]string
	procs [3]*faultnet.Proc
}

// startNATSCluster starts the three nodes, n1 to n3.
func startNATSCluster(t *testing.T, n *faultnet.Net) *natsCluster {
	c := &natsCluster{t: t}
	for i := range c.hosts {
		c.hosts[i] = n.Host("nats" + strconv.Itoa(i+1))
		c.dirs[i] = t.TempDir()
	}
	for i := range c.hosts {
		c.start(i)
	}
	return c
}

// start starts node i (again, after a kill: same name, same storage).
func (c *natsCluster) start(i int) {
	var routes []string
	for _, h := range c.hosts {
		routes = append(routes, h.Addr(routePort))
	}
	h := c.hosts[i]
	cmd := h.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"="+c.name(i), nodeAddr+"="+h.IP(), nodeRoutes+"="+strings.Join(routes, ","), nodeDir+"="+c.dirs[i])
	c.procs[i] = h.StartCmd("nats", cmd)
}

// name is node i's server name.
func (c *natsCluster) name(i int) string { return "n" + strconv.Itoa(i+1) }

// index is the index of the node named name, -1 if none is.
func (c *natsCluster) index(name string) int {
	for i := range c.hosts {
		if c.name(i) == name {
			return i
		}
	}
	return -1
}

// urls are the nodes' client URLs, comma-separated, those of skip left
// to the end (a client that tries them in order connects elsewhere first).
func (c *natsCluster) urls(skip int) string {
	var us, last []string
	for i, h := range c.hosts {
		u := "nats://" + h.Addr(natsPort)
		if i == skip {
			last = append(last, u)
		} else {
			us = append(us, u)
		}
	}
	return strings.Join(append(us, last...), ",")
}

// clusterSink is the drainers' sink on a host of its own: it records
// each request's key, arrival and sender (its address).
type clusterSink struct {
	url string
	mu  sync.Mutex
	got []arrival
}

// arrival is one request at the sink.
type arrival struct {
	key  string
	at   time.Time
	from string // the sender's IP
}

func startClusterSink(t *testing.T, h *faultnet.Host) *clusterSink {
	t.Helper()
	l, err := h.Listen("tcp", h.Addr(httpPort))
	if err != nil {
		t.Fatal(err)
	}
	s := &clusterSink{url: "http://" + h.Addr(httpPort)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		from, _, _ := net.SplitHostPort(req.RemoteAddr)
		a := arrival{key: req.Header.Get(drain.IdempotencyKeyHeader), at: time.Now(), from: from}
		s.mu.Lock()
		s.got = append(s.got, a)
		s.mu.Unlock()
	})}
	go srv.Serve(l) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return s
}

// arrivals returns the requests so far, in order of arrival.
func (s *clusterSink) arrivals() []arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// keys is how many keys have arrived.
func (s *clusterSink) keys() int {
	seen := map[string]bool{}
	for _, a := range s.arrivals() {
		seen[a.key] = true
	}
	return len(seen)
}

// await polls the sink until at least n keys have arrived, or for up to
// within; it returns when they had.
func (s *clusterSink) await(n int, within time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(within)
	for {
		if s.keys() >= n {
			return time.Now(), true
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		<-time.After(50 * time.Millisecond) // the sink's count, polled
	}
}

// drainReport is the checker's account of the sink's arrivals.
type drainReport struct {
	keys, dups int
	// stall is the longest time, from the fault on, with no new key
	// applied; allBy is when the last key first arrived.
	stall time.Duration
	allBy time.Time
	// dupsFrom counts the duplicates by sender, lateFrom those of them
	// that arrived after since (the fault's end: a paused drainer's
	// resumption).
	dupsFrom map[string]int
	lateFrom map[string]int
}

// check reports the arrivals, the stall measured from fault, the late
// duplicates from since.
func check(as []arrival, fault, since time.Time) drainReport {
	r := drainReport{dupsFrom: map[string]int{}, lateFrom: map[string]int{}}
	seen := map[string]bool{}
	last := fault
	for _, a := range as {
		if seen[a.key] {
			r.dups++
			r.dupsFrom[a.from]++
			if !since.IsZero() && a.at.After(since) {
				r.lateFrom[a.from]++
			}
			continue
		}
		seen[a.key] = true
		r.keys++
		r.allBy = a.at
		if a.at.After(fault) {
			r.stall = max(r.stall, a.at.Sub(last))
			last = a.at
		}
	}
	return r
}

// clusterSetup starts the cluster and the sink, creates the stream (3
// replicas, file storage) and the consumer, publishes the records, and
// puts the consumer's leader on the stream's leader's node. It returns
// the cluster, the sink and the leader's index.
func clusterSetup(t *testing.T, n *faultnet.Net) (*natsCluster, *clusterSink, int) {
	t.Helper()
	c := startNATSCluster(t, n)
	sh := n.Host("sink")
	sink := startClusterSink(t, sh)

	// The test's own connection, from the sink's host (never cut).
	var nc *nats.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		nc, err = nats.Connect(c.urls(-1), nats.SetCustomDialer(hostDialer{sh}), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats: %v", err)
		}
		<-time.After(100 * time.Millisecond) // the servers' start, polled
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var stream jetstream.Stream
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		stream, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Storage: jetstream.FileStorage, Replicas: 3})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream: %v", err)
		}
		<-time.After(200 * time.Millisecond) // the cluster's forming, polled
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, 0, clusterRecords)
	for i := range clusterRecords {
		f, err := js.PublishMsgAsync(jsdrain.NewMsg("work.a", "r"+strconv.Itoa(i), "", "", []byte(strconv.Itoa(i))))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish: %v", err)
		case <-ctx.Done():
			t.Fatal("publish: not confirmed within 60 s")
		}
	}
	src, err := jsdrain.New(ctx, js, jsdrain.Options{Stream: "WORK", Consumer: clusterConsumer, AckWait: clusterAckWait})
	if err != nil {
		t.Fatal(err)
	}
	src.Stop()

	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := info.Cluster.Leader
	for {
		ci, err := js.Consumer(ctx, "WORK", clusterConsumer)
		if err == nil {
			var inf *jetstream.ConsumerInfo
			if inf, err = ci.Info(ctx); err == nil && inf.Cluster.Leader == leader {
				break
			} else if err == nil {
				req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, leader)
				_, err = nc.RequestWithContext(ctx, "$JS.API.CONSUMER.LEADER.STEPDOWN.WORK."+clusterConsumer, []byte(req))
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("the consumer's leader not moved to %s: %v", leader, err)
		}
		<-time.After(200 * time.Millisecond) // the consumer's election, polled
	}
	i := c.index(leader)
	if i < 0 {
		t.Fatalf("leader %q is none of the nodes", leader)
	}
	return c, sink, i
}

// startDrainer runs a drainer process on h, draining at rate a second
// from the nodes in the order of urls.
func startDrainer(t *testing.T, h *faultnet.Host, urls, sinkURL string, rate int) *faultnet.Proc {
	t.Helper()
	cmd := h.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), drainerEnv+"="+h.Name(), drainerNATS+"="+urls, drainerSink+"="+sinkURL, drainerRate+"="+strconv.Itoa(rate))
	return h.StartCmd("drainer", cmd)
}

// The scenarios' faults: the leader cut for clusterCut (longer than the
// Raft election timeout's 4–9 s, so that the others elect a leader
// meanwhile), killed for clusterDown, a drainer paused for clusterPause,
// three ack waits.
const (
	clusterCut   = 10 * time.Second
	clusterDown  = 5 * time.Second
	clusterPause = 3 * clusterAckWait
	// clusterStart is how many records the drainers apply before the
	// fault.
	clusterStart = 400
)

// TestFaultNATSCluster: a three-node JetStream cluster (each node a
// process on a host of its own, routed to the others), a stream of three
// replicas on file storage holding clusterRecords records, drained into
// a sink on a host of its own that records each request's
// Idempotency-Key. Promises (README, "Draining a queue"; docs/draining.md):
// every record applied; a record reaches the sink twice only as stated
// there: a drainer that lost the queue past the ack wait repeats at most
// what it holds, its rate for half the ack wait, its workers and the
// acknowledgements awaiting an answer, never more than its window; a
// drainer stopped past the ack wait sends nothing it held on its
// resumption, only its workers' calls. Each scenario takes 36–55 s on
// the loaded 2-core machine, so all run in make faults only.
//
//   - leader-cut: the node leading the stream and the consumer is cut
//     from the two others and from the drainer for clusterCut, then
//     healed;
//   - leader-kill: that node is killed (SIGKILL by its process id) and
//     started again clusterDown later, on its storage;
//   - drainer-pause: two drainers share the consumer, at half the rate
//     each; one is paused (SIGSTOP) for clusterPause, three ack waits,
//     then resumed (SIGCONT): the other takes over what it held once the
//     ack wait has passed, and what the paused one sends on its
//     resumption is counted.
func TestFaultNATSCluster(t *testing.T) {
	for _, sc := range []string{"leader-cut", "leader-kill", "drainer-pause"} {
		t.Run(sc, func(t *testing.T) {
			inMakeFaults(t)
			natsClusterScenario(t, sc)
		})
	}
}

func natsClusterScenario(t *testing.T, scenario string) {
	n := faultnet.New(t)
	c, sink, leader := clusterSetup(t, n)
	urls := c.urls(leader) // the drainers connect to a follower
	var drainers []*faultnet.Proc
	var dhosts []*faultnet.Host
	ndrainers := 1
	if scenario == "drainer-pause" {
		ndrainers = 2
	}
	for i := range ndrainers {
		h := n.Host("drainer" + strconv.Itoa(i+1))
		dhosts = append(dhosts, h)
		drainers = append(drainers, startDrainer(t, h, urls, sink.url, clusterRate/ndrainers))
	}
	begin := time.Now()
	if _, ok := sink.await(clusterStart, 60*time.Second); !ok {
		t.Fatalf("%d of %d records applied before the fault, within 60 s", sink.keys(), clusterStart)
	}

	// The phases are the scenario's own durations, not synchronisation.
	fault := time.Now()
	var healed time.Time // the heal, the restart or the resumption
	var what string
	lh := c.hosts[leader]
	switch scenario {
	case "leader-cut":
		others := append([]*faultnet.Host{}, dhosts...)
		for i, h := range c.hosts {
			if i != leader {
				others = append(others, h)
			}
		}
		lh.Partition(others...)
		<-time.After(clusterCut)
		lh.Heal(others...)
		what = fmt.Sprintf("the node leading the stream and its consumer (%s) cut from the two others and from the drainer for %v, then healed", c.name(leader), clusterCut)
	case "leader-kill":
		c.procs[leader].Kill()
		<-time.After(clusterDown)
		c.start(leader)
		what = fmt.Sprintf("the node leading the stream and its consumer (%s) killed (SIGKILL) and started again %v later on its storage", c.name(leader), clusterDown)
	case "drainer-pause":
		drainers[0].Pause()
		<-time.After(clusterPause)
		drainers[0].Resume()
		what = fmt.Sprintf("one of two drainers (%d/s each) paused (SIGSTOP) for %v, then resumed (SIGCONT)", clusterRate/2, clusterPause)
	}
	healed = time.Now()
	during := check(sink.arrivals(), fault, time.Time{}).keys
	if _, ok := sink.await(clusterRecords, 60*time.Second); !ok {
		t.Errorf("%d of %d records applied 60 s after the fault ended", sink.keys(), clusterRecords)
	}
	<-time.After(clusterAckWait + time.Second) // any redelivery still due
	for _, d := range drainers {
		d.Kill()
	}
	r := check(sink.arrivals(), fault, healed)

	// What a drainer holds: its rate for half the ack wait waiting, its
	// workers' Sink calls, and the acknowledgements not yet confirmed;
	// never more than its window (jsdrain.DefaultWindow).
	perDrainer := clusterRate / ndrainers
	bound := perDrainer*int(clusterAckWait/time.Second)/2 + clusterWorkers
	var dupsBy []string
	for i, h := range dhosts {
		dupsBy = append(dupsBy, fmt.Sprintf("drainer %d sent %d (%d after the fault ended)", i+1, r.dupsFrom[h.IP()], r.lateFrom[h.IP()]))
	}
	t.Logf("%s: %d applied before the fault (%v after the start), %d by its end; all %d by %v after it ended; longest time without a new key %v; duplicates %d (%s), rate and workers %d",
		scenario, clusterStart, fault.Sub(begin).Round(time.Millisecond), during, r.keys, r.allBy.Sub(healed).Round(time.Millisecond),
		r.stall.Round(time.Millisecond), r.dups, strings.Join(dupsBy, "; "), bound)
	row(t, fmt.Sprintf("NATS cluster, %s: three nodes, a stream of 3 replicas, %d records drained at %d/s (ack wait %v, %d workers a drainer); %s", scenario, clusterRecords, clusterRate, clusterAckWait, clusterWorkers, what),
		fmt.Sprintf("records applied %d of %d; duplicates %d (%s; a drainer's rate for half the ack wait plus its workers %d, its window %d); longest time without a new record %v; all applied %v after the fault ended",
			r.keys, clusterRecords, r.dups, strings.Join(dupsBy, "; "), bound, jsdrain.DefaultWindow, r.stall.Round(time.Millisecond), r.allBy.Sub(healed).Round(time.Millisecond)))
	if r.keys != clusterRecords {
		t.Errorf("%d of %d records applied", r.keys, clusterRecords)
	}
	if r.dups > jsdrain.DefaultWindow {
		t.Errorf("%d duplicates, above a drainer's window %d", r.dups, jsdrain.DefaultWindow)
	}
	// The paused drainer sends nothing it held past the ack wait on its
	// resumption (drain.Stats.Lapsed): what it sends again after it is
	// what its workers had begun as it stopped and what its Source had
	// received and not yet handed out.
	if late := r.lateFrom[dhosts[0].IP()]; scenario == "drainer-pause" && late > clusterWorkers {
		t.Errorf("the paused drainer sent %d records again after its resumption, above %d", late, clusterWorkers)
	}
}
