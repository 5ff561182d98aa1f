package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// failing is a Store that decides in inner until fail is set, and then
// fails every call.
type failing struct {
	inner ratelimit.Store
	fail  bool
}

func (f *failing) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if f.fail {
		return dst, errors.New("store down")
	}
	return f.inner.Decide(ctx, dst, items)
}

// TestSettleAtMostOnce: a store that fails between the take and the
// adjustment loses the adjustment (ErrSettlementLost); the reservation
// stays at its estimate and cannot be settled again, so nothing is ever
// adjusted twice.
func TestSettleAtMostOnce(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	mem := memstore.New(memstore.Options{JanitorInterval: -1, Now: clock.Now})
	defer mem.Close()
	st := &failing{inner: mem}
	rs := &ratelimit.Reservations{Store: st, Ledger: mem, Now: clock.Now}
	r := &ratelimit.Rule{Name: "once", Quota: 10, Period: 10 * time.Second}
	ctx := context.Background()
	id, _, err := rs.Reserve(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 8}})
	if err != nil || id == "" {
		t.Fatalf("Reserve: %q %v", id, err)
	}
	st.fail = true
	one := func(int, *ratelimit.Reserved) (int64, error) { return 1, nil }
	if _, err := rs.Settle(ctx, id, one); !errors.Is(err, ratelimit.ErrSettlementLost) {
		t.Fatalf("Settle on a failing store: %v, want ErrSettlementLost", err)
	}
	st.fail = false
	if _, err := rs.Settle(ctx, id, one); !errors.Is(err, ratelimit.ErrAlreadySettled) {
		t.Fatalf("Settle again: %v, want ErrAlreadySettled", err)
	}
	ds, _ := mem.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r}})
	if ds[0].Remaining != 2 {
		t.Fatalf("remaining %d, want 2: the estimate of 8 stands", ds[0].Remaining)
	}
}

// refusing is a Ledger that keeps nothing.
type refusing struct{}

func (refusing) Record(context.Context, string, []byte, time.Duration) error {
	return errors.New("ledger down")
}
func (refusing) Take(context.Context, string) ([]byte, error) {
	return nil, ratelimit.ErrUnknownReservation
}

// TestReserveGivesBack: a reservation whose record cannot be kept gives
// back what it took and returns the ledger's error with no id.
func TestReserveGivesBack(t *testing.T) {
	mem := memstore.New(memstore.Options{JanitorInterval: -1})
	defer mem.Close()
	rs := &ratelimit.Reservations{Store: mem, Ledger: refusing{}}
	r := &ratelimit.Rule{Name: "back", Quota: 10, Period: time.Hour}
	ctx := context.Background()
	id, ds, err := rs.Reserve(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 6}})
	if err == nil || id != "" || len(ds) != 1 || !ds[0].Allowed {
		t.Fatalf("Reserve with a failing ledger: %q %+v %v", id, ds, err)
	}
	if ds, _ = mem.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r}}); ds[0].Remaining != 10 {
		t.Fatalf("remaining %d, want 10: the 6 given back", ds[0].Remaining)
	}
}
