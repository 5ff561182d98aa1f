package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// An admission is when one admitted decision was asked and answered, in
// this process's monotonic clock: the counter took it somewhere between.
type admission struct{ before, after time.Duration }

// loadResult is what a run of countLoad saw.
type loadResult struct {
	admitted  [][]admission // per key
	calls     int64
	fallbacks int64
	run       time.Duration
}

// countLoad has every store's callers decide cost 1 on random keys of r,
// offered at rate per second in all (open loop, each caller on its own
// schedule; one that falls behind asks at once), until run has passed.
// With skew, store 0 is offered 90 % of the traffic; bursty callers
// alternate 100 ms of asking with 100 ms of rest.
func countLoad(t *testing.T, stores []*Store, r *ratelimit.Rule, keys int, skew, bursty bool, rate float64, run time.Duration) loadResult {
	t.Helper()
	ctx := context.Background()
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("k%d", i)
	}
	const callers = 4
	var mu sync.Mutex
	res := loadResult{admitted: make([][]admission, keys)}
	origin := time.Now()
	stop := origin.Add(run)
	var wg sync.WaitGroup
	for si, s := range stores {
		share := 1 / float64(len(stores))
		if skew {
			share = 0.1 / float64(len(stores)-1)
			if si == 0 {
				share = 0.9
			}
		}
		gap := time.Duration(float64(time.Second) / (rate * share / callers))
		for c := range callers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(si), uint64(c)))
				next := origin
				local := make([][]admission, keys)
				var calls, fallbacks int64
				items := []ratelimit.Item{{Rule: r, Cost: 1}}
				var ds []ratelimit.Decision
				for {
					now := time.Now()
					if !now.Before(stop) {
						break
					}
					if bursty && (now.Sub(origin)/(100*time.Millisecond))%2 == 1 {
						next = origin.Add((now.Sub(origin)/(100*time.Millisecond) + 1) * 100 * time.Millisecond)
						time.Sleep(time.Until(next)) // pacing the load, not synchronising
						continue
					}
					if next.After(now) {
						time.Sleep(next.Sub(now)) // pacing the load, not synchronising
					}
					next = next.Add(gap)
					k := rng.IntN(keys)
					items[0].Key = names[k]
					before := time.Since(origin)
					var err error
					ds, err = s.Decide(ctx, ds[:0], items)
					after := time.Since(origin)
					if err != nil {
						t.Error(err)
						return
					}
					calls++
					switch {
					case ds[0].Reason != ratelimit.ReasonOK && ds[0].Reason != ratelimit.ReasonLimited:
						fallbacks++
					case ds[0].Allowed:
						local[k] = append(local[k], admission{before, after})
					}
				}
				mu.Lock()
				defer mu.Unlock()
				res.calls += calls
				res.fallbacks += fallbacks
				for k := range local {
					res.admitted[k] = append(res.admitted[k], local[k]...)
				}
			})
		}
	}
	wg.Wait()
	res.run = time.Since(origin)
	return res
}

// worstWindow returns, over every window of length l, the most admissions
// surely inside it (asked and answered within it), per key, and the key.
func worstWindow(adm [][]admission, l time.Duration) (worst int, key int) {
	for k, as := range adm {
		slices.SortFunc(as, func(a, b admission) int { return int(a.before - b.before) })
		// For each start (an admission's before), count those with
		// before ≥ start and after ≤ start+l.
		for i := range as {
			end := as[i].before + l
			n := 0
			for j := i; j < len(as) && as[j].before <= end; j++ {
				if as[j].after <= end {
					n++
				}
			}
			if n > worst {
				worst, key = n, k
			}
		}
	}
	return worst, key
}

func total(adm [][]admission) int {
	n := 0
	for _, as := range adm {
		n += len(as)
	}
	return n
}

// countingStores returns 4 Stores on srv, each with its own client as
// separate replicas would have, knowing they are 4.
func countingStores(t *testing.T, srv *redistest.Server, prefix string, mods ...func(*Options)) []*Store {
	stores := make([]*Store, 4)
	for i := range stores {
		stores[i] = newTestStore(t, []string{srv.Addr()}, nil, func(o *testConfig) {
			o.Prefix, o.Replicas, o.Now = prefix, 4, nil
			for _, m := range mods {
				m(&o.Options)
			}
		})
	}
	return stores
}

