package ratelimit_test

import (
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// TestStepTables decides storetest's step tables, which every Store runs
// through storetest.Run, with Rule.Decide on one State per table, and checks
// that Peek and denials leave the State as it was.
func TestStepTables(t *testing.T) {
	for _, tb := range storetest.StepTables() {
		t.Run(tb.Name, func(t *testing.T) {
			r := &tb.Rule
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			s := ratelimit.State{Algorithm: r.Algorithm}
			for i, st := range tb.Steps {
				if st.Rule != nil {
					r = st.Rule
				}
				now := storetest.Start.Add(st.At)
				if !st.Abs.IsZero() {
					now = st.Abs
				}
				want := st.Want
				want.Capacity, want.Rule = r.Capacity(), r.Name
				before := ratelimit.CloneState(s)
				r.Peek(&s, now, st.Cost)
				if !ratelimit.StatesEqual(before, s) {
					t.Fatalf("step %d: Peek changed the state from %+v to %+v", i, before, s)
				}
				got := r.Decide(&s, now, st.Cost)
				if got != want {
					t.Fatalf("step %d (rule %s, at %v, cost %d):\n got %+v\nwant %+v", i, r.Name, now.Sub(storetest.Start), st.Cost, got, want)
				}
				if !got.Allowed && !ratelimit.StatesEqual(before, s) {
					t.Fatalf("step %d: denial changed the state from %+v to %+v", i, before, s)
				}
			}
		})
	}
}
