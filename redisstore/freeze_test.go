package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// The fault suite: Redis stopped with SIGSTOP (a pause: it keeps what was
// sent to it and runs it when it resumes) or SIGKILL (a crash) in the
// middle of a load. Every decision is answered within the timeout and a
// margin, by the failure mode while Redis cannot answer; afterwards the
// counting is exact again, and nothing that was answered as a timeout was
// consumed when Redis resumed.

// faultTimeout is the per-call timeout of the fault suite.
const faultTimeout = 80 * time.Millisecond

// hourly are fail_closed rules of 100 per hour: one unit of GCRA comes back
// every 36 s, a fixed window resets on the hour, so that a test of a few
// seconds sees no capacity come back (see sameHour).
func hourly() []*ratelimit.Rule {
	return []*ratelimit.Rule{
		{Name: "gcra", Quota: 100, Period: time.Hour, Failure: ratelimit.FailClosed},
		{Name: "fixed", Algorithm: ratelimit.FixedWindow, Quota: 100, Period: time.Hour, Failure: ratelimit.FailClosed},
	}
}

// sameHour skips t when the hour changed since start: a fixed window of an
// hour has been reset, and its count says nothing.
func sameHour(t *testing.T, start time.Time) {
	t.Helper()
	if !start.Truncate(time.Hour).Equal(time.Now().Truncate(time.Hour)) {
		t.Skip("the hour changed during the test: the fixed window was reset")
	}
}

// faultStore returns a store whose calls give up after timeout, with a
// breaker that does not open (every call goes to Redis), and a referee: a
// store of the same keys with a timeout of slack, which counts what is left
// (a decision slowed by a loaded machine is then not mistaken for a fault).
func faultStore(t *testing.T, addrs []string, timeout time.Duration, noCoalesce bool) (s, ref *Store) {
	t.Helper()
	s = newStoreOn(t, ClientOptions{Addrs: addrs, Timeout: timeout}, Options{
		Timeout: timeout, BreakerThreshold: 1 << 30, NoCoalesce: noCoalesce,
	})
	ref = newStoreOn(t, ClientOptions{Addrs: addrs, Timeout: slack}, Options{Timeout: slack, Prefix: s.prefix})
	return s, ref
}

// ready waits until Redis decides each item (a check, cost 0, which also
// loads the script on its node) and has s sample its node's clock, so that
// the calls under test do not spend their short timeout on set-up.
func ready(t *testing.T, s *Store, items ...ratelimit.Item) {
	t.Helper()
	for _, it := range items {
		awaitRedis(t, s, it, slack)
		key := string(appendKey(nil, s.prefix, HashTag(it.Key), it.Key))
		now := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), slack)
		_, err := s.sclock.cutoff(ctx, key, now, now.Add(slack))
		cancel()
		if err != nil {
			t.Fatalf("sampling the clock of %s's node: %v", it.Key, err)
		}
	}
}

// warm opens connections: n concurrent checks (cost 0) of each item, with
// Redis up. Calls in flight when Redis stops are then on connections it
// has accepted, whose commands it reads when it resumes (a new connection
// may wait in the listen backlog and be dropped).
func warm(t *testing.T, s *Store, n int, items ...ratelimit.Item) {
	t.Helper()
	checks := make([]ratelimit.Item, len(items))
	for i, it := range items {
		it.Cost = 0
		checks[i] = it
	}
	ch := inFlight(s, n, checks...)
	for range n * len(checks) {
		<-ch // whatever the answer (a slow one is a failure mode): a call made
	}
}

// take decides n units of item one at a time with Redis up and fails t
// unless all are admitted by Redis.
func take(t *testing.T, s *Store, item ratelimit.Item, n int) {
	t.Helper()
	for i := range n {
		if d := timed(t, s, slack, item)[0]; !d.Allowed || d.Reason != ratelimit.ReasonOK {
			t.Fatalf("%s: unit %d of %d with Redis up: %+v", item.Key, i+1, n, d)
		}
	}
}