// TestCountingAccuracy runs 4 replicas sharing one Redis on one rule, in
// each mode, even and skewed, steady and bursty, on one key: batched and
// strict never admit above the limit in any window (counting only the
// admissions surely inside it) and take at least 97 % (95 % skewed) of
// what the rule allows over the run; approximate stays within its bound
// (see "Where the counter lives") and takes at least 97 %.
func TestCountingAccuracy(t *testing.T) {
	srv := redistest.Standalone(t)
	const rate, burst = 1000, 200
	const window = time.Second
	run := 2 * time.Second
	for _, mode := range []ratelimit.Counting{ratelimit.Strict, ratelimit.Batched, ratelimit.Approximate} {
		for _, shape := range []struct {
			name          string
			skew, bursty  bool
			least, leastW float64
		}{
			{"even", false, false, 0.97, 0.97},
			{"skewed", true, false, 0.95, 0.95},
			{"bursty", false, true, 0.97, 0.97},
		} {
			t.Run(mode.String()+"/"+shape.name, func(t *testing.T) {
				r := &ratelimit.Rule{Name: "acc", Quota: rate, Period: time.Second, Burst: burst, Counting: mode}
				stores := countingStores(t, srv, fmt.Sprintf("acc%d%s:", mode, shape.name))
				warmStores(t, stores)
				offered := 4.0 * rate
				if shape.bursty {
					offered *= 2 // in bursts, half the time
				}
				res := countLoad(t, stores, r, 1, shape.skew, shape.bursty, offered, run)
				if res.fallbacks != 0 {
					t.Fatalf("%d decisions fell back", res.fallbacks)
				}
				got := total(res.admitted)
				worst, _ := worstWindow(res.admitted, window)
				limitW := burst + rate*int(window/time.Second)
				// What the rule allows over the time the callers asked
				// (bursty callers rest 100 ms at a time, which refills
				// less than the burst: only the last rest is lost).
				allowed := burst + int(float64(rate)*run.Seconds())
				if shape.bursty {
					allowed -= rate / 10
				}
				bound := 0
				if mode == ratelimit.Approximate {
					bound = approxBound(4, DefaultReconcileInterval+50*time.Millisecond, rate, burst)
				}
				var st Stats
				for _, s := range stores {
					x := s.Stats()
					st.Requests += x.Requests
					st.Counted += x.Counted
					st.Leases += x.Leases
					st.Reconciles += x.Reconciles
					st.CachedDenials += x.CachedDenials
					st.Stranded += x.Stranded
				}
				t.Logf("%d calls, admitted %d of %d allowed (%.1f%%); worst %v window %d of %d (+%d bound); Redis calls %d, local %d, leases %d, reconciles %d, cached denials %d, stranded %d",
					res.calls, got, allowed, 100*float64(got)/float64(allowed), window, worst, limitW, bound,
					st.Requests, st.Counted, st.Leases, st.Reconciles, st.CachedDenials, st.Stranded)
				if worst > limitW+bound {
					t.Errorf("a %v window admitted %d > %d + %d", window, worst, limitW, bound)
				}
				if res.calls < int64(2*allowed) {
					t.Skipf("not saturated: %d calls for %d admissible", res.calls, allowed)
				}
				// Approximate replicas take their share of what refills
				// at each reconciliation: on a machine too loaded to keep
				// the interval (the race detector, other work), they take
				// less, which is no fault of the counting. A replica
				// reconciles only the intervals it touched the key in:
				// bursty callers rest half the time.
				kept := uint64(len(stores)) * uint64(run/DefaultReconcileInterval)
				if shape.bursty {
					kept /= 2
				}
				if mode == ratelimit.Approximate && 4*st.Reconciles < 3*kept {
					t.Skipf("the machine kept %d reconciliations of %d", st.Reconciles, kept)
				}
				least := shape.least
				if mode == ratelimit.Approximate {
					least = 0.97 // the figure, skewed or not
				}
				if float64(got) < least*float64(allowed) {
					t.Errorf("admitted %d < %.0f%% of %d", got, 100*least, allowed)
				}
			})
		}
	}
}

// approxBound is the documented bound of approximate counting: what n
// replicas reconciling every interval (plus the round trip) may admit
// beyond the limit of a GCRA rule of rate per second and burst.
func approxBound(n int, interval time.Duration, rate, burst int) int {
	return int(float64(n-1) / float64(n) * (float64(burst) + float64(rate)*interval.Seconds()))
}

