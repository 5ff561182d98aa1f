package faultnet_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// lossRules: per counting mode, a saturated key (the window checker's:
// strict and batched a fixed window of 100 a second, approximate a GCRA
// bucket of 100 a second with a burst of 10, as TestFaultPartition's)
// and a free one far above what the clients send (the throughput's and
// latency's, as TestFaultRTT's). No failure mode is stated: serve's
// default, local, decides what Redis does not within its timeout.
const lossRules = `domain: loss
descriptors:
  - key: strict
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window}
  - key: batched
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window, counting: batched}
  - key: approximate
    rate_limit: {unit: second, requests_per_unit: 100, burst: 10, algorithm: gcra, counting: approximate}
  - key: strict_free
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
  - key: batched_free
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra, counting: batched}
  - key: approximate_free
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra, counting: approximate}
`

// TestFaultLoss: jitter and packet loss between serve and Redis, without
// tc netem. Two serve replicas (--replicas 2) reach one Redis through a
// relay on a host between them, first without delay (the baseline: what
// the loaded machine alone sends to the failure mode), then delaying
// each direction by 1 ms ± 0.5 ms (uniform, each read drawn apart, order
// kept: Relay.SetJitter); then 1 % and then 5 % of the packets between
// each replica and the relay's host are dropped too, each way
// (Net.Loss), so serve's calls to Redis see TCP retransmissions (about
// 200 ms on Linux for a lone segment: a tail loss probe or the
// retransmission timeout) against its 50 ms timeout. Per condition and
// counting mode, for 2 s: 8 closed-loop clients per replica on free keys
// of their own (decisions a second, p50/p99) and 2 paced ones per replica
// on one saturated key (up to 1,000 a second in all: the per-window
// checker). Measured: decisions by Redis and by the failure mode
// (local), shed, the breaker's outages (serve's log), the hosts' TCP
// counters. Checked, per 1 s window of the saturated key: strict and
// batched, what Redis decided at most the limit, what each replica
// decided by local at most limit/2 (ARCHITECTURE.md, "When the store
// fails"), the whole at most twice the limit; approximate, the whole at
// most twice its bound (118, as in TestFaultPartition); every decision
// within the Redis timeout plus a margin; none failed; each loss dropped
// some packets.
func TestFaultLoss(t *testing.T) {
	inMakeFaults(t)
	n := faultnet.New(t)
	rh, wh, s1h, s2h, ch := n.Host("redis"), n.Host("wan"), n.Host("serve1"), n.Host("serve2"), n.Host("client")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	relay := wh.Relay(redisPort, redis.Addr(), 0)
	flags := []string{"--store", "redis", "--redis-addr", relay.Addr(), "--replicas", "2"}
	servers := []*serve{startServe(t, s1h, ch, lossRules, flags...), startServe(t, s2h, ch, lossRules, flags...)}

	const (
		span      = 2 * time.Second
		perServe  = 8 // closed-loop clients on free keys, per replica
		hotLimit  = 100
		hotBound  = approxBound // approximate's, N = 2, d = 50 ms
		hotPerSrv = 2
	)
	type cell struct {
		rate             float64
		lat, hotLat      faultnet.LatencyReport
		local, shed      int // decisions by the failure mode; shed by serve's guard
		failed           []faultnet.Op
		slow             []string // the decisions past decisionBound: reason and time
		whole, redisPart faultnet.WindowReport
		localParts       [2]faultnet.WindowReport
		outages          int           // breaker outages begun, both replicas
		down             time.Duration // their durations, as serve logged them
	}
	run := func(mode, cond string) cell {
		before := [2]int{}
		for i, s := range servers {
			before[i], _ = outages(s.proc.Log())
		}
		var hot faultnet.History
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { load(servers, hotPerSrv, 4*time.Millisecond, &hot, stop, "loss", mode, "hot-"+cond) })
		free := closedLoop(perServe*len(servers), span, func(hist *faultnet.History, w int) {
			servers[w%len(servers)].check(hist, w%len(servers), "loss", mode+"_free", fmt.Sprint(w))
		})
		close(stop)
		wg.Wait()
		hops := hot.Ops()
		c := cell{rate: float64(len(free)) / span.Seconds(), lat: faultnet.CheckLatency(free, decisionBound), hotLat: faultnet.CheckLatency(hops, decisionBound)}
		var byRedis []faultnet.Op
		byLocal := [2][]faultnet.Op{}
		for _, op := range append(free, hops...) {
			switch {
			case op.Reason == shed:
				c.shed++
			case op.Outcome == faultnet.Failed:
				c.failed = append(c.failed, op)
			case op.Reason == "local":
				c.local++
			}
			if d := op.End.Sub(op.Start); d > decisionBound {
				c.slow = append(c.slow, fmt.Sprintf("%s %v", op.Reason, d.Round(time.Millisecond)))
			}
		}
		for _, op := range hops {
			switch {
			case op.Reason == shed || op.Outcome == faultnet.Failed:
			case op.Reason == "local":
				byLocal[op.Client] = append(byLocal[op.Client], op)
			default:
				byRedis = append(byRedis, op)
			}
		}
		limit := hotLimit
		if mode == "approximate" {
			limit = approxLimit
		}
		c.whole = faultnet.CheckWindows(hops, time.Second, limit)
		c.redisPart = faultnet.CheckWindows(byRedis, time.Second, limit)
		for i := range c.localParts {
			c.localParts[i] = faultnet.CheckWindows(byLocal[i], time.Second, limit/2)
		}
		for i, s := range servers {
			k, _ := outages(s.proc.Log())
			c.outages += k - before[i]
		}
		return c
	}

	conditions := []struct {
		name    string
		jitter  bool
		percent float64
	}{{"none", false, 0}, {"jitter", true, 0}, {"loss1", true, 1}, {"loss5", true, 5}}
	modes := []string{"strict", "batched", "approximate"}
	results := map[string]map[string]cell{}
	for _, cond := range conditions {
		if cond.jitter {
			relay.SetDelay(time.Millisecond)
			relay.SetJitter(500 * time.Microsecond)
		}
		serveBefore, relayBefore := tcpStats(t, s1h, s2h), tcpStats(t, wh)
		var losses []*faultnet.Loss
		if cond.percent > 0 {
			for _, s := range []*faultnet.Host{s1h, s2h} {
				losses = append(losses, n.Loss(s, wh, cond.percent))
			}
		}
		results[cond.name] = map[string]cell{}
		downBefore := [2]time.Duration{}
		for i, s := range servers {
			_, downBefore[i] = outages(s.proc.Log())
		}
		for _, mode := range modes {
			c := run(mode, cond.name)
			// outages sums the durations of every outage ended so far:
			// the cell's are the difference.
			for i, s := range servers {
				_, d := outages(s.proc.Log())
				c.down += d - downBefore[i]
				downBefore[i] = d
			}
			results[cond.name][mode] = c
			base := results[cond.name]["strict"]
			what := "without delay (the relay)"
			if cond.jitter {
				what = "1 ms ± 0.5 ms each way (the relay)"
			}
			if cond.percent > 0 {
				what += fmt.Sprintf(", %v%% packet loss each way between serve and the relay's host (nftables)", cond.percent)
			}
			t.Logf("%s %-11s %6.0f decisions/s (%.2f× strict), p50 %v, p99 %v, max %v; %d by local, %d shed, %d failed; hot key: %v; Redis's part %v; local parts %v and %v; hot p99 %v; breaker: %d outages, %v down",
				cond.name, mode, c.rate, c.rate/base.rate, c.lat.P50.Round(10*time.Microsecond), c.lat.P99.Round(10*time.Microsecond), c.lat.Max.Round(time.Millisecond),
				c.local, c.shed, len(c.failed), c.whole, c.redisPart, c.localParts[0], c.localParts[1], c.hotLat.P99.Round(10*time.Microsecond), c.outages, c.down.Round(time.Millisecond))
			row(t, fmt.Sprintf("jitter and loss: serve (2 replicas) to Redis %s; %s counting", what, mode),
				fmt.Sprintf("%.0f decisions/s (%.2f× strict), p50 %v, p99 %v, max %v over %d free-key decisions; %d of %d decisions by local, %d shed; saturated key's worst window %d (Redis's part %d, local parts %d and %d); breaker outages %d (%v down)",
					c.rate, c.rate/base.rate, c.lat.P50.Round(10*time.Microsecond), c.lat.P99.Round(10*time.Microsecond), c.lat.Max.Round(time.Millisecond), c.lat.N,
					c.local, c.lat.N+c.hotLat.N, c.shed, c.whole.Worst, c.redisPart.Worst, c.localParts[0].Worst, c.localParts[1].Worst, c.outages, c.down.Round(time.Millisecond)))
		}
		for _, l := range losses {
			k := l.Counts()
			t.Logf("%s: dropped %d of %d packets serve to relay, %d of %d back (%.2f%%)", cond.name, k.ABDropped, k.AB, k.BADropped, k.BA, 100*k.Dropped())
			if cond.percent > 0 && k.ABDropped+k.BADropped == 0 {
				t.Errorf("%s: the loss dropped nothing of %d packets", cond.name, k.AB+k.BA)
			}
			l.Heal()
		}
		sv, rl := tcpStats(t, s1h, s2h), tcpStats(t, wh)
		t.Logf("%s: TCP on the serve hosts (the relay's host): %d (%d) segments retransmitted, %d (%d) tail loss probes, %d (%d) retransmission timeouts; serve opened %d connections to Redis",
			cond.name, sv.RetransSegs-serveBefore.RetransSegs, rl.RetransSegs-relayBefore.RetransSegs, sv.TCPLossProbes-serveBefore.TCPLossProbes, rl.TCPLossProbes-relayBefore.TCPLossProbes,
			sv.TCPTimeouts-serveBefore.TCPTimeouts, rl.TCPTimeouts-relayBefore.TCPTimeouts, sv.ActiveOpens-serveBefore.ActiveOpens)
	}

	for _, cond := range conditions {
		for _, mode := range modes {
			c := results[cond.name][mode]
			if len(c.failed) > 0 {
				t.Errorf("%s %s: %d decisions failed, the first: %+v", cond.name, mode, len(c.failed), c.failed[0])
			}
			if len(c.slow) > 0 {
				t.Errorf("%s %s: %d decisions took longer than %v (p99 %v): %v", cond.name, mode, len(c.slow), decisionBound, c.lat.P99, c.slow)
			}
			if mode == "approximate" {
				if c.whole.Worst > 2*hotBound {
					t.Errorf("%s %s: a window admitted %d, above twice approximate's bound %d", cond.name, mode, c.whole.Worst, hotBound)
				}
				continue
			}
			if c.redisPart.Worst > hotLimit {
				t.Errorf("%s %s: Redis's decisions exceeded the limit: %v", cond.name, mode, c.redisPart)
			}
			for i, r := range c.localParts {
				if r.Worst > hotLimit/2 {
					t.Errorf("%s %s: replica %d's local decisions exceeded its share: %v", cond.name, mode, i+1, r)
				}
			}
			if c.whole.Worst > 2*hotLimit {
				t.Errorf("%s %s: a window admitted %d, above twice the limit", cond.name, mode, c.whole.Worst)
			}
		}
	}
}