// drain decides item until Redis denies it and returns how many units it
// admitted; it fails t on a decision not made by Redis, or past 200.
func drain(t *testing.T, s *Store, item ratelimit.Item) int {
	t.Helper()
	for n := 0; n <= 200; n++ {
		d := timed(t, s, slack, item)[0]
		switch {
		case d.Reason == ratelimit.ReasonLimited && !d.Allowed:
			return n
		case d.Reason != ratelimit.ReasonOK || !d.Allowed:
			t.Fatalf("%s: unit %d: %+v", item.Key, n+1, d)
		}
	}
	t.Fatalf("%s: admitted more than 200", item.Key)
	return 0
}

// flight is one decision made concurrently with others.
type flight struct {
	key  string
	d    ratelimit.Decision
	err  error
	took time.Duration
}

// inFlight starts n decisions of each item at once and returns a channel
// that receives every one of them.
func inFlight(s *Store, n int, items ...ratelimit.Item) <-chan flight {
	out := make(chan flight, n*len(items))
	for range n {
		for _, it := range items {
			go func() {
				start := time.Now()
				ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{it})
				f := flight{key: it.Key, err: err, took: time.Since(start)}
				if err == nil {
					f.d = ds[0]
				}
				out <- f
			}()
		}
	}
	return out
}

// await receives n flights and fails t unless each came within bound and
// was decided for a reason in want (by key, "" for any other key).
func await(t *testing.T, ch <-chan flight, n int, bound time.Duration, want map[string]ratelimit.Reason) {
	t.Helper()
	timer := time.NewTimer(bound + slack)
	defer timer.Stop()
	var worst time.Duration
	for range n {
		var f flight
		select {
		case f = <-ch:
		case <-timer.C:
			t.Fatalf("decisions still in flight %v after they were started", bound+slack)
		}
		worst = max(worst, f.took)
		if f.err != nil {
			t.Fatalf("%s: %v", f.key, f.err)
		}
		if f.took > bound {
			t.Errorf("%s: decided in %v, bound %v", f.key, f.took, bound)
		}
		r, ok := want[f.key]
		if !ok {
			r = want[""]
		}
		if f.d.Reason != r || f.d.Allowed != (r == ratelimit.ReasonOK) {
			t.Errorf("%s: %+v, want %v", f.key, f.d, r)
		}
	}
	t.Logf("%d decisions, slowest %v", n, worst)
}

// awaitRedis polls with a check (cost 0) of item until Redis decides it
// again, for at most limit.
func awaitRedis(t *testing.T, s *Store, item ratelimit.Item, limit time.Duration) {
	t.Helper()
	item.Cost = 0
	deadline := time.Now().Add(limit)
	for {
		if d := timed(t, s, slack, item)[0]; d.Reason == ratelimit.ReasonOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis still not deciding %s %v after it came back", item.Key, limit)
		}
		time.Sleep(5 * time.Millisecond) // polling an external process, bounded by deadline
	}
}

