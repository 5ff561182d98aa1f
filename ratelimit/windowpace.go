package ratelimit

import (
	"math"
	"time"
)

// Pacing to a window: a service that counts in fixed windows of length W
// (20,000 units a second, counted from each second's start) refuses what
// one window receives beyond its capacity, even when the rate averaged
// over time is below it, and its client does not know where its windows
// start. A token bucket of limit r' and burst b lets through at most
// b + r'·W units in any W, wherever it starts; with b = WindowBurst·r·W
// (at least 1) and r' = r − b/W − WindowSlack·r, that is (1 −
// WindowSlack)·r·W, the rest of r·W left for the jitter between the
// client's clock and the service's. Clients that share the capacity
// (lease.Limiter's holders) each pace so at their part r_i: at an instant
// a, a bucket holds at most its burst, a fraction of r_i(a), and in
// [a, a+W) it earns no more than the integral of its limit, so that while
// the parts never add up to more than r at any instant, the window
// receives at most r·W.
const (
	WindowBurst = 0.01
	WindowSlack = 0.01
)

// WindowPacing returns the token bucket (limit and burst) that paces a
// rate so that no window of length w, wherever it starts, receives more
// than rate × w (see WindowBurst): for 500 a second over one second, 490
// a second with a burst of 5. w > 0. The burst is at least 1; for rates
// below a few units a window, the limit never falls below half the rate,
// and a window may then see one unit more than its share. A rate of 0 or
// less gives (0, 0).
func WindowPacing(rate float64, w time.Duration) (limit Limit, burst int) {
	if !(rate > 0) || w <= 0 {
		return 0, 0
	}
	sec := w.Seconds()
	burst = max(1, int(math.Floor(rate*sec*WindowBurst)))
	l := rate - (float64(burst)/sec + WindowSlack*rate)
	return Limit(max(l, rate/2)), burst
}