// tcp is what the kernel counted of TCP in some hosts' namespaces:
// segments retransmitted, tail loss probes sent (a retransmission after
// about two round trips, before the retransmission timeout), the
// timeouts themselves (200 ms at least) and the connections opened.
type tcp struct {
	RetransSegs, TCPLossProbes, TCPTimeouts, ActiveOpens int64
}

// tcpStats sums the counters of hosts, read from their /proc/net/snmp
// and /proc/net/netstat (each a namespace's own).
func tcpStats(t *testing.T, hosts ...*faultnet.Host) tcp {
	t.Helper()
	var sum tcp
	for _, h := range hosts {
		out, err := h.Command("cat", "/proc/net/snmp", "/proc/net/netstat").Output()
		if err != nil {
			t.Fatalf("TCP counters of %s: %v", h.Name(), err)
		}
		// Each group is a line of names and a line of values.
		lines := strings.Split(string(out), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j := 1; j < len(names) && j < len(values); j++ {
				v, _ := strconv.ParseInt(values[j], 10, 64)
				switch names[0] + names[j] {
				case "Tcp:RetransSegs":
					sum.RetransSegs += v
				case "Tcp:ActiveOpens":
					sum.ActiveOpens += v
				case "TcpExt:TCPLossProbes":
					sum.TCPLossProbes += v
				case "TcpExt:TCPTimeouts":
					sum.TCPTimeouts += v
				}
			}
		}
	}
	return sum
}

// outages counts, in serve's JSON log, the outages its Redis store's
// breaker began ("Redis does not answer") and sums the durations of
// those that ended ("Redis answers again", its outage field).
func outages(log string) (begun int, down time.Duration) {
	for line := range strings.Lines(log) {
		var e struct {
			Msg    string `json:"msg"`
			Outage string `json:"outage"`
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		switch {
		case strings.HasPrefix(e.Msg, "Redis does not answer"):
			begun++
		case strings.HasPrefix(e.Msg, "Redis answers again"):
			if d, err := time.ParseDuration(e.Outage); err == nil {
				down += d
			}
		}
	}
	return begun, down
}
