package faultnet_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// strictRules: one strict fixed window of 100 a second per value of k,
// stating no failure mode (so serve's default, local, decides when Redis
// cannot).
const (
	strictRules = `domain: faults
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window}
`
	strictLimit = 100
	// decisionBound is what a decision may take as a client sees it:
	// serve's Redis timeout (50 ms, its default) and a margin for the
	// HTTP round trip on a loaded machine running the race detector
	// (288 ms was seen beside two CPU-bound loops). A caller that waited
	// a timeout behind each other's (batched before its fix: 16 callers,
	// 16 timeouts) would exceed it.
	decisionBound = 50*time.Millisecond + 450*time.Millisecond
)

// TestFaultPartition: scenario a. Two serve replicas share one Redis on
// hosts of their own; clients on a fourth host keep asking both for one
// saturated key of a fixed window, counted strict (in make test) or
// batched (in make faults). One replica is cut from Redis for 3 s, then
// healed. Promises checked: every window admits at most the limit while
// Redis decides everything, and at most the limit plus the cut replica's
// local share (limit/2) while it decides alone (local, the default
// failure mode, at --replicas 2: ARCHITECTURE.md, "When the store
// fails"); every decision within the Redis timeout plus a margin; the cut
// replica back on Redis within its breaker's cooldown and probe after the
// heal. Batched counting may spend, while cut, blocks it leased before:
// it is held to local's general bound, twice the limit.
func TestFaultPartition(t *testing.T) {
	for _, counting := range []string{"strict", "batched"} {
		t.Run(counting, func(t *testing.T) {
			if counting != "strict" {
				inMakeFaults(t)
			}
			partition(t, counting)
		})
	}
}

func partition(t *testing.T, counting string) {
	n := faultnet.New(t)
	rh, s1h, s2h, ch := n.Host("redis"), n.Host("serve1"), n.Host("serve2"), n.Host("client")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	flags := []string{"--store", "redis", "--redis-addr", redis.Addr(), "--replicas", "2"}
	rules := strings.Replace(strictRules, "fixed_window}", "fixed_window, counting: "+counting+"}", 1)
	servers := []*serve{startServe(t, s1h, ch, rules, flags...), startServe(t, s2h, ch, rules, flags...)}

	var hist faultnet.History
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { load(servers, 2, 4*time.Millisecond, &hist, stop, "faults", "k", "hot"); close(done) }()
	// The phases are the scenario's own durations, not synchronisation.
	phase := func(d time.Duration) time.Time { <-time.After(d); return time.Now() }
	cutAt := phase(2500 * time.Millisecond)
	s1h.Partition(rh)
	healAt := phase(3 * time.Second)
	s1h.Heal(rh)
	phase(3 * time.Second)
	close(stop)
	<-done

	ops := hist.Ops()
	var before, during, after []faultnet.Op
	for _, op := range ops {
		switch {
		case op.End.Before(cutAt.Truncate(time.Second)):
			before = append(before, op)
		case op.Start.Before(healAt):
			during = append(during, op)
		default:
			after = append(after, op)
		}
	}
	// Recovery: from the heal to the first decision of the cut replica
	// made by Redis again.
	local, sheds, recovered := 0, 0, time.Duration(-1)
	var failed []faultnet.Op
	for _, op := range ops {
		switch {
		case op.Reason == shed:
			sheds++
		case op.Outcome == faultnet.Failed:
			failed = append(failed, op)
		}
		if op.Client != 0 {
			continue
		}
		if op.Reason == "local" {
			local++
		}
		if recovered < 0 && op.Start.After(healAt) && (op.Reason == "ok" || op.Reason == "limited") {
			recovered = op.End.Sub(healAt)
		}
	}
	whole := faultnet.CheckWindows(ops, time.Second, strictLimit)
	pre := faultnet.CheckWindows(before, time.Second, strictLimit)
	lat := faultnet.CheckLatency(ops, decisionBound)
	t.Logf("before the cut: %v", pre)
	t.Logf("whole run: %v", whole)
	t.Logf("latency: %v", lat)
	t.Logf("cut replica: %d local decisions; back on Redis %v after the heal", local, recovered.Round(time.Millisecond))
	for _, w := range faultnet.Windows(ops, time.Second) {
		t.Logf("  window %s: admitted %d (possibly %d)", w.Start.Format("15:04:05"), w.Certain, w.Possible)
	}
	bound := strictLimit + strictLimit/2
	if counting != "strict" {
		bound = 2 * strictLimit
	}
	row(t, "partition: one of 2 serve replicas cut from Redis 3 s ("+counting+", fixed window 100/s, default failure mode local)",
		fmt.Sprintf("over-admission %.0f%% of the limit (bound %d%%); decisions p99 %v, max %v (bound %v); %d of %d shed by serve's overload guard; back on Redis %v after the heal",
			100*whole.Over, 100*(bound-strictLimit)/strictLimit, lat.P99.Round(time.Millisecond), lat.Max.Round(time.Millisecond), decisionBound,
			sheds, len(ops), recovered.Round(time.Millisecond)))

	if len(failed) > 0 {
		t.Errorf("%d decisions failed, the first: %+v", len(failed), failed[0])
	}
	if sheds > 0 && counting == "strict" {
		t.Errorf("serve's overload guard shed %d decisions", sheds)
	}
	if pre.Worst > strictLimit {
		t.Errorf("before the cut, Redis deciding everything: %v", pre)
	}
	if local == 0 {
		t.Error("the cut replica made no local decision: the partition did not reach it")
	}
	if whole.Worst > bound {
		t.Errorf("a window admitted %d, above %d: %v", whole.Worst, bound, whole)
	}
	if lat.Over > 0 {
		t.Errorf("%d decisions took longer than %v: %v", lat.Over, decisionBound, lat)
	}
	if recovered < 0 || recovered > 3*time.Second {
		t.Errorf("the cut replica was not back on Redis within 3 s of the heal (%v)", recovered)
	}
	if len(during) == 0 || len(after) == 0 {
		t.Errorf("decisions: %d during the cut, %d after", len(during), len(after))
	}
}

// row prints a row of docs/faults.md's table: the scenario, what was
// measured, and the command that reproduces it.
func row(t *testing.T, scenario, measured string) {
	t.Helper()
	t.Logf("faults.md | %s | %s | `%s=1 go test -race -count=1 -run '^%s$' -v ./internal/faultnet/` |", scenario, measured, faultsEnv, t.Name())
}
