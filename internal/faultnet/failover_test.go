package faultnet_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// failoverRules: failoverRules' hot key is strictRules' (100 a second);
// ledger's limit is never reached, so that every admission Redis
// acknowledged is an increment it should still hold at the end.
const (
	failoverRules = strictRules + `  - key: ledger
    rate_limit: {unit: day, requests_per_unit: 100000000, algorithm: fixed_window}
`
	ledgerLimit = 100000000
	masterName  = "sluice"
)

// TestFaultFailover: scenario b. Redis as a primary and a replica, three
// Sentinels (quorum 2), two serve replicas that find the primary through
// the Sentinels, each on a host of its own, and clients on another. Under
// load, the primary is either frozen (SIGSTOP) or cut from its replica
// and the Sentinels (not from the serve replicas) until the Sentinels
// have promoted the replica and both serve replicas run their scripts on
// it; then it is resumed or healed (the Sentinels make it a replica of
// the new primary). Promises checked: each window of the strict key
// admits at most twice the limit (local's bound for a window Redis
// decides part of); every decision within the Redis timeout plus a
// margin. Measured: the time to recover, and the increments Redis
// acknowledged (admissions with reason ok of a key far below its limit)
// that the new primary does not count: asynchronous replication loses
// what a cut primary acknowledged.
//
// `make test` runs the first mode; `make faults` all three. The third
// mode is the second with the primary told to refuse writes
// once its replica has not acknowledged the stream for a second
// (min-replicas-to-write 1, min-replicas-max-lag 1): Redis's own bound on
// what a cut primary acknowledges.
func TestFaultFailover(t *testing.T) {
	for _, mode := range []string{"freeze", "partition", "partition-min-replicas"} {
		t.Run(mode, func(t *testing.T) {
			if mode != "freeze" {
				inMakeFaults(t)
			}
			failover(t, mode)
		})
	}
}

// sentinelSet is a Redis primary and replica and three Sentinels
// (quorum 2), each on a host of its own, asked from the client host.
type sentinelSet struct {
	primaryHost, replicaHost *faultnet.Host
	primary                  *redisproc.Process
	replica                  *redis.Client // a client of the replica, from the client host
	sentinelHosts            []*faultnet.Host
	sentinels                []*redis.Client
	sentinelAddrs            []string
}

