package drain

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/priority"
)

type fakeMsg struct {
	Message
	key string
}

// TestSchedulerStarvation: with two priorities backlogged, the low one
// is passed over exactly StarvationLimit times in a row, then released.
func TestSchedulerStarvation(t *testing.T) {
	const limit = 4
	s := newScheduler([]priority.Priority{priority.Low, priority.High}, limit)
	for i := range 100 {
		s.push(0, "", taken{&hold{msg: fakeMsg{key: fmt.Sprint("low", i)}, input: 0}})
		s.push(1, "", taken{&hold{msg: fakeMsg{key: fmt.Sprint("high", i)}, input: 1}})
	}
	var got []int
	for range 50 {
		tk, ok := s.pop()
		if !ok {
			t.Fatal("empty too soon")
		}
		got = append(got, tk.input)
	}
	run := 0
	for i, in := range got {
		if in == 1 {
			run++
			if run > limit {
				t.Fatalf("release %d: low passed over %d times in a row (limit %d): %v", i, run, limit, got)
			}
			continue
		}
		if run != limit {
			t.Fatalf("release %d: low released after %d highs, want %d: %v", i, run, limit, got)
		}
		run = 0
	}
}

// TestSchedulerThreeLevels: the anti-starvation bound holds for every
// waiting level, the highest due level first.
func TestSchedulerThreeLevels(t *testing.T) {
	const limit = 3
	s := newScheduler([]priority.Priority{priority.Sheddable, priority.Normal, priority.Critical}, limit)
	for i := range 200 {
		for in := range 3 {
			s.push(in, "", taken{&hold{msg: fakeMsg{key: fmt.Sprint(in, i)}, input: in}})
		}
	}
	since := [3]int{}
	for i := range 300 {
		tk, _ := s.pop()
		for in := range 3 {
			if in == tk.input {
				since[in] = 0
			} else if in < tk.input {
				since[in]++
				if since[in] > limit+2 {
					t.Fatalf("release %d: input %d waited %d releases below a higher one", i, in, since[in])
				}
			}
		}
	}
}

// TestSchedulerTenants: within a priority, tenants take turns whatever
// their backlogs.
func TestSchedulerTenants(t *testing.T) {
	s := newScheduler([]priority.Priority{priority.Normal}, 16)
	for i := range 90 {
		s.push(0, "big", taken{&hold{msg: fakeMsg{key: fmt.Sprint("big", i)}}})
	}
	for i := range 10 {
		s.push(0, "small", taken{&hold{msg: fakeMsg{key: fmt.Sprint("small", i)}}})
		s.push(0, "tiny", taken{&hold{msg: fakeMsg{key: fmt.Sprint("tiny", i)}}})
	}
	counts := map[string]int{}
	for range 30 {
		tk, _ := s.pop()
		k := tk.msg.(fakeMsg).key
		counts[strings.TrimRight(k, "0123456789")]++
	}
	if counts["big"] != 10 || counts["small"] != 10 || counts["tiny"] != 10 {
		t.Fatalf("first 30 releases by tenant: %v, want 10 each", counts)
	}
	all := s.drainAll()
	if len(all) != 110-30 {
		t.Fatalf("drainAll returned %d, want %d", len(all), 110-30)
	}
	for _, tk := range all {
		if k := tk.msg.(fakeMsg).key; k[:3] != "big" {
			t.Fatalf("after 30 turns a small tenant's message %q is still waiting", k)
		}
	}
	if s.len() != 0 {
		t.Fatalf("len %d after drainAll", s.len())
	}
}

// TestFifoBounded: a queue that never empties keeps its storage to what
// it holds.
func TestFifoBounded(t *testing.T) {
	var q fifo[taken]
	for i := range 100000 {
		q.push(taken{&hold{input: i}})
		if q.len() > 10 {
			if got := q.pop(); got.input != i-10 {
				t.Fatalf("popped %d, want %d", got.input, i-10)
			}
		}
	}
	if cap(q.items) > 64 {
		t.Fatalf("a queue of %d items has capacity %d", q.len(), cap(q.items))
	}
}
