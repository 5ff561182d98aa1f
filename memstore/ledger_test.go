package memstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// TestLedgerBound: with 16 goroutines recording and taking at once, the
// ledger holds its bound; a full ledger forgets its oldest record first
// (never the one just made); an expired record is unknown, and its id
// may be recorded again.
func TestLedgerBound(t *testing.T) {
	clock := storetest.NewClock(time.Unix(1_800_000_000, 0))
	s := New(Options{JanitorInterval: -1, MaxReservations: 64, Now: clock.Now})
	defer s.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 2000 {
				id := ratelimit.NewReservationID()
				if err := s.Record(ctx, id, []byte{1}, time.Minute); err != nil {
					t.Error(err)
					return
				}
				// A goroutine descheduled while the others made 64 records
				// finds its own forgotten: allowed.
				if _, err := s.Take(ctx, id); err != nil && !errors.Is(err, ratelimit.ErrUnknownReservation) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := s.Reservations(); n != 64 {
		t.Errorf("%d records held, want the bound, 64", n)
	}
	first := ratelimit.NewReservationID()
	if err := s.Record(ctx, first, []byte{1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	var last string
	for range 64 {
		last = ratelimit.NewReservationID()
		// A shorter TTL than the oldest's: still not the one forgotten.
		if err := s.Record(ctx, last, []byte{1}, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Take(ctx, first); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Errorf("the oldest of a full ledger: %v, want forgotten", err)
	}
	if _, err := s.Take(ctx, last); err != nil {
		t.Errorf("the newest of a full ledger: %v", err)
	}
	id := ratelimit.NewReservationID()
	if err := s.Record(ctx, id, []byte{1}, time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if _, err := s.Take(ctx, id); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Errorf("expired: %v", err)
	}
	if err := s.Record(ctx, id, []byte{2}, time.Second); err != nil {
		t.Errorf("an expired id recorded again: %v", err)
	}
}
