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

// localFor is a Store that decides in inner, but answers the items of key
// local as its failure mode would when the store cannot decide them:
// admitted, Reason ReasonLocal, nothing counted in inner.
type localFor struct {
	inner ratelimit.Store
	local string
}

func (l localFor) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	var mine []ratelimit.Item
	for _, it := range items {
		if it.Key != l.local {
			mine = append(mine, it)
		}
	}
	ds, err := l.inner.Decide(ctx, nil, mine)
	if err != nil {
		return dst, err
	}
	for _, it := range items {
		if it.Key == l.local {
			dst = append(dst, ratelimit.Decision{Allowed: true, Reason: ratelimit.ReasonLocal})
			continue
		}
		dst, ds = append(dst, ds[0]), ds[1:]
	}
	return dst, nil
}

// TestSettleSkipsFailureMode: an item the store's failure mode admitted
// was never counted at the store, so its settlement must not refund
// there (found between hosts: a reservation decided by local on a replica
// cut from Redis, refunded on Redis, gave back 60 units Redis never
// counted). It stays at its estimate; the item the store decided is
// refunded.
func TestSettleSkipsFailureMode(t *testing.T) {
	mem := memstore.New(memstore.Options{JanitorInterval: -1})
	defer mem.Close()
	rs := &ratelimit.Reservations{Store: localFor{inner: mem, local: "cut"}, Ledger: mem}
	r := &ratelimit.Rule{Name: "mode", Quota: 100, Period: time.Hour}
	ctx := context.Background()
	id, _, err := rs.Reserve(ctx, nil, []ratelimit.Item{{Key: "cut", Rule: r, Cost: 50}, {Key: "ok", Rule: r, Cost: 50}})
	if err != nil || id == "" {
		t.Fatalf("Reserve: %q %v", id, err)
	}
	st, err := rs.Settle(ctx, id, func(int, *ratelimit.Reserved) (int64, error) { return 20, nil })
	if err != nil || len(st) != 1 || st[0].Key != "ok" || st[0].Refunded != 30 {
		t.Fatalf("Settle: %+v %v, want the store's item alone refunded 30", st, err)
	}
	for key, want := range map[string]int64{"cut": 100, "ok": 80} {
		if ds, _ := mem.Decide(ctx, nil, []ratelimit.Item{{Key: key, Rule: r}}); ds[0].Remaining != want {
			t.Errorf("%s: remaining %d, want %d", key, ds[0].Remaining, want)
		}
	}
}

// late is a Store whose calls reach inner but whose answers are lost: its
// failure mode answers instead (fail_closed), as a call to Redis that
// timed out after Redis had run it.
type late struct {
	inner ratelimit.Store
	calls int
}

func (l *late) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	l.calls++
	if _, err := l.inner.Decide(ctx, nil, items); err != nil {
		return dst, err
	}
	for range items {
		dst = append(dst, ratelimit.Decision{Reason: ratelimit.ReasonFailClosed})
	}
	return dst, nil
}

// TestSettleNotResentAfterFailureMode: a settlement whose call the store
// ran but whose answer came from the failure mode is lost, never sent
// again (found between hosts: the refund, taken for a denial past the
// settling rule's capacity, was sent a second time and given twice).
func TestSettleNotResentAfterFailureMode(t *testing.T) {
	mem := memstore.New(memstore.Options{JanitorInterval: -1})
	defer mem.Close()
	r := &ratelimit.Rule{Name: "late", Quota: 100, Period: time.Hour}
	ctx := context.Background()
	rs := &ratelimit.Reservations{Store: mem, Ledger: mem}
	id, _, err := rs.Reserve(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 100}})
	if err != nil || id == "" {
		t.Fatalf("Reserve: %q %v", id, err)
	}
	st := &late{inner: mem}
	rs.Store = st
	_, err = rs.Settle(ctx, id, func(int, *ratelimit.Reserved) (int64, error) { return 40, nil })
	if !errors.Is(err, ratelimit.ErrSettlementLost) || st.calls != 1 {
		t.Fatalf("Settle: %v after %d calls, want ErrSettlementLost after 1", err, st.calls)
	}
	if ds, _ := mem.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r}}); ds[0].Remaining != 60 {
		t.Errorf("remaining %d, want 60: the refund of 60 applied once", ds[0].Remaining)
	}
}
