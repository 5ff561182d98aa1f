package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestBatchDifferential sends random batches of requests as the batcher
// coalesces them (one EVALSHA, decided in order inside the script) and
// requires the decisions memstore gives the same requests one by one. The
// batches mix one-item GCRA requests (the script's lean batch path), the
// same key several times, costs beyond capacity and refunds (which leave
// the lean path), other algorithms and several items per request.
func TestBatchDifferential(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			batchDiffRun(t, srv.Addr(), seed, 300)
		})
	}
}

func batchDiffRun(t *testing.T, addr string, seed uint64, steps int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+100))
	now := time.Unix(1_800_000_000, 987_654_321)
	clock := func() time.Time { return now }
	rs := newTestStore(t, []string{addr}, clock, func(o *testConfig) { o.NoDenialCache = true }) // as in diffRun
	if rs.batch == nil {
		t.Fatal("the store does not coalesce")
	}
	ms := memstore.New(memstore.Options{Now: clock, JanitorInterval: -1})
	t.Cleanup(func() { ms.Close() })
	ms_ := time.Millisecond
	gcra := []*ratelimit.Rule{
		{Name: "gcra", Quota: 5, Period: 100 * ms_},
		{Name: "gcra-burst", Quota: 3, Period: 100 * ms_, Burst: 7},
		{Name: "gcra-uneven", Quota: 3, Period: 1000*ms_ + 1},
	}
	others := []*ratelimit.Rule{
		{Name: "fixed", Algorithm: ratelimit.FixedWindow, Quota: 5, Period: 100 * ms_},
		// Whole seconds and a period that neither divides nor is a multiple
		// of a second: the script's fixed-window fast path takes the first,
		// its general path the second.
		{Name: "fixed-s", Algorithm: ratelimit.FixedWindow, Quota: 4, Period: time.Second},
		{Name: "fixed-odd", Algorithm: ratelimit.FixedWindow, Quota: 4, Period: 1500 * ms_},
		{Name: "log", Algorithm: ratelimit.SlidingLog, Quota: 4, Period: 100 * ms_},
		{Name: "leaky", Algorithm: ratelimit.LeakyBucket, Quota: 5, Period: 100 * ms_},
	}
	keys := []string{"a", "b", "c", "d"}
	ctx := context.Background()
	fastOnly := 0
	for step := range steps {
		if rng.IntN(3) != 0 {
			now = now.Add(time.Duration(rng.Int64N(int64(40 * time.Millisecond))))
		}
		n := 2 + rng.IntN(10)
		reqs := make([][]ratelimit.Item, n)
		allFast := true
		for i := range reqs {
			m := 1
			if rng.IntN(8) == 0 {
				m = 2
			}
			items := make([]ratelimit.Item, m)
			for j := range items {
				r := gcra[rng.IntN(len(gcra))]
				if rng.IntN(6) == 0 {
					r = others[rng.IntN(len(others))]
				}
				cost := 1 + rng.Int64N(2)
				switch rng.IntN(15) {
				case 0:
					cost = -rng.Int64N(3)
				case 1:
					cost = r.Capacity() + 1
				case 2:
					cost = 0
				}
				if m > 1 || r.Algorithm != ratelimit.GCRA || cost > r.Capacity() || cost < 0 {
					allFast = false
				}
				items[j] = ratelimit.Item{Key: keys[rng.IntN(len(keys))], Rule: r, Cost: cost}
			}
			reqs[i] = items
		}
		if allFast {
			fastOnly++
		}
		calls := make([]*call, n)
		for i, items := range reqs {
			req, err := rs.build(items)
			if err != nil {
				t.Fatal(err)
			}
			req.args[0] = strconv.FormatInt(now.UnixNano(), 10)
			calls[i] = &call{ctx: ctx, deadline: time.Now().Add(time.Minute), req: req, done: make(chan struct{}, 1)}
		}
		rs.batch.send(calls)
		for i, items := range reqs {
			c := calls[i]
			<-c.done
			if c.err != nil {
				t.Fatalf("step %d request %d: %v", step, i, c.err)
			}
			got, _, err := parse(nil, items, c.res)
			if err != nil {
				t.Fatalf("step %d request %d: %v", step, i, err)
			}
			want, _ := ms.Decide(ctx, nil, items)
			for j := range items {
				if !sameDecision(got[j], want[j]) {
					t.Fatalf("step %d request %d of %d item %d (%s key %s cost %d):\n redis %+v\n   mem %+v",
						step, i, n, j, items[j].Rule.Name, items[j].Key, items[j].Cost, got[j], want[j])
				}
			}
		}
	}
	if fastOnly == 0 || fastOnly == steps {
		t.Errorf("%d of %d batches were GCRA-only: both kinds must be exercised", fastOnly, steps)
	}
}

// TestQueuedAfterClose: a request that reaches the queue after Close has
// drained it gets ErrClosed, instead of waiting for an answer that never
// comes. Close leaves both the queue and the quit signal ready, so do
// takes either at random: 100 attempts queue some.
func TestQueuedAfterClose(t *testing.T) {
	s, err := New(nopClient(t), Options{}) // never contacted
	if err != nil {
		t.Fatal(err)
	}
	b := s.batch
	s.Close()
	b.pending.Add(1) // another request pending: do queues its own
	r := &ratelimit.Rule{Name: "r", Quota: 5, Period: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 100 {
		req, err := s.build([]ratelimit.Item{{Key: "k", Rule: r, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.do(ctx, time.Now().Add(time.Minute), req); !errors.Is(err, ErrClosed) {
			t.Fatalf("attempt %d: err = %v, want ErrClosed", i, err)
		}
	}
}
