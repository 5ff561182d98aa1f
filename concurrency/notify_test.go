package concurrency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The tests of release notifications and of fairness and weights across
// processes, on real redis-server processes. The channel and queue keys
// they watch are SemaphoreStore's layout (its package documentation):
// Key(name) + ":freed" and Key(name) + ":q".

// pollRedis calls cond every few milliseconds until it holds, failing the
// test after timeout. It polls Redis state, not time.
func pollRedis(t testing.TB, timeout time.Duration, what string, cond func(context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v", what, timeout)
		case <-tick.C:
		}
	}
}

// subscribers returns a condition: the channel of semaphore name has n
// subscribers.
func subscribers(c *redis.Client, b *redisstore.SemaphoreStore, name string, n int64) func(context.Context) (bool, error) {
	ch := b.Key(name) + ":freed"
	return func(ctx context.Context) (bool, error) {
		m, err := c.PubSubNumSub(ctx, ch).Result()
		return m[ch] == n, err
	}
}

// queued returns a condition: n waiters queue on semaphore name.
func queued(c *redis.Client, b *redisstore.SemaphoreStore, name string, n int64) func(context.Context) (bool, error) {
	return members(c, b.Key(name)+":q", n)
}

// members returns a condition: the sorted set at key has n members.
func members(c *redis.Client, key string, n int64) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		got, err := c.ZCard(ctx, key).Result()
		return got == n, err
	}
}

// newStore returns a SemaphoreStore on a client of its own, as another
// process would have.
func newStore(t testing.TB, srv *redistest.Server) *redisstore.SemaphoreStore {
	t.Helper()
	b, err := redisstore.NewSemaphoreStore(srv.Client(), redisstore.SemaphoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type grant struct {
	p   *concurrency.Permit
	err error
	at  time.Time
}

// acquireAsync starts AcquireN in a goroutine of the test's and returns
// the channel of its result.
func acquireAsync(ctx context.Context, d *concurrency.Distributed, n int64) <-chan grant {
	got := make(chan grant, 1)
	go func() {
		p, err := d.AcquireN(ctx, n)
		got <- grant{p, err, time.Now()}
	}()
	return got
}

// TestReleaseWakesOtherStore: with a poll interval of 10 s, a waiter on
// another client is granted a permit freed on the first well within the
// interval (2 s on a loaded machine; a few ms measured), because the
// release publishes. Without Fair, and with Fair and weights.
func TestReleaseWakesOtherStore(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client()
	const poll, bound = 10 * time.Second, 2 * time.Second
	for _, tc := range []struct {
		name           string
		fair           bool
		limit, hold, n int64
	}{
		{"unfair", false, 1, 1, 1},
		{"fair weighted", true, 3, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := concurrency.DistributedOptions{TTL: 30 * time.Second, MinBackoff: poll, MaxBackoff: poll, QueueTTL: 30 * time.Second, Fair: tc.fair}
			hb, wb := newStore(t, srv), newStore(t, srv)
			holder, err := concurrency.NewDistributed(hb, tc.name, tc.limit, o)
			if err != nil {
				t.Fatal(err)
			}
			waiter, err := concurrency.NewDistributed(wb, tc.name, tc.limit, o)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var lat []time.Duration
			for round := range 3 {
				p, err := holder.TryAcquireN(ctx, tc.hold)
				if err != nil {
					t.Fatalf("round %d: holder: %v", round, err)
				}
				got := acquireAsync(ctx, waiter, tc.n)
				// The waiter has failed once and watches.
				pollRedis(t, 5*time.Second, "the waiter's subscription", subscribers(admin, wb, tc.name, 1))
				if tc.fair {
					pollRedis(t, 5*time.Second, "the waiter's place", queued(admin, wb, tc.name, 1))
				}
				released := time.Now()
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
				g := <-got
				if g.err != nil {
					t.Fatalf("round %d: waiter: %v", round, g.err)
				}
				d := g.at.Sub(released)
				lat = append(lat, d)
				if d > bound {
					t.Errorf("round %d: waiter granted %v after the release, want within %v (poll interval %v)", round, d, bound, poll)
				}
				if err := g.p.Release(ctx); err != nil {
					t.Fatal(err)
				}
				// The last waiter gone, its watch ends.
				pollRedis(t, 5*time.Second, "the end of the watch", subscribers(admin, wb, tc.name, 0))
			}
			t.Logf("release to grant on another client: %v (poll interval %v)", lat, poll)
		})
	}
}

// counted is a SemaphoreStore (a Notifier still) that counts the acquire
// attempts that have returned.
type counted struct {
	*redisstore.SemaphoreStore
	attempts *atomic.Int64
}

func (c counted) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	defer c.attempts.Add(1)
	return c.SemaphoreStore.Acquire(ctx, name, token, limit, ttl, wait)
}

