package faultnet_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// clockRules: two keys of 100 a second, counted strict and stating no
// failure mode (local decides when Redis cannot): k=fw a fixed window,
// k=gcra a GCRA bucket with a burst of 10 (a window of 1 s admits at most
// 110 of it: the burst and a second's refill).
const (
	clockRules = `domain: faults
descriptors:
  - key: k
    value: fw
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: fixed_window}
  - key: k
    value: gcra
    rate_limit: {unit: second, requests_per_unit: 100, burst: 10, algorithm: gcra}
`
	gcraLimit = 110
)

// TestFaultClock: a replica whose clock is off. Two serve replicas
// share one Redis on hosts of their own; the first runs with its clock
// moved (--clock-offset: +700 ms, then −1.3 s in a second run), the
// second with the machine's. Clients on a fourth host ask both for one
// fixed-window key and one GCRA key, 3 s on Redis, then 3 s with the
// moved replica cut from Redis, so that local decides its share on its
// own clock, then 2.5 s healed. Promises checked (ARCHITECTURE.md,
// "Time" and "When the store fails"), per 1 s window of the machine's
// clock: on Redis, the server's clock decides, so what Redis decided
// never exceeds the limit whatever the replicas' clocks; the other
// replica's local part at most its share (limit/2), the moved one's at
// most its share on the bucket and twice it on the fixed window (its
// local windows straddle Redis's: measured, stated); no window above
// twice the limit. Measured: the worst window of the cut against the
// limit plus the cut replica's share, the bound with the clocks
// agreeing (TestFaultPartition). Checked too, that the offset took effect: the
// moved replica's local windows of the fixed-window key begin where its
// clock turns a second, −offset mod 1 s on the machine's clock.
func TestFaultClock(t *testing.T) {
	inMakeFaults(t)
	for _, off := range []time.Duration{700 * time.Millisecond, -1300 * time.Millisecond} {
		t.Run(off.String(), func(t *testing.T) { clockOffset(t, off) })
	}
}

