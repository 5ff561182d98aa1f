package faultnet_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// rttRules: one GCRA rule per counting mode, far above what the clients
// send, so that every decision is an admission and the figures are the
// cost of deciding at a distance, not of denying.
const rttRules = `domain: rtt
descriptors:
  - key: strict
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
  - key: batched
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra, counting: batched}
  - key: approximate
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra, counting: approximate}
`

// TestFaultRTT: scenario d. One serve replica decides on a Redis reached
// through a relay on a host between them that delays each direction by
// half the round trip (tc netem where the kernel has it is not needed:
// the relay stands in); 16 clients on another host ask in a closed loop,
// each on a key of its own, for 2 s per counting mode and round trip.
// Measured: decisions a second and p50/p99 as the clients see them,
// strict, batched and approximate at 0.1, 1 and 10 ms, and how many
// decisions the failure mode made (calls past serve's default 50 ms
// timeout: on a loaded machine, at 10 ms, some are) or serve shed.
// Checked: batched and approximate decide more a second than strict at
// 10 ms.
func TestFaultRTT(t *testing.T) {
	inMakeFaults(t)
	n := faultnet.New(t)
	rh, wh, sh, ch := n.Host("redis"), n.Host("wan"), n.Host("serve"), n.Host("client")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	relay := wh.Relay(redisPort, redis.Addr(), 50*time.Microsecond)
	s := startServe(t, sh, ch, rttRules, "--store", "redis", "--redis-addr", relay.Addr())

	const (
		workers = 16
		span    = 2 * time.Second
	)
	type result struct {
		rate              float64
		lat               faultnet.LatencyReport
		byFailure, failed int // decided by the failure mode; no decision (shed, an error)
	}
	measure := func(mode string, d time.Duration) result {
		ops := closedLoop(workers, d, func(hist *faultnet.History, w int) {
			s.check(hist, w, "rtt", mode, fmt.Sprint(w))
		})
		r := result{rate: float64(len(ops)) / d.Seconds(), lat: faultnet.CheckLatency(ops, time.Second)}
		for _, op := range ops {
			switch {
			case op.Outcome == faultnet.Failed:
				r.failed++
			case op.Outcome != faultnet.Admitted || op.Reason != "ok":
				r.byFailure++
			}
		}
		return r
	}
	modes := []string{"strict", "batched", "approximate"}
	results := map[time.Duration]map[string]result{}
	for _, rtt := range []time.Duration{100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond} {
		relay.SetDelay(rtt / 2)
		results[rtt] = map[string]result{}
		for _, mode := range modes {
			measure(mode, 300*time.Millisecond) // warm: connections, leases, views
			r := measure(mode, span)
			results[rtt][mode] = r
			base := results[rtt]["strict"]
			t.Logf("rtt %v %-11s %8.0f decisions/s (%.2f× strict), p50 %v (%.2f×), p99 %v (%.2f×); %d by the failure mode, %d without a decision",
				rtt, mode, r.rate, r.rate/base.rate, r.lat.P50.Round(10*time.Microsecond), float64(r.lat.P50)/float64(base.lat.P50),
				r.lat.P99.Round(10*time.Microsecond), float64(r.lat.P99)/float64(base.lat.P99), r.byFailure, r.failed)
			row(t, fmt.Sprintf("RTT %v between serve and Redis (a delaying relay), %d closed-loop clients, %s counting", rtt, workers, mode),
				fmt.Sprintf("%.0f decisions/s (%.2f× strict), p50 %v, p99 %v; %d of %d by the failure mode (a call past the 50 ms timeout), %d shed or failed",
					r.rate, r.rate/base.rate, r.lat.P50.Round(10*time.Microsecond), r.lat.P99.Round(10*time.Microsecond), r.byFailure, r.lat.N, r.failed))
		}
	}
	far := results[10*time.Millisecond]
	for _, mode := range modes[1:] {
		if far[mode].rate < far["strict"].rate {
			t.Errorf("at 10 ms, %s decided %.0f a second, fewer than strict's %.0f", mode, far[mode].rate, far["strict"].rate)
		}
	}
}
