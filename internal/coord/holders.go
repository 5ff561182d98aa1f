package coord

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/dashboard"
)

// Holders is what Service.Holders answers: the permits of a name held
// now, without their ids.
type Holders struct {
	Name string
	// Holders are the unexpired permits, by fence
	// (concurrency.Store.Holders): fence, weight, held for and expires
	// in, by the store's clock.
	Holders []concurrency.Holder
	// Queued is the fair waiters in the store's queue, of every process
	// (-1 when the store does not say).
	Queued int
	// Waiting is the acquires waiting on the name in this process.
	Waiting int
}

// Holds reports whether a permit of fence is among the holders.
func (h Holders) Holds(fence uint64) bool {
	for _, p := range h.Holders {
		if p.Fence == fence {
			return true
		}
	}
	return false
}

// Holders lists the permits of name held now, by fence, in one atomic
// read of the store, and counts this process's acquires waiting on it.
// It never reveals a permit id. A protected service that received a
// permit's fence can ask whether it is still held (Holds): the answer is
// true of the instant the store read it, and the permit may lapse right
// after; see package fence's Held.
func (s *Service) Holders(ctx context.Context, name string) (h Holders, err error) {
	defer func() { s.metrics.count("holders", err) }()
	if err := s.checkName(name); err != nil {
		return Holders{}, err
	}
	l, err := s.store.Holders(ctx, name)
	if err != nil {
		return Holders{}, s.storeError(ctx, err)
	}
	if l.Holders == nil {
		l.Holders = []concurrency.Holder{}
	}
	return Holders{Name: name, Holders: l.Holders, Queued: l.Queued, Waiting: s.Waiting(name)}, nil
}

// statusTimeout bounds the store's reads of one Status.
const statusTimeout = 2 * time.Second

// Status returns the semaphores acquired through this process since it
// started (at most Limits.MaxSeen, the most recently acquired first),
// each with its limit as last asked for, its holders read from the store
// now, and its waiters: the dashboard's and `sluice top`'s view of the
// coordination API. A name whose holders cannot be read within the
// status's bound shows the error instead. Beside them are the leased
// services this process runs remote holders for (LeaseStatus), which
// need no read of the store.
func (s *Service) Status(ctx context.Context) *dashboard.CoordinationStatus {
	type named struct {
		name string
		seenName
	}
	s.mu.Lock()
	names := make([]named, 0, len(s.seen))
	for n, sn := range s.seen {
		names = append(names, named{n, sn})
	}
	s.mu.Unlock()
	slices.SortFunc(names, func(a, b named) int { return cmp.Compare(b.seq, a.seq) })
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	out := &dashboard.CoordinationStatus{Semaphores: make([]dashboard.HeldSemaphore, 0, len(names)), Leases: s.LeaseStatus(time.Now())}
	for _, n := range names {
		hs := dashboard.HeldSemaphore{Name: n.name, Limit: n.limit, Holders: []dashboard.SemaphoreHolder{}, Waiting: s.Waiting(n.name), Queued: -1}
		l, err := s.store.Holders(ctx, n.name)
		if err != nil {
			hs.Error = err.Error()
		} else {
			hs.Queued, hs.Held = l.Queued, l.Used()
			for _, h := range l.Holders {
				hs.Holders = append(hs.Holders, ViewHolder(h))
			}
		}
		out.Semaphores = append(out.Semaphores, hs)
	}
	return out
}

// ViewHolder is h as the dashboard's status shows it, in milliseconds
// (HeldForMS absent when unknown).
func ViewHolder(h concurrency.Holder) dashboard.SemaphoreHolder {
	v := dashboard.SemaphoreHolder{Fence: h.Fence, Weight: h.Weight, ExpiresInMS: h.ExpiresIn.Milliseconds()}
	if h.HeldFor >= 0 {
		ms := h.HeldFor.Milliseconds()
		v.HeldForMS = &ms
	}
	return v
}
