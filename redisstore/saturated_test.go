package redisstore

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// saturatedRun is how long each run of TestSaturatedLatency lasts; 0 (the
// default) skips it: it is a figure for bench/RESULTS.md, not a bound.
var (
	saturatedRun     = flag.Duration("saturated.run", 0, "TestSaturatedLatency: how long each mode runs (0: skip)")
	saturatedRate    = flag.Int("saturated.rate", 1000, "TestSaturatedLatency: the rule's rate per second (its burst a fifth of it)")
	saturatedFixed   = flag.Bool("saturated.fixed", false, "TestSaturatedLatency: a fixed window (envoy-format rules' default) instead of GCRA")
	saturatedCallers = flag.Int("saturated.callers", 32, "TestSaturatedLatency: callers")
)

// TestSaturatedLatency measures the decision latency of strict and
// batched counting on two saturated keys, as one serve replica sees it:
// one Store, 32 callers asking the two keys in turn, open loop, offered
// 4× what the rule allows. It logs p50, p99 and max of each mode and
// batched's p99 over strict's (go test -run TestSaturatedLatency
// ./redisstore/ -saturated.run=5s -v).
func TestSaturatedLatency(t *testing.T) {
	if *saturatedRun == 0 {
		t.Skip("a figure: -saturated.run=5s measures it")
	}
	srv := redistest.Standalone(t)
	const keys = 2
	callers, rate := *saturatedCallers, *saturatedRate
	p99 := map[ratelimit.Counting]time.Duration{}
	for _, mode := range []ratelimit.Counting{ratelimit.Strict, ratelimit.Batched, ratelimit.Strict, ratelimit.Batched} {
		s := countingStore(t, srv.Addr(), fmt.Sprintf("sat%d%d:", mode, time.Now().UnixNano()), 1)
		warmStores(t, []*Store{s})
		r := &ratelimit.Rule{Name: "sat", Quota: int64(rate), Period: time.Second, Burst: int64(rate / 5), Counting: mode}
		if *saturatedFixed {
			r.Algorithm, r.Burst = ratelimit.FixedWindow, 0
		}
		gap := time.Duration(float64(time.Second) / (4 * keys * float64(rate) / float64(callers)))
		origin := time.Now()
		stop := origin.Add(*saturatedRun)
		var mu sync.Mutex
		var lat []time.Duration
		var admitted, calls int
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				var mine []time.Duration
				adm := 0
				items := []ratelimit.Item{{Rule: r, Cost: 1}}
				var ds []ratelimit.Decision
				next := origin.Add(time.Duration(c) * gap / time.Duration(callers))
				for k := c; ; k++ {
					if next.After(stop) {
						break
					}
					time.Sleep(time.Until(next)) // pacing the load (open loop)
					items[0].Key = fmt.Sprintf("k%d", k%keys)
					start := time.Now()
					var err error
					ds, err = s.Decide(context.Background(), ds[:0], items)
					mine = append(mine, time.Since(start))
					if err != nil {
						t.Error(err)
						return
					}
					if ds[0].Allowed {
						adm++
					}
					next = next.Add(gap)
				}
				mu.Lock()
				defer mu.Unlock()
				lat = append(lat, mine...)
				admitted += adm
				calls += len(mine)
			})
		}
		wg.Wait()
		run := time.Since(origin)
		slices.Sort(lat)
		at := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))].Round(time.Microsecond) }
		allowed := keys * (rate/5 + int(float64(rate)*run.Seconds()))
		if *saturatedFixed {
			allowed = keys * rate * int(run.Seconds()+1)
		}
		st := s.Stats()
		p99[mode] = max(p99[mode], at(0.99))
		t.Logf("%-8v %v: %d calls, admitted %d of %d allowed (%.1f%%): p50 %v, p90 %v, p99 %v, max %v; Redis calls %d, leases %d, cached denials %d",
			mode, run.Round(time.Millisecond), calls, admitted, allowed, 100*float64(admitted)/float64(allowed), at(0.5), at(0.9), at(0.99), lat[len(lat)-1].Round(time.Microsecond),
			st.Requests, st.Leases, st.CachedDenials)
	}
	t.Logf("batched p99 ÷ strict p99 (worst of two runs each): %.2f", float64(p99[ratelimit.Batched])/float64(p99[ratelimit.Strict]))
}

