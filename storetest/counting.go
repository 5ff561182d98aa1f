package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// NewReplicas returns n Stores that share one backend, as n replicas of a
// service would, each told that there are n, on the clock now (which
// RunCounting never moves: nothing refills).
type NewReplicas func(t *testing.T, n int, now func() time.Time) []ratelimit.Store

// RunCounting checks what the counting modes (ratelimit.Counting) promise,
// for every mode and every algorithm it supports, on a rule of 20 per hour
// at a frozen instant:
//
//   - one replica admits exactly the capacity, one unit at a time, and
//     then denies with ReasonLimited, whatever the mode; a request of
//     three units with one left is denied by its second and consumes
//     nothing, its first and third reported admitted alone;
//   - 4 replicas asked in turn admit exactly the capacity together in
//     strict and batched modes (batched never admits above the limit, and
//     at a frozen instant strands nothing that a later request cannot
//     lease), and at most the capacity plus (N−1)/N of it in approximate
//     mode, its bound when nothing refills.
//
// A store that keeps its state in one process (memstore) is exact in
// every mode and passes with n handles on one store.
func RunCounting(t *testing.T, newReplicas NewReplicas) {
	ctx := context.Background()
	const quota = 20
	for c := ratelimit.Strict; c <= ratelimit.Approximate; c++ {
		for a := ratelimit.GCRA; a <= ratelimit.LeakyBucket; a++ {
			if !c.Supports(a) {
				continue
			}
			r := &ratelimit.Rule{Name: "counting", Algorithm: a, Quota: quota, Period: time.Hour, Counting: c}
			t.Run(fmt.Sprintf("single/%s/%s", c, a), func(t *testing.T) {
				clock := NewClock(Start)
				s := newReplicas(t, 1, clock.Now)[0]
				for i := range quota + 1 {
					ds, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "single", Rule: r, Cost: 1}})
					if err != nil {
						t.Fatal(err)
					}
					if want := i < quota; ds[0].Allowed != want || (!want && ds[0].Reason != ratelimit.ReasonLimited) {
						t.Fatalf("unit %d: %+v, want allowed=%v", i+1, ds[0], want)
					}
				}
			})
			t.Run(fmt.Sprintf("denied/%s/%s", c, a), func(t *testing.T) {
				clock := NewClock(Start)
				s := newReplicas(t, 1, clock.Now)[0]
				unit := ratelimit.Item{Key: "denied", Rule: r, Cost: 1}
				decide := func(items ...ratelimit.Item) []ratelimit.Decision {
					t.Helper()
					ds, err := s.Decide(ctx, nil, items)
					if err != nil {
						t.Fatal(err)
					}
					return ds
				}
				for i := range quota - 1 {
					if ds := decide(unit); !ds[0].Allowed {
						t.Fatalf("unit %d: %+v", i+1, ds[0])
					}
				}
				// One unit left: a request of three is denied by its
				// second, its first item's unit not consumed, and its
				// third reports what it alone would get: admitted.
				if ds := decide(unit, unit, unit); ratelimit.Allowed(ds) || !ds[0].Allowed || ds[1].Reason != ratelimit.ReasonLimited || !ds[2].Allowed {
					t.Fatalf("three units with one left: %+v, want the second limited, the others allowed alone", ds)
				}
				if ds := decide(unit); !ds[0].Allowed {
					t.Fatalf("the last unit, after a denied request of two: %+v", ds[0])
				}
				if ds := decide(unit); ds[0].Allowed {
					t.Fatalf("a unit beyond the capacity: %+v", ds[0])
				}
			})
			t.Run(fmt.Sprintf("replicas/%s/%s", c, a), func(t *testing.T) {
				const n = 4
				clock := NewClock(Start)
				stores := newReplicas(t, n, clock.Now)
				admitted := 0
				for i := range 10 * quota {
					ds, err := stores[i%n].Decide(ctx, nil, []ratelimit.Item{{Key: "replicas", Rule: r, Cost: 1}})
					if err != nil {
						t.Fatal(err)
					}
					if ds[0].Allowed {
						admitted++
					}
				}
				switch c {
				case ratelimit.Approximate:
					if bound := quota + (n-1)*quota/n; admitted > bound {
						t.Errorf("%d replicas admitted %d, above the bound %d", n, admitted, bound)
					}
				default:
					if admitted != quota {
						t.Errorf("%d replicas admitted %d, want exactly %d", n, admitted, quota)
					}
				}
			})
		}
	}
}
