package memstore

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Reservations
//
// A Store is also a ratelimit.Ledger: it keeps the records of
// reservations (ratelimit.Reservations) in memory, at most
// Options.MaxReservations of them, each until its TTL ends by the store's
// clock, settled or not (a settled record is kept, emptied, to answer a
// repeat). A full ledger forgets the record that would expire first,
// which then stays charged at its estimate, as an expired reservation
// does: a flood of reservations never refuses one, it only shortens how
// long the oldest can be settled.

var _ ratelimit.Ledger = (*Store)(nil)

// ledger is a Store's reservations: a map by id and a heap by expiry.
type ledger struct {
	mu   sync.Mutex
	max  int
	byID map[string]*reservation
	exp  expiries
}

type reservation struct {
	id      string
	rec     []byte // nil once settled
	expires int64  // Unix ns
}

// Record implements ratelimit.Ledger.
func (s *Store) Record(ctx context.Context, id string, rec []byte, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := ratelimit.CheckReservationID(id); err != nil {
		return err
	}
	if len(rec) == 0 || len(rec) > ratelimit.MaxReservationRecord || ttl <= 0 {
		return fmt.Errorf("%w: record of %d bytes for %v", ratelimit.ErrBadReservation, len(rec), ttl)
	}
	l := &s.ledger
	now := s.now().UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	if l.byID[id] != nil {
		return ratelimit.ErrReservationExists
	}
	if l.byID == nil {
		l.byID = make(map[string]*reservation)
	}
	for len(l.exp) >= l.max {
		delete(l.byID, heap.Pop(&l.exp).(*reservation).id)
	}
	r := &reservation{id: id, rec: append([]byte(nil), rec...), expires: now + int64(ttl)}
	l.byID[id] = r
	heap.Push(&l.exp, r)
	return nil
}

// Take implements ratelimit.Ledger.
func (s *Store) Take(ctx context.Context, id string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l := &s.ledger
	now := s.now().UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	r := l.byID[id]
	switch {
	case r == nil:
		return nil, ratelimit.ErrUnknownReservation
	case r.rec == nil:
		return nil, ratelimit.ErrAlreadySettled
	}
	rec := r.rec
	r.rec = nil
	return rec, nil
}

// Reservations is the number of reservation records held, settled or not.
func (s *Store) Reservations() int {
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	return len(s.ledger.byID)
}

// expire forgets the records expired at now.
func (l *ledger) expire(now int64) {
	for len(l.exp) > 0 && l.exp[0].expires <= now {
		delete(l.byID, heap.Pop(&l.exp).(*reservation).id)
	}
}

// expiries is a min-heap of reservations by expiry (container/heap).
type expiries []*reservation

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].expires < h[j].expires }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(*reservation)) }
func (h *expiries) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return r
}
