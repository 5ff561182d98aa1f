package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// NewSettling returns a new, empty Store whose clock is now and the Ledger
// that keeps its reservations (often the same value).
type NewSettling func(t *testing.T, now func() time.Time) (ratelimit.Store, ratelimit.Ledger)

// SettleOptions adapt RunSettle to a store.
type SettleOptions struct {
	// Expire makes the reservation id expire at once, for a ledger that
	// does not expire by the clock RunSettle gives it (Redis expires by
	// the server's). Nil: RunSettle moves its clock past the TTL.
	Expire func(t *testing.T, l ratelimit.Ledger, id string)
}

// settleTTL is the TTL of RunSettle's reservations.
const settleTTL = time.Minute

// RunSettle checks reservations with settlement (ratelimit.Reservations)
// on a Store and its Ledger, on the fake clock:
//
//   - step tables for every algorithm, at fixed instants: a refund
//     (actual below the estimate) gives the difference back; a charge
//     past the limit (actual above) is a debt that delays the next
//     request of a bucket by exactly the excess's refill time, keeps a
//     fixed window closed until it ends and no longer, weighs into the
//     next window of a sliding window, and keeps a sliding log full for
//     its period;
//   - a window's refund after its window gives nothing back;
//   - settling twice is ErrAlreadySettled, even from many goroutines at
//     once (exactly one settles); an unknown id, and an expired one, is
//     ErrUnknownReservation, and the expired one stays charged at its
//     estimate;
//   - a denied reservation takes nothing and records nothing, all or
//     nothing across its items, also when their keys have different hash
//     tags (Cluster slots);
//   - batched and approximate rules: the charge reaches the shared
//     counter at once (a strict decision sees it).
func RunSettle(t *testing.T, newSettling NewSettling, opts SettleOptions) {
	t.Run("Steps", func(t *testing.T) { testSettleSteps(t, newSettling) })
	t.Run("WindowRefundLate", func(t *testing.T) { testSettleLateRefund(t, newSettling) })
	t.Run("Once", func(t *testing.T) { testSettleOnce(t, newSettling, opts) })
	t.Run("Denied", func(t *testing.T) { testSettleDenied(t, newSettling) })
	t.Run("Counting", func(t *testing.T) { testSettleCounting(t, newSettling) })
}

// settleEnv is one subtest's Reservations on a Store and its clock.
type settleEnv struct {
	*env
	rs *ratelimit.Reservations
}

func newSettleEnv(t *testing.T, newSettling NewSettling) *settleEnv {
	c := NewClock(Start)
	s, l := newSettling(t, c.Now)
	if s == nil || l == nil {
		t.Fatal("NewSettling returned nil")
	}
	return &settleEnv{
		env: &env{t: t, clock: c, store: s},
		rs:  &ratelimit.Reservations{Store: s, Ledger: l, TTL: settleTTL, Now: c.Now},
	}
}

// reserve reserves items and fails the test unless they are admitted.
func (e *settleEnv) reserve(items ...ratelimit.Item) string {
	e.t.Helper()
	id, ds, err := e.rs.Reserve(e.t.Context(), nil, items)
	if err != nil || id == "" {
		e.t.Fatalf("Reserve(%s) at %v = %q, %+v, %v; want admitted", fmtItems(items), e.clock.Now().Sub(Start), id, ds, err)
	}
	return id
}

// settle settles id with one actual cost for every item.
func (e *settleEnv) settle(id string, actual int64) ([]ratelimit.Settled, error) {
	return e.rs.Settle(e.t.Context(), id, func(int, *ratelimit.Reserved) (int64, error) { return actual, nil })
}

// A settleStep is one instant of a settlement table: at At, decide Cost
// on the key (Reserve when Reserve is set, Settle with Actual when Settle
// is), and expect the admission (or the settled amounts) and RetryAfter.
type settleStep struct {
	At                time.Duration
	Reserve, Settle   bool
	Cost, Actual      int64
	Allowed           bool
	Remaining         int64
	RetryAfter        time.Duration
	Refunded, Charged int64
}

