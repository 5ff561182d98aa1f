package storetest

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// ruleOf returns a rule of algorithm alg admitting limit per period; its
// capacity is limit.
func ruleOf(alg ratelimit.Algorithm, limit int64, period time.Duration) *ratelimit.Rule {
	return &ratelimit.Rule{Name: alg.String(), Algorithm: alg, Quota: limit, Period: period}
}

// forEachAlgorithm runs f in one subtest per algorithm.
func forEachAlgorithm(t *testing.T, f func(t *testing.T, alg ratelimit.Algorithm)) {
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) { f(t, alg) })
	}
}

// testAllOrNothing decides requests of several keys and rules: when one
// item is denied, nothing is consumed on the others.
func testAllOrNothing(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	ka, kb, kc := e.key("a"), e.key("b"), e.key("c")
	ra := ruleOf(ratelimit.GCRA, 5, time.Hour)
	rb := ruleOf(ratelimit.FixedWindow, 2, time.Hour)
	rc := ruleOf(ratelimit.SlidingLog, 3, time.Hour)
	item := func(k string, r *ratelimit.Rule, cost int64) ratelimit.Item {
		return ratelimit.Item{Key: k, Rule: r, Cost: cost}
	}
	if d := e.one(kb, rb, 2); !d.Allowed {
		t.Fatalf("b: cost 2 of 2: %+v", d)
	}
	// b denies: a and c must not be consumed.
	ds := e.decide(item(ka, ra, 1), item(kb, rb, 1), item(kc, rc, 1))
	if ratelimit.Allowed(ds) || !ds[0].Allowed || ds[1].Allowed || !ds[2].Allowed {
		t.Fatalf("[a:1 b:1 c:1] with b exhausted: got %+v, want a and c allowed alone, b denied", ds)
	}
	if ds[1].Reason != ratelimit.ReasonLimited || ds[1].RetryAfter <= 0 {
		t.Errorf("b denied with %+v, want ReasonLimited and a RetryAfter", ds[1])
	}
	// An item above capacity denies the request too.
	ds = e.decide(item(ka, ra, 1), item(kc, rc, 4))
	if ratelimit.Allowed(ds) || ds[1].Reason != ratelimit.ReasonExceedsCapacity {
		t.Fatalf("[a:1 c:4]: got %+v, want c exceeding its capacity", ds)
	}
	if got := e.remaining(ka, ra); got != 5 {
		t.Errorf("a: %d remaining after denied requests, want 5", got)
	}
	if got := e.remaining(kc, rc); got != 3 {
		t.Errorf("c: %d remaining after denied requests, want 3", got)
	}
	// Allowed together: all consumed.
	ds = e.decide(item(ka, ra, 2), item(kc, rc, 1))
	if !ratelimit.Allowed(ds) {
		t.Fatalf("[a:2 c:1]: %+v", ds)
	}
	if ds[0].Remaining != 3 || ds[1].Remaining != 2 {
		t.Errorf("[a:2 c:1]: remaining %d and %d, want 3 and 2", ds[0].Remaining, ds[1].Remaining)
	}
	if a, c := e.remaining(ka, ra), e.remaining(kc, rc); a != 3 || c != 2 {
		t.Errorf("after [a:2 c:1]: remaining %d and %d, want 3 and 2", a, c)
	}
	// Refunds in a denied request are not applied either.
	ds = e.decide(item(ka, ra, -1), item(kc, rc, -1), item(kb, rb, 1))
	if ratelimit.Allowed(ds) {
		t.Fatalf("[a:-1 c:-1 b:1] with b exhausted: allowed: %+v", ds)
	}
	if a, c := e.remaining(ka, ra), e.remaining(kc, rc); a != 3 || c != 2 {
		t.Errorf("after the denied [a:-1 c:-1 b:1]: remaining %d and %d, want 3 and 2", a, c)
	}
	// The denial is reported whichever position the denying item has.
	ds = e.decide(item(kb, rb, 1), item(ka, ra, 3))
	if ratelimit.Allowed(ds) || ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("[b:1 a:3]: %+v, want b denied and a allowed alone", ds)
	}
	if d := e.one(ka, ra, 3); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("a:3 after the denied [b:1 a:3]: %+v", d)
	}
}

