package retry

import (
	"math"
	"testing"
)

// A Limiter's WaitN takes an int: the cost saturates where int is
// narrower than int64, never wraps.
func TestWaitCost(t *testing.T) {
	for _, tt := range []struct {
		n    int64
		want int
	}{{0, 0}, {5, 5}, {math.MaxInt64, math.MaxInt}} {
		if got := waitCost(tt.n); got != tt.want {
			t.Errorf("waitCost(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}
