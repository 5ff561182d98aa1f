// Command peers runs gubernator (github.com/gubernator-io/gubernator/v2),
// a peer of Sluice's approximate counting, for bench/peers.sh: a node of a
// cluster with static peers, a closed-loop load of GetRateLimits, and
// Sluice's accuracy harness (redisstore's TestCountingAccuracy) in
// gubernator's terms. It is a module of its own, so that Sluice's go.mod
// gains no dependency; the script builds it through the module proxy.
// Loopback only.
//
//	peers node -grpc ADDR -http ADDR -peers A,B,C,D
//	peers load -addrs A,B,C,D -pids P,Q,R,S -c 64 -k 10000 -d 6s -json
//	peers accuracy -addrs A,B,C,D -algorithm leaky -shape skewed -d 5s
//
// The node serves gubernator's daemon with discovery "none" and the peer
// list given (each node must be given the same list), so that GLOBAL
// behaviour runs between separate processes without gossip or etcd.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	guber "github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"github.com/sluicehq/sluice/bench/loadrun"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peers node|load|accuracy [flags]")
		os.Exit(2)
	}
	cmds := map[string]func([]string) error{"node": node, "load": load, "accuracy": accuracy}
	cmd, ok := cmds[os.Args[1]]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: peers node|load|accuracy [flags]")
		os.Exit(2)
	}
	if err := cmd(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "peers "+os.Args[1]+":", err)
		os.Exit(1)
	}
}

// loopbacks splits a comma-separated list of host:port addresses and
// refuses any that is not on the loopback interface.
func loopbacks(list string) ([]string, error) {
	addrs := strings.Split(list, ",")
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil, err
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("refusing the non-loopback address %q", a)
		}
	}
	return addrs, nil
}

// node serves one gubernator daemon until SIGINT or SIGTERM.
func node(args []string) error {
	fs := flag.NewFlagSet("node", flag.ExitOnError)
	grpcAddr := fs.String("grpc", "", "gRPC listen address (loopback)")
	httpAddr := fs.String("http", "", "HTTP listen address (loopback)")
	peerList := fs.String("peers", "", "every node's gRPC address, this one's included, comma-separated")
	syncWait := fs.Duration("sync-wait", 0, "GLOBAL's sync interval (GlobalSyncWait; 0: gubernator's default, 100ms)")
	_ = fs.Parse(args)
	addrs, err := loopbacks(*peerList + "," + *grpcAddr + "," + *httpAddr)
	if err != nil {
		return err
	}
	addrs = addrs[:len(addrs)-2]
	if !slices.Contains(addrs, *grpcAddr) {
		return errors.New("-peers must hold -grpc")
	}
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := guber.SpawnDaemon(ctx, guber.DaemonConfig{
		Logger:            logger.WithField("node", *grpcAddr),
		InstanceID:        *grpcAddr,
		GRPCListenAddress: *grpcAddr,
		HTTPListenAddress: *httpAddr,
		AdvertiseAddress:  *grpcAddr,
		PeerDiscoveryType: "none",
		Behaviors:         guber.BehaviorConfig{GlobalSyncWait: *syncWait},
	})
	if err != nil {
		return err
	}
	peers := make([]guber.PeerInfo, len(addrs))
	for i, a := range addrs {
		peers[i] = guber.PeerInfo{GRPCAddress: a}
	}
	d.SetPeers(peers)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	// Exiting ends the daemon; its Close can wait on peers already gone,
	// and it holds nothing to keep.
	return nil
}

// clients dials each address.
func clients(addrs []string) ([]guber.V1Client, func(), error) {
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	cs := make([]guber.V1Client, len(addrs))
	for i, a := range addrs {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, conn)
		cs[i] = guber.NewV1Client(conn)
	}
	return cs, closeAll, nil
}

