package retry

import (
	"math"
	"time"
)

// Ceiling is the throttle controller of a client that paces itself at a
// rate (units a second) and is told "too many" by the service it calls: it
// answers a throttled response in proportion to what it says, and keeps
// the ceiling on the client's rate that results.
//
//   - A retry hint pauses the client until now + hint (at most MaxPause;
//     PausedUntil), and cuts nothing.
//   - The throttled responses that come back until the pause has ended
//     and grace has passed (the requests in flight at the first one being
//     answered) are one episode: they were sent before the client could
//     react, and cut nothing.
//   - One after an episode, within repeat of its end, is a repeat: the
//     pause did not suffice, and the ceiling is cut in proportion to the
//     overshoot seen — the last episode's throttled responses over the
//     units sent in the last window — never below Backoff times the rate.
//     It starts a new episode.
//   - Once cut, the ceiling climbs back linearly to the rate it was cut
//     from in Recovery, and is then gone.
//
// So a lone throttled response, or one window that overshot, costs the
// pause it asks for; a service whose real limit is below the client's
// rate sees its throttled responses repeat and the ceiling settle in a
// step or two at what it accepts. lease.Holder and httplimit.Client are
// built on it.
//
// The zero value has no ceiling and is ready to use with the defaults of
// each field. Unlike the other types of this package, a Ceiling is not
// safe for concurrent use: it lives under its owner's lock.
type Ceiling struct {
	// Backoff is the lowest factor by which one cut lowers the ceiling;
	// DefaultBackoff when 0 or outside (0, 1).
	Backoff float64
	// Recovery is the time in which a lowered ceiling climbs back to the
	// rate it was cut from; DefaultRecovery when 0.
	Recovery time.Duration
	// MaxPause bounds the pause a retry hint asks for; DefaultMaxPause
	// when 0.
	MaxPause time.Duration

	set        bool    // a cut is in force: ceiling, cutAt, cutFrom, cutTo
	ceiling    float64 // the ceiling last computed
	pauseUntil time.Time
	epEnd      time.Time // when the current episode ends
	epCount    int64     // the throttled responses of the last episode
	cutAt      time.Time // the last cut: from cutFrom to cutTo then
	cutFrom    float64
	cutTo      float64
}

// The defaults of a Ceiling's fields.
const (
	DefaultBackoff  = 0.75
	DefaultRecovery = 2 * time.Second
	DefaultMaxPause = time.Minute
)

func (c *Ceiling) backoff() float64 {
	if c.Backoff > 0 && c.Backoff < 1 {
		return c.Backoff
	}
	return DefaultBackoff
}

func (c *Ceiling) recovery() time.Duration {
	if c.Recovery > 0 {
		return c.Recovery
	}
	return DefaultRecovery
}

func (c *Ceiling) maxPause() time.Duration {
	if c.MaxPause > 0 {
		return c.MaxPause
	}
	return DefaultMaxPause
}

// Throttled reports, at now, a throttled response whose retry hint asked
// to wait hint (none when hint ≤ 0), and reports whether it cut the
// ceiling (see Ceiling). grace is how long after the pause (or now, without
// one) the episode lasts; repeat how long after an episode's end a
// throttled response is a repeat; rate is the client's rate now, and sent
// returns the units it sent over the last window (called only for a cut).
func (c *Ceiling) Throttled(now time.Time, hint, grace, repeat time.Duration, rate float64, sent func() float64) (cut bool) {
	c.Pause(now, hint)
	switch {
	case !c.epEnd.IsZero() && !now.After(c.epEnd):
		c.epCount++ // the same episode
		return false
	case !c.epEnd.IsZero() && now.Sub(c.epEnd) <= repeat:
		cut = c.cut(now, rate, sent)
	}
	c.epCount = 1
	c.epEnd = now.Add(grace)
	if c.pauseUntil.After(now) {
		c.epEnd = c.pauseUntil.Add(grace)
	}
	return cut
}

// Pause pauses the client until now + d, at most MaxPause, and reports
// whether that extended the pause; d ≤ 0 does nothing. It is the whole of
// a refusal that is not throttling (an overloaded service's 503 with a
// retry hint: overload is not quota).
func (c *Ceiling) Pause(now time.Time, d time.Duration) bool {
	if d <= 0 {
		return false
	}
	if until := now.Add(min(d, c.maxPause())); until.After(c.pauseUntil) {
		c.pauseUntil = until
		return true
	}
	return false
}

// PausedUntil returns the end of the latest pause (the zero Time if none).
func (c *Ceiling) PausedUntil() time.Time { return c.pauseUntil }

// cut lowers the ceiling at now in proportion to the overshoot of the last
// episode.
func (c *Ceiling) cut(now time.Time, rate float64, sent func() float64) bool {
	cur := min(c.At(now), rate)
	if cur <= 0 {
		return false
	}
	f := 1 - c.backoff()
	if n := sent(); n > 0 {
		f = min(f, float64(c.epCount)/n)
	}
	c.set, c.cutAt, c.cutFrom, c.cutTo = true, now, cur, max(min(1, cur), cur*(1-f))
	c.ceiling = c.cutTo
	return true
}

// At returns the ceiling at now, climbing back after a cut: +Inf when
// there is none.
func (c *Ceiling) At(now time.Time) float64 {
	if !c.set {
		return math.Inf(1)
	}
	el, rec := now.Sub(c.cutAt), c.recovery()
	if el >= rec {
		c.set = false
		return math.Inf(1)
	}
	c.ceiling = max(c.ceiling, c.cutTo+(c.cutFrom-c.cutTo)*el.Seconds()/rec.Seconds())
	return c.ceiling
}

// Lowered reports whether a cut is in force: the ceiling was lowered and
// has not yet climbed back (as of the last call to At).
func (c *Ceiling) Lowered() bool { return c.set }