// testDeniedReports decides requests denied by an item that was denied
// alone just before (which a store may remember), beside items that fail
// in other ways or would fit: each item reports what ratelimit.DecideMany
// says, a cost beyond capacity ReasonExceedsCapacity and Never, a limited
// one ReasonLimited and its own RetryAfter, one that would fit a check at
// cost 0, and nothing is consumed; and a denial after a consumption that
// followed the same denial reports the key as it is now.
func testDeniedReports(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	e.at(time.Second)
	type key struct {
		name string
		rule *ratelimit.Rule
		st   ratelimit.State // as the store should hold it
	}
	keys := []*key{
		{name: e.key("denied"), rule: ruleOf(ratelimit.FixedWindow, 2, time.Minute)},
		{name: e.key("beyond"), rule: ruleOf(ratelimit.FixedWindow, 1, time.Second)},
		{name: e.key("limited"), rule: ruleOf(ratelimit.GCRA, 2, time.Minute)},
		{name: e.key("fits"), rule: ruleOf(ratelimit.SlidingLog, 3, time.Minute)},
	}
	denied, beyond, limited, fits := keys[0], keys[1], keys[2], keys[3]
	one := func(k *key, cost int64) ratelimit.Decision {
		t.Helper()
		got := e.one(k.name, k.rule, cost)
		if want := k.rule.Decide(&k.st, e.clock.Now(), cost); got != want {
			t.Fatalf("%s:%d: got %+v, want %+v", k.name, cost, got, want)
		}
		return got
	}
	one(denied, 1)
	if d := one(denied, 2); d.Allowed || d.Reason != ratelimit.ReasonLimited {
		t.Fatalf("denied:2 after 1 of 2: %+v, want ReasonLimited", d)
	}
	one(limited, 2)
	one(fits, 1)
	for _, order := range [][]*key{
		{beyond, limited, fits, denied},
		{denied, beyond, limited, fits},
		{fits, denied, beyond},
		{limited, denied},
	} {
		e.clock.Advance(time.Millisecond)
		costs := map[*key]int64{denied: 2, beyond: 2, limited: 1, fits: 1}
		items := make([]ratelimit.Item, len(order))
		kept := make([]*ratelimit.State, len(order))
		for i, k := range order {
			items[i] = ratelimit.Item{Key: k.name, Rule: k.rule, Cost: costs[k]}
			kept[i] = &k.st
		}
		want, _ := ratelimit.DecideMany(nil, items, e.clock.Now(), kept, make([]ratelimit.State, len(items)))
		got := e.decide(items...)
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s: item %d: got %+v, want %+v", fmtItems(items), i, got[i], want[i])
			}
		}
	}
	for _, k := range keys[1:] {
		one(k, 0) // nothing consumed
	}
	// A consumption after a denial (which a store may remember) changes
	// what the next denial of that cost reports.
	for _, k := range []*key{
		{name: e.key("stale-fixed"), rule: ruleOf(ratelimit.FixedWindow, 3, time.Hour)},
		{name: e.key("stale-gcra"), rule: ruleOf(ratelimit.GCRA, 3, time.Hour)},
	} {
		one(k, 1)
		one(k, 3)
		one(k, 1)
		one(k, 3)
	}
	// So does one after that denial ran out: the key drained meanwhile,
	// and the next denial reports from what it holds now.
	for _, k := range []*key{
		{name: e.key("expired-fixed"), rule: ruleOf(ratelimit.FixedWindow, 5, time.Hour)},
		{name: e.key("expired-gcra"), rule: ruleOf(ratelimit.GCRA, 5, time.Hour)},
	} {
		one(k, 3)
		one(k, 1)
		one(k, 3)
		e.clock.Advance(53 * time.Minute)
		one(k, 3)
		one(k, 3)
	}
}

// testSameKeyTwice names one key twice in a request: the items are decided
// in order against the same state, and all or nothing.
func testSameKeyTwice(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := ruleOf(alg, 5, time.Hour)
		two := func(c1, c2 int64) []ratelimit.Decision {
			return e.decide(ratelimit.Item{Key: k, Rule: r, Cost: c1}, ratelimit.Item{Key: k, Rule: r, Cost: c2})
		}
		ds := two(3, 3)
		if ratelimit.Allowed(ds) || !ds[0].Allowed || ds[1].Allowed {
			t.Fatalf("[k:3 k:3] of 5: %+v, want the first allowed alone and the second denied", ds)
		}
		if got := e.remaining(k, r); got != 5 {
			t.Fatalf("%d remaining after a denied [k:3 k:3], want 5", got)
		}
		ds = two(2, 3)
		if !ratelimit.Allowed(ds) || ds[0].Remaining != 3 || ds[1].Remaining != 0 {
			t.Fatalf("[k:2 k:3] of 5: %+v, want both allowed, remaining 3 then 0", ds)
		}
		if d := e.one(k, r, 1); d.Allowed {
			t.Fatalf("cost 1 after [k:2 k:3] of 5: %+v", d)
		}
	})
}

