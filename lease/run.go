package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrRunning is returned by Run when the Holder already runs.
var ErrRunning = errors.New("lease: holder already running")

// Run works for the holder until ctx is done, then releases every lease
// and leaves; it returns the error of that last release, if any. Store
// errors while running are counted (Stats.Outages), not returned.
func (h *Holder) Run(ctx context.Context) error {
	h.mu.Lock()
	if h.running {
		h.mu.Unlock()
		return ErrRunning
	}
	h.running = true
	h.mu.Unlock()
	rng := rand.New(rand.NewPCG(h.cfg.Seed, 2))
	tm := time.NewTimer(0)
	defer tm.Stop()
	due := time.Now() // when tm fires
	// Members that start together cannot see one another on their first
	// look: during its first period the holder looks every tenth of one,
	// so that the member that took the idle capacity yields to the
	// others within that, notified or not.
	firstPeriod := due.Add(h.cfg.RenewEvery)
	// soon asks for a look now, or a fiftieth of a period after the last
	// one (so that a burst of wake-ups is one look), unless tm fires
	// sooner; it reports whether that is later than now.
	soon := func() (later bool) {
		h.mu.Lock()
		at := h.dem.lastTick.Add(h.cfg.RenewEvery / 50)
		h.mu.Unlock()
		d := time.Until(at)
		if d <= 0 {
			return false
		}
		if at.Before(due) {
			tm.Reset(d)
			due = at
		}
		return true
	}
	// The store's notifications, when it sends them (Notifier); nil
	// while not watching, and watched again after every look until a
	// watch succeeds. Watch runs in a goroutine of Run's, one at a time,
	// so that a store that does not answer never holds up the renewals;
	// it ends when Watch returns (at the latest when ctx is done).
	var notes <-chan string
	watched := make(chan (<-chan string), 1)
	watching := false
	watcher, canWatch := h.c.(Notifier)
	watch := func() {
		if !canWatch || notes != nil || watching || ctx.Err() != nil {
			return
		}
		watching = true
		go func() {
			c, err := watcher.Watch(ctx)
			if err != nil {
				c = nil
			}
			watched <- c
		}()
	}
	watch()
	for {
		select {
		case <-ctx.Done():
			return h.shutdown(ctx)
		case <-h.wake:
			// A caller waits with no capacity.
			if soon() {
				continue
			}
		case c := <-watched:
			// A watch begins: what happened before it was missed, so
			// look once it is in place.
			watching, notes = false, c
			if c == nil || soon() {
				continue
			}
		case id, ok := <-notes:
			// Another member released partitions, left, came or
			// needs more: look at once.
			if !ok {
				notes = nil
				continue
			}
			if id == h.cfg.ID || soon() {
				continue
			}
		case <-tm.C:
		}
		d := h.tick(ctx, rng)
		if d == 0 {
			d = h.cfg.RenewEvery
			d -= time.Duration(rng.Float64() * h.cfg.Jitter * float64(d))
		}
		if time.Now().Before(firstPeriod) {
			d = min(d, h.cfg.RenewEvery/10)
		}
		tm.Reset(d)
		due = time.Now().Add(d)
		watch()
	}
}

// shutdown ends Run: it stops using every lease, then releases them all
// and leaves, within one CallTimeout counted after ctx is done.
func (h *Holder) shutdown(ctx context.Context) error {
	h.mu.Lock()
	all := h.table.clear()
	h.refreshLocked(time.Now())
	h.st.Releases += uint64(len(all))
	h.running = false
	h.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.CallTimeout)
	defer cancel()
	var errs []error
	if len(all) > 0 {
		if err := h.c.Release(cctx, h.cfg.ID, all); err != nil {
			errs = append(errs, fmt.Errorf("lease: release on shutdown: %w", err))
		}
	}
	if err := h.c.Leave(cctx, h.cfg.ID); err != nil {
		errs = append(errs, fmt.Errorf("lease: leave on shutdown: %w", err))
	}
	return errors.Join(errs...)
}

// tick does one period's work, a round, and returns how long to wait for
// the next one: 0 for a normal period.
//
// A round sends up to four store calls, in this order and never with h.mu
// held: the heartbeat, which publishes the demand and reads the view; the
// release of the leases the plan gives up; the renewal of those it keeps;
// the acquisition of free partitions. h.mu is taken once before the
// heartbeat, to estimate the demand it publishes, and once after each
// call, to apply what the call returned as soon as it returns:
//
//   - after the heartbeat, to plan from the view and the holder's leases,
//     and to stop using the leases the plan releases before the release is
//     sent: the store may lease them to another member as soon as the
//     release reaches it;
//   - after the release, only to count it: when it fails the outage takes
//     effect at once, as after any call that fails (Options.Outage);
//   - after the renewal, so that the new deadlines, and the lost leases,
//     take effect before the acquisition is sent: capacity does not lapse,
//     nor a lost lease stay in use, while that call is in flight;
//   - after the acquisition, to use what it granted.
func (h *Holder) tick(ctx context.Context, rng *rand.Rand) time.Duration {
	me := h.startRound()
	p, recv, ok := h.heartbeat(ctx, me, rng)
	if !ok {
		return 0
	}
	if len(p.release) > 0 {
		h.release(ctx, p.release)
	}
	if len(p.renew) > 0 {
		h.renew(ctx, p.renew)
	}
	contended := false
	if len(p.acquire) > 0 {
		contended = h.acquire(ctx, p.acquire)
	}
	return h.nextLook(p, contended, recv, rng)
}