// warmStores dials each store's connections and loads the script before a run.
func warmStores(t *testing.T, stores []*Store) {
	t.Helper()
	r := &ratelimit.Rule{Name: "warm", Quota: 1, Period: time.Second}
	var wg sync.WaitGroup
	for _, s := range stores {
		for range 4 {
			wg.Go(func() {
				if _, err := s.Decide(context.Background(), nil, []ratelimit.Item{{Key: "warm", Rule: r}}); err != nil {
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
}

// TestCountingManyKeys runs 4 replicas on 10,000 keys of one approximate
// rule (a burst of 8 and one more per 10 s, each key) for 2 s: no key
// admits more than the rule plus the bound. Every replica reconciles all
// the keys it touched in one pipeline per interval. It does not saturate
// the keys: each replica's first decision on a key is a round trip (it
// has no view yet), and 16 callers on this machine make too few of them
// in 2 s; the figures are logged, not asserted.
func TestCountingManyKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	const keys, burst = 10000, 8
	run := 2 * time.Second
	r := &ratelimit.Rule{Name: "many", Quota: 1, Period: 10 * time.Second, Burst: burst, Counting: ratelimit.Approximate}
	stores := countingStores(t, srv, "many:")
	warmStores(t, stores)
	perKey := burst + int(run/(10*time.Second))
	offered := 2 * float64(keys*perKey) / run.Seconds()
	res := countLoad(t, stores, r, keys, false, false, offered, run)
	if res.fallbacks != 0 {
		t.Fatalf("%d decisions fell back", res.fallbacks)
	}
	got := total(res.admitted)
	allowed := keys * perKey
	bound := approxBound(4, DefaultReconcileInterval+50*time.Millisecond, 0, burst) + 1
	worst, key := worstWindow(res.admitted, run)
	var st Stats
	for _, s := range stores {
		x := s.Stats()
		st.Requests += x.Requests
		st.Counted += x.Counted
		st.Reconciles += x.Reconciles
	}
	t.Logf("%d calls in %v, admitted %d of %d allowed (%.1f%%); worst key k%d admitted %d of %d (+%d bound); Redis calls %d, local %d, reconciles %d",
		res.calls, res.run, got, allowed, 100*float64(got)/float64(allowed), key, worst, perKey, bound, st.Requests, st.Counted, st.Reconciles)
	if worst > perKey+bound {
		t.Errorf("key k%d admitted %d > %d + %d", key, worst, perKey, bound)
	}
	if st.Reconciles == 0 {
		t.Error("no reconciliation")
	}
}

// TestCountingFreeze pauses Redis (SIGSTOP) for 500 ms in the middle of a
// 3 s saturating run of 4 replicas on one fail_closed rule, in each mode.
// While Redis does not answer, batched replicas spend the blocks they
// hold and approximate ones decide on their views; then the failure mode
// denies. Over the whole run, once reconciliation has caught up, the
// admitted stay within the limit (plus the bound for approximate): hits
// counted during the pause are sent once, when Redis answers again.
func TestCountingFreeze(t *testing.T) {
	const rate, burst = 1000, 200
	run := 3 * time.Second
	for _, mode := range []ratelimit.Counting{ratelimit.Batched, ratelimit.Approximate} {
		t.Run(mode.String(), func(t *testing.T) {
			srv := redistest.Standalone(t)
			r := &ratelimit.Rule{Name: "frz", Quota: rate, Period: time.Second, Burst: burst, Counting: mode, Failure: ratelimit.FailClosed}
			// Calls time out as they would in production; views are kept
			// 40 intervals, 400 ms, less than the pause.
			stores := countingStores(t, srv, "frz:", func(o *Options) {
				o.Timeout, o.ReconcileInterval = DefaultTimeout, 10*time.Millisecond
			})
			warmStores(t, stores)
			freeze := time.AfterFunc(run/3, srv.Freeze) // the fault's schedule
			thaw := time.AfterFunc(run/3+run/6, srv.Thaw)
			defer freeze.Stop()
			defer thaw.Stop()
			res := countLoad(t, stores, r, 1, false, false, 4*rate, run)
			got := total(res.admitted)
			limit := burst + int(float64(rate)*res.run.Seconds())
			bound := 0
			if mode == ratelimit.Approximate {
				bound = approxBound(4, 10*time.Millisecond+50*time.Millisecond, rate, burst)
			}
			t.Logf("%d calls, admitted %d, limit %d (+%d bound), %d decided by the failure mode", res.calls, got, limit, bound, res.fallbacks)
			if got > limit+bound {
				t.Errorf("admitted %d > %d + %d", got, limit, bound)
			}
			if res.fallbacks == 0 {
				t.Error("no decision by the failure mode while Redis was frozen")
			}
			worst, _ := worstWindow(res.admitted, time.Second)
			if worst > burst+rate+bound {
				t.Errorf("a 1s window admitted %d > %d + %d", worst, burst+rate, bound)
			}
		})
	}
}

// stateDebt returns the debt Redis holds for key under a GCRA rule: its T
// less its Seen, which for a state written once from fresh is the cost
// times the interval.
func stateDebt(t *testing.T, s *Store, key string) time.Duration {
	t.Helper()
	st, ok, err := s.State(context.Background(), key)
	if err != nil || !ok {
		t.Fatalf("state of %q: %v (found %v)", key, err, ok)
	}
	return time.Duration(st.T - st.Seen)
}

// touchKeys has s decide 1 + i%3 units of r on each key i, locally.
func touchKeys(t *testing.T, s *Store, r *ratelimit.Rule, keys []string) {
	t.Helper()
	for i, k := range keys {
		for range 1 + i%3 {
			ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{{Key: k, Rule: r, Cost: 1}})
			if err != nil || !ds[0].Allowed {
				t.Fatalf("key %q: %v %+v", k, err, ds)
			}
		}
	}
}

// TestReconcileCalls reconciles by hand (the interval is an hour) on one
// server: the hits of every key touched reach Redis exactly, many keys
// per script call and never more than maxReconcileKeys in one; a key not
// touched since the last reconciliation is not sent again, and one
// touched again is; a key whose stored state the reconciliation form
// does not take (in debt under another interval) is sent on its own, and
// counted all the same.
func TestReconcileCalls(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, []string{srv.Addr()}, nil, func(o *testConfig) { o.ReconcileInterval = time.Hour })
	r := &ratelimit.Rule{Name: "calls", Quota: 100, Period: time.Hour, Burst: 1000, Counting: ratelimit.Approximate}
	iv := s.count.info(r).push.Interval()
	keys := make([]string, 2*maxReconcileKeys+37)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	touchKeys(t, s, r, keys)
	st0 := s.Stats()
	s.count.reconcile()
	st1 := s.Stats()
	if got := st1.Batched - st0.Batched; got != 3 {
		t.Errorf("%d keys reconciled in %d script calls, want 3", len(keys), got)
	}
	for i, k := range keys {
		if got, want := stateDebt(t, s, k), time.Duration(1+i%3)*iv; got != want {
			t.Fatalf("key %q: Redis holds a debt of %v, want %v", k, got, want)
		}
	}

	s.count.reconcile()
	if st := s.Stats(); st.Batched != st1.Batched || st.Reconciles != st1.Reconciles {
		t.Errorf("a reconciliation with no key touched sent %d calls", st.Batched-st1.Batched)
	}

	// Touched again: sent again, and its view is the shared state's.
	touchKeys(t, s, r, keys[:1])
	s.count.reconcile()
	if got := s.Stats().Batched - st1.Batched; got != 1 {
		t.Errorf("one key touched again: %d script calls, want 1", got)
	}
	e := s.count.entry(keys[0], r)
	e.mu.Lock()
	pending, synced := e.pending, e.synced
	e.mu.Unlock()
	if pending != 0 || synced.IsZero() {
		t.Errorf("after its reconciliation: %d hits pending, synced at %v", pending, synced)
	}

	// A state in debt under another interval: the general path rescales it.
	other := &ratelimit.Rule{Name: "other", Quota: 10, Period: time.Hour}
	if ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{{Key: "rescaled", Rule: other, Cost: 5}}); err != nil || !ds[0].Allowed {
		t.Fatalf("strict decision: %v %+v", err, ds)
	}
	touchKeys(t, s, r, []string{"rescaled"})
	s.count.reconcile()
	st, _, err := s.State(context.Background(), "rescaled")
	if err != nil {
		t.Fatal(err)
	}
	if st.N != int64(iv) {
		t.Errorf("the rescaled key's interval is %v, want the push rule's %v", time.Duration(st.N), iv)
	}
	e = s.count.entry("rescaled", r)
	e.mu.Lock()
	pending = e.pending
	e.mu.Unlock()
	if pending != 0 {
		t.Errorf("the rescaled key kept %d hits pending", pending)
	}
}

// TestReconcileClusterSlots reconciles by hand on the three-master
// Cluster keys of several hash tags and untagged ones: every key's hits
// reach Redis exactly, in one script call per slot (per maxReconcileKeys
// of its keys), as slot computes it and CLUSTER KEYSLOT agrees.
func TestReconcileClusterSlots(t *testing.T) {
	cl := redistest.Cluster(t)
	s := newTestStore(t, cl.Addrs(), nil, func(o *testConfig) { o.ReconcileInterval = time.Hour })
	r := &ratelimit.Rule{Name: "slots", Quota: 100, Period: time.Hour, Burst: 1000, Counting: ratelimit.Approximate}
	iv := s.count.info(r).push.Interval()
	var keys []string
	for _, tag := range []string{"a", "b", "c"} {
		for i := range maxReconcileKeys + 10 {
			keys = append(keys, fmt.Sprintf("{%s}u%d", tag, i))
		}
	}
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("u%d", i))
	}
	touchKeys(t, s, r, keys)
	perSlot := map[uint16]int{}
	ctx := context.Background()
	for i, k := range keys {
		rk := s.count.entry(k, r).rkey
		sl := slot(rk)
		perSlot[sl]++
		if i%50 == 0 {
			got, err := s.c.ClusterKeySlot(ctx, rk).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != int64(sl) {
				t.Fatalf("slot(%q) = %d, CLUSTER KEYSLOT says %d", rk, sl, got)
			}
		}
	}
	want := uint64(0)
	for _, n := range perSlot {
		want += uint64((n + maxReconcileKeys - 1) / maxReconcileKeys)
	}
	before := s.Stats().Batched
	s.count.reconcile()
	if got := s.Stats().Batched - before; got != want {
		t.Errorf("%d keys in %d slots reconciled in %d script calls, want %d", len(keys), len(perSlot), got, want)
	}
	for i, k := range keys {
		if got, want := stateDebt(t, s, k), time.Duration(1+i%3)*iv; got != want {
			t.Fatalf("key %q: Redis holds a debt of %v, want %v", k, got, want)
		}
	}
}

