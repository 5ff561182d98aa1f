package adaptive

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// runDistantStore runs 16 closed-loop callers for 20 virtual seconds
// through a Guard configured as serve's (a Gradient aiming at half a 100ms
// objective, a Shedder holding p99 under it), each call spending own of
// its own and then waiting wait on a store, and returns the Guard's
// stats. With account, the callers give each call a wait account and add
// the store's wait to it, as serve does.
func runDistantStore(t *testing.T, account bool, own, wait time.Duration) Stats {
	var st Stats
	synctest.Test(t, func(t *testing.T) {
		const objective = 100 * time.Millisecond
		g, err := NewGuard(GuardOptions{
			Concurrency: ConcurrencyOptions{Max: 64, Initial: 64, Controller: &Gradient{Target: objective / 2}},
			Shedder:     &ShedderOptions{Objective: Objective{Quantile: 0.99, Latency: objective}, Float64: func() float64 { return 0.5 }},
		})
		if err != nil {
			t.Fatal(err)
		}
		end := time.Now().Add(20 * time.Second)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for time.Now().Before(end) {
					ctx := priority.NewContext(context.Background(), priority.Sheddable)
					if account {
						ctx = WithWaitAccount(ctx)
					}
					pm, err := g.Acquire(ctx)
					if err != nil {
						time.Sleep(time.Millisecond) // a refused caller retries soon
						continue
					}
					time.Sleep(own) // the server's own work (its queueing for a CPU)
					start := time.Now()
					time.Sleep(wait) // the store's round trip
					AddWait(ctx, time.Since(start))
					pm.Done()
				}
			})
		}
		wg.Wait()
		st = g.Stats()
	})
	return st
}

func shedTotal(st Stats) uint64 {
	var n uint64
	for _, s := range st.Shed {
		n += s
	}
	return n
}

// TestGuardExcludesStoreWaits: a store 90ms away is no overload of the
// server, whose own work takes 100µs a call for 16 callers. Without a wait
// account the Guard takes the round trip for its latency and refuses calls
// (the control, which shows the scenario is one that sheds); with one it
// refuses none, and its latency sample is the server's own. The same
// 90ms spent in the server itself still sheds with the account.
func TestGuardExcludesStoreWaits(t *testing.T) {
	const us, ms90 = 100 * time.Microsecond, 90 * time.Millisecond
	st := runDistantStore(t, true, ms90, us)
	t.Logf("90ms of its own, accounted: %d refused, limit %v, shed fraction %.2f, p99 %v", shedTotal(st), st.Limit, st.Shedder.Fraction, st.Shedder.Quantile)
	if shedTotal(st) == 0 {
		t.Errorf("a server taking 90ms of its own a call refused nothing with a wait account; the account must not hide the server's own latency")
	}
	ctl := runDistantStore(t, false, us, ms90)
	t.Logf("without a wait account: %d refused, limit %v, shed fraction %.2f, p99 %v", shedTotal(ctl), ctl.Limit, ctl.Shedder.Fraction, ctl.Shedder.Quantile)
	if st := ctl; shedTotal(st) == 0 {
		t.Fatalf("control without a wait account refused nothing (limit %v, p99 %v): the scenario does not reproduce the overload it guards against", st.Limit, st.Shedder.Quantile)
	}
	st = runDistantStore(t, true, us, ms90)
	if n := shedTotal(st); n != 0 {
		t.Errorf("with the store's waits accounted, the Guard refused %d calls (limit %v, shed fraction %v, p99 %v); want none", n, st.Limit, st.Shedder.Fraction, st.Shedder.Quantile)
	}
	if st.Limit != 64 {
		t.Errorf("limit %v, want it held at its maximum 64", st.Limit)
	}
	if q := st.Shedder.Quantile; q > time.Millisecond {
		t.Errorf("Shedder's p99 %v, want the server's own latency (100µs), not the store's round trip", q)
	}
}

func TestAddWaitWithoutAccount(t *testing.T) {
	AddWait(context.Background(), time.Second) // no account: nothing to add to, no panic
	ctx := WithWaitAccount(context.Background())
	AddWait(ctx, 3*time.Millisecond)
	AddWait(ctx, -time.Millisecond) // ignored
	AddWait(ctx, 2*time.Millisecond)
	if got := waitsOf(ctx).excluded(int64(time.Second)); got != int64(5*time.Millisecond) {
		t.Errorf("account holds %v, want 5ms", time.Duration(got))
	}
	if got := waitsOf(ctx).excluded(int64(time.Millisecond)); got != int64(time.Millisecond) {
		t.Errorf("excluded from a 1ms sample %v, want at most the sample", time.Duration(got))
	}
}