// testRefund refunds with negative costs: capacity comes back, never above
// the rule's capacity.
func testRefund(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := ruleOf(alg, 5, time.Hour)
		steps := []struct {
			cost    int64
			allowed bool
			rem     int64
		}{
			{5, true, 0},
			{-2, true, 2},
			{3, false, 2},
			{-100, true, 5},
			{math.MinInt64, true, 5},
			{5, true, 0}, // never above capacity:
			{1, false, 0},
		}
		for i, st := range steps {
			d := e.one(k, r, st.cost)
			if d.Allowed != st.allowed || d.Remaining != st.rem {
				t.Fatalf("step %d: cost %d: got %+v, want allowed %v, remaining %d", i, st.cost, d, st.allowed, st.rem)
			}
		}
	})
}

// testCostZero checks without consuming.
func testCostZero(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := ruleOf(alg, 5, time.Hour)
		want := ratelimit.Decision{Allowed: true, Capacity: 5, Remaining: 5, Rule: r.Name}
		if d := e.one(k, r, 0); d != want {
			t.Fatalf("cost 0 on a new key: got %+v, want %+v", d, want)
		}
		e.one(k, r, 3)
		for range 10 {
			if d := e.one(k, r, 0); !d.Allowed || d.Remaining != 2 || d.RetryAfter != 0 {
				t.Fatalf("cost 0 with 2 remaining: %+v", d)
			}
		}
		e.one(k, r, 2)
		if d := e.one(k, r, 0); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("cost 0 with nothing remaining: %+v", d)
		}
	})
}

// testExceedsCapacity asks for more than the capacity: denied with its own
// reason and RetryAfter Never, consuming nothing.
func testExceedsCapacity(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := ruleOf(alg, 5, time.Hour)
		for _, cost := range []int64{6, ratelimit.MaxQuota + 1, math.MaxInt64} {
			d := e.one(k, r, cost)
			want := ratelimit.Decision{Reason: ratelimit.ReasonExceedsCapacity, Capacity: 5, Remaining: 5, RetryAfter: ratelimit.Never, Rule: r.Name}
			if d != want {
				t.Fatalf("cost %d: got %+v, want %+v", cost, d, want)
			}
		}
		e.one(k, r, 2)
		if d := e.one(k, r, 6); d.Reason != ratelimit.ReasonExceedsCapacity || d.Remaining != 3 || d.RetryAfter != ratelimit.Never {
			t.Fatalf("cost 6 with 3 remaining: %+v", d)
		}
		if d := e.one(k, r, 3); !d.Allowed {
			t.Fatalf("cost 3 with 3 remaining: %+v", d)
		}
	})
}

// testKeysAreIndependent uses two keys with one rule.
func testKeysAreIndependent(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		r := ruleOf(alg, 3, time.Hour)
		if d := e.one(e.key("a"), r, 3); !d.Allowed {
			t.Fatalf("a: %+v", d)
		}
		if d := e.one(e.key("b"), r, 3); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("b after a was exhausted: %+v", d)
		}
		if d := e.one(e.key("a"), r, 1); d.Allowed {
			t.Fatalf("a exhausted: %+v", d)
		}
	})
}