// TestFreezeConsumesNothing freezes a standalone Redis (SIGSTOP) while
// decisions are in flight: they are answered fail_closed within the
// timeout, and when Redis resumes (SIGCONT) and reads them, their scripts
// are past their cutoff and do nothing, so the keys still admit exactly
// what was left before the freeze. Coalesced (pipelines, one EVALSHA for
// the batch) and not (a connection per call).
func TestFreezeConsumesNothing(t *testing.T) {
	for _, noCoalesce := range []bool{false, true} {
		t.Run(fmt.Sprint("noCoalesce=", noCoalesce), func(t *testing.T) {
			noLeak(t)
			start := time.Now()
			srv := redistest.Standalone(t)
			s, ref := faultStore(t, []string{srv.Addr()}, faultTimeout, noCoalesce)
			var items []ratelimit.Item
			for _, r := range hourly() {
				it := ratelimit.Item{Key: r.Name, Rule: r, Cost: 1}
				ready(t, s, it)
				take(t, ref, it, 10)
				items = append(items, it)
			}
			warm(t, s, 20, items...)

			srv.Freeze()
			const n = 20
			await(t, inFlight(s, n, items...), n*len(items), faultTimeout+margin,
				map[string]ratelimit.Reason{"": ratelimit.ReasonFailClosed})
			srv.Thaw()

			awaitRedis(t, s, items[0], 5*time.Second)
			for _, it := range items {
				if got := drain(t, ref, it); got != 90 {
					t.Errorf("%s: %d admitted after the thaw, want 90: the calls answered fail_closed consumed %d", it.Key, got, 90-got)
				}
			}
			if st := s.Stats(); st.FailClosed < n*uint64(len(items)) {
				t.Errorf("stats: %+v, want FailClosed >= %d", st, n*len(items))
			}
			sameHour(t, start)
			if el := time.Since(start); el > 10*time.Second {
				t.Errorf("took %v", el)
			}
		})
	}
}

// TestKillMidLoad kills a standalone Redis (SIGKILL) under a load of
// concurrent callers and starts it again on the same port: during the
// outage every decision is fail_closed within the timeout; afterwards the
// server, which persists nothing, has lost every state, and the keys admit
// exactly their capacity again.
func TestKillMidLoad(t *testing.T) {
	noLeak(t)
	start := time.Now()
	srv := redistest.Standalone(t)
	s, ref := faultStore(t, []string{srv.Addr()}, faultTimeout, false)
	var items []ratelimit.Item
	for _, r := range hourly() {
		it := ratelimit.Item{Key: r.Name, Rule: r, Cost: 1}
		ready(t, s, it)
		take(t, ref, it, 10)
		items = append(items, it)
	}
	// The load: callers on keys of their own, each one decision after the
	// other until stop, every one within the bound.
	load := &ratelimit.Rule{Name: "load", Quota: 1 << 30, Period: time.Second, Failure: ratelimit.FailClosed}
	stop := make(chan struct{})
	slowest := make(chan time.Duration, 4)
	for w := range cap(slowest) {
		go func() {
			var worst time.Duration
			it := []ratelimit.Item{{Key: fmt.Sprint("load", w), Rule: load, Cost: 1}}
			for {
				select {
				case <-stop:
					slowest <- worst
					return
				default:
				}
				t0 := time.Now()
				if _, err := s.Decide(context.Background(), nil, it); err != nil {
					t.Error(err)
				}
				worst = max(worst, time.Since(t0))
			}
		}()
	}

	srv.Stop()
	const n = 20
	await(t, inFlight(s, n, items...), n*len(items), faultTimeout+margin,
		map[string]ratelimit.Reason{"": ratelimit.ReasonFailClosed})
	srv.Start()
	awaitRedis(t, s, items[0], 5*time.Second)
	close(stop)
	for range cap(slowest) {
		if w := <-slowest; w > faultTimeout+margin {
			t.Errorf("a decision of the load took %v, bound %v", w, faultTimeout+margin)
		}
	}
	for _, it := range items {
		if got := drain(t, ref, it); got != 100 {
			t.Errorf("%s: %d admitted after the restart, want 100 (the restarted server is empty)", it.Key, got)
		}
	}
	sameHour(t, start)
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("took %v", el)
	}
}

// TestClusterFreeze freezes one master of three: keys on the other two are
// still decided by Redis, keys on the frozen one fail_closed, all within
// the timeout; after SIGCONT, the frozen node's keys admit exactly what
// was left, so nothing answered as a timeout was consumed.
func TestClusterFreeze(t *testing.T) {
	clusterFault(t, "frozen", (*redistest.Server).Freeze, (*redistest.Server).Thaw, 90, 10*time.Second)
}

