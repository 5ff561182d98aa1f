package faultnet_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// restartRules: one strict fixed window of 200 per 4 s, stating no
// failure mode (local decides when Redis cannot). The window is long
// enough that the replicas are back on the restarted Redis before it
// ends: what a restart empties then counts again in the same window.
const (
	restartRules = `domain: faults
descriptors:
  - key: k
    rate_limit: {period: 4s, requests_per_unit: 200, algorithm: fixed_window}
`
	restartLimit  = 200
	restartPeriod = 4 * time.Second
)

// TestFaultRestart: Redis killed (SIGKILL, by its process id) under load
// and started again at once on the same host and port, empty (no
// persistence). Two serve replicas (--replicas 2) on hosts of their own,
// clients on a fourth asking both for one saturated key of a fixed
// window of 200 per 4 s, below its pace at the window's start; the kill
// comes once Redis has admitted 85 % of the window's limit. Local's
// promise (ARCHITECTURE.md, "When the store fails") assumes a Redis that
// keeps its data; one restarted empty counts again, so the restart's
// window may hold twice the limit at Redis and local's shares while it
// was away on top (it said the 2× covered it; this measured more).
// Measured per window: the restart's, by part (Redis before the kill,
// each replica's local part while Redis was away, Redis after the
// restart); the others. Checked: each part at most the limit (each
// replica's local part at most its share), Redis's part of the other
// windows at most the limit (a call timing out on the loaded machine
// may add local's), the restart's window at most three times the
// limit, every decision within the timeout plus a margin.
func TestFaultRestart(t *testing.T) {
	inMakeFaults(t)
	n := faultnet.New(t)
	rh, s1h, s2h, ch := n.Host("redis"), n.Host("serve1"), n.Host("serve2"), n.Host("client")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	flags := []string{"--store", "redis", "--redis-addr", redis.Addr(), "--replicas", "2"}
	servers := []*serve{startServe(t, s1h, ch, restartRules, flags...), startServe(t, s2h, ch, restartRules, flags...)}

	var hist faultnet.History
	stop := make(chan struct{})
	done := make(chan struct{})
	// About 130 checks a second, below the key's 200 per window's pace
	// at the start: the kill comes before the window is spent, so that
	// the replicas ask Redis again (a spent window's denials are
	// answered from serve's denial cache, which would hide the restart).
	go func() { load(servers, 1, 15*time.Millisecond, &hist, stop, "faults", "k", "hot"); close(done) }()
	// The phases are the scenario's own instants, not synchronisation:
	// the kill once Redis has admitted 85 % of the limit in the first
	// window that starts at least 2 s after the load; the end a whole
	// window after the restart's.
	window := time.Now().Add(2 * time.Second).Truncate(restartPeriod).Add(restartPeriod)
	<-time.After(time.Until(window))
	for admittedSince(&hist, window) < restartLimit*85/100 {
		if time.Since(window) > restartPeriod/2 {
			t.Fatalf("only %d admitted in the first half of the window: the load is too slow", admittedSince(&hist, window))
		}
		<-time.After(5 * time.Millisecond)
	}
	killAt := time.Now()
	redis.Kill()
	if err := redis.Restart(); err != nil {
		t.Fatal(err)
	}
	upAt := time.Now()
	<-time.After(time.Until(window.Add(2 * restartPeriod)))
	close(stop)
	<-done

	ops := hist.Ops()
	var beforeKill, afterRestart, failed []faultnet.Op
	var byLocal [2][]faultnet.Op
	back := [2]time.Duration{-1, -1}
	for _, op := range ops {
		switch {
		case op.Outcome == faultnet.Failed:
			failed = append(failed, op)
		case op.Reason == "local":
			byLocal[op.Client] = append(byLocal[op.Client], op)
		case op.End.Before(killAt):
			beforeKill = append(beforeKill, op)
		case op.Start.After(upAt):
			afterRestart = append(afterRestart, op)
			if back[op.Client] < 0 {
				back[op.Client] = op.End.Sub(upAt)
			}
		}
	}
	inWindow := func(ops []faultnet.Op) int {
		n := 0
		for _, w := range faultnet.Windows(ops, restartPeriod) {
			if w.Start.Equal(window) {
				n = w.Certain
			}
		}
		return n
	}
	// The windows before and after the restart's: Redis's part, and
	// the whole (a call that timed out on a loaded machine is decided
	// by local, within its share).
	var others, othersRedis []faultnet.Op
	for _, op := range ops {
		if op.End.Before(window) || !op.Start.Before(window.Add(restartPeriod)) {
			others = append(others, op)
			if op.Reason != "local" {
				othersRedis = append(othersRedis, op)
			}
		}
	}
	whole := inWindow(ops)
	redisBefore, redisAfter := inWindow(beforeKill), inWindow(afterRestart)
	local := [2]int{inWindow(byLocal[0]), inWindow(byLocal[1])}
	otherPart := faultnet.CheckWindows(others, restartPeriod, restartLimit)
	otherRedis := faultnet.CheckWindows(othersRedis, restartPeriod, restartLimit)
	lat := faultnet.CheckLatency(ops, decisionBound)
	for _, w := range faultnet.Windows(ops, restartPeriod) {
		t.Logf("  window %s: admitted %d (possibly %d)", w.Start.Format("15:04:05"), w.Certain, w.Possible)
	}
	t.Logf("killed %v into the window (%d admitted in it by Redis), answering PING again %v later; replicas back on Redis %v and %v after it; local decisions %d and %d",
		killAt.Sub(window).Round(time.Millisecond), redisBefore, upAt.Sub(killAt).Round(time.Millisecond), back[0].Round(time.Millisecond), back[1].Round(time.Millisecond), len(byLocal[0]), len(byLocal[1]))
	t.Logf("the restart's window: %d admitted (limit %d): Redis before the kill %d, local %d and %d, Redis after the restart %d", whole, restartLimit, redisBefore, local[0], local[1], redisAfter)
	t.Logf("the other windows: %v; latency %v", otherPart, lat)
	row(t, fmt.Sprintf("restart: Redis killed (SIGKILL) once it has admitted 85 %% of a window's limit, and started again empty on the same port, under load (~130 checks a second); 2 serve replicas, a fixed window of %d per %v", restartLimit, restartPeriod),
		fmt.Sprintf("the restart's window %d (%.2f× the limit): Redis before the kill %d, local %d + %d, Redis after the restart %d; the other windows %d at most (Redis's part %d); Redis answered again %v after the kill, the replicas on it %v and %v after that; p99 %v, max %v, %d failed",
			whole, float64(whole)/restartLimit, redisBefore, local[0], local[1], redisAfter, otherPart.Worst, otherRedis.Worst, upAt.Sub(killAt).Round(time.Millisecond),
			back[0].Round(time.Millisecond), back[1].Round(time.Millisecond), lat.P99.Round(time.Millisecond), lat.Max.Round(time.Millisecond), len(failed)))

	if len(failed) > 0 {
		t.Errorf("%d decisions failed, the first: %+v", len(failed), failed[0])
	}
	if redisBefore > restartLimit || redisAfter > restartLimit {
		t.Errorf("Redis admitted %d before the kill and %d after the restart in one window, above the limit %d", redisBefore, redisAfter, restartLimit)
	}
	for i, l := range local {
		if l > restartLimit/2 {
			t.Errorf("replica %d's local decisions admitted %d in the window, above its share %d", i+1, l, restartLimit/2)
		}
	}
	if otherRedis.Worst > restartLimit {
		t.Errorf("Redis admitted %d in a window other than the restart's, above the limit: %v", otherRedis.Worst, otherRedis)
	}
	if whole > 3*restartLimit {
		t.Errorf("the restart's window admitted %d, above three times the limit", whole)
	}
	if redisBefore == 0 || redisAfter == 0 || back[0] < 0 || back[1] < 0 {
		t.Errorf("the scenario did not run: Redis admitted %d before the kill, %d after the restart; replicas back %v", redisBefore, redisAfter, back)
	}
	if lat.Over > 0 {
		t.Errorf("%d decisions took longer than %v: %v", lat.Over, decisionBound, lat)
	}
}

// admittedSince counts the admissions of hist answered since from.
func admittedSince(hist *faultnet.History, from time.Time) int {
	n := 0
	for _, op := range hist.Ops() {
		if op.Outcome == faultnet.Admitted && !op.End.Before(from) {
			n++
		}
	}
	return n
}
