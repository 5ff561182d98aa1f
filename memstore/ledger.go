package memstore

import (
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
// repeat). A full ledger forgets its oldest record, which then stays
// charged at its estimate, as an expired reservation does: a flood of
// reservations never refuses one, it only shortens how long the oldest
// can be settled (at R reservations a second, MaxReservations/R seconds).
//
// A settlement is decided under ratelimit.Rule.Settling, a rule of far
// larger capacity; the key's share in use, which eviction weighs, stays
// measured against its own capacity (entry.decided), so a key in debt
// weighs as exhausted.

var _ ratelimit.Ledger = (*Store)(nil)

// ledger is a Store's reservations: a map by id, and the records in the
// order they were made, the oldest at head.
type ledger struct {
	mu    sync.Mutex
	max   int
	byID  map[string]*reservation
	order []*reservation // order[head:] are held; nil slots were taken out early
	head  int
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
	l.mu.Lock()
	defer l.mu.Unlock()
	now := s.now().UnixNano()
	l.trim(now)
	if r := l.byID[id]; r != nil && r.expires > now {
		return ratelimit.ErrReservationExists
	}
	if l.byID == nil {
		l.byID = make(map[string]*reservation)
	}
	r := &reservation{id: id, rec: append([]byte(nil), rec...), expires: now + int64(ttl)}
	l.byID[id] = r
	l.order = append(l.order, r)
	return nil
}

// Take implements ratelimit.Ledger.
func (s *Store) Take(ctx context.Context, id string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l := &s.ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byID[id]
	switch {
	case r == nil || r.expires <= s.now().UnixNano():
		return nil, ratelimit.ErrUnknownReservation
	case r.rec == nil:
		return nil, ratelimit.ErrAlreadySettled
	}
	rec := r.rec
	r.rec = nil
	return rec, nil
}

// Reservations is the number of reservation records held, settled or not
// (expired ones included until a Record finds them).
func (s *Store) Reservations() int {
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	return len(s.ledger.byID)
}

// trim forgets the oldest records while the ledger is full or they have
// expired at now, so that one more fits.
func (l *ledger) trim(now int64) {
	for l.head < len(l.order) {
		r := l.order[l.head]
		if len(l.byID) < l.max && r.expires > now {
			break
		}
		if l.byID[r.id] == r {
			delete(l.byID, r.id)
		}
		l.order[l.head] = nil
		l.head++
	}
	if l.head > len(l.order)/2 { // reuse the front half
		n := copy(l.order, l.order[l.head:])
		clear(l.order[n:])
		l.order, l.head = l.order[:n], 0
	}
}