// poll waits for cond, at most 20 s.
func poll(t *testing.T, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	if err := redisproc.Poll(20*time.Second, nil, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// startSentinelSet starts a sentinelSet on n, the primary with more
// arguments, and waits until the replica is in sync and every Sentinel
// knows the replica and the other two.
func startSentinelSet(t *testing.T, n *faultnet.Net, ch *faultnet.Host, primaryArgs ...string) *sentinelSet {
	t.Helper()
	ss := &sentinelSet{primaryHost: n.Host("primary"), replicaHost: n.Host("replica")}
	ss.primary = startRedis(t, ss.primaryHost, redisproc.Standalone, redisPort, primaryArgs...)
	replica := startRedis(t, ss.replicaHost, redisproc.Standalone, redisPort, "--replicaof", ss.primaryHost.IP(), strconv.Itoa(redisPort))
	client := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, Dialer: ch.DialContext, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	ss.replica = client(replica.Addr())
	poll(t, "replica in sync", func(ctx context.Context) (bool, string, error) {
		info, err := ss.replica.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up"), info, err
	})
	conf := []string{
		fmt.Sprintf("sentinel monitor %s %s %d 2", masterName, ss.primaryHost.IP(), redisPort),
		fmt.Sprintf("sentinel down-after-milliseconds %s 1000", masterName),
		fmt.Sprintf("sentinel failover-timeout %s 10000", masterName),
	}
	for i := range 3 {
		h := n.Host("sentinel" + strconv.Itoa(i+1))
		s, err := redisproc.Start(redisproc.Options{Kind: redisproc.Sentinel, Dir: t.TempDir(), Host: h, Port: sentinelPort,
			Args: func(int) []string { return conf }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Kill)
		ss.sentinelHosts = append(ss.sentinelHosts, h)
		ss.sentinels = append(ss.sentinels, client(s.Addr()))
		ss.sentinelAddrs = append(ss.sentinelAddrs, s.Addr())
	}
	for i, s := range ss.sentinels {
		poll(t, "Sentinel "+strconv.Itoa(i+1)+" knows the replica and the other Sentinels", func(ctx context.Context) (bool, string, error) {
			reps, err := s.Do(ctx, "SENTINEL", "REPLICAS", masterName).Slice()
			if err != nil {
				return false, "", err
			}
			others, err := s.Do(ctx, "SENTINEL", "SENTINELS", masterName).Slice()
			return err == nil && len(reps) == 1 && len(others) == 2, fmt.Sprintf("%d replicas, %d other Sentinels", len(reps), len(others)), err
		})
	}
	return ss
}

// awaitPromotion waits until the Sentinels name the replica master.
func (ss *sentinelSet) awaitPromotion(t *testing.T) {
	t.Helper()
	poll(t, "the Sentinels promote the replica", func(ctx context.Context) (bool, string, error) {
		addr, err := ss.sentinels[0].Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName).StringSlice()
		return err == nil && len(addr) == 2 && addr[0] == ss.replicaHost.IP(), fmt.Sprint(addr), err
	})
}

func failover(t *testing.T, mode string) {
	n := faultnet.New(t)
	ch := n.Host("client")
	var primaryArgs []string
	if mode == "partition-min-replicas" {
		primaryArgs = []string{"--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"}
	}
	ss := startSentinelSet(t, n, ch, primaryArgs...)
	ph, qh, primary, rc, sentinelHosts, sentinelAddrs := ss.primaryHost, ss.replicaHost, ss.primary, ss.replica, ss.sentinelHosts, ss.sentinelAddrs
	flags := []string{"--store", "redis", "--redis-master", masterName, "--redis-addr", strings.Join(sentinelAddrs, ","), "--replicas", "2"}
	s1h, s2h := n.Host("serve1"), n.Host("serve2")
	servers := []*serve{startServe(t, s1h, ch, failoverRules, flags...), startServe(t, s2h, ch, failoverRules, flags...)}

	var hot, ledger faultnet.History
	stop := make(chan struct{})
	done := make(chan struct{}, 2)
	go func() { load(servers, 2, 4*time.Millisecond, &hot, stop, "faults", "k", "hot"); done <- struct{}{} }()
	go func() {
		load(servers, 1, 5*time.Millisecond, &ledger, stop, "faults", "ledger", "l")
		done <- struct{}{}
	}()
	phase := func(d time.Duration) time.Time { <-time.After(d); return time.Now() }
	phase(2500 * time.Millisecond) // the scenario's own duration

	signal := func(sig os.Signal) {
		t.Helper()
		if err := primary.Signal(sig); err != nil {
			t.Fatalf("%v to the primary: %v", sig, err)
		}
	}
	cut := append([]*faultnet.Host{qh}, sentinelHosts...)
	if mode == "freeze" {
		signal(redisproc.FreezeSignal)
	} else {
		ph.Partition(cut...)
	}
	began := time.Now()
	ss.awaitPromotion(t)
	promoted := time.Now()
	// Both serve replicas decide on the new primary: each has run a
	// script there.
	poll(t, "both serve replicas on the new primary", func(ctx context.Context) (bool, string, error) {
		list, err := rc.ClientList(ctx).Result()
		return err == nil && ranScript(list, s1h.IP()) && ranScript(list, s2h.IP()), list, err
	})
	recovered := time.Now()
	if mode == "freeze" {
		signal(redisproc.ThawSignal)
	} else {
		ph.Heal(cut...)
	}
	phase(3 * time.Second)
	close(stop)
	<-done
	<-done

	acked, counted := ledgerCount(t, servers[0], &ledger, "l")
	lost := acked - counted

	ops := hot.Ops()
	whole := faultnet.CheckWindows(ops, time.Second, strictLimit)
	lat := faultnet.CheckLatency(append(ops, ledger.Ops()...), decisionBound)
	var failed []faultnet.Op
	reasons := map[string]int{}
	for _, op := range append(ops, ledger.Ops()...) {
		reasons[op.Reason]++
		if op.Outcome == faultnet.Failed && op.Reason != shed {
			failed = append(failed, op)
		}
	}
	for _, w := range faultnet.Windows(ops, time.Second) {
		t.Logf("  window %s: admitted %d (possibly %d)", w.Start.Format("15:04:05"), w.Certain, w.Possible)
	}
	t.Logf("%s: promoted %v after it began; both serve replicas on the new primary %v after it began", mode, promoted.Sub(began).Round(time.Millisecond), recovered.Sub(began).Round(time.Millisecond))
	t.Logf("hot key: %v; latency: %v; reasons %v", whole, lat, reasons)
	t.Logf("ledger: %d increments acknowledged by Redis, %d counted by the new primary: %d lost", acked, counted, lost)
	what := map[string]string{"freeze": "frozen (SIGSTOP)", "partition": "cut from its replica and the Sentinels",
		"partition-min-replicas": "cut from its replica and the Sentinels, with min-replicas-to-write 1 and min-replicas-max-lag 1"}[mode]
	row(t, "failover: Redis primary "+what+" under load, three Sentinels promote its replica; two serve replicas through the Sentinels (strict 100/s, default local)",
		fmt.Sprintf("over-admission %.0f%% of the limit (bound 100%%); decisions p99 %v, max %v (bound %v), %d shed by serve's overload guard; promoted %v after the fault, both replicas on the new primary %v after it; %d of %d acknowledged increments lost",
			100*whole.Over, lat.P99.Round(time.Millisecond), lat.Max.Round(time.Millisecond), decisionBound, reasons[shed],
			promoted.Sub(began).Round(time.Millisecond), recovered.Sub(began).Round(time.Millisecond), lost, acked))

	if len(failed) > 0 {
		t.Errorf("%d decisions failed, the first: %+v", len(failed), failed[0])
	}
	if whole.Worst > 2*strictLimit {
		t.Errorf("a window admitted %d, above twice the limit: %v", whole.Worst, whole)
	}
	if lat.Over > 0 {
		t.Errorf("%d decisions took longer than %v: %v", lat.Over, decisionBound, lat)
	}
	if lost < 0 {
		t.Logf("the new primary counts %d increments more than Redis acknowledged: calls answered late, decided here too", -lost)
	}
}

// ledgerCount returns the increments Redis acknowledged for the ledger's
// value (admissions answered ok in hist) and the count Redis holds now,
// read through s by a check of cost 0 (counted at Redis: a read that
// timed out on a loaded machine and was answered by local says nothing,
// so it is asked again).
func ledgerCount(t *testing.T, s *serve, hist *faultnet.History, value string) (acked, counted int) {
	t.Helper()
	for _, op := range hist.Ops() {
		if op.Outcome == faultnet.Admitted && op.Reason == "ok" {
			acked++
		}
	}
	var read answer
	poll(t, "the ledger read at Redis", func(context.Context) (bool, string, error) {
		var err error
		read, err = s.ask("faults", "ledger", value, 0)
		return err == nil && read.Descriptors[0].Reason == "ok", fmt.Sprint(read), err
	})
	return acked, ledgerLimit - read.Descriptors[0].Remaining
}

// ranScript reports whether CLIENT LIST's answer list has a client from
// ip whose last command ran a script.
func ranScript(list, ip string) bool {
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "addr="+ip+":") && strings.Contains(line, " cmd=eval") {
			return true
		}
	}
	return false
}