// clusterFault runs one fault against one master of a three-master
// Cluster: fault while calls are in flight, then heal. The victim's
// keys (10 of 100 spent before) fail closed within the timeout, the other
// nodes' keys are decided by Redis; after recovery the victim's keys admit
// exactly after (90: nothing consumed; 100: the node restarted empty).
func clusterFault(t *testing.T, what string, fault, heal func(*redistest.Server), after int, bound time.Duration) {
	cl := redistest.Cluster(t)
	start := time.Now()
	// A longer timeout: the live nodes' calls must be answered by Redis
	// within it on a loaded machine.
	const timeout = 3 * faultTimeout
	s, ref := faultStore(t, cl.Addrs(), timeout, false)
	victim := cl.Nodes[1]
	hit, live := clusterKeys(t, s, victim.Addr())
	ready(t, s, append(hit, live...)...)
	for _, it := range append(hit, live...) {
		take(t, ref, it, 10)
	}
	warm(t, s, 10, append(hit, live...)...)

	fault(victim)
	const n = 10
	want := map[string]ratelimit.Reason{"": ratelimit.ReasonOK}
	for _, it := range hit {
		want[it.Key] = ratelimit.ReasonFailClosed
	}
	await(t, inFlight(s, n, append(hit, live...)...), n*(len(hit)+len(live)), timeout+margin, want)
	heal(victim)

	awaitRedis(t, s, hit[0], 10*time.Second)
	for _, it := range hit {
		if got := drain(t, ref, it); got != after {
			t.Errorf("%s (%s, %s node): %d admitted after it came back, want %d", it.Key, it.Rule.Name, what, got, after)
		}
	}
	for _, it := range live {
		if got := drain(t, ref, it); got != 90-n {
			t.Errorf("%s (live node): %d admitted, want %d", it.Key, got, 90-n)
		}
	}
	sameHour(t, start)
	if el := time.Since(start); el > bound {
		t.Errorf("took %v after the cluster was up, bound %v", el, bound)
	}
}

// warmAtOnce runs call(0) … call(n-1) at once with Redis up, opening the
// connections and sampling the clock the frozen calls will use.
func warmAtOnce(t *testing.T, n int, call func(i int) error) {
	t.Helper()
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- call(i) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("acquire and release with Redis up: %v", err)
		}
	}
}