// TestBatchedShortKeyDeniesHere: while a lease of a batched key Redis was
// short of is in flight (Redis frozen), another caller the blocks cannot
// cover is denied at once, in process, rather than waiting for the lease;
// a key Redis was not short of makes it wait, and admits it once Redis
// answers.
func TestBatchedShortKeyDeniesHere(t *testing.T) {
	srv := redistest.Standalone(t)
	s := countingStore(t, srv.Addr(), fmt.Sprintf("short%d:", time.Now().UnixNano()), 1, func(o *Options) {
		o.BlockSpan, o.BlockHold = time.Second, time.Second // a short key stays short for a second past its refusal
	})
	r := &ratelimit.Rule{Name: "short", Quota: 100, Period: time.Second, Burst: 800, Counting: ratelimit.Batched}
	ctx := context.Background()
	decide := func(key string) (ratelimit.Decision, error) {
		ds, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: key, Rule: r, Cost: 1}})
		if err != nil {
			return ratelimit.Decision{}, err
		}
		return ds[0], nil
	}
	// Saturate "k": ask until Redis refuses its lease.
	for i := 0; ; i++ {
		d, err := decide("k")
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		if i > 2000 {
			t.Fatal("never denied")
		}
	}
	e := s.counting.batched.entry("k", r)
	e.mu.Lock()
	short, denied := e.shortUntil, e.deniedUntil
	e.mu.Unlock()
	if !time.Now().Before(short) {
		t.Fatalf("a refused lease left the key short until %v, now %v", short, time.Now())
	}
	time.Sleep(time.Until(denied) + 2*time.Millisecond) // the refusal's RetryAfter passes: the next caller leases

	// inFlight starts a caller of key on Redis frozen and returns once its
	// lease is in flight, with the caller's answer to come.
	inFlight := func(key string) chan error {
		srv.Freeze()
		first := make(chan error, 1)
		go func() { _, err := decide(key); first <- err }()
		e := s.counting.batched.entry(key, r)
		for start := time.Now(); ; time.Sleep(time.Millisecond) {
			e.mu.Lock()
			busy := e.busy != nil
			e.mu.Unlock()
			if busy {
				return first
			}
			if time.Since(start) > 5*time.Second {
				srv.Thaw()
				t.Fatal("no lease in flight")
			}
		}
	}

	first := inFlight("k")
	start := time.Now()
	d, err := decide("k")
	took := time.Since(start)
	srv.Thaw()
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Reason != ratelimit.ReasonLimited || d.RetryAfter <= 0 || d.ResetAfter < d.RetryAfter || took > 500*time.Millisecond {
		t.Errorf("a short key with a lease in flight: %+v after %v; want denied here at once, with a RetryAfter and a ResetAfter", d, took)
	}
	if err := <-first; err != nil {
		t.Error(err)
	}

	// A fresh key is not short: its second caller waits for the lease.
	first = inFlight("fresh")
	second := make(chan ratelimit.Decision, 1)
	go func() {
		d, err := decide("fresh")
		if err != nil {
			t.Error(err)
		}
		second <- d
	}()
	select {
	case d := <-second:
		t.Errorf("a fresh key's caller answered %+v while its lease was in flight; want it to wait", d)
	case <-time.After(100 * time.Millisecond):
	}
	srv.Thaw()
	if d := <-second; !d.Allowed {
		t.Errorf("a fresh key's second caller: %+v; want admitted", d)
	}
	if err := <-first; err != nil {
		t.Error(err)
	}
}
