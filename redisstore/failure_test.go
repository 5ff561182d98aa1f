package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
	"go.uber.org/goleak"
)

// margin is what a decision may take beyond Options.Timeout while Redis is
// down or slow: scheduling on a loaded 2-core machine under -race (typical
// figures are a few milliseconds; see the logged maxima).
const margin = 300 * time.Millisecond

// slack bounds calls that are not about failures (first connections, script
// loading): they only must not hang.
const slack = 5 * time.Second

// errDown stands for a failed call to Redis.
var errDown = errors.New("connection refused")

func TestBreaker(t *testing.T) {
	now := time.Unix(0, 0)
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	b := breaker{threshold: 3, cooldown: time.Second, now: func() time.Time { return now }, log: log}
	steps := []struct {
		name  string
		at    time.Duration // since the start
		allow bool          // want allow()
		ok    bool          // outcome reported when allowed
	}{
		{"closed", 0, true, false},
		{"closed, 1 failure", 0, true, false},
		{"closed, 2 failures", 0, true, false},
		{"open", 0, false, false},
		{"still open", 999 * time.Millisecond, false, false},
		{"half-open probe", time.Second, true, false},
		{"probe failed: open again", time.Second, false, false},
		{"second probe", 2 * time.Second, true, true},
		{"closed again", 2 * time.Second, true, true},
	}
	for _, st := range steps {
		now = time.Unix(0, 0).Add(st.at)
		if got := b.allow(); got != st.allow {
			t.Fatalf("%s: allow() = %v, want %v", st.name, got, st.allow)
		}
		if st.allow {
			var err error
			if !st.ok {
				err = errDown
			}
			b.done(err)
		}
	}
	if b.trips.Load() != 2 {
		t.Fatalf("trips = %d, want 2", b.trips.Load())
	}
	// One outage, logged once when it began and once when it ended, however
	// often the breaker opened in between.
	wantLog := `level=WARN msg="Redis does not answer; deciding by each rule's failure mode until it does" failures=3 err="connection refused"
level=INFO msg="Redis answers again; decisions are back on Redis" outage=2s
`
	if got := logged.String(); got != wantLog {
		t.Fatalf("log:\n%s\nwant:\n%s", got, wantLog)
	}
	logged.Reset()
	// While a probe is out, nobody else goes through.
	now = now.Add(time.Hour)
	b.done(errDown)
	b.done(errDown)
	b.done(errDown)
	now = now.Add(time.Hour)
	if !b.allow() || b.allow() {
		t.Fatal("half-open breaker let zero or two probes through")
	}
	// A probe whose caller gave up lets another one go.
	b.abandon()
	if !b.allow() || b.allow() {
		t.Fatal("after an abandoned probe: want exactly one more probe")
	}
}

// TestBreakerSlow: timeouts at the threshold ask whether Redis answers at
// all; an answer keeps the breaker closed (slow, not dead), no answer
// opens it; a refused connection opens it at once, with no check.
func TestBreakerSlow(t *testing.T) {
	now := time.Unix(0, 0)
	var checks []func()
	answer := errors.New("unset")
	b := breaker{threshold: 3, cooldown: time.Second, now: func() time.Time { return now },
		log:   slog.New(slog.DiscardHandler),
		check: func() error { return answer },
		spawn: func(f func()) { checks = append(checks, f) },
	}
	timeout := fmt.Errorf("redis: %w", context.DeadlineExceeded)
	run := func() { // runs the one check out
		t.Helper()
		if len(checks) != 1 {
			t.Fatalf("%d checks out, want 1", len(checks))
		}
		f := checks[0]
		checks = nil
		f()
	}
	for range 3 {
		b.done(timeout)
	}
	if !b.allow() || b.isOpen() {
		t.Fatal("closed breaker stopped calls while checking")
	}
	b.done(timeout) // more timeouts while the check is out: no second check
	answer = nil
	run()
	if b.isOpen() || b.slow.Load() != 1 || b.trips.Load() != 0 {
		t.Fatalf("slow Redis: open %v, slow %d, trips %d", b.isOpen(), b.slow.Load(), b.trips.Load())
	}
	// No answer to the check: open.
	for range 3 {
		b.done(timeout)
	}
	answer = context.DeadlineExceeded
	run()
	if !b.isOpen() || b.allow() || b.trips.Load() != 1 {
		t.Fatalf("dead Redis: open %v, trips %d", b.isOpen(), b.trips.Load())
	}
	// Half-open probe times out: no call goes while the check is out; an
	// error reply is an answer and closes it.
	now = now.Add(time.Second)
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	b.done(timeout)
	if b.allow() {
		t.Fatal("half-open breaker let a call through while checking")
	}
	answer = replyError("LOADING Redis is loading the dataset in memory")
	run()
	if b.isOpen() || !b.allow() || b.slow.Load() != 2 {
		t.Fatalf("after an answered check: open %v, slow %d", b.isOpen(), b.slow.Load())
	}
	b.done(nil)
	// A refused connection is no timeout: open at the threshold, no check.
	for range 3 {
		b.done(errDown)
	}
	if len(checks) != 0 || !b.isOpen() || b.trips.Load() != 2 {
		t.Fatalf("refused: checks %d, open %v, trips %d", len(checks), b.isOpen(), b.trips.Load())
	}
}

