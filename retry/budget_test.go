package retry_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/retry"
)

// A step is one call at a fixed instant, at after the case's start:
// requests > 0 counts that many requests, otherwise a retry is asked for
// and must be answered want.
type step struct {
	at       time.Duration
	requests int
	want     bool
}

func TestBudget(t *testing.T) {
	start := time.Unix(1_000_000, 0) // on a slot boundary for every window below
	tests := []struct {
		name   string
		ratio  float64
		min    int
		window time.Duration
		start  time.Time // zero means start
		steps  []step
	}{
		{
			name: "min alone", ratio: 0.1, min: 2, window: 10 * time.Second,
			steps: []step{{want: true}, {want: true}, {want: false}},
		},
		{
			name: "negative min means none", ratio: 0.5, min: -1, window: 10 * time.Second,
			steps: []step{
				{want: false},
				{requests: 2},
				{want: true},
				{want: false},
			},
		},
		{
			name: "ratio of the requests", ratio: 0.1, min: -1, window: 10 * time.Second,
			steps: []step{
				{requests: 30},
				{want: true}, {want: true}, {want: true},
				{want: false},
			},
		},
		{
			name: "ratio plus min", ratio: 0.25, min: 1, window: 10 * time.Second,
			steps: []step{
				{requests: 8},
				{want: true}, {want: true}, {want: true},
				{want: false},
			},
		},
		{
			name: "defaults: 0.1, 10 retries, 10 s",
			steps: []step{
				{want: true}, {want: true}, {want: true}, {want: true}, {want: true},
				{want: true}, {want: true}, {want: true}, {want: true}, {want: true},
				{want: false},
				{requests: 10},
				{want: true}, // 10 + 0.1×10
				{want: false},
				{at: 9999 * time.Millisecond, want: false}, // still in the window
				{at: 10 * time.Second, want: true},         // all of it has slid out
			},
		},
		{
			name: "negative ratio and window take the defaults", ratio: -1, min: -1, window: -time.Second,
			steps: []step{
				{requests: 20},
				{want: true}, {want: true},
				{want: false},
				{at: 10 * time.Second, requests: 10},
				{at: 10 * time.Second, want: true},
				{at: 10 * time.Second, want: false},
			},
		},
		{
			name: "the window slides slot by slot", ratio: 0.1, min: -1, window: time.Second,
			steps: []step{
				{requests: 10},
				{want: true},
				{want: false},
				{at: 500 * time.Millisecond, requests: 10},
				{at: 500 * time.Millisecond, want: true}, // 20 requests, 2 retries
				{at: 999 * time.Millisecond, want: false},
				// The first slot has slid out: 10 requests and 1 retry left.
				{at: time.Second, want: false},
				// Its place in the ring is reused from zero.
				{at: time.Second, requests: 10},
				{at: time.Second, want: true}, // 20 requests, 2 retries
				{at: time.Second, want: false},
				// Only the slot of 1 s is left: 10 requests, 1 retry.
				{at: 1500 * time.Millisecond, want: false},
				{at: 1500 * time.Millisecond, requests: 10},
				{at: 1500 * time.Millisecond, want: true},
				// Nothing is left.
				{at: 3 * time.Second, want: false},
			},
		},
		{
			name: "instants before 1970", ratio: 0.1, min: -1, window: 10 * time.Second,
			start: time.Unix(-5, 0),
			steps: []step{
				{requests: 10},
				{want: true},
				{want: false},
				{at: 10 * time.Second, want: false},
			},
		},
		{
			name: "window shorter than the slots", ratio: 1, min: -1, window: 5,
			steps: []step{
				{requests: 1},
				{want: true},
				{want: false},
				{at: 10, want: false},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := tt.start
			if t0.IsZero() {
				t0 = start
			}
			b := retry.NewBudget(tt.ratio, tt.min, tt.window)
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				if s.requests > 0 {
					for range s.requests {
						b.Request(now)
					}
					continue
				}
				if got := b.Retry(now); got != s.want {
					t.Fatalf("step %d: Retry at +%v = %v, want %v", i, s.at, got, s.want)
				}
			}
		})
	}
}

// TestBudgetConcurrent: requests and retries counted from many goroutines
// at once are all counted, and exactly the budget's worth of retries is
// allowed.
func TestBudgetConcurrent(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	b := retry.NewBudget(0.1, -1, 10*time.Second)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 100 {
				b.Request(now)
			}
		})
	}
	wg.Wait()
	var allowed atomic.Int64
	for range 10 {
		wg.Go(func() {
			for range 20 {
				if b.Retry(now) {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := allowed.Load(); got != 100 {
		t.Errorf("%d retries allowed for 1000 requests at ratio 0.1, want 100", got)
	}
}