// TestReleaseWakesOneWaiter: three waiters, each on a client of its own
// (as in three processes), wait for a permit of limit 1 with a poll
// interval longer than the test; each release is answered by exactly one
// attempt, the named waiter's, which is granted, and no waiter of another
// process asks in vain. Every waiter ends granted, so every attempt it
// made is counted by then.
func TestReleaseWakesOneWaiter(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client()
	const name, poll = "one", time.Minute
	o := concurrency.DistributedOptions{TTL: 30 * time.Second, MinBackoff: poll, MaxBackoff: poll, QueueTTL: 2 * poll}
	var attempts atomic.Int64
	hb := newStore(t, srv)
	holder, err := concurrency.NewDistributed(hb, name, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := holder.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []<-chan grant
	for range 3 {
		d, err := concurrency.NewDistributed(counted{newStore(t, srv), &attempts}, name, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, acquireAsync(ctx, d, 1))
	}
	// Each waiter asks once, and once more when its watch is in place;
	// each is recorded, and watches. (Counted as they return: an attempt
	// still in flight at the release could be granted.)
	pollRedis(t, 5*time.Second, "the waiters' subscriptions", subscribers(admin, hb, name, 3))
	pollRedis(t, 5*time.Second, "the waiters recorded", members(admin, hb.Key(name)+":pw", 3))
	pollRedis(t, 5*time.Second, "the waiters' second attempts", func(context.Context) (bool, error) { return attempts.Load() == 6, nil })
	granted := 0
	for granted < 3 {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got[0]:
			p, err = g.p, g.err
		case g := <-got[1]:
			p, err = g.p, g.err
		case g := <-got[2]:
			p, err = g.p, g.err
		case <-ctx.Done():
			t.Fatalf("%d waiters granted, then none", granted)
		}
		if err != nil {
			t.Fatal(err)
		}
		granted++
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := attempts.Load(); n != 6+3 {
		t.Fatalf("%d acquire attempts, want 9: 2 each to wait, then one a release", n)
	}
}

// lossy is a SemaphoreStore whose watch is in place but loses every
// message (fail: whose watch fails).
type lossy struct {
	*redisstore.SemaphoreStore
	fail    bool
	watches atomic.Int64
}

func (l *lossy) Watch(ctx context.Context, name string) (<-chan string, error) {
	l.watches.Add(1)
	if l.fail {
		return nil, errors.New("watch refused")
	}
	in, err := l.SemaphoreStore.Watch(ctx, name)
	if err != nil {
		return nil, err
	}
	out := make(chan string)
	go func() {
		defer close(out)
		for range in { // every message lost
		}
	}()
	return out, nil
}

// TestLostNotificationPolls: when the notifications are lost, or the
// watch fails, a waiter still finds a freed permit by polling, within
// its poll interval (300 ms; bound 3 s on a loaded machine).
func TestLostNotificationPolls(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client()
	const poll, bound = 300 * time.Millisecond, 3 * time.Second
	for _, fail := range []bool{false, true} {
		name := map[bool]string{false: "lost", true: "failed"}[fail]
		t.Run(name, func(t *testing.T) {
			o := concurrency.DistributedOptions{TTL: 30 * time.Second, MinBackoff: poll, MaxBackoff: poll}
			hb := newStore(t, srv)
			wb := &lossy{SemaphoreStore: newStore(t, srv), fail: fail}
			holder, err := concurrency.NewDistributed(hb, name, 1, o)
			if err != nil {
				t.Fatal(err)
			}
			waiter, err := concurrency.NewDistributed(wb, name, 1, o)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p, err := holder.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := acquireAsync(ctx, waiter, 1)
			var published <-chan *redis.Message
			if fail {
				pollRedis(t, 5*time.Second, "a watch attempt", func(context.Context) (bool, error) { return wb.watches.Load() > 0, nil })
			} else {
				// The test's own subscription tells that the release did
				// publish (so that polling, not a notification, is what
				// granted): the waiter's may end before the message
				// reaches it, when its poll comes just after the release.
				pollRedis(t, 5*time.Second, "the waiter's subscription", subscribers(admin, wb.SemaphoreStore, name, 1))
				sub := admin.Subscribe(ctx, hb.Key(name)+":freed")
				defer sub.Close()
				if _, err := sub.Receive(ctx); err != nil {
					t.Fatal(err)
				}
				published = sub.Channel()
			}
			released := time.Now()
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			g := <-got
			if g.err != nil {
				t.Fatal(g.err)
			}
			d := g.at.Sub(released)
			if d > bound {
				t.Errorf("granted %v after the release, want within %v (poll interval %v)", d, bound, poll)
			}
			g.p.Release(ctx) //nolint:errcheck // the test is over
			if !fail {
				select {
				case <-published:
				case <-ctx.Done():
					t.Fatal("the release published nothing to lose")
				}
			}
			t.Logf("notifications %s: granted %v after the release (poll interval %v; %d watch attempts)", name, d.Round(time.Millisecond), poll, wb.watches.Load())
		})
	}
}

// The fair semaphore of TestFairOrderAcrossProcesses. The waiters poll
// every 2 s, so the grants follow each other at the speed of the
// notifications; their places last 10 s.
const (
	orderName  = "order"
	orderLimit = 2
	orderProcs = 4
)

var orderOpts = concurrency.DistributedOptions{TTL: 10 * time.Second, MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second, QueueTTL: 10 * time.Second, Fair: true}

// childQueue is a child of TestFairOrderAcrossProcesses: it waits for a
// permit of weight w, appends id to the list of grants, and releases.
func childQueue(t *testing.T, c *redis.Client, b *redisstore.SemaphoreStore, limit, w int64, id string) {
	d, err := concurrency.NewDistributed(b, orderName, limit, orderOpts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := d.AcquireN(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	// The permit is the whole semaphore: nobody else appends meanwhile.
	if err := c.RPush(ctx, b.Key(orderName)+":test-grants", id).Err(); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("semworker: granted=%s at=%d\n", id, time.Now().UnixNano())
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFairOrderAcrossProcesses: OS processes that queue on a fair
// semaphore one after another (each started once the one before is queued
// and watching) are granted it in that order when its holder releases.
// Each takes the whole limit, so the grants follow one another and the
// list they append to is the order of the grants.
func TestFairOrderAcrossProcesses(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("starts OS processes")
	}
	srv := redistest.Standalone(t)
	admin := srv.Client()
	b := newStore(t, srv)
	holder, err := concurrency.NewDistributed(b, orderName, orderLimit, orderOpts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	p, err := holder.AcquireN(ctx, orderLimit)
	if err != nil {
		t.Fatal(err)
	}
	var kids []*child
	var want []string
	for i := range orderProcs {
		id := strconv.Itoa(i)
		kids = append(kids, startChild(t, envMode+"=queue", envRedis+"="+srv.Addr(),
			envLimit+"="+strconv.Itoa(orderLimit), envWeight+"="+strconv.Itoa(orderLimit), envID+"="+id))
		want = append(want, id)
		n := int64(i + 1)
		pollRedis(t, 10*time.Second, "child "+id+" queued and watching", func(ctx context.Context) (bool, error) {
			select {
			case <-kids[i].done:
				return false, fmt.Errorf("child %s exited: %v", id, kids[i].err)
			default:
			}
			q, err := queued(admin, b, orderName, n)(ctx)
			if !q || err != nil {
				return q, err
			}
			return subscribers(admin, b, orderName, n)(ctx)
		})
	}
	released := time.Now()
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var after []time.Duration // each grant, after the release
	for i, k := range kids {
		for line := range k.lines {
			var id int
			var at int64
			if _, err := fmt.Sscanf(line, "granted=%d at=%d", &id, &at); err != nil || id != i {
				t.Errorf("child %d said %q", i, line)
			}
			after = append(after, time.Unix(0, at).Sub(released).Round(100*time.Microsecond))
		}
		if <-k.done; k.err != nil {
			t.Fatalf("child %d: %v", i, k.err)
		}
	}
	all := time.Since(released)
	got, err := admin.LRange(ctx, b.Key(orderName)+":test-grants", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("grants in the order %v, want the arrival order %v", got, want)
	}
	t.Logf("%d processes granted in arrival order %v, at %v after the release, the children exited within %v (poll interval %v)", orderProcs, got, after, all.Round(time.Millisecond), orderOpts.MaxBackoff)
}

// The weighted semaphore of TestWeightedAcrossProcesses.
var (
	weightedLimit   = 5
	weightedWeights = []int{1, 1, 2, 3, 4}
	weightedIters   = 15
	weightedOpts    = concurrency.DistributedOptions{TTL: 5 * time.Second, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, QueueTTL: 5 * time.Second, Fair: true}
)

// audit keeps, in Redis, the weight held by the children of
// TestWeightedAcrossProcesses as they report it: ARGV[1] is the weight
// taken (negative: given back), ARGV[2] the holders (+1 or -1), ARGV[3]
// the limit. It records the peaks and each time the limit is exceeded.
var audit = redis.NewScript(`
local held = redis.call('HINCRBY', KEYS[1], 'held', ARGV[1])
local n = redis.call('HINCRBY', KEYS[1], 'holders', ARGV[2])
if held > tonumber(redis.call('HGET', KEYS[1], 'peak') or '0') then
  redis.call('HSET', KEYS[1], 'peak', held)
end
if n > tonumber(redis.call('HGET', KEYS[1], 'peakholders') or '0') then
  redis.call('HSET', KEYS[1], 'peakholders', n)
end
if tonumber(ARGV[2]) > 0 then
  redis.call('HINCRBY', KEYS[1], 'grants', 1)
  if held > tonumber(ARGV[3]) then
    redis.call('HINCRBY', KEYS[1], 'over', 1)
  end
end
return held
`)

const weightedAudit = "test-weighted-audit"

// childWeighted is a child of TestWeightedAcrossProcesses: iters times,
// it acquires weight w, reports it to the audit, works, reports its end
// and releases.
func childWeighted(t *testing.T, c *redis.Client, b *redisstore.SemaphoreStore, limit, w int64, iters int) {
	d, err := concurrency.NewDistributed(b, "weighted", limit, weightedOpts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lost := 0
	for range iters {
		p, err := d.AcquireN(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		if err := audit.Run(ctx, c, []string{weightedAudit}, w, 1, limit).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // the protected work, not synchronisation
		if p.Err() != nil {
			lost++
		}
		if err := audit.Run(ctx, c, []string{weightedAudit}, -w, -1, limit).Err(); err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("semworker: lost=%d\n", lost)
}

// TestWeightedAcrossProcesses: OS processes acquiring permits of weights
// 1, 1, 2, 3 and 4 on a fair semaphore of limit 5 never hold more than 5
// between them, as an audit in Redis (incremented after each grant,
// decremented before each release) records; and they do hold permits at
// the same time, so that the limit is what held them back.
func TestWeightedAcrossProcesses(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("starts OS processes")
	}
	srv := redistest.Standalone(t)
	admin := srv.Client()
	var kids []*child
	for _, w := range weightedWeights {
		kids = append(kids, startChild(t, envMode+"=weighted", envRedis+"="+srv.Addr(),
			envLimit+"="+strconv.Itoa(weightedLimit), envWeight+"="+strconv.Itoa(w), envIters+"="+strconv.Itoa(weightedIters)))
	}
	for i, k := range kids {
		for line := range k.lines {
			if line != "lost=0" {
				t.Errorf("child %d (weight %d) said %q", i, weightedWeights[i], line)
			}
		}
		if <-k.done; k.err != nil {
			t.Fatalf("child %d: %v", i, k.err)
		}
	}
	a, err := admin.HGetAll(context.Background(), weightedAudit).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := func(k string) int { v, _ := strconv.Atoi(a[k]); return v }
	if got, want := n("grants"), len(weightedWeights)*weightedIters; got != want {
		t.Fatalf("audit counted %d grants, want %d", got, want)
	}
	if n("over") != 0 || n("peak") > weightedLimit {
		t.Fatalf("weight held peaked at %d, above the limit %d, %d times", n("peak"), weightedLimit, n("over"))
	}
	if n("held") != 0 || n("holders") != 0 {
		t.Errorf("audit ends with %d held by %d holders, want 0", n("held"), n("holders"))
	}
	if n("peakholders") < 2 {
		t.Errorf("at most %d holder at once: the processes never overlapped", n("peakholders"))
	}
	t.Logf("%d weighted grants in %d processes: peak weight %d of %d, peak holders %d", n("grants"), len(kids), n("peak"), weightedLimit, n("peakholders"))
}

// polled is a SemaphoreStore that hides its notifications (it is no
// Notifier) and counts the acquire attempts.
type polled struct {
	concurrency.FairStore
	attempts atomic.Int64
}

func (p *polled) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	p.attempts.Add(1)
	return p.FairStore.Acquire(ctx, name, token, limit, ttl, wait)
}

// BenchmarkReleaseToGrant measures the time from a release on one client
// to the grant of the permit to a waiter on another, with the default
// backoffs (5 ms to 250 ms): "notified" on the Redis store, "polled" on
// the same store with its notifications hidden, the waiter having backed
// off to MaxBackoff (8 attempts) before the release. It reports the mean
// and the largest (µs/grant, max-µs); ns/op includes each operation's
// set-up (the waiter's subscription, or its backing off).
func BenchmarkReleaseToGrant(b *testing.B) {
	srv := redistest.Standalone(b)
	admin := srv.Client()
	for _, mode := range []string{"notified", "polled"} {
		b.Run(mode, func(b *testing.B) {
			hb, wb := newStore(b, srv), newStore(b, srv)
			var ws concurrency.Store = wb
			counted := &polled{FairStore: wb}
			if mode == "polled" {
				ws = counted
			}
			holder, err := concurrency.NewDistributed(hb, "latency-"+mode, 1, concurrency.DistributedOptions{})
			if err != nil {
				b.Fatal(err)
			}
			waiter, err := concurrency.NewDistributed(ws, "latency-"+mode, 1, concurrency.DistributedOptions{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var sum, worst time.Duration
			for b.Loop() {
				p, err := holder.TryAcquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				counted.attempts.Store(0)
				got := acquireAsync(ctx, waiter, 1)
				if mode == "notified" {
					pollRedis(b, 5*time.Second, "the subscription", subscribers(admin, wb, "latency-"+mode, 1))
				} else {
					pollRedis(b, 5*time.Second, "the backing off", func(context.Context) (bool, error) { return counted.attempts.Load() >= 8, nil })
				}
				released := time.Now()
				if err := p.Release(ctx); err != nil {
					b.Fatal(err)
				}
				g := <-got
				if g.err != nil {
					b.Fatal(g.err)
				}
				d := g.at.Sub(released)
				sum += d
				worst = max(worst, d)
				g.p.Release(ctx) //nolint:errcheck // measured already
				if mode == "notified" {
					pollRedis(b, 5*time.Second, "the end of the watch", subscribers(admin, wb, "latency-"+mode, 0))
				}
			}
			b.ReportMetric(float64(sum.Microseconds())/float64(b.N), "µs/grant")
			b.ReportMetric(float64(worst.Microseconds()), "max-µs")
		})
	}
}

// timedAll is a SemaphoreStore (a Notifier still) that records when
// each acquire attempt, of either kind, starts.
type timedAll struct {
	*redisstore.SemaphoreStore
	mu     *sync.Mutex
	starts *[]time.Time
}

func (c timedAll) started() {
	c.mu.Lock()
	*c.starts = append(*c.starts, time.Now())
	c.mu.Unlock()
}

func (c timedAll) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	c.started()
	return c.SemaphoreStore.Acquire(ctx, name, token, limit, ttl, wait)
}

func (c timedAll) AcquireFair(ctx context.Context, name, token string, weight, limit int64, ttl, wait time.Duration) (concurrency.FairResult, uint64, error) {
	c.started()
	return c.SemaphoreStore.AcquireFair(ctx, name, token, weight, limit, ttl, wait)
}

// TestLiveWatchPollsAtMaxBackoff: once its watch is live, a blocked
// Acquire, which the store names when room opens, polls only at
// MaxBackoff (1 s here, pauses drawn in [0.5 s, 1 s]), not from
// MinBackoff (5 ms) up, nor, first in a fair line, every MinBackoff.
// The attempts it starts from 200 ms after Redis counts its
// subscription to 2.4 s after are at least two (polling goes on, the
// fallback for a lost notification), and each starts at least 0.5 s
// after the one before; polling from 5 ms, some would be 160 or 320 ms
// apart, and first in line, 5 ms. The 200 ms leave the client time to
// learn that its SUBSCRIBE took (the attempts before may be MinBackoff
// apart, and one more follows at once). A release still grants it at
// once.
func TestLiveWatchPollsAtMaxBackoff(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client()
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			name := "live-" + strconv.FormatBool(fair)
			// The plain waiter never joins the line (FairAfter < 0): its
			// move there, an attempt at once, is not polling.
			o := concurrency.DistributedOptions{TTL: 30 * time.Second, MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Second, Fair: fair, FairAfter: -1}
			hb := newStore(t, srv)
			holder, err := concurrency.NewDistributed(hb, name, 1, o)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var starts []time.Time
			waiter, err := concurrency.NewDistributed(timedAll{newStore(t, srv), &mu, &starts}, name, 1, o)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p, err := holder.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := acquireAsync(ctx, waiter, 1)
			pollRedis(t, 5*time.Second, "the waiter's subscription", subscribers(admin, hb, name, 1))
			subscribed := time.Now()
			// The span measured, not a synchronisation.
			time.Sleep(time.Until(subscribed.Add(2400 * time.Millisecond)))
			mu.Lock()
			var live []time.Time
			for _, at := range starts {
				if at.After(subscribed.Add(200 * time.Millisecond)) {
					live = append(live, at)
				}
			}
			all := len(starts)
			mu.Unlock()
			if len(live) < 2 {
				t.Errorf("%d acquire attempts from 0.2 s to 2.4 s after the subscription, want at least 2", len(live))
			}
			for i := 1; i < len(live); i++ {
				if gap := live[i].Sub(live[i-1]); gap < 500*time.Millisecond {
					t.Errorf("attempts %v apart once the watch is live, want at least 0.5 s", gap.Round(time.Millisecond))
				}
			}
			released := time.Now()
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			g := <-got
			if g.err != nil {
				t.Fatal(g.err)
			}
			g.p.Release(ctx) //nolint:errcheck // the test is over
			t.Logf("%d attempts in all, %d from 0.2 s after the subscription; granted %v after the release", all, len(live), g.at.Sub(released).Round(time.Millisecond))
		})
	}
}

// TestWatchLingers: the watch outlives its last waiter for a while, so a
// waiter that comes soon after (a loop that released and asks again)
// finds it live: no new SUBSCRIBE (Redis's count of them is unchanged),
// and it is granted at the next release; the watch still ends once no
// waiter comes.
func TestWatchLingers(t *testing.T) {
	srv := redistest.Standalone(t)
	admin := srv.Client()
	const name = "linger"
	o := concurrency.DistributedOptions{TTL: 30 * time.Second, MinBackoff: time.Second, MaxBackoff: 10 * time.Second}
	hb, wb := newStore(t, srv), newStore(t, srv)
	holder, err := concurrency.NewDistributed(hb, name, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := concurrency.NewDistributed(wb, name, 1, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subscribes := func() int64 {
		t.Helper()
		stats, err := admin.InfoMap(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		if _, err := fmt.Sscanf(stats["Commandstats"]["cmdstat_subscribe"], "calls=%d", &n); err != nil {
			t.Fatalf("cmdstat_subscribe %q: %v", stats["Commandstats"]["cmdstat_subscribe"], err)
		}
		return n
	}
	round := func(i int) {
		t.Helper()
		p, err := holder.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("round %d: holder: %v", i, err)
		}
		got := acquireAsync(ctx, waiter, 1)
		pollRedis(t, 5*time.Second, "the waiter's subscription", subscribers(admin, wb, name, 1))
		pollRedis(t, 5*time.Second, "the waiter recorded", members(admin, wb.Key(name)+":pw", 1))
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		g := <-got
		if g.err != nil {
			t.Fatalf("round %d: waiter: %v", i, g.err)
		}
		if err := g.p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	round(0)
	before := subscribes()
	round(1)
	if after := subscribes(); after != before {
		t.Errorf("%d SUBSCRIBEs for a waiter that came while the watch lingered, want none", after-before)
	}
	pollRedis(t, 5*time.Second, "the end of the watch", subscribers(admin, wb, name, 0))
}