// replyError is an error reply of Redis.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// policyRules have one rule of each failure mode, 10 per hour: a replica
// of 2 decides locally at 5.
func policyRules() (open, closed, local *ratelimit.Rule) {
	open = &ratelimit.Rule{Name: "open", Quota: 10, Period: time.Hour, Failure: ratelimit.FailOpen}
	closed = &ratelimit.Rule{Name: "closed", Quota: 10, Period: time.Hour, Failure: ratelimit.FailClosed}
	local = &ratelimit.Rule{Name: "local", Quota: 10, Period: time.Hour, Failure: ratelimit.FailLocal}
	return
}

// noLeak checks, after every other cleanup of t (servers stopped), that no
// goroutine started during t is left.
func noLeak(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// timed decides and fails the test if the call took longer than bound.
func timed(t *testing.T, s *Store, bound time.Duration, items ...ratelimit.Item) []ratelimit.Decision {
	t.Helper()
	start := time.Now()
	ds, err := s.Decide(context.Background(), nil, items)
	if el := time.Since(start); el > bound {
		t.Fatalf("decision took %v, bound %v", el, bound)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// TestServerDown stops redis-server in the middle of a run and starts it
// again: while it is down every decision is bounded and follows its rule's
// failure mode; once it is back the store is exact again by itself; and
// nothing leaks.
func TestServerDown(t *testing.T) {
	for _, coalesce := range []bool{true, false} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) {
			noLeak(t)
			srv := redistest.Standalone(t)
			const timeout = 50 * time.Millisecond
			s := newStoreOn(t, ClientOptions{Addrs: []string{srv.Addr()}, Timeout: timeout}, Options{
				Timeout: timeout, Replicas: 2,
				BreakerThreshold: 3, BreakerCooldown: 100 * time.Millisecond, NoCoalesce: !coalesce,
			})
			open, closed, local := policyRules()
			bound := timeout + margin
			for _, r := range []*ratelimit.Rule{open, closed, local} {
				if d := timed(t, s, slack, ratelimit.Item{Key: r.Name, Rule: r, Cost: 1})[0]; d.Reason != ratelimit.ReasonOK {
					t.Fatalf("%s with Redis up: %+v", r.Name, d)
				}
			}

			srv.Stop()
			for i := range 20 {
				ds := timed(t, s, bound,
					ratelimit.Item{Key: "open", Rule: open, Cost: 1},
					ratelimit.Item{Key: "closed", Rule: closed, Cost: 1})
				if ds[0].Reason != ratelimit.ReasonFailOpen || !ds[0].Allowed || ds[1].Reason != ratelimit.ReasonFailClosed || ds[1].Allowed || ds[1].RetryAfter <= 0 {
					t.Fatalf("call %d with Redis down: %+v", i, ds)
				}
				d := timed(t, s, bound, ratelimit.Item{Key: "local", Rule: local, Cost: 1})[0]
				// The local share is 10/2 = 5 per hour.
				if d.Reason != ratelimit.ReasonLocal || d.Allowed != (i < 5) {
					t.Fatalf("local call %d: %+v", i, d)
				}
			}
			st := s.Stats()
			if st.FailOpen != 20 || st.FailClosed != 20 || st.Local != 20 || st.Trips == 0 || !st.Open {
				t.Fatalf("stats while down: %+v", st)
			}

			srv.Start()
			// Back to Redis by itself: within a few cool-downs.
			deadline := time.Now().Add(5 * time.Second)
			for {
				d := timed(t, s, slack, ratelimit.Item{Key: "probe", Rule: open, Cost: 0})[0]
				if d.Reason == ratelimit.ReasonOK {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("still %v 5 s after Redis came back", d.Reason)
				}
				time.Sleep(10 * time.Millisecond) // polling, bounded by deadline
			}
			// Exact again: the restarted server is empty, so 10 are admitted.
			for i := range 12 {
				d := timed(t, s, slack, ratelimit.Item{Key: "closed", Rule: closed, Cost: 1})[0]
				if d.Allowed != (i < 10) || (d.Reason != ratelimit.ReasonOK && d.Reason != ratelimit.ReasonLimited) {
					t.Fatalf("after restart, call %d: %+v", i, d)
				}
			}
			if s.Stats().Open {
				t.Fatal("breaker still open")
			}
			s.Close()
		})
	}
}

