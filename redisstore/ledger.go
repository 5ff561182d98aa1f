package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ratelimit"
)

// Reservations
//
// A Store is also a ratelimit.Ledger: a reservation's record lives at its
// own Redis key (reservationKey: a hash tag of its own, so on a Cluster it
// is one key on one node, whatever slots the reservation's items live in),
// written once with SET NX PX, so that every replica finds it and an id is
// never recorded twice; ledger_take.lua returns it and leaves the empty
// string in its place for the rest of its TTL, so that a repeat is told it
// was settled. Its TTL runs on the Redis server's clock. The record and
// the items' counters are separate keys, so taking a record and applying
// its adjustment are two calls: a crash between them loses the adjustment
// (ratelimit.Reservations states it).

//go:embed ledger_take.lua
var ledgerTakeLua string

var takeScript = redis.NewScript(ledgerTakeLua)

var _ ratelimit.Ledger = (*Store)(nil)

// Record implements ratelimit.Ledger.
func (s *Store) Record(ctx context.Context, id string, rec []byte, ttl time.Duration) error {
	if err := ratelimit.CheckReservationID(id); err != nil {
		return err
	}
	if len(rec) == 0 || len(rec) > ratelimit.MaxReservationRecord || ttl <= 0 {
		return fmt.Errorf("%w: record of %d bytes for %v", ratelimit.ErrBadReservation, len(rec), ttl)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ok, err := s.c.SetNX(ctx, reservationKey(s.prefix, id), rec, ttl).Result()
	if err != nil {
		return fmt.Errorf("redisstore: recording reservation: %w", err)
	}
	if !ok {
		return ratelimit.ErrReservationExists
	}
	return nil
}

// Take implements ratelimit.Ledger.
func (s *Store) Take(ctx context.Context, id string) ([]byte, error) {
	if err := ratelimit.CheckReservationID(id); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := takeScript.Run(ctx, s.c, []string{reservationKey(s.prefix, id)}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, ratelimit.ErrUnknownReservation
	case err != nil:
		return nil, fmt.Errorf("redisstore: taking reservation: %w", err)
	}
	switch v := v.(type) {
	case string:
		return []byte(v), nil
	case int64:
		return nil, ratelimit.ErrAlreadySettled
	}
	return nil, fmt.Errorf("redisstore: taking reservation: unexpected reply %T", v)
}
