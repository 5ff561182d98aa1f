package lease

import (
	"slices"
	"testing"
	"time"
)

// TestTable steps a lease table through fixed instants: leases count
// until their deadlines, a renewal applies only to the epoch it was sent
// for, a refusal drops the lease, and a stale instant never brings back a
// lease that has ended.
func TestTable(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var tb table
	type check struct {
		at      time.Duration
		valid   int
		horizon time.Duration // from t0; -1: none
		counted time.Duration // the instant valid counted at, from t0
	}
	steps := []struct {
		name string
		do   func()
		want []check
	}{
		{"empty", func() {}, []check{{0, 0, -1, 0}}},
		{"three granted until 2s, one until 3s", func() {
			tb.add([]Grant{{0, 1}, {1, 1}, {2, 1}}, at(2*time.Second))
			tb.add([]Grant{{5, 7}}, at(3*time.Second))
		}, []check{
			{time.Second, 4, 2 * time.Second, time.Second},
			{2*time.Second - 1, 4, 2 * time.Second, 2*time.Second - 1},
			// A deadline is the first instant a lease is not used.
			{2 * time.Second, 1, 3 * time.Second, 2 * time.Second},
			// An earlier instant counts as the latest seen.
			{time.Second, 1, 3 * time.Second, 2 * time.Second},
		}},
		{"renewal: 0 renewed, 1 refused, 2 under an old epoch, 5 not sent", func() {
			r, l := tb.renewed([]Grant{{0, 1}, {1, 1}, {2, 0}}, []bool{true, false, true}, at(4*time.Second))
			if r != 1 || l != 1 {
				t.Errorf("renewed %d lost %d, want 1 and 1", r, l)
			}
		}, []check{
			{2 * time.Second, 2, 3 * time.Second, 2 * time.Second},
			{3 * time.Second, 1, 4 * time.Second, 3 * time.Second},
			{4 * time.Second, 0, -1, 4 * time.Second},
		}},
	}
	for _, s := range steps {
		s.do()
		for _, c := range s.want {
			counted, n, horizon := tb.valid(at(c.at))
			wantH := time.Time{}
			if c.horizon >= 0 {
				wantH = at(c.horizon)
			}
			if n != c.valid || !horizon.Equal(wantH) || !counted.Equal(at(c.counted)) {
				t.Errorf("%s: at %v: %d valid, horizon %v, counted at %v; want %d, %v, %v",
					s.name, c.at, n, horizon.Sub(t0), counted.Sub(t0), c.valid, wantH.Sub(t0), c.counted)
			}
		}
	}
	// Leases held, valid or not, in the order they run out.
	if got, want := tb.grants(), []Grant{{2, 1}, {5, 7}, {0, 1}}; !slices.Equal(got, want) {
		t.Errorf("grants %v, want %v", got, want)
	}
	if !tb.holds(2) || tb.holds(1) {
		t.Errorf("holds(2) %v holds(1) %v, want true and false", tb.holds(2), tb.holds(1))
	}
	// LeasesAt's view: valid at the instant given, by partition.
	if got := tb.at(at(2500 * time.Millisecond)); len(got) != 2 || got[0].Partition != 0 || got[1].Partition != 5 ||
		!got[0].Deadline.Equal(at(4*time.Second)) || got[1].Epoch != 7 {
		t.Errorf("at 2.5s: %+v, want partitions 0 (until 4s) and 5 (epoch 7)", got)
	}
	tb.drop([]Grant{{5, 7}})
	if got, want := tb.clear(), []Grant{{2, 1}, {0, 1}}; !slices.Equal(got, want) {
		t.Errorf("clear returned %v, want %v", got, want)
	}
	if _, n, _ := tb.valid(at(0)); n != 0 || len(tb.grants()) != 0 {
		t.Errorf("after clear: %d valid, grants %v", n, tb.grants())
	}
}