// TestSlowServer makes Redis answer slowly (DEBUG SLEEP from another
// connection): decisions stay bounded by the timeout and fall back, then
// return to Redis.
func TestSlowServer(t *testing.T) {
	noLeak(t)
	srv := redistest.Standalone(t)
	const timeout = 30 * time.Millisecond
	s := newStoreOn(t, ClientOptions{Addrs: []string{srv.Addr()}, Timeout: timeout}, Options{Timeout: timeout, BreakerCooldown: 50 * time.Millisecond})
	_, closed, _ := policyRules()
	item := ratelimit.Item{Key: "k", Rule: closed, Cost: 0}
	if d := timed(t, s, slack, item)[0]; d.Reason != ratelimit.ReasonOK {
		t.Fatalf("before: %+v", d)
	}
	admin := srv.Client()
	var wg sync.WaitGroup
	wg.Add(1)
	slept := make(chan error, 1)
	go func() {
		defer wg.Done()
		slept <- admin.Do(context.Background(), "DEBUG", "SLEEP", "0.3").Err()
	}()
	// Wait until the server is inside DEBUG SLEEP: a decision fails.
	var sawClosed int
	deadline := time.Now().Add(5 * time.Second)
	for sawClosed < 5 && time.Now().Before(deadline) {
		d := timed(t, s, timeout+margin, item)[0]
		if d.Reason == ratelimit.ReasonFailClosed {
			sawClosed++
		}
	}
	if sawClosed < 5 {
		t.Fatal("never saw the slow server")
	}
	wg.Wait()
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		d := timed(t, s, slack, item)[0]
		if d.Reason == ratelimit.ReasonOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after the sleep", d.Reason)
		}
		time.Sleep(5 * time.Millisecond) // polling, bounded by deadline
	}
	if st := s.Stats(); st.Errors == 0 || st.FailClosed < 5 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestClusterNodeRestart stops one master of three: keys in its slots fall
// back, the others are still decided by Redis; once it is back, all are
// exact again.
func TestClusterNodeRestart(t *testing.T) {
	cl := redistest.Cluster(t)
	const timeout = 100 * time.Millisecond
	s := newStoreOn(t, ClientOptions{Addrs: cl.Addrs(), Timeout: timeout}, Options{Timeout: timeout, BreakerThreshold: 1000})
	_, closed, _ := policyRules()
	ctx := context.Background()
	// Find keys on each node.
	keys := map[string]string{} // node address → key
	for i := 0; len(keys) < 3 && i < 1000; i++ {
		k := fmt.Sprint("k", i)
		m, err := s.c.(*redis.ClusterClient).MasterForKey(ctx, string(appendKey(nil, s.prefix, HashTag(k), k)))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := keys[m.Options().Addr]; !ok {
			keys[m.Options().Addr] = k
		}
	}
	if len(keys) != 3 {
		t.Fatalf("keys on %d nodes", len(keys))
	}
	victim := cl.Nodes[1]
	decide := func(k string, bound time.Duration) ratelimit.Decision {
		return timed(t, s, bound, ratelimit.Item{Key: k, Rule: closed, Cost: 1})[0]
	}
	for _, k := range keys {
		if d := decide(k, slack); d.Reason != ratelimit.ReasonOK {
			t.Fatalf("before: %+v", d)
		}
	}
	victim.Stop()
	for addr, k := range keys {
		d := decide(k, timeout+margin)
		if addr == victim.Addr() && d.Reason != ratelimit.ReasonFailClosed {
			t.Fatalf("key on the stopped node: %+v", d)
		}
		if addr != victim.Addr() && d.Reason != ratelimit.ReasonOK {
			t.Fatalf("key on a live node: %+v", d)
		}
	}
	victim.Start()
	deadline := time.Now().Add(10 * time.Second)
	k := keys[victim.Addr()]
	for {
		d := timed(t, s, slack, ratelimit.Item{Key: k, Rule: closed, Cost: 0})[0]
		if d.Reason == ratelimit.ReasonOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node back, still %+v", d)
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by deadline
	}
	// The restarted node is empty: exactly 10 again.
	for i := range 11 {
		if d := decide(k, slack); d.Allowed != (i < 10) {
			t.Fatalf("after restart, call %d: %+v", i, d)
		}
	}
}

// blockHook holds every command until release is closed, then fails it.
type blockHook struct{ entered, release chan struct{} }

func (h blockHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h blockHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.entered <- struct{}{}
		<-h.release
		return fmt.Errorf("connection reset")
	}
}
func (h blockHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCloseDuringCall: a call that Close interrupts returns ErrClosed, as
// Decide after Close does, not a decision of the failure policy, and is not
// counted as a Redis error.
func TestCloseDuringCall(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: the hook fails first
	t.Cleanup(func() { c.Close() })
	h := blockHook{entered: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(h)
	s, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &ratelimit.Rule{Name: "r", Quota: 5, Period: time.Second, Failure: ratelimit.FailOpen}
	type result struct {
		ds  []ratelimit.Decision
		err error
	}
	done := make(chan result)
	go func() {
		ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}})
		done <- result{ds, err}
	}()
	<-h.entered
	s.Close()
	close(h.release)
	if res := <-done; !errors.Is(res.err, ErrClosed) {
		t.Fatalf("Decide during Close = %+v, %v; want ErrClosed", res.ds, res.err)
	}
	if st := s.Stats(); st.Errors != 0 || st.FailOpen != 0 {
		t.Errorf("stats after a call ended by Close: %+v", st)
	}
}
