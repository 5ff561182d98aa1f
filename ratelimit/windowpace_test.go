package ratelimit_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestWindowPacing: the bucket that keeps any window within a rate's
// share: a hundredth of a window's worth as the burst (at least 1), the
// rate less that burst per window and less 1 %, never below half the
// rate; nothing for no rate or no window.
func TestWindowPacing(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		w     time.Duration
		limit ratelimit.Limit
		burst int
	}{
		{500, time.Second, 490, 5},
		{20000, time.Second, 19600, 200},
		{100, 10 * time.Second, 98, 10},
		{1, time.Second, 0.5, 1}, // 1 − 1 − 0.01 is below half the rate
		{50, time.Second, 48.5, 1},
		{0, time.Second, 0, 0},
		{-3, time.Second, 0, 0},
		{500, 0, 0, 0},
	} {
		limit, burst := ratelimit.WindowPacing(tc.rate, tc.w)
		if burst != tc.burst || abs(float64(limit-tc.limit)) > 1e-9 {
			t.Errorf("WindowPacing(%v, %v) = %v, %d; want %v, %d", tc.rate, tc.w, limit, burst, tc.limit, tc.burst)
		}
		if tc.w > 0 && tc.rate > 2 {
			// The bound: burst + limit·W within 99 % of rate·W.
			if got := float64(burst) + float64(limit)*tc.w.Seconds(); got > 0.99*tc.rate*tc.w.Seconds()+1e-9 {
				t.Errorf("WindowPacing(%v, %v) lets %v through a window, more than 99 %% of %v", tc.rate, tc.w, got, tc.rate*tc.w.Seconds())
			}
		}
	}
}

func abs(x float64) float64 { return max(x, -x) }
