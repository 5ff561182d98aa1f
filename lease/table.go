package lease

import (
	"sort"
	"time"
)

// A table is a Holder's lease table: the partitions it leases, each with
// its epoch and the deadline after which it is not used. Its methods take
// the instants they need; it never reads the clock. It never goes back in
// time: valid counts an instant earlier than the latest one it saw as
// that one, so that a caller holding a stale instant cannot bring back a
// lease that has ended.
//
// Only Run's goroutine adds, renews or drops leases. The zero value is
// empty; the Holder's mutex guards it.
type table struct {
	leases map[int]held
	latest time.Time // the latest instant valid saw
}

type held struct {
	epoch    uint64
	deadline time.Time
}

// add records leases granted, used until deadline.
func (t *table) add(gs []Grant, deadline time.Time) {
	if t.leases == nil {
		t.leases = map[int]held{}
	}
	for _, g := range gs {
		t.leases[g.Partition] = held{epoch: g.Epoch, deadline: deadline}
	}
}

// renewed applies a renewal's answer: leases[i] is renewed until deadline
// when ok[i], and lost (dropped) otherwise. A lease no longer in the
// table under that epoch is left alone, so that an answer never applies
// to another epoch of the partition. It returns how many were renewed and
// lost.
func (t *table) renewed(leases []Grant, ok []bool, deadline time.Time) (renewed, lost int) {
	for i, g := range leases {
		l, found := t.leases[g.Partition]
		if !found || l.epoch != g.Epoch {
			continue
		}
		if ok[i] {
			l.deadline = deadline
			t.leases[g.Partition] = l
			renewed++
		} else {
			delete(t.leases, g.Partition)
			lost++
		}
	}
	return renewed, lost
}

// drop stops using leases (they are being released).
func (t *table) drop(gs []Grant) {
	for _, g := range gs {
		delete(t.leases, g.Partition)
	}
}

// clear drops every lease and returns them, as grants does.
func (t *table) clear() []Grant {
	gs := t.grants()
	clear(t.leases)
	return gs
}

// holds reports whether the table has a lease on partition p, valid or
// not.
func (t *table) holds(p int) bool {
	_, ok := t.leases[p]
	return ok
}

// grants returns the leases, valid or not, in the order of their
// deadlines (then of their partitions): those that run out first come
// first.
func (t *table) grants() []Grant {
	gs := make([]Grant, 0, len(t.leases))
	for p, l := range t.leases {
		gs = append(gs, Grant{Partition: p, Epoch: l.epoch})
	}
	sort.Slice(gs, func(i, j int) bool {
		a, b := t.leases[gs[i].Partition], t.leases[gs[j].Partition]
		if !a.deadline.Equal(b.deadline) {
			return a.deadline.Before(b.deadline)
		}
		return gs[i].Partition < gs[j].Partition
	})
	return gs
}

// valid returns the number of leases valid at now and the earliest of
// their deadlines (zero if none). An instant earlier than the latest one
// seen counts as that one; valid returns the instant it counted at.
func (t *table) valid(now time.Time) (at time.Time, n int, horizon time.Time) {
	if now.Before(t.latest) {
		now = t.latest
	}
	t.latest = now
	for _, l := range t.leases {
		if !l.deadline.After(now) {
			continue
		}
		n++
		if horizon.IsZero() || l.deadline.Before(horizon) {
			horizon = l.deadline
		}
	}
	return now, n, horizon
}

// at returns the leases valid at now, by partition.
func (t *table) at(now time.Time) []Lease {
	var out []Lease
	for p, l := range t.leases {
		if l.deadline.After(now) {
			out = append(out, Lease{Grant: Grant{Partition: p, Epoch: l.epoch}, Deadline: l.deadline})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out
}
