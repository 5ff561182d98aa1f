package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// A manyStep decides one request of items at epoch0+at with DecideMany on
// the states of a map-backed store, and expects want. Capacity and Rule of
// want are filled in from the items' rules.
type manyStep struct {
	at    time.Duration
	items []Item
	want  []Decision
}

// mapStore keeps states by key, as a Store would, and decides requests
// with DecideMany, keeping the working states only if every item is
// admitted. It fails when DecideMany changes a kept state.
type mapStore map[string]*State

func (m mapStore) decide(dst []Decision, items []Item, now time.Time) ([]Decision, bool, error) {
	kept := make([]*State, len(items))
	before := map[string]State{}
	for i, it := range items {
		if kept[i] = m[it.Key]; kept[i] != nil {
			before[it.Key] = kept[i].clone()
		}
	}
	work := make([]State, len(items))
	dst, ok := DecideMany(dst, items, now, kept, work)
	for k, st := range before {
		if !statesEqual(st, *m[k]) {
			return dst, ok, fmt.Errorf("DecideMany changed the kept state of %q from %+v to %+v", k, st, *m[k])
		}
	}
	if ok {
		for i, it := range items {
			m[it.Key] = &work[i]
		}
	}
	return dst, ok, nil
}

func TestDecideMany(t *testing.T) {
	r := &Rule{Name: "w", Algorithm: FixedWindow, Quota: 3, Period: time.Minute}
	item := func(key string, cost int64) Item { return Item{Key: key, Rule: r, Cost: cost} }
	lg := &Rule{Name: "l", Algorithm: SlidingLog, Quota: 3, Period: time.Minute}
	logItem := func(cost int64) Item { return Item{Key: "log", Rule: lg, Cost: cost} }
	m := time.Minute
	steps := []manyStep{
		// A sliding log's items at one instant add to its newest entry in
		// place: a denied request must leave the kept log as it was.
		{items: []Item{logItem(1)}, want: []Decision{ok(2, m)}},
		{items: []Item{logItem(1), logItem(1), item("x", 4)}, want: []Decision{ok(2, m), ok(2, m), never(3, 0)}},
		{items: []Item{logItem(1), logItem(1)}, want: []Decision{ok(1, m), ok(0, m)}},
		{items: []Item{item("a", 1), item("b", 1)}, want: []Decision{ok(2, m), ok(2, m)}},
		// The same key twice: the second item sees what the first consumed.
		{items: []Item{item("a", 1), item("a", 1)}, want: []Decision{ok(1, m), ok(0, m)}},
		// a is denied: b, before and after it, reports what it alone would
		// get, at cost 0 since nothing was taken.
		{items: []Item{item("b", 1), item("a", 1), item("b", 1)}, want: []Decision{ok(2, m), limited(0, m, m), ok(2, m)}},
		// The denied item's decision counts what its key's earlier items
		// consumed; the others report from the state before the request.
		{items: []Item{item("b", 2), item("b", 1)}, want: []Decision{ok(2, m), limited(0, m, m)}},
		// An item that alone would be denied reports its own denial, and
		// items after the first denial are not decided.
		{items: []Item{item("c", 4), item("a", 1), item("b", 1)}, want: []Decision{never(3, 0), limited(0, m, m), ok(2, m)}},
		// A check (cost 0) counts as admitted and consumes nothing.
		{items: []Item{item("b", 0), item("b", 1)}, want: []Decision{ok(2, m), ok(1, m)}},
		// Only the admitted requests above consumed: a is full, b holds two
		// units, c none.
		{items: []Item{item("a", 0), item("b", 1), item("c", 3)}, want: []Decision{ok(0, m), ok(0, m), ok(0, m)}},
		{at: m, items: []Item{item("a", 3), item("b", 3), item("c", 3)}, want: []Decision{ok(0, m), ok(0, m), ok(0, m)}},
		// A new key reports from the zero State, fresh.
		{at: m, items: []Item{item("a", 1), item("d", 1)}, want: []Decision{limited(0, m, m), ok(3, 0)}},
	}
	store := mapStore{}
	sentinel := Decision{Rule: "before"}
	for i, st := range steps {
		got, admitted, err := store.decide([]Decision{sentinel}, st.items, epoch0.Add(st.at))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if len(got) != 1+len(st.items) || got[0] != sentinel {
			t.Fatalf("step %d: got %d decisions after %+v, want %d after the sentinel", i, len(got), got[0], len(st.items))
		}
		for j, want := range st.want {
			want.Capacity, want.Rule = st.items[j].Rule.Capacity(), st.items[j].Rule.Name
			if got[1+j] != want {
				t.Errorf("step %d item %d (%s, cost %d):\n got %+v\nwant %+v", i, j, st.items[j].Key, st.items[j].Cost, got[1+j], want)
			}
		}
		if admitted != Allowed(got[1:]) {
			t.Errorf("step %d: DecideMany reports admitted %v for %+v", i, admitted, got[1:])
		}
	}
}