// decide sends one request of one hit and reports whether it was admitted.
func decide(ctx context.Context, c guber.V1Client, req *guber.RateLimitReq) (admitted bool, err error) {
	resp, err := c.GetRateLimits(ctx, &guber.GetRateLimitsReq{Requests: []*guber.RateLimitReq{req}})
	if err != nil {
		return false, err
	}
	if len(resp.Responses) != 1 {
		return false, fmt.Errorf("%d responses to one request", len(resp.Responses))
	}
	r := resp.Responses[0]
	if r.Error != "" {
		return false, errors.New(r.Error)
	}
	return r.Status == guber.Status_UNDER_LIMIT, nil
}

// algorithm parses -algorithm.
func algorithm(s string) (guber.Algorithm, error) {
	switch s {
	case "token":
		return guber.Algorithm_TOKEN_BUCKET, nil
	case "leaky":
		return guber.Algorithm_LEAKY_BUCKET, nil
	}
	return 0, fmt.Errorf("-algorithm %q: token or leaky", s)
}

// load runs loadrun's closed loop of GetRateLimits, one hit on one of K
// keys each, with a limit no run reaches, the calls spread over the
// nodes in turn (each node sees every key).
func load(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	addrList := fs.String("addrs", "", "the nodes' gRPC addresses, comma-separated")
	pidList := fs.String("pids", "", "the nodes' PIDs, comma-separated, for their CPU per request")
	global := fs.Bool("global", true, "Behavior GLOBAL (false: gubernator's default, BATCHING, each key decided by its owner)")
	var c loadrun.Config
	fs.IntVar(&c.Callers, "c", 64, "concurrent callers")
	fs.IntVar(&c.Keys, "k", 10000, "distinct keys")
	fs.DurationVar(&c.Dur, "d", 5*time.Second, "duration (at most 2m)")
	fs.StringVar(&c.Name, "name", "gubernator", "label for the result")
	asJSON := fs.Bool("json", false, "print one JSON object")
	_ = fs.Parse(args)
	c.Domain = "bench"
	addrs, err := loopbacks(*addrList)
	if err != nil {
		return err
	}
	for p := range strings.SplitSeq(*pidList, ",") {
		if n, err := strconv.Atoi(p); err == nil {
			c.PIDs = append(c.PIDs, n)
		}
	}
	if err := c.Check(); err != nil {
		return err
	}
	cs, closeAll, err := clients(addrs)
	if err != nil {
		return err
	}
	defer closeAll()
	behavior := guber.Behavior_BATCHING
	if *global {
		behavior = guber.Behavior_GLOBAL
	}
	keys := make([]string, c.Keys)
	for i := range keys {
		keys[i] = loadrun.Value(i) // rlsload's values
	}
	var turn atomic.Uint64
	ctx := context.Background()
	r, err := loadrun.Run(c, func(i int) (bool, error) {
		admitted, err := decide(ctx, cs[turn.Add(1)%uint64(len(cs))], &guber.RateLimitReq{
			Name: "bench_remote_address", UniqueKey: keys[i],
			Hits: 1, Limit: 1_000_000_000, Duration: 1000, Algorithm: guber.Algorithm_TOKEN_BUCKET, Behavior: behavior,
		})
		return !admitted, err
	})
	if err != nil {
		return err
	}
	return r.Print(os.Stdout, *asJSON)
}

// admission is one admitted call: when it was sent and when its answer
// came, from the run's origin.
type admission struct{ before, after time.Duration }