// startRound estimates the demand at the start of a round and returns the
// entry the heartbeat publishes for the holder.
func (h *Holder) startRound() Member {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	need, want := h.dem.estimate(now, bucket{
		limit:   h.pace.limit,
		burst:   h.pace.lim.Burst(),
		empty:   h.pace.rate <= 0 || h.pace.lim.TokensAt(now) < 1,
		window:  h.pace.window,
		ceiling: h.thr.At(now),
		even:    h.even,
	})
	h.refreshLocked(now)
	return Member{ID: h.cfg.ID, Weight: h.cfg.Weight, Need: need, Want: want}
}

// heartbeat publishes me and reads the view; then it plans the round from
// the view and stops using the leases the plan releases. It returns the
// plan and when the view arrived, or false when the call failed (the
// round ends there).
func (h *Holder) heartbeat(ctx context.Context, me Member, rng *rand.Rand) (p plan, recv time.Time, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	view, err := h.c.Heartbeat(cctx, me, h.cfg.storeTTL(), h.cfg.Partitions)
	cancel()
	recv = time.Now()

	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.recordLocked(ctx, err) {
		return plan{}, recv, false
	}
	h.outage = false
	members := withSelf(view.Members, me)
	p = h.planLocked(me, members, view.Partitions, rng)
	// The even share of the capacity among the members seen, for
	// OutageEvenShare.
	var totalW float64
	for _, m := range members {
		totalW += max(0, m.Weight)
	}
	if totalW > 0 {
		h.even = h.cfg.Capacity * h.cfg.Weight / totalW
	}
	// Stop using what is released before the store frees it.
	h.table.drop(p.release)
	h.st.Releases += uint64(len(p.release))
	h.refreshLocked(time.Now())
	return p, recv, true
}

// release gives leases, no longer used, back to the store. Its outcome
// counts only in the stats and the outage: if it fails, the leases expire
// in the store by themselves.
func (h *Holder) release(ctx context.Context, leases []Grant) {
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	err := h.c.Release(cctx, h.cfg.ID, leases)
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	h.recordLocked(ctx, err)
}

// renew renews leases. Each one renewed is valid for validity from when
// the call was sent; each one refused is lost, and dropped. When the call
// fails, nothing changes: the leases run out at their deadlines.
func (h *Holder) renew(ctx context.Context, leases []Grant) {
	sent := time.Now()
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	ok, err := h.c.Renew(cctx, h.cfg.ID, leases, h.cfg.storeTTL())
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.recordLocked(ctx, err) {
		return
	}
	renewed, lost := h.table.renewed(leases, ok, sent.Add(h.cfg.validity()))
	h.st.Renewals += uint64(renewed)
	h.st.Losses += uint64(lost)
	h.refreshLocked(time.Now())
}

// acquire asks the store for the free partitions parts; each one granted
// is valid for validity from when the call was sent. It reports whether
// some were not granted: other members took them since the view.
func (h *Holder) acquire(ctx context.Context, parts []int) (contended bool) {
	sent := time.Now()
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	gs, err := h.c.Acquire(cctx, h.cfg.ID, parts, h.cfg.storeTTL())
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.recordLocked(ctx, err) {
		return false
	}
	h.table.add(gs, sent.Add(h.cfg.validity()))
	h.st.Acquisitions += uint64(len(gs))
	h.refreshLocked(time.Now())
	return len(gs) < len(parts)
}

// recordLocked counts a store call that returned err. A call that failed
// while the holder runs (not because ctx is done) marks an outage, and the
// rate is refreshed at once for the outage policy to apply. It reports
// whether the call succeeded. h.mu is held.
func (h *Holder) recordLocked(ctx context.Context, err error) (ok bool) {
	h.st.StoreCalls++
	if err == nil {
		return true
	}
	if ctx.Err() == nil {
		h.st.Outages++
		h.outage = true
		h.refreshLocked(time.Now())
	}
	return false
}

// nextLook returns how long after a round of plan p to look again: 0 for
// a normal period. contended reports that partitions seen free were taken
// by another member before the acquisition; recv is when the view
// arrived.
func (h *Holder) nextLook(p plan, contended bool, recv time.Time, rng *rand.Rand) time.Duration {
	var next time.Duration
	if p.starving {
		next = h.cfg.RenewEvery / 10
	}
	if contended {
		// Partitions seen free were taken by another member since the
		// view: often one that looked at the same instant, as holders
		// do when a dead member's leases expire. Look again at once,
		// after a random pause so that those who collided do not look
		// in step: the view shows who won, and any partition still
		// free. Each such look follows a partition taken by another, so
		// they are few.
		d := time.Duration((0.01 + 0.04*rng.Float64()) * float64(h.cfg.RenewEvery))
		if next == 0 || d < next {
			next = max(time.Millisecond, d)
		}
	}
	if p.stale > 0 {
		// A partition whose owner missed a renewal frees at the latest
		// stale after the view was made, by the store's clock; allow for
		// the drift and the store's millisecond rounding.
		at := recv.Add(p.stale + time.Duration(float64(p.stale)*h.cfg.Drift) + 2*time.Millisecond)
		if d := max(time.Millisecond, time.Until(at)); next == 0 || d < next {
			next = d
		}
	}
	return next
}