// settleTables are the step tables: a rule of capacity 10 (1 unit a
// second for buckets, 10 per 10 s window for the windows), a reservation
// of 4 at 0 settled at 14 (or 1), and the requests after it.
func settleTables() []struct {
	rule  ratelimit.Rule
	steps []settleStep
} {
	bucket := func() []settleStep {
		return []settleStep{
			{At: 0, Reserve: true, Cost: 4, Allowed: true},
			// 4 taken, 6 left; actual 14: 10 more, a debt of 4 past the capacity.
			{At: 0, Settle: true, Actual: 14, Charged: 10},
			// The next unit needs the debt (14 s) down to 9 s: 5 s, the 4 units
			// of excess plus its own. Without the excess it would have gone at once.
			{At: 0, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 5 * time.Second},
			{At: 5*time.Second - 1, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 1},
			{At: 5 * time.Second, Cost: 1, Allowed: true, Remaining: 0},
			// Refund: a reservation of 5 that cost 1 gives 4 back.
			{At: 20 * time.Second, Reserve: true, Cost: 5, Allowed: true, Remaining: 5},
			{At: 20 * time.Second, Settle: true, Actual: 1, Refunded: 4},
			{At: 20 * time.Second, Cost: 0, Allowed: true, Remaining: 9},
		}
	}
	return []struct {
		rule  ratelimit.Rule
		steps []settleStep
	}{
		{ratelimit.Rule{Name: "gcra", Algorithm: ratelimit.GCRA, Quota: 10, Period: 10 * time.Second}, bucket()},
		{ratelimit.Rule{Name: "leaky", Algorithm: ratelimit.LeakyBucket, Quota: 10, Period: 10 * time.Second}, bucket()},
		{ratelimit.Rule{Name: "fixed", Algorithm: ratelimit.FixedWindow, Quota: 10, Period: 10 * time.Second}, []settleStep{
			{At: time.Second, Reserve: true, Cost: 4, Allowed: true},
			{At: time.Second, Settle: true, Actual: 14, Charged: 10},
			// 14 counted in a window of 10: closed until it ends (10 s), not after.
			{At: 2 * time.Second, Cost: 1, Allowed: false, RetryAfter: 8 * time.Second},
			{At: 10*time.Second - 1, Cost: 1, Allowed: false, RetryAfter: 1},
			{At: 10 * time.Second, Cost: 1, Allowed: true, Remaining: 9},
			{At: 11 * time.Second, Reserve: true, Cost: 5, Allowed: true},
			{At: 12 * time.Second, Settle: true, Actual: 2, Refunded: 3},
			{At: 12 * time.Second, Cost: 0, Allowed: true, Remaining: 7},
		}},
		{ratelimit.Rule{Name: "sliding_window", Algorithm: ratelimit.SlidingWindow, Quota: 10, Period: 10 * time.Second}, []settleStep{
			{At: 0, Reserve: true, Cost: 4, Allowed: true},
			{At: 0, Settle: true, Actual: 14, Charged: 10},
			// In the next window the 14 weigh as the previous count: at 15 s,
			// half of it (7) is still counted, 3 left.
			{At: 15 * time.Second, Cost: 0, Allowed: true, Remaining: 3},
			{At: 15 * time.Second, Cost: 4, Allowed: false, Remaining: 3, RetryAfter: 5*time.Second/7 + 1},
		}},
		{ratelimit.Rule{Name: "sliding_log", Algorithm: ratelimit.SlidingLog, Quota: 10, Period: 10 * time.Second}, []settleStep{
			{At: 0, Reserve: true, Cost: 4, Allowed: true},
			{At: 0, Settle: true, Actual: 14, Charged: 10},
			{At: 9 * time.Second, Cost: 1, Allowed: false, RetryAfter: time.Second},
			{At: 10 * time.Second, Cost: 10, Allowed: true, Remaining: 0},
		}},
	}
}

func testSettleSteps(t *testing.T, newSettling NewSettling) {
	for _, tc := range settleTables() {
		t.Run(tc.rule.Name, func(t *testing.T) {
			e := newSettleEnv(t, newSettling)
			r := tc.rule
			key := e.key("k")
			var id string
			for i, s := range tc.steps {
				e.at(s.At)
				switch {
				case s.Reserve:
					id = e.reserve(ratelimit.Item{Key: key, Rule: &r, Cost: s.Cost})
				case s.Settle:
					st, err := e.settle(id, s.Actual)
					if err != nil || len(st) != 1 || st[0].Refunded != s.Refunded || st[0].Charged != s.Charged {
						t.Fatalf("step %d at %v: Settle(%d) = %+v, %v; want refunded %d, charged %d", i, s.At, s.Actual, st, err, s.Refunded, s.Charged)
					}
				default:
					d := e.one(key, &r, s.Cost)
					if d.Allowed != s.Allowed || d.Remaining != s.Remaining || d.RetryAfter != s.RetryAfter {
						t.Fatalf("step %d at %v: cost %d: allowed %v remaining %d retry %v; want %v %d %v", i, s.At, s.Cost, d.Allowed, d.Remaining, d.RetryAfter, s.Allowed, s.Remaining, s.RetryAfter)
					}
				}
			}
		})
	}
}

// testSettleLateRefund: a window's refund after its window gives nothing
// back (the later window never counted those units); a bucket's does.
func testSettleLateRefund(t *testing.T, newSettling NewSettling) {
	for _, a := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.SlidingLog, ratelimit.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			e := newSettleEnv(t, newSettling)
			r := &ratelimit.Rule{Name: a.String(), Algorithm: a, Quota: 10, Period: 10 * time.Second}
			key := e.key("k")
			e.at(time.Second)
			id := e.reserve(ratelimit.Item{Key: key, Rule: r, Cost: 6})
			e.at(12 * time.Second)
			before := e.remaining(key, r)
			st, err := e.settle(id, 0)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(0) // a window's refund after its window: nothing
			if a == ratelimit.GCRA {
				want = 6 // decided, but the bucket drained meanwhile: never below empty
			}
			if st[0].Refunded != want {
				t.Fatalf("refunded %d, want %d", st[0].Refunded, want)
			}
			if got := e.remaining(key, r); got != before {
				t.Fatalf("remaining %d after a late refund, %d before: a late refund gave capacity back", got, before)
			}
		})
	}
}

