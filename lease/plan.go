package lease

import (
	"math/rand/v2"
	"time"
)

// A plan is what a round does after the heartbeat.
type plan struct {
	// release and renew share the holder's leases: those given up and
	// those kept.
	release, renew []Grant
	// acquire lists free partitions to ask for.
	acquire []int
	// starving says to look again after a quarter of a period.
	starving bool
	// stale is, when the holder wants more partitions, the shortest TTL
	// left of a partition whose owner has missed a renewal; 0 if none.
	stale time.Duration
}

// withSelf returns the members of a view with the holder's own entry as it
// has just published it, me: in the place of the store's copy, or
// appended if the view lacks it. It may overwrite elements of members.
func withSelf(members []Member, me Member) []Member {
	found := false
	for i := range members {
		if members[i].ID == me.ID {
			members[i], found = me, true
		}
	}
	if !found {
		members = append(members, me)
	}
	return members
}

// planLocked decides, from the view (members, with the holder's own entry
// me, and the partitions' states), what the holder releases, renews and
// acquires. h.mu is held.
func (h *Holder) planLocked(me Member, members []Member, parts []PartitionState, rng *rand.Rand) plan {
	want := me.Want
	c := h.censusLocked(me.ID, members, parts)
	var out plan
	// Release above need + hysteresis, and yield above the aim while
	// others lack partitions that are not free; the leases released are
	// those that run out first.
	mine := h.table.grants()
	keep := min(len(mine), want+h.cfg.Hysteresis)
	if short := c.deficit - len(c.free); short > 0 && keep > c.aim {
		keep = max(c.aim, keep-short)
	}
	out.release, out.renew = mine[:len(mine)-keep], mine[len(mine)-keep:]
	// Acquire free partitions up to the need, or the aim while others
	// lack theirs, starting at a random offset among the free ones.
	limit := want
	if c.deficit > 0 {
		limit = min(want, c.aim)
	}
	if k := min(limit-keep, len(c.free)); k > 0 {
		off := rng.IntN(len(c.free))
		for i := range k {
			out.acquire = append(out.acquire, c.free[(off+i)%len(c.free)])
		}
	}
	myDeficit := min(want, c.aim) - keep - len(out.acquire)
	out.starving = myDeficit > 0 && (c.above || len(c.free) > len(out.acquire))
	// Callers wait with no capacity at all: look again soon, whatever
	// the estimate said (it may not have seen them yet).
	if h.dem.waiters() && keep+len(out.acquire) == 0 && h.cfg.Reserved == 0 {
		out.starving = true
	}
	if want > keep+len(out.acquire) {
		out.stale = h.staleTTL(me.ID, parts)
	}
	return out
}

// A census is what a plan needs to know of the view besides the holder's
// own leases.
type census struct {
	free    []int // the free partitions, in order
	aim     int   // the holder's share, in partitions
	deficit int   // the partitions the other members lack to reach theirs
	above   bool  // whether another member holds more than its share
}

// censusLocked counts, in the view, the free partitions and every member's
// share and holdings. A partition the holder leases counts as its own
// whatever the view says (until a renewal says otherwise). h.mu is held.
func (h *Holder) censusLocked(id string, members []Member, parts []PartitionState) census {
	var c census
	heldBy := map[string]int{}
	for i, ps := range parts {
		switch {
		case h.table.holds(i):
		case ps.Owner == "":
			c.free = append(c.free, i)
		case ps.Owner != id:
			heldBy[ps.Owner]++
		}
	}
	aims := shares(members, h.cfg.Partitions)
	for i, m := range members {
		if m.ID == id {
			c.aim = aims[i]
			continue
		}
		c.deficit += max(0, aims[i]-heldBy[m.ID])
		if heldBy[m.ID] > aims[i] {
			c.above = true
		}
	}
	return c
}

// staleTTL returns the shortest TTL left of a partition held by another
// member than id that has missed a renewal, 0 if none.
func (h *Holder) staleTTL(id string, parts []PartitionState) time.Duration {
	// A lease renewed on time has more than the store's TTL less a
	// period (and a call) left.
	fresh := h.cfg.storeTTL() - time.Duration(float64(h.cfg.RenewEvery)*(1+h.cfg.Jitter)) - h.cfg.CallTimeout
	var stale time.Duration
	for _, ps := range parts {
		if ps.Owner != "" && ps.Owner != id && ps.TTL > 0 && ps.TTL < fresh && (stale == 0 || ps.TTL < stale) {
			stale = ps.TTL
		}
	}
	return stale
}