// accuracy runs Sluice's accuracy harness against the cluster: 4 callers
// per node, each paced to its share of offered × rate on one key of
// Behavior GLOBAL (or BATCHING), for -d; then it reports what was admitted against what
// the limit allows over the run, and the worst 1 s window (counting the
// admissions surely inside it, sent and answered in it) against the
// limit. Shapes: even; skewed (90 % of the calls to one node that does
// not own the key, the rest spread); skewed-owner (90 % to the owner).
func accuracy(args []string) error {
	fs := flag.NewFlagSet("accuracy", flag.ExitOnError)
	addrList := fs.String("addrs", "", "the nodes' gRPC addresses, comma-separated")
	algo := fs.String("algorithm", "leaky", "leaky (LEAKY_BUCKET with -burst: Sluice's GCRA) or token (TOKEN_BUCKET: a window of -rate from its first hit)")
	shape := fs.String("shape", "even", "even, skewed or skewed-owner")
	rate := fs.Int("rate", 1000, "the limit, per second")
	burst := fs.Int("burst", 200, "LEAKY_BUCKET's burst (TOKEN_BUCKET has none: its window holds -rate)")
	offered := fs.Float64("offered", 4, "offered load, as a multiple of -rate")
	run := fs.Duration("d", 5*time.Second, "duration (at most 1m)")
	global := fs.Bool("global", true, "Behavior GLOBAL (false: BATCHING, every decision by the key's owner, the harness's check)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	_ = fs.Parse(args)
	addrs, err := loopbacks(*addrList)
	if err != nil {
		return err
	}
	behavior := guber.Behavior_BATCHING
	if *global {
		behavior = guber.Behavior_GLOBAL
	}
	alg, err := algorithm(*algo)
	if err != nil {
		return err
	}
	if *run <= 0 || *run > time.Minute || *rate < 1 || *burst < 1 || *offered <= 0 || *offered > 100 || len(addrs) < 2 {
		return errors.New("bounds: 0 < d ≤ 1m, rate ≥ 1, burst ≥ 1, 0 < offered ≤ 100, at least 2 nodes")
	}
	cs, closeAll, err := clients(addrs)
	if err != nil {
		return err
	}
	defer closeAll()
	ctx := context.Background()
	key := fmt.Sprintf("%s-%s-%d", *algo, *shape, time.Now().UnixNano())
	// request returns a request on the run's key (the server fills in
	// CreatedAt, so each call has its own).
	request := func(hits int64, b guber.Behavior) *guber.RateLimitReq {
		r := &guber.RateLimitReq{
			Name: "acc", UniqueKey: key, Hits: hits, Limit: int64(*rate), Duration: 1000,
			Algorithm: alg, Behavior: b,
		}
		if alg == guber.Algorithm_LEAKY_BUCKET {
			r.Burst = int64(*burst)
		}
		return r
	}
	owner, wait, err := findOwner(ctx, cs[0], addrs, request(0, guber.Behavior_BATCHING))
	if err != nil {
		return err
	}
	// The probe opened the key's first window (TOKEN_BUCKET): start when
	// it has closed, so that the run's windows are the run's own.
	time.Sleep(wait)
	hot := -1
	switch *shape {
	case "even":
	case "skewed":
		hot = (owner + 1) % len(cs)
	case "skewed-owner":
		hot = owner
	default:
		return fmt.Errorf("-shape %q: even, skewed or skewed-owner", *shape)
	}

	const callers = 4 // per node, as TestCountingAccuracy's per replica
	var mu sync.Mutex
	var adm []admission
	var calls, errs atomic.Int64
	origin := time.Now()
	stop := origin.Add(*run)
	var wg sync.WaitGroup
	for ni, c := range cs {
		share := 1 / float64(len(cs))
		if hot >= 0 {
			share = 0.1 / float64(len(cs)-1)
			if ni == hot {
				share = 0.9
			}
		}
		gap := time.Duration(float64(time.Second) / (*offered * float64(*rate) * share / callers))
		for range callers {
			wg.Go(func() {
				var local []admission
				for next := origin; ; next = next.Add(gap) {
					if now := time.Now(); next.After(now) {
						time.Sleep(next.Sub(now)) // pacing the load, not synchronising
					}
					if !time.Now().Before(stop) {
						break
					}
					before := time.Since(origin)
					ok, err := decide(ctx, c, request(1, behavior))
					after := time.Since(origin)
					calls.Add(1)
					switch {
					case err != nil:
						errs.Add(1)
					case ok:
						local = append(local, admission{before, after})
					}
				}
				mu.Lock()
				adm = append(adm, local...)
				mu.Unlock()
			})
		}
	}
	wg.Wait()

	// What the limit allows over the run: LEAKY_BUCKET, as Sluice's GCRA,
	// the burst and then the rate; TOKEN_BUCKET, the rate in each window
	// begun in the run (the first at the first call, each lasting 1 s).
	allowed, limitW := *burst+int(float64(*rate)*run.Seconds()), *burst+*rate
	if alg == guber.Algorithm_TOKEN_BUCKET {
		windows := int((*run + time.Second - 1) / time.Second)
		allowed, limitW = *rate*windows, *rate
	}
	worst := worstWindow(adm, time.Second)
	res := accuracyResult{
		Behavior: behavior.String(), Algorithm: *algo, Shape: *shape, Nodes: len(cs), Owner: owner, Hot: hot, Seconds: run.Seconds(),
		Offered: *offered * float64(*rate), Calls: calls.Load(), Errors: errs.Load(),
		Admitted: len(adm), Allowed: allowed, AdmittedPct: 100 * float64(len(adm)) / float64(allowed),
		WorstWindow: worst, WindowLimit: limitW, WorstPct: 100 * float64(worst) / float64(limitW),
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("gubernator %s %s %s (%d nodes, owner %d, hot %d): %d calls in %.0fs, %d errors; admitted %d of %d allowed (%.1f%%); worst 1s window %d of %d (%.1f%%)\n",
		res.Behavior, res.Algorithm, res.Shape, res.Nodes, res.Owner, res.Hot, res.Calls, res.Seconds, res.Errors, res.Admitted, res.Allowed, res.AdmittedPct, res.WorstWindow, res.WindowLimit, res.WorstPct)
	return nil
}

type accuracyResult struct {
	Behavior    string  `json:"behavior"`
	Algorithm   string  `json:"algorithm"`
	Shape       string  `json:"shape"`
	Nodes       int     `json:"nodes"`
	Owner       int     `json:"owner"` // the node owning the key
	Hot         int     `json:"hot"`   // the node taking 90 %, or -1
	Seconds     float64 `json:"seconds"`
	Offered     float64 `json:"offered_per_s"`
	Calls       int64   `json:"calls"`
	Errors      int64   `json:"errors"`
	Admitted    int     `json:"admitted"`
	Allowed     int     `json:"allowed"`
	AdmittedPct float64 `json:"admitted_pct"`
	WorstWindow int     `json:"worst_window"`
	WindowLimit int     `json:"window_limit"`
	WorstPct    float64 `json:"worst_pct"`
}

// findOwner sends probe (no hits, not GLOBAL) to first, the node of
// addrs[0], which forwards it to the key's owner and names it (or owns the
// key); it returns the owner's index in addrs and how long until the
// window the probe opened has closed.
func findOwner(ctx context.Context, first guber.V1Client, addrs []string, probe *guber.RateLimitReq) (int, time.Duration, error) {
	resp, err := first.GetRateLimits(ctx, &guber.GetRateLimitsReq{Requests: []*guber.RateLimitReq{probe}})
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Responses) != 1 || resp.Responses[0].Error != "" {
		return 0, 0, fmt.Errorf("probe: %v", resp.Responses)
	}
	r := resp.Responses[0]
	wait := time.Until(time.UnixMilli(r.ResetTime)) + 10*time.Millisecond
	wait = min(max(wait, 0), 2*time.Second)
	o, ok := r.Metadata["owner"]
	if !ok {
		return 0, wait, nil // the first node owns it
	}
	i := slices.Index(addrs, o)
	if i < 0 {
		return 0, 0, fmt.Errorf("owner %q is none of the nodes", o)
	}
	return i, wait, nil
}

// worstWindow returns the most admissions surely inside any window of
// length l (sent at or after its start, answered by its end), as
// redisstore's accuracy tests count them.
func worstWindow(as []admission, l time.Duration) int {
	slices.SortFunc(as, func(a, b admission) int { return int(a.before - b.before) })
	worst := 0
	for i := range as {
		end := as[i].before + l
		n := 0
		for j := i; j < len(as) && as[j].before <= end; j++ {
			if as[j].after <= end {
				n++
			}
		}
		worst = max(worst, n)
	}
	return worst
}