func testSettleOnce(t *testing.T, newSettling NewSettling, opts SettleOptions) {
	e := newSettleEnv(t, newSettling)
	r := &ratelimit.Rule{Name: "once", Quota: 10, Period: 10 * time.Second}
	key := e.key("k")
	id := e.reserve(ratelimit.Item{Key: key, Rule: r, Cost: 5})
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = e.settle(id, 1) })
	}
	wg.Wait()
	settled := 0
	for _, err := range errs {
		switch {
		case err == nil:
			settled++
		case !errors.Is(err, ratelimit.ErrAlreadySettled):
			t.Fatalf("concurrent Settle: %v", err)
		}
	}
	if settled != 1 {
		t.Fatalf("%d of %d concurrent settlements settled, want 1", settled, n)
	}
	if got := e.remaining(key, r); got != 9 {
		t.Fatalf("remaining %d after settling 5 at 1, want 9: refunded %d times?", got, settled)
	}
	if _, err := e.settle(ratelimit.NewReservationID(), 1); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle(unknown) = %v, want ErrUnknownReservation", err)
	}
	if _, err := e.settle("not an id!", 1); !errors.Is(err, ratelimit.ErrBadReservation) {
		t.Fatalf("Settle(malformed) = %v, want ErrBadReservation", err)
	}
	// Expiry: never settled, the estimate stays charged.
	key2 := e.key("expires")
	id2 := e.reserve(ratelimit.Item{Key: key2, Rule: r, Cost: 5})
	if opts.Expire != nil {
		opts.Expire(t, e.rs.Ledger, id2)
	} else {
		e.clock.Advance(settleTTL)
	}
	if _, err := e.settle(id2, 0); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle(expired) = %v, want ErrUnknownReservation", err)
	}
	if opts.Expire != nil { // the clock has not moved: the 5 are still taken
		if got := e.remaining(key2, r); got != 5 {
			t.Fatalf("remaining %d after an expired reservation of 5, want 5", got)
		}
	}
}

// testSettleDenied: a denied reservation takes nothing and keeps no
// record; its items may live in different hash tags.
func testSettleDenied(t *testing.T, newSettling NewSettling) {
	e := newSettleEnv(t, newSettling)
	r := &ratelimit.Rule{Name: "denied", Quota: 10, Period: 10 * time.Second}
	a, b := e.key("a/x"), e.key("b/y") // different tags on a Cluster
	e.one(b, r, 8)
	id, ds, err := e.rs.Reserve(t.Context(), nil, []ratelimit.Item{{Key: a, Rule: r, Cost: 3}, {Key: b, Rule: r, Cost: 3}})
	if err != nil || id != "" || ratelimit.Allowed(ds) {
		t.Fatalf("Reserve over the limit = %q, %+v, %v; want denied without an id", id, ds, err)
	}
	if got := e.remaining(a, r); got != 10 {
		t.Fatalf("remaining %d on the admitted item of a denied reservation, want 10", got)
	}
	id = e.reserve(ratelimit.Item{Key: a, Rule: r, Cost: 3}, ratelimit.Item{Key: b, Rule: r, Cost: 2})
	st, err := e.rs.Settle(t.Context(), id, func(i int, _ *ratelimit.Reserved) (int64, error) { return []int64{1, 6}[i], nil })
	if err != nil || st[0].Refunded != 2 || st[1].Charged != 4 {
		t.Fatalf("Settle = %+v, %v; want 2 refunded on a, 4 charged on b", st, err)
	}
	if ra, rb := e.remaining(a, r), e.remaining(b, r); ra != 9 || rb != 0 {
		t.Fatalf("remaining a %d, b %d; want 9, 0", ra, rb)
	}
}

// testSettleCounting: a charge on a batched or approximate rule is taken
// at the shared counter at once.
func testSettleCounting(t *testing.T, newSettling NewSettling) {
	for _, c := range []ratelimit.Counting{ratelimit.Batched, ratelimit.Approximate} {
		t.Run(c.String(), func(t *testing.T) {
			e := newSettleEnv(t, newSettling)
			r := &ratelimit.Rule{Name: fmt.Sprint("counting-", c), Quota: 10, Period: 10 * time.Second, Counting: c}
			strict := *r
			strict.Counting = ratelimit.Strict
			key := e.key("k")
			id := e.reserve(ratelimit.Item{Key: key, Rule: r, Cost: 4})
			if st, err := e.settle(id, 14); err != nil || st[0].Charged != 10 {
				t.Fatalf("Settle = %+v, %v; want 10 charged", st, err)
			}
			if d := e.one(key, &strict, 1); d.Allowed || d.RetryAfter < time.Second {
				t.Fatalf("a strict unit after a charge of 10 on a capacity of 10: %+v; want denied for at least 1 s", d)
			}
		})
	}
}