func clockOffset(t *testing.T, off time.Duration) {
	n := faultnet.New(t)
	rh, s1h, s2h, ch := n.Host("redis"), n.Host("serve1"), n.Host("serve2"), n.Host("client")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	flags := []string{"--store", "redis", "--redis-addr", redis.Addr(), "--replicas", "2"}
	servers := []*serve{startServe(t, s1h, ch, clockRules, append(flags, "--clock-offset", off.String())...), startServe(t, s2h, ch, clockRules, flags...)}
	if !strings.Contains(servers[0].proc.LogTail(), "clock_offset") {
		t.Fatalf("the first replica does not say its clock is moved:\n%s", servers[0].proc.LogTail())
	}

	keys := []struct {
		value string
		limit int
		hist  faultnet.History
	}{{value: "fw", limit: strictLimit}, {value: "gcra", limit: gcraLimit}}
	stop := make(chan struct{})
	done := make(chan struct{}, len(keys))
	for i := range keys {
		go func() {
			load(servers, 2, 6*time.Millisecond, &keys[i].hist, stop, "faults", "k", keys[i].value)
			done <- struct{}{}
		}()
	}
	// The phases are the scenario's own durations, not synchronisation.
	phase := func(d time.Duration) time.Time { <-time.After(d); return time.Now() }
	cutAt := phase(3 * time.Second)
	s1h.Partition(rh)
	healAt := phase(3 * time.Second)
	s1h.Heal(rh)
	phase(2500 * time.Millisecond)
	close(stop)
	for range keys {
		<-done
	}

	var measured []string
	for i := range keys {
		k := &keys[i]
		ops := k.hist.Ops()
		var byRedis, before, cut []faultnet.Op
		var byLocal [2][]faultnet.Op
		var failed []faultnet.Op
		for _, op := range ops {
			switch {
			case op.Outcome == faultnet.Failed:
				failed = append(failed, op)
			case op.Reason == "local":
				byLocal[op.Client] = append(byLocal[op.Client], op)
			default:
				byRedis = append(byRedis, op)
			}
			// The windows wholly before the cut, and those of the cut
			// (from the one it began in to the one a second after the
			// heal).
			if op.End.Before(cutAt.Truncate(time.Second)) {
				before = append(before, op)
			} else if op.Start.Before(healAt.Truncate(time.Second).Add(2 * time.Second)) {
				cut = append(cut, op)
			}
		}
		share := k.limit / 2
		whole := faultnet.CheckWindows(ops, time.Second, k.limit)
		beforePart := faultnet.CheckWindows(before, time.Second, k.limit)
		cutPart := faultnet.CheckWindows(cut, time.Second, k.limit)
		redisPart := faultnet.CheckWindows(byRedis, time.Second, k.limit)
		var localParts [2]faultnet.WindowReport
		for j := range localParts {
			localParts[j] = faultnet.CheckWindows(byLocal[j], time.Second, share)
		}
		lat := faultnet.CheckLatency(ops, decisionBound)
		t.Logf("%s: whole run %v; before the cut %v; windows of the cut %v", k.value, whole, beforePart, cutPart)
		t.Logf("%s: decided by Redis %v; by local on the moved, cut replica %v (%d decisions), on the other %v (%d)", k.value, redisPart, localParts[0], len(byLocal[0]), localParts[1], len(byLocal[1]))
		t.Logf("%s: latency %v", k.value, lat)
		for _, w := range faultnet.Windows(ops, time.Second) {
			t.Logf("  %s window %s: admitted %d (possibly %d)", k.value, w.Start.Format("15:04:05"), w.Certain, w.Possible)
		}
		m := fmt.Sprintf("%s (limit %d a window): worst window before the cut %d; Redis's part %d at most; local parts %d (moved, cut) and %d (other) at most, share %d; worst window of the cut %d, limit + share %d; p99 %v, max %v",
			k.value, k.limit, beforePart.Worst, redisPart.Worst, localParts[0].Worst, localParts[1].Worst, share, cutPart.Worst, k.limit+share, lat.P99.Round(time.Millisecond), lat.Max.Round(time.Millisecond))

		if k.value == "fw" {
			// Where the moved replica's local windows began, on the
			// machine's clock: the earliest answer of each (but the
			// first, which the cut began in the middle of).
			starts := localWindowStarts(byLocal[0], off)
			t.Logf("fw: the moved replica's local windows' first admissions, past −offset mod 1 s: %v", starts)
			if len(starts) < 2 {
				t.Fatalf("the moved replica's local decisions of fw span %d windows of its clock, want at least 3", len(starts)+1)
			}
			for _, d := range starts {
				if d > 250*time.Millisecond {
					t.Errorf("a local window of the moved replica began %v past −offset mod 1 s: its clock is not moved by %v (%v)", d, off, starts)
					break
				}
			}
			m += fmt.Sprintf("; its local windows' first admissions %v–%v past −offset mod 1 s", slices.Min(starts), slices.Max(starts))
		}
		measured = append(measured, m)

		if len(failed) > 0 {
			t.Errorf("%s: %d decisions failed, the first: %+v", k.value, len(failed), failed[0])
		}
		if redisPart.Worst > k.limit {
			t.Errorf("%s: Redis's decisions exceeded the limit with a replica's clock %v off: %v", k.value, off, redisPart)
		}
		// A window algorithm decides local's share in windows of the
		// replica's own clock: with its clock moved by a fraction of a
		// window, one window of Redis's clock overlaps two of its own,
		// and holds up to twice its share (ARCHITECTURE.md, "When the
		// store fails"). A bucket has no windows to move.
		movedShare := share
		if k.value == "fw" {
			movedShare = 2 * share
		}
		if localParts[0].Worst > movedShare {
			t.Errorf("%s: the moved replica's local decisions admitted %d in a window, above %d: %v", k.value, localParts[0].Worst, movedShare, localParts[0])
		}
		if localParts[1].Worst > share {
			t.Errorf("%s: the other replica's local decisions exceeded its share: %v", k.value, localParts[1])
		}
		if len(byLocal[0]) == 0 {
			t.Errorf("%s: the cut replica made no local decision: the partition did not reach it", k.value)
		}
		if whole.Worst > 2*k.limit {
			t.Errorf("%s: a window admitted %d, above twice the limit: %v", k.value, whole.Worst, whole)
		}
		if lat.Over > 0 {
			t.Errorf("%s: %d decisions took longer than %v: %v", k.value, lat.Over, decisionBound, lat)
		}
	}
	row(t, fmt.Sprintf("clock offset: 2 serve replicas, one with --clock-offset %v, on one Redis; 3 s on Redis, then the moved replica cut from Redis 3 s (local on its own clock)", off),
		strings.Join(measured, "; "))
}

// localWindowStarts returns, for each window of a clock moved by off
// that ops (admissions by one replica's local failure mode, by start)
// fall in but the first, how long after the window's start on the
// machine's clock its earliest answer came.
func localWindowStarts(ops []faultnet.Op, off time.Duration) []time.Duration {
	first := map[int64]time.Duration{}
	var windows []int64
	for _, op := range ops {
		if op.Outcome != faultnet.Admitted {
			continue
		}
		moved := op.End.Add(off).UnixNano()
		w, into := moved/int64(time.Second), time.Duration(moved%int64(time.Second))
		if d, ok := first[w]; !ok || into < d {
			if !ok {
				windows = append(windows, w)
			}
			first[w] = into
		}
	}
	slices.Sort(windows)
	var out []time.Duration
	for _, w := range windows[min(1, len(windows)):] {
		out = append(out, first[w].Round(time.Millisecond))
	}
	return out
}
