package lease

import (
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limitheader"
)

// Throttled reports a throttled (429) response from the service that
// gave no retry hint; see ThrottledAfterAt.
func (h *Holder) Throttled() { h.ThrottledAfterAt(time.Now(), 0) }

// ThrottledAt is Throttled at now.
func (h *Holder) ThrottledAt(now time.Time) { h.ThrottledAfterAt(now, 0) }

// ThrottledAfter reports a throttled (429) response from the service that
// asked to wait d before trying again; see ThrottledAfterAt.
func (h *Holder) ThrottledAfter(d time.Duration) { h.ThrottledAfterAt(time.Now(), d) }

// ThrottledAfterAt reports, at now, a throttled (429) response from the
// service whose retry hint asked to wait d (none when d ≤ 0): the input of
// the throttle controller.
//
//   - A hint pauses the Limiter until now + d (at most MaxPause): it
//     admits nothing until then, and the capacity is not cut.
//   - The 429s that come back until the pause has ended and the requests
//     in flight at the first one have been answered (a tenth of a period
//     later) are one episode: they were sent before the holder could
//     react, and cut nothing.
//   - A 429 after an episode, within two periods (or two windows) of its
//     end, is a repeat: the pause did not suffice, and the ceiling on the
//     rate is cut in proportion to the overshoot seen, the last episode's
//     429s over the units admitted in the last window, never below
//     Backoff times the rate. It starts a new episode.
//   - Once cut, the ceiling climbs back linearly to the rate it was cut
//     from in Recovery (two periods), and is then gone.
//
// So a lone 429, or one window that overshot, costs the pause it asks
// for; a downstream whose real limit is below the leased capacity sees
// its 429s repeat and the ceiling settle in a step or two at what it
// accepts.
func (h *Holder) ThrottledAfterAt(now time.Time, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.st.Throttled++
	paused := h.thr.PausedUntil()
	grace, repeat := h.cfg.RenewEvery/10, max(2*h.cfg.RenewEvery, 2*h.pace.window)
	if h.thr.Throttled(now, d, grace, repeat, h.pace.rate, func() float64 { return h.pace.sent(now) }) {
		h.st.Cuts++
	}
	if h.thr.PausedUntil().After(paused) {
		h.st.Pauses++
	}
	h.refreshLocked(now)
}

// pauseLocked pauses the Limiter until now + d, at most MaxPause; d ≤ 0
// does nothing. h.mu is held.
func (h *Holder) pauseLocked(now time.Time, d time.Duration) {
	if h.thr.Pause(now, d) {
		h.st.Pauses++
	}
}

// Observe reports a response of the service; see ObserveAt.
func (h *Holder) Observe(status int, header map[string][]string) {
	h.ObserveAt(time.Now(), status, header)
}

// ObserveAt reports, at now, a response of the service with its status
// code and header fields (an http.Header): a 429 is ThrottledAfterAt with
// the retry hint that limitheader.RetryDelay finds (Retry-After,
// Retry-After-Ms, X-Ms-Retry-After-Ms, RateLimit's t, ...); a 503 with a
// hint pauses the Limiter as long, and counts as no throttling (overload
// is not quota); and a RateLimit-Policy field sets the window the Limiter
// paces to, from the w of its policy of lowest quota per second.
func (h *Holder) ObserveAt(now time.Time, status int, header map[string][]string) {
	if vs := header["Ratelimit-Policy"]; len(vs) > 0 {
		if w := policyWindow(strings.Join(vs, ", ")); w > 0 {
			h.SetWindowAt(now, w)
		}
	}
	const tooMany, unavailable = 429, 503
	if status != tooMany && status != unavailable {
		return
	}
	d, _ := limitheader.RetryDelay(header, now)
	if status == tooMany {
		h.ThrottledAfterAt(now, d)
		return
	}
	h.mu.Lock()
	h.pauseLocked(now, d)
	h.mu.Unlock()
}

// maxWindow bounds the window a RateLimit-Policy field may set.
const maxWindow = 24 * time.Hour

// policyWindow returns the window of the policy of lowest quota per
// second in a RateLimit-Policy value, 0 if none has one (or it is
// malformed).
func policyWindow(v string) time.Duration {
	items, err := limitheader.ParseRateLimitPolicy(v)
	if err != nil {
		return 0
	}
	var w time.Duration
	best := math.Inf(1)
	for _, it := range items {
		if it.Window <= 0 {
			continue
		}
		if r := float64(it.Quota) / float64(it.Window); r < best {
			best = r
			w = time.Duration(min(it.Window, int64(maxWindow/time.Second))) * time.Second
		}
	}
	return w
}

// SetWindow sets the downstream's window that the Limiter paces to (see
// Options.Window); d ≤ 0 stops window pacing.
func (h *Holder) SetWindow(d time.Duration) { h.SetWindowAt(time.Now(), d) }

// SetWindowAt is SetWindow at now.
func (h *Holder) SetWindowAt(now time.Time, d time.Duration) {
	d = min(max(0, d), maxWindow)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pace.setWindow(now, d) {
		h.refreshLocked(now)
	}
}
