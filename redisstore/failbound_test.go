package redisstore

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestFailureBound reproduces issue 31's first finding and measures the
// bound that replaces it. One key of a strict rule, 100 per 1 s fixed
// window, is saturated (about 2,000 calls a second from 4 callers) on one
// replica while Redis is made slow (frozen with SIGSTOP for 150 ms, three
// times the 50 ms timeout, so that every call in flight times out, at the
// start of each of two windows; it answers a liveness check within the
// default 1 s) and then
// dead (killed for 1.2 s, spanning windows, and started again). Admitted
// decisions are counted per window, each in the window it was decided in
// (the instant it returned plus its ResetAfter gives the window's end).
//
// Four configurations: the failure mode (fail_open, or the default,
// local) by the breaker (the one before issue 31, which opens on three
// timeouts in a row, or the one that asks whether Redis answers at all
// before it opens). With the default, every window must admit at most
// twice the limit (the limit at Redis, plus this replica's share decided
// in process while Redis could not decide: Replicas 1, so the whole
// limit); and the slow phase must not open the new breaker. fail_open
// has no bound: its figures are logged (bench/RESULTS.md §20).
func TestFailureBound(t *testing.T) {
	const limit = 100
	cases := []struct {
		name       string
		mode       ratelimit.FailureMode
		oldBreaker bool
	}{
		{"fail_open/breaker-before", ratelimit.FailOpen, true},
		{"fail_open/slow-told-from-dead", ratelimit.FailOpen, false},
		{"local/breaker-before", ratelimit.FailDefault, true},
		{"local/slow-told-from-dead", ratelimit.FailDefault, false},
	}
	var report []string
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			s := newStoreOn(t, ClientOptions{Addrs: []string{srv.Addr()}}, Options{})
			if c.oldBreaker {
				s.brks.single.check = nil // every timeout counts as a failure, as before
			}
			r := &ratelimit.Rule{Name: "bound", Algorithm: ratelimit.FixedWindow, Quota: limit, Period: time.Second, Failure: c.mode}
			res := boundRun(t, s, srv, r)
			slow, dead := res.worst(res.slow), res.worst(res.dead)
			line := fmt.Sprintf("| %s | %d (%.2f×) | %d (%.2f×) | %d | %d |",
				c.name, slow, float64(slow)/limit, dead, float64(dead)/limit, res.slowTrips, res.slowChecks)
			report = append(report, line)
			t.Logf("windows, admitted (of which by the failure mode); s slow, d dead: %s", res.windows())
			t.Logf("%s; fallbacks: %v", line, res.reasons)
			if c.mode != ratelimit.FailDefault {
				return
			}
			for w, n := range res.admitted {
				if n > 2*limit {
					t.Errorf("window %s admitted %d > 2 × %d", time.Unix(w, 0).UTC().Format("15:04:05"), n, limit)
				}
			}
			if !c.oldBreaker && res.slowTrips != 0 {
				t.Errorf("a slow Redis (frozen 150 ms at a time) opened the breaker %d times", res.slowTrips)
			}
		})
	}
	t.Logf("worst 1 s window, limit %d:\n| configuration | slow Redis | dead Redis | trips while slow | slow checks |\n%s",
		limit, strings.Join(report, "\n"))
}

// boundResult is what boundRun measured.
type boundResult struct {
	admitted              map[int64]int // window end (Unix seconds) → admitted
	fallback              map[int64]int // of which by the failure mode
	slow, dead            [2]int64      // windows of each phase, first and last
	slowTrips, slowChecks uint64        // breaker trips and checks answered in the slow phase
	reasons               map[ratelimit.Reason]int
}

func (r *boundResult) worst(span [2]int64) int {
	w := 0
	for k := span[0]; k <= span[1]; k++ {
		w = max(w, r.admitted[k])
	}
	return w
}

func (r *boundResult) windows() string {
	ks := make([]int64, 0, len(r.admitted))
	for k := range r.admitted {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	var b strings.Builder
	for _, k := range ks {
		tag := ""
		switch {
		case k >= r.slow[0] && k <= r.slow[1]:
			tag = "s"
		case k >= r.dead[0] && k <= r.dead[1]:
			tag = "d"
		}
		fmt.Fprintf(&b, "%d%s(%d) ", r.admitted[k], tag, r.fallback[k])
	}
	return b.String()
}

// boundRun saturates one key of r on s while it makes srv slow, then
// dead, then alive again, and returns what was admitted in each window.
// The phases start at window boundaries; the sleeps below are the
// faults' schedule, not synchronisation.
func boundRun(t *testing.T, s *Store, srv *redistest.Server, r *ratelimit.Rule) *boundResult {
	t.Helper()
	ctx := context.Background()
	item := []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}
	if _, err := s.Decide(ctx, nil, item); err != nil { // connect, load the script
		t.Fatal(err)
	}
	type rec struct {
		window int64
		reason ratelimit.Reason
	}
	const callers, every = 4, 2 * time.Millisecond
	stop := make(chan struct{})
	recs := make([][]rec, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			var ds []ratelimit.Decision
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				var err error
				ds, err = s.Decide(ctx, ds[:0], item)
				end := time.Now()
				if err != nil {
					t.Error(err)
					return
				}
				if d := ds[0]; d.Allowed {
					// The window's end, and up to the call's latency beyond
					// it (a millisecond for a ResetAfter rounded down).
					w := end.Add(d.ResetAfter + time.Millisecond).Unix()
					if d.ResetAfter == 0 {
						w = end.Unix() + 1 // admitted knowing nothing (fail_open): where it returned
					}
					recs[i] = append(recs[i], rec{w, d.Reason})
				}
			}
		}()
	}
	// untilWindow waits for the start of the next window and returns the
	// end of the window that starts then.
	untilWindow := func() int64 {
		next := time.Now().Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(next))
		return next.Unix() + 1
	}
	res := &boundResult{admitted: map[int64]int{}, fallback: map[int64]int{}, reasons: map[ratelimit.Reason]int{}}
	untilWindow() // a window of load before the faults
	before := s.Stats()
	for i := range 2 {
		w := untilWindow()
		if i == 0 {
			res.slow[0] = w
		}
		res.slow[1] = w
		srv.Freeze()
		time.Sleep(150 * time.Millisecond)
		srv.Thaw()

	}
	after := s.Stats()
	res.slowTrips, res.slowChecks = after.Trips-before.Trips, after.Slow-before.Slow
	res.dead[0] = untilWindow()
	srv.Stop()
	time.Sleep(1200 * time.Millisecond)
	srv.Start()
	// Until Redis decides again, then one more window.
	deadline := time.Now().Add(10 * time.Second)
	for reqs := s.Stats().Requests; s.Stats().Requests == reqs; {
		if time.Now().After(deadline) {
			t.Fatal("Redis never decided again")
		}
		time.Sleep(10 * time.Millisecond) // polling, bounded by deadline
	}
	res.dead[1] = untilWindow()
	untilWindow()
	close(stop)
	wg.Wait()
	for _, rs := range recs {
		for _, x := range rs {
			res.admitted[x.window]++
			if x.reason != ratelimit.ReasonOK {
				res.fallback[x.window]++
				res.reasons[x.reason]++
			}
		}
	}
	return res
}