// TestCountingDeniedEverywhere has 4 replicas share one approximate key
// that nothing refills during the test, under skewed load (replica 0
// asks 9 times as often as each other one), and reconciles them by hand,
// one after the other, at the end of every round: a round is one
// interval. Once a replica's reconciliation has shown the key over its
// limit (its view, with no hit of its own pending, has no room for one
// more), every replica denies the key after its next reconciliation,
// within one interval: from the round after next, nothing is admitted.
// Over the run, the replicas admit the capacity at least (approximate
// takes what it may) and at most the capacity plus the bound.
func TestCountingDeniedEverywhere(t *testing.T) {
	srv := redistest.Standalone(t)
	const n, capacity = 4, 400
	r := &ratelimit.Rule{Name: "everywhere", Quota: 40, Period: time.Hour, Burst: capacity, Counting: ratelimit.Approximate}
	stores := countingStores(t, srv, "everywhere:", func(o *Options) { o.ReconcileInterval = time.Hour })
	ctx := context.Background()
	item := []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}
	over := func(s *Store) bool { // the replica's view has no room for a hit
		e := s.count.entry("k", r)
		e.mu.Lock()
		defer e.mu.Unlock()
		v := e.view
		var d ratelimit.Decision
		e.info.local.DecideInto(&d, &v, s.localNow(), n)
		return e.pending == 0 && !d.Allowed
	}
	admitted, seen := 0, -1 // seen: the round whose reconciliations first showed the key over
	for round := 0; round < 100 && (seen < 0 || round <= seen+3); round++ {
		inRound := 0
		for i, s := range stores {
			asks := 3
			if i == 0 {
				asks = 27
			}
			for range asks {
				ds, err := s.Decide(ctx, nil, item)
				if err != nil {
					t.Fatal(err)
				}
				if ds[0].Reason != ratelimit.ReasonOK && ds[0].Reason != ratelimit.ReasonLimited {
					t.Fatalf("round %d, replica %d: decided by %v", round, i, ds[0].Reason)
				}
				if ds[0].Allowed {
					inRound++
				}
			}
		}
		admitted += inRound
		if seen >= 0 && round >= seen+2 && inRound > 0 {
			t.Errorf("round %d: %d admitted, though a replica saw the key over its limit in round %d", round, inRound, seen)
		}
		for _, s := range stores {
			s.count.reconcile()
			if seen < 0 && over(s) {
				seen = round
			}
		}
	}
	if seen < 0 {
		t.Fatalf("no replica saw the key over its limit in 100 rounds (%d admitted)", admitted)
	}
	bound := approxBound(n, 0, 0, capacity)
	t.Logf("over its limit on a replica after round %d; admitted %d of %d (+%d bound)", seen, admitted, capacity, bound)
	if admitted < capacity-n || admitted > capacity+bound {
		t.Errorf("admitted %d, want %d to %d + %d", admitted, capacity-n, capacity, bound)
	}
}
