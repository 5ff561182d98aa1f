// Package storetest is a conformance suite for implementations of
// ratelimit.Store, in the spirit of testing/fstest.TestFS: a Store passes
// when Run passes.
//
// Run decides through the Store interface only, on a fake clock that each
// subtest moves by hand, so a Store under test must take its time from the
// now function it is given (a Redis store passes those instants to its
// scripts instead of reading the server's clock), to the nanosecond: the
// tables probe instants 1ns before RetryAfter has passed. It checks:
//
//   - the step tables of StepTables, which package ratelimit's own tests
//     decide too: fixed instants for every algorithm, exact Allowed,
//     Reason, Capacity, Remaining, ResetAfter and RetryAfter at each step,
//     instants that go backwards, limit changes mid-window and calendar
//     windows across a month boundary, DST changes and half-hour zones;
//   - requests of several items, decided all or nothing, including one key
//     named twice, and what each item of a denied request reports;
//   - refunds (never above capacity), cost 0, cost above capacity, limit 0,
//     tiny rates and huge costs;
//   - that an older instant creates no capacity;
//   - concurrency: many goroutines on one key admit exactly the capacity;
//   - random sequences: the cost admitted over any window stays within what
//     the algorithm promises, RetryAfter is exact, and under saturation at
//     least 99% of the promise is admitted.
//
// Every subtest creates its own Store and uses keys that start with its
// own name. The whole suite makes some 23,000 Decide calls, at most 1,600
// in one subtest.
package storetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// NewStore returns a new, empty Store whose clock is now. The Store must be
// closed by t.Cleanup if needed.
type NewStore func(t *testing.T, now func() time.Time) ratelimit.Store

// Run runs the conformance suite against the Stores that newStore returns,
// one per subtest.
func Run(t *testing.T, newStore NewStore) {
	t.Run("Steps", func(t *testing.T) { testSteps(t, newStore) })
	t.Run("EdgeRules", func(t *testing.T) { testEdgeRules(t, newStore) })
	t.Run("AllOrNothing", func(t *testing.T) { testAllOrNothing(t, newStore) })
	t.Run("RollbackSlidingLog", func(t *testing.T) { testRollbackSlidingLog(t, newStore) })
	t.Run("DeniedReports", func(t *testing.T) { testDeniedReports(t, newStore) })
	t.Run("SameKeyTwice", func(t *testing.T) { testSameKeyTwice(t, newStore) })
	t.Run("Refund", func(t *testing.T) { testRefund(t, newStore) })
	t.Run("CostZero", func(t *testing.T) { testCostZero(t, newStore) })
	t.Run("ExceedsCapacity", func(t *testing.T) { testExceedsCapacity(t, newStore) })
	t.Run("KeysAreIndependent", func(t *testing.T) { testKeysAreIndependent(t, newStore) })
	t.Run("AppendsToDst", func(t *testing.T) { testAppendsToDst(t, newStore) })
	t.Run("InvalidRule", func(t *testing.T) { testInvalidRule(t, newStore) })
	t.Run("TimeBackwards", func(t *testing.T) { testTimeBackwards(t, newStore) })
	t.Run("TimeBackwardsBounds", func(t *testing.T) { testTimeBackwardsBounds(t, newStore) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newStore) })
	t.Run("ConcurrentAllOrNothing", func(t *testing.T) { testConcurrentAllOrNothing(t, newStore) })
	t.Run("Bounds", func(t *testing.T) { testBounds(t, newStore) })
	t.Run("Saturation", func(t *testing.T) { testSaturation(t, newStore) })
}

// env is one subtest's Store and clock.
type env struct {
	t     *testing.T
	clock *Clock
	store ratelimit.Store
}

func newEnv(t *testing.T, newStore NewStore) *env {
	t.Helper()
	c := NewClock(Start)
	s := newStore(t, c.Now)
	if s == nil {
		t.Fatal("NewStore returned nil")
	}
	return &env{t: t, clock: c, store: s}
}

// key returns a key unique to the subtest.
func (e *env) key(name string) string {
	return e.t.Name() + "/" + name
}

// at sets the clock to Start+d.
func (e *env) at(d time.Duration) *env {
	e.clock.Set(Start.Add(d))
	return e
}

// decide decides items and fails the test on an error or a wrong number of
// decisions.
func (e *env) decide(items ...ratelimit.Item) []ratelimit.Decision {
	e.t.Helper()
	ds, err := e.store.Decide(e.t.Context(), nil, items)
	if err != nil {
		e.t.Fatalf("Decide(%s) at %v: %v", fmtItems(items), e.clock.Now().Sub(Start), err)
	}
	if len(ds) != len(items) {
		e.t.Fatalf("Decide(%s) returned %d decisions, want %d", fmtItems(items), len(ds), len(items))
	}
	return ds
}

// one decides a single item.
func (e *env) one(key string, r *ratelimit.Rule, cost int64) ratelimit.Decision {
	e.t.Helper()
	return e.decide(ratelimit.Item{Key: key, Rule: r, Cost: cost})[0]
}

// remaining returns what a cost-0 check reports as remaining.
func (e *env) remaining(key string, r *ratelimit.Rule) int64 {
	e.t.Helper()
	return e.one(key, r, 0).Remaining
}

func fmtItems(items []ratelimit.Item) string {
	var b strings.Builder
	for i, it := range items {
		name := "<nil>"
		if it.Rule != nil {
			name = it.Rule.Name
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%s:%d", it.Key, name, it.Cost)
	}
	return "[" + b.String() + "]"
}
