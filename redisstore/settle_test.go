package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestSettleReachesReplicas measures when a settlement's charge reaches
// the other replicas of a batched or approximate rule (redisstore's
// package doc, "Where the counter lives"): replica A reserves 4 units and
// settles at 104, a charge of 100 (the capacity) at the shared counter;
// replica B, which had decided on the key before, then admits from what
// it holds (an approximate view not yet reconciled, a batched block not
// yet spent) and no more: after one reconciliation (approximate) or once
// its block is spent (batched), it denies.
func TestSettleReachesReplicas(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, c := range []ratelimit.Counting{ratelimit.Approximate, ratelimit.Batched} {
		t.Run(c.String(), func(t *testing.T) {
			prefix := fmt.Sprintf("s%d:", rand.Uint64())
			replica := func() *Store {
				return newTestStore(t, []string{srv.Addr()}, nil, func(o *testConfig) {
					o.Prefix, o.Replicas, o.ReconcileInterval = prefix, 2, time.Hour
				})
			}
			a, b := replica(), replica()
			// 100 units per 100 s: one unit refills every second, far
			// slower than the test runs.
			r := &ratelimit.Rule{Name: "settle", Quota: 100, Period: 100 * time.Second, Counting: c}
			ctx := context.Background()
			decideB := func() bool {
				t.Helper()
				ds, err := b.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}})
				if err != nil {
					t.Fatal(err)
				}
				return ds[0].Allowed
			}
			if !decideB() {
				t.Fatal("B's first unit denied")
			}
			if c == ratelimit.Approximate {
				b.counting.approximate.flush() // B's view is the shared state's
			}
			rs := &ratelimit.Reservations{Store: a, Ledger: a}
			id, _, err := rs.Reserve(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 4}})
			if err != nil || id == "" {
				t.Fatalf("Reserve: %q, %v", id, err)
			}
			st, err := rs.Settle(ctx, id, func(int, *ratelimit.Reserved) (int64, error) { return 104, nil })
			if err != nil || st[0].Charged != 100 {
				t.Fatalf("Settle: %+v, %v", st, err)
			}
			stale := 0
			for decideB() {
				stale++
				if stale > 100 {
					t.Fatal("B admits on after a charge of the whole capacity")
				}
				if c == ratelimit.Approximate && stale == 1 {
					b.counting.approximate.reconcile() // one reconciliation
				}
			}
			t.Logf("%s: B admitted %d units after the charge (shared debt ≥ the capacity)", c, stale)
			switch c {
			case ratelimit.Approximate:
				if stale != 1 { // the one before its reconciliation
					t.Errorf("B admitted %d units after the charge, want 1: the one before its next reconciliation", stale)
				}
			case ratelimit.Batched:
				// At most a block: a quarter of B's share, 50/4.
				if stale > 12 {
					t.Errorf("B admitted %d units after the charge, more than one block (12)", stale)
				}
			}
		})
	}
}

// TestSettleScriptPath: a settlement's charge on a bucket is decided by
// the script, not on the exact path: Rule.Settling's debt bound keeps
// capacity × interval within the script's doubles.
func TestSettleScriptPath(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, []string{srv.Addr()}, nil, nil)
	rs := &ratelimit.Reservations{Store: s, Ledger: s}
	ctx := context.Background()
	for _, a := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket} {
		r := &ratelimit.Rule{Name: a.String(), Algorithm: a, Quota: 1000, Period: time.Second}
		id, _, err := rs.Reserve(ctx, nil, []ratelimit.Item{{Key: a.String(), Rule: r, Cost: 10}})
		if err != nil || id == "" {
			t.Fatalf("%s: Reserve: %q %v", a, id, err)
		}
		before := s.Stats().Exact
		if st, err := rs.Settle(ctx, id, func(int, *ratelimit.Reserved) (int64, error) { return 5000, nil }); err != nil || st[0].Charged != 4990 {
			t.Fatalf("%s: Settle: %+v %v", a, st, err)
		}
		if n := s.Stats().Exact - before; n != 0 {
			t.Errorf("%s: the settlement took the exact path %d times", a, n)
		}
	}
}