// testAppendsToDst checks that Decide appends to dst.
func testAppendsToDst(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	r := ruleOf(ratelimit.GCRA, 3, time.Hour)
	sentinel := ratelimit.Decision{Rule: "sentinel", Remaining: -7}
	dst := append(make([]ratelimit.Decision, 0, 4), sentinel)
	items := []ratelimit.Item{{Key: e.key("a"), Rule: r, Cost: 1}, {Key: e.key("b"), Rule: r, Cost: 2}}
	ds, err := e.store.Decide(t.Context(), dst, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 3 || ds[0] != sentinel || ds[1].Remaining != 2 || ds[2].Remaining != 1 {
		t.Fatalf("Decide(dst with 1 element, 2 items) = %+v, want the sentinel then 2 decisions", ds)
	}
	ds, err = e.store.Decide(t.Context(), nil, nil)
	if err != nil || len(ds) != 0 {
		t.Fatalf("Decide(nil, no items) = %v, %v; want no decisions and no error", ds, err)
	}
}

// testInvalidRule checks that a rule that cannot be decided (a missing
// rule, a negative limit or burst, no period) is an error wrapping
// ratelimit.ErrInvalidRule, and that the other items are not consumed. A
// Store need not run all of Rule.Validate on every request.
func testInvalidRule(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	good := ruleOf(ratelimit.GCRA, 3, time.Hour)
	bad := []*ratelimit.Rule{
		nil,
		{Name: "negative_limit", Quota: -1, Period: time.Second},
		{Name: "negative_burst", Quota: 1, Period: time.Second, Burst: -1},
		{Name: "no_period", Quota: 1},
		{Name: "no_quota", Period: time.Second}, // a forgotten Quota, not a Block
		{Name: "negative_period", Algorithm: ratelimit.SlidingWindow, Quota: 1, Period: -time.Second},
	}
	k := e.key("k")
	for _, r := range bad {
		for _, items := range [][]ratelimit.Item{
			{{Key: e.key("bad"), Rule: r, Cost: 1}},
			{{Key: k, Rule: good, Cost: 1}, {Key: e.key("bad"), Rule: r, Cost: 1}},
		} {
			_, err := e.store.Decide(t.Context(), nil, items)
			if !errors.Is(err, ratelimit.ErrInvalidRule) {
				t.Errorf("Decide(%s): error %v, want one wrapping ratelimit.ErrInvalidRule", fmtItems(items), err)
			}
		}
	}
	if got := e.remaining(k, good); got != 3 {
		t.Errorf("%d remaining after requests with an invalid rule, want 3", got)
	}
}

// testTimeBackwards moves the clock back: an older instant creates no
// capacity.
func testTimeBackwards(t *testing.T, newStore NewStore) {
	forEachAlgorithm(t, func(t *testing.T, alg ratelimit.Algorithm) {
		e := newEnv(t, newStore)
		k := e.key("k")
		r := ruleOf(alg, 10, time.Second)
		if d := e.at(time.Second).one(k, r, 10); !d.Allowed {
			t.Fatalf("cost 10 at 1s: %+v", d)
		}
		for _, back := range []time.Duration{500 * ms, 0, -time.Hour} {
			if d := e.at(back).one(k, r, 1); d.Allowed {
				t.Fatalf("cost 1 at %v, after 10 of 10 at 1s: %+v", back, d)
			}
			if d := e.at(back).one(k, r, 0); d.Remaining != 0 {
				t.Fatalf("cost 0 at %v, after 10 of 10 at 1s: %+v", back, d)
			}
		}
		if d := e.at(3*time.Second).one(k, r, 10); !d.Allowed {
			t.Fatalf("cost 10 at 3s: %+v", d)
		}
	})
}

// testRollbackSlidingLog denies requests whose sliding log item changed an
// entry of the log in place (a cost at the instant of the newest entry, a
// refund): the rollback must restore the log exactly, not a copy that
// shares its entries.
func testRollbackSlidingLog(t *testing.T, newStore NewStore) {
	e := newEnv(t, newStore)
	kb := e.key("b")
	rb := ruleOf(ratelimit.FixedWindow, 1, time.Hour)
	rl := ruleOf(ratelimit.SlidingLog, 3, time.Second)
	if d := e.one(kb, rb, 1); !d.Allowed {
		t.Fatalf("b: %+v", d)
	}
	denied := func(k string, cost int64) {
		t.Helper()
		ds := e.decide(ratelimit.Item{Key: k, Rule: rl, Cost: cost}, ratelimit.Item{Key: kb, Rule: rb, Cost: 1})
		if ratelimit.Allowed(ds) || !ds[0].Allowed {
			t.Fatalf("[%s:%d b:1] with b exhausted: %+v", k, cost, ds)
		}
	}
	expect := func(k string, cost int64, allowed bool, rem int64) {
		t.Helper()
		if d := e.one(k, rl, cost); d.Allowed != allowed || d.Remaining != rem {
			t.Fatalf("%s:%d at %v: got %+v, want allowed %v, remaining %d", k, cost, e.clock.Now().Sub(Start), d, allowed, rem)
		}
	}
	same, refund := e.key("same_instant"), e.key("refund")
	e.at(0)
	expect(same, 1, true, 2)
	denied(same, 1)
	expect(refund, 2, true, 1)
	denied(refund, -1)
	e.at(500 * ms)
	expect(same, 2, true, 0)
	e.at(time.Second) // the entries at 0 leave
	expect(same, 1, true, 0)
	expect(same, 1, false, 0)
	expect(refund, 3, true, 0)
}