// failFrozen makes n acquires at once on a frozen server and checks that
// each fails within faultTimeout and the margin.
func failFrozen(t *testing.T, n int, acquire func(i int) (any, error)) {
	t.Helper()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			start := time.Now()
			got, err := acquire(i)
			if el := time.Since(start); el > faultTimeout+margin {
				err = fmt.Errorf("acquire took %v, bound %v", el, faultTimeout+margin)
			} else if err == nil {
				err = fmt.Errorf("acquire on a frozen server: %v, nil error", got)
			} else {
				err = nil
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestSemaphoreFreeze freezes Redis while acquires are in flight: each
// fails within its deadline, and when Redis resumes and runs them, none
// adds a holder: no permit is held that nobody owns.
func TestSemaphoreFreeze(t *testing.T) {
	srv := redistest.Standalone(t)
	c, err := NewClient(ClientOptions{Addrs: []string{srv.Addr()}, Timeout: faultTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sem, err := NewSemaphoreStore(c, SemaphoreOptions{Prefix: fmt.Sprintf("t%d:", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 10
	// Open connections and sample the clock: n holders at once, released.
	warmAtOnce(t, n, func(i int) error {
		tok := fmt.Sprint("warm", i)
		fence, err := sem.Acquire(ctx, "s", tok, n, time.Hour, 0)
		if err == nil && fence == 0 {
			err = errors.New("no permit")
		}
		if err == nil {
			_, err = sem.Release(ctx, "s", tok)
		}
		return err
	})

	srv.Freeze()
	failFrozen(t, n, func(i int) (any, error) {
		cctx, cancel := context.WithTimeout(ctx, faultTimeout)
		defer cancel()
		return sem.Acquire(cctx, "s", fmt.Sprint("frozen", i), n, time.Hour, 0)
	})
	srv.Thaw()

	admin := srv.Client()
	// What the frozen server was sent runs as soon as it resumes, but not
	// necessarily before a command of a new connection: look for holders
	// for a while (polling an external process, bounded).
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		if held, err := admin.ZCard(ctx, sem.Key("s")).Result(); err != nil || held != 0 {
			t.Fatalf("after the thaw: %d holders (err %v), want 0: acquires answered as failed took permits", held, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freezeOnHook freezes srv when armed and a command is an EVALSHA of sha,
// just before the command is sent.
type freezeOnHook struct {
	srv   *redistest.Server
	sha   string
	armed *atomic.Bool
}

func (h freezeOnHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h freezeOnHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == h.sha && h.armed.CompareAndSwap(true, false) {
			h.srv.Freeze()
		}
		return next(ctx, cmd)
	}
}
func (h freezeOnHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestExactFreeze: on the exact path (a yearly rule), Redis is frozen
// after it answered the read and before it receives the compare-and-set:
// the call is answered fail_closed within the timeout, and the write, run
// when Redis resumes, is past its cutoff and does nothing.
func TestExactFreeze(t *testing.T) {
	start := time.Now()
	srv := redistest.Standalone(t)
	s, ref := faultStore(t, []string{srv.Addr()}, faultTimeout, true)
	armed := new(atomic.Bool)
	s.c.AddHook(freezeOnHook{srv: srv, sha: s.cas.Hash(), armed: armed})
	r := &ratelimit.Rule{Name: "yearly", Quota: 100, Period: 365 * 24 * time.Hour, Failure: ratelimit.FailClosed}
	it := ratelimit.Item{Key: "yearly", Rule: r, Cost: 1}
	ready(t, s, it)
	take(t, s, it, 1) // loads the compare-and-set script
	take(t, ref, it, 9)

	armed.Store(true)
	if d := timed(t, s, faultTimeout+margin, it)[0]; d.Reason != ratelimit.ReasonFailClosed {
		t.Fatalf("decision while frozen: %+v", d)
	}
	if armed.Load() {
		t.Fatal("the compare-and-set was never sent")
	}
	srv.Thaw()
	if got := drain(t, ref, it); got != 90 {
		t.Errorf("%d admitted after the thaw, want 90: the call answered fail_closed consumed %d", got, 90-got)
	}
	if st := s.Stats(); st.Exact == 0 {
		t.Error("the yearly rule did not take the exact path")
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("took %v", el)
	}
}

// TestLeaseFreeze freezes Redis while lease acquires are in flight: each
// fails within the store's timeout, and when Redis resumes and runs them,
// none grants a partition: no lease is held by a member that was told it
// failed.
func TestLeaseFreeze(t *testing.T) {
	srv := redistest.Standalone(t)
	c, err := NewClient(ClientOptions{Addrs: []string{srv.Addr()}, Timeout: faultTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ls, err := NewLeaseStore(c, fmt.Sprint("svc", time.Now().UnixNano()), LeaseOptions{Timeout: faultTimeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 8 // members, one partition each
	// Open connections and sample the clock: every partition acquired at
	// once, then released.
	warmAtOnce(t, n, func(i int) error {
		id := fmt.Sprint("m", i)
		gs, err := ls.Acquire(ctx, id, []int{i}, time.Hour)
		if err == nil && len(gs) != 1 {
			err = fmt.Errorf("granted %v", gs)
		}
		if err == nil {
			err = ls.Release(ctx, id, gs)
		}
		return err
	})

	srv.Freeze()
	failFrozen(t, n, func(i int) (any, error) {
		return ls.Acquire(ctx, fmt.Sprint("m", i), []int{i}, time.Hour)
	})
	srv.Thaw()

	admin := srv.Client()
	// As in TestSemaphoreFreeze: look for owners for a while (polling an
	// external process, bounded).
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		parts, err := admin.HGetAll(ctx, ls.keys[2]).Result()
		if err != nil {
			t.Fatal(err)
		}
		for p, v := range parts {
			if f := strings.Fields(v); len(f) == 3 {
				t.Fatalf("after the thaw, partition %s is leased (%q): acquires answered as failed took it", p, v)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBatchCutoffs sends one pipeline, by hand, of requests at two
// instants (two groups): first a check, which carries no cutoff, then a
// request that takes. The second gets the pipeline's cutoff, not none or
// one in the past: it is decided.
func TestBatchCutoffs(t *testing.T) {
	srv := redistest.Standalone(t)
	s, _ := faultStore(t, []string{srv.Addr()}, time.Second, false)
	r := &ratelimit.Rule{Name: "r", Quota: 10, Period: time.Hour}
	ready(t, s, ratelimit.Item{Key: "a", Rule: r})
	now := time.Now()
	var calls []*call
	for i, cost := range []int64{0, 1} {
		req, err := s.build([]ratelimit.Item{{Key: fmt.Sprint("k", i), Rule: r, Cost: cost}})
		if err != nil {
			t.Fatal(err)
		}
		req.args[argNow] = strconv.FormatInt(now.UnixNano()+int64(i), 10)
		calls = append(calls, &call{ctx: context.Background(), deadline: now.Add(time.Second), req: req, done: make(chan struct{}, 1)})
	}
	s.batch.send(calls)
	for i, c := range calls {
		<-c.done
		if c.err != nil || len(c.res) != replyFields || c.res[replyAllowed] != int64(1) {
			t.Errorf("request %d (cost %d): %v %v, want admitted", i, i, c.res, c.err)
		}
	}
}

// TestClusterKill kills one master of a three-master Cluster (SIGKILL)
// mid-load and starts it again on its port, where it rejoins the Cluster
// empty: its keys are answered fail_closed within the bound while it is
// down, the other nodes' keys are decided by Redis all along, and after
// the restart the victim's keys count from zero, exactly.
func TestClusterKill(t *testing.T) {
	clusterFault(t, "killed", (*redistest.Server).Stop, (*redistest.Server).Start, 100, 15*time.Second)
}

// clusterKeys returns keys of s on a Cluster: one per rule of hourly on the
// node at victim, and one on each other node.
func clusterKeys(t *testing.T, s *Store, victim string) (onVictim, elsewhere []ratelimit.Item) {
	t.Helper()
	rules := hourly()
	others := map[string]bool{}
	for i := 0; (len(onVictim) < len(rules) || len(others) < 2) && i < 10000; i++ {
		k := fmt.Sprint("k", i)
		m, err := s.c.(*redis.ClusterClient).MasterForKey(context.Background(), string(appendKey(nil, s.prefix, HashTag(k), k)))
		if err != nil {
			t.Fatal(err)
		}
		switch addr := m.Options().Addr; {
		case addr == victim && len(onVictim) < len(rules):
			onVictim = append(onVictim, ratelimit.Item{Key: k, Rule: rules[len(onVictim)], Cost: 1})
		case addr != victim && !others[addr]:
			others[addr] = true
			elsewhere = append(elsewhere, ratelimit.Item{Key: k, Rule: rules[0], Cost: 1})
		}
	}
	if len(onVictim) < len(rules) || len(elsewhere) != 2 {
		t.Fatalf("keys: %d on the victim, %d on the others", len(onVictim), len(elsewhere))
	}
	return onVictim, elsewhere
}

// TestBatchedLeaseFailureShared: callers waiting for a batched key's
// lease while Redis is frozen are decided by the failure mode when that
// lease times out, each within about one timeout, rather than each
// starting a lease of its own behind the last and waiting another
// timeout (16 callers waited up to 16 timeouts; a serve replica cut from
// Redis shed 6–10 % of its decisions to its overload guard that way).
func TestBatchedLeaseFailureShared(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes redis-server")
	}
	srv := redistest.Standalone(t)
	s, _ := faultStore(t, []string{srv.Addr()}, faultTimeout, false)
	r := &ratelimit.Rule{Name: "b", Algorithm: ratelimit.FixedWindow, Quota: 100, Period: time.Hour,
		Counting: ratelimit.Batched, Failure: ratelimit.FailClosed}
	item := ratelimit.Item{Key: "shared", Rule: r, Cost: 1}
	ready(t, s, ratelimit.Item{Key: item.Key, Rule: r})
	srv.Freeze()
	defer srv.Thaw()
	const callers = 16
	type result struct {
		d    ratelimit.Decision
		err  error
		took time.Duration
	}
	results := make(chan result, callers)
	for range callers {
		go func() {
			start := time.Now()
			ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{item})
			var d ratelimit.Decision
			if err == nil {
				d = ds[0]
			}
			results <- result{d, err, time.Since(start)}
		}()
	}
	var slowest time.Duration
	for range callers {
		res := <-results
		if res.err != nil || res.d.Reason != ratelimit.ReasonFailClosed {
			t.Errorf("decision %+v, err %v: want fail_closed", res.d, res.err)
		}
		slowest = max(slowest, res.took)
	}
	if slowest > 3*faultTimeout {
		t.Errorf("the slowest of %d callers took %v, more than 3 timeouts of %v", callers, slowest, faultTimeout)
	}
	t.Logf("the slowest of %d callers took %v (timeout %v)", callers, slowest, faultTimeout)
}

// TestBatchedNotBehindProbe: once the breaker has opened (Redis frozen),
// the callers of a batched key that arrive while its lease is the
// breaker's probe are decided by the failure mode at once, not after
// waiting for the probe's timeout (a serve replica cut from Redis shed
// decisions to its overload guard when every second's probe made its
// callers wait).
func TestBatchedNotBehindProbe(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes redis-server")
	}
	srv := redistest.Standalone(t)
	s := newStoreOn(t, ClientOptions{Addrs: []string{srv.Addr()}, Timeout: faultTimeout}, Options{
		Timeout: faultTimeout, BreakerThreshold: 1, BreakerCooldown: 50 * time.Millisecond, LivenessTimeout: 50 * time.Millisecond,
	})
	r := &ratelimit.Rule{Name: "b", Algorithm: ratelimit.FixedWindow, Quota: 100, Period: time.Hour,
		Counting: ratelimit.Batched, Failure: ratelimit.FailClosed}
	item := ratelimit.Item{Key: "probe", Rule: r, Cost: 1}
	ready(t, s, ratelimit.Item{Key: item.Key, Rule: r})
	srv.Freeze()
	defer srv.Thaw()
	decide := func() (ratelimit.Decision, time.Duration) {
		start := time.Now()
		ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{item})
		if err != nil {
			t.Errorf("Decide: %v", err)
			return ratelimit.Decision{}, 0
		}
		return ds[0], time.Since(start)
	}
	decide() // times out; the liveness check then opens the breaker
	deadline := time.Now().Add(10 * time.Second)
	for st := s.Stats(); st.Trips == 0 || st.Open; st = s.Stats() { // opened, and its cooldown over
		if time.Now().After(deadline) {
			t.Fatalf("the breaker did not open and cool down: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	const callers = 16
	took := make(chan time.Duration, callers)
	for range callers {
		go func() {
			d, dt := decide()
			if d.Reason != ratelimit.ReasonFailClosed {
				t.Errorf("decision %+v: want fail_closed", d)
			}
			took <- dt
		}()
	}
	var times []time.Duration
	for range callers {
		times = append(times, <-took)
	}
	slices.Sort(times)
	// One caller is the probe and waits its timeout; the others do not.
	if median := times[callers/2]; median > faultTimeout/2 {
		t.Errorf("the median of %d callers took %v behind the probe (timeout %v): %v", callers, median, faultTimeout, times)
	}
	t.Logf("callers took %v", times)
}
