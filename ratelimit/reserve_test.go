package ratelimit_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// A reserveStep is one reservation at a fixed instant and what it must
// be told.
type reserveStep struct {
	at      time.Duration // since start
	cost    int64
	maxWait time.Duration
	allowed bool
	wait    time.Duration
	retry   time.Duration // RetryAfter when denied
	reset   time.Duration // ResetAfter: the key's debt after the step
	remain  int64         // Remaining, in the rule's own terms
}

// TestReserveSteps decides reservations on one key of 10/s, burst 2
// (interval 100ms, capacity time 200ms), in the manner of x/time/rate's
// step tables: each step's wait is exact from the debt, reservations queue
// behind one another, one that would need more than its maxWait is denied
// and consumes nothing, and its RetryAfter says when a reservation of the
// same wait would fit. GCRA and LeakyBucket answer alike.
func TestReserveSteps(t *testing.T) {
	const ms = time.Millisecond
	steps := []reserveStep{
		// A full bucket: the burst goes at once.
		{at: 0, cost: 1, maxWait: 300 * ms, allowed: true, wait: 0, reset: 100 * ms, remain: 1},
		{at: 0, cost: 1, maxWait: 300 * ms, allowed: true, wait: 0, reset: 200 * ms, remain: 0},
		// Empty: the next units queue, each behind the ones before.
		{at: 0, cost: 1, maxWait: 300 * ms, allowed: true, wait: 100 * ms, reset: 300 * ms},
		{at: 0, cost: 2, maxWait: 300 * ms, allowed: true, wait: 300 * ms, reset: 500 * ms},
		// Would need 400ms > 300ms: denied, nothing taken; a 300ms
		// reservation fits 100ms later.
		{at: 0, cost: 1, maxWait: 300 * ms, allowed: false, retry: 100 * ms, reset: 500 * ms},
		// The same with a longer wait is admitted, and queues.
		{at: 0, cost: 1, maxWait: 450 * ms, allowed: true, wait: 400 * ms, reset: 600 * ms},
		// The queue is full to 450ms (4 whole intervals: 400ms): the next
		// unit would wait 500ms, denied; 50ms later it would wait 450ms,
		// still more than 4 intervals; 100ms later it fits.
		{at: 0, cost: 1, maxWait: 450 * ms, allowed: false, retry: 100 * ms, reset: 600 * ms},
		{at: 50 * ms, cost: 1, maxWait: 450 * ms, allowed: false, retry: 50 * ms, reset: 550 * ms},
		{at: 100 * ms, cost: 1, maxWait: 450 * ms, allowed: true, wait: 400 * ms, reset: 600 * ms},
		// A cost above the capacity can never be sent: never, whatever
		// the wait.
		{at: 100 * ms, cost: 3, maxWait: time.Second, allowed: false, retry: ratelimit.Never, reset: 600 * ms},
		// No wait allowed: a plain decision.
		{at: 300 * ms, cost: 1, maxWait: 0, allowed: false, retry: 300 * ms, reset: 400 * ms},
		// Long after: a full bucket again.
		{at: 2 * time.Second, cost: 2, maxWait: 300 * ms, allowed: true, wait: 0, reset: 200 * ms, remain: 0},
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			r := &ratelimit.Rule{Name: "r", Algorithm: alg, Quota: 10, Period: time.Second, Burst: 2}
			start := time.Unix(1_700_000_000, 0)
			var s ratelimit.State
			for i, st := range steps {
				rr, err := r.ReservingFor(st.cost, st.maxWait)
				if err != nil {
					t.Fatal(err)
				}
				if err := rr.Validate(); err != nil {
					t.Fatalf("step %d: reserving rule: %v", i, err)
				}
				before := ratelimit.CloneState(s)
				d := rr.Decide(&s, start.Add(st.at), st.cost)
				wait := r.ReserveOutcome(&d)
				want := ratelimit.Decision{Allowed: st.allowed, Capacity: 2, Remaining: st.remain, ResetAfter: st.reset, RetryAfter: st.retry, Rule: "r"}
				switch {
				case !st.allowed && st.retry == ratelimit.Never:
					want.Reason = ratelimit.ReasonExceedsCapacity
				case !st.allowed:
					want.Reason = ratelimit.ReasonLimited
				}
				if d != want || wait != st.wait {
					t.Fatalf("step %d (at %v, cost %d, maxWait %v):\n got %+v wait %v\nwant %+v wait %v", i, st.at, st.cost, st.maxWait, d, wait, want, st.wait)
				}
				if !d.Allowed && !ratelimit.StatesEqual(before, s) {
					t.Fatalf("step %d: a denied reservation changed the state from %+v to %+v", i, before, s)
				}
			}
		})
	}
}

// TestReserveSendsConform reserves at random instants, costs and waits
// on one key, then replays the sends at the instants each admitted
// reservation was told, in time order, through the original rule on a
// fresh state: every one must be admitted. Each denied reservation must
// have needed more than its maxWait (in whole intervals), and the same
// reservation is admitted RetryAfter later, not 1ns sooner.
func TestReserveSendsConform(t *testing.T) {
	for seed := range uint64(50) {
		rnd := rand.New(rand.NewPCG(seed, 7))
		iv := time.Duration(1+rnd.IntN(50)) * time.Millisecond
		burst := int64(1 + rnd.IntN(5))
		alg := []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.LeakyBucket}[rnd.IntN(2)]
		r := &ratelimit.Rule{Name: "r", Algorithm: alg, Quota: 1, Period: iv, Burst: burst}
		start := time.Unix(1_700_000_000, 0)
		var s ratelimit.State
		type send struct {
			at   time.Time
			cost int64
		}
		var sends []send
		now := start
		for range 200 {
			now = now.Add(time.Duration(rnd.Int64N(int64(2 * iv))))
			cost := 1 + rnd.Int64N(burst)
			maxWait := time.Duration(rnd.Int64N(int64(20 * iv)))
			rr, err := r.ReservingFor(cost, maxWait)
			if err != nil {
				t.Fatal(err)
			}
			d := rr.Decide(&s, now, cost)
			wait := r.ReserveOutcome(&d)
			if wait > maxWait {
				t.Fatalf("seed %d: told to wait %v > maxWait %v", seed, wait, maxWait)
			}
			if d.Allowed {
				sends = append(sends, send{now.Add(wait), cost})
				continue
			}
			if d.RetryAfter <= 0 || d.RetryAfter == ratelimit.Never {
				t.Fatalf("seed %d: denied with RetryAfter %v", seed, d.RetryAfter)
			}
			if p := rr.Peek(&s, now.Add(d.RetryAfter), cost); !p.Allowed {
				t.Fatalf("seed %d: denied with RetryAfter %v, but the same reservation then is denied too: %+v", seed, d.RetryAfter, p)
			}
			if p := rr.Peek(&s, now.Add(d.RetryAfter-1), cost); p.Allowed {
				t.Fatalf("seed %d: RetryAfter %v is not the least: 1ns earlier admits", seed, d.RetryAfter)
			}
			if need := d.ResetAfter + time.Duration(cost)*iv - time.Duration(burst)*iv; need <= maxWait/iv*iv {
				t.Fatalf("seed %d: denied a reservation needing %v, within maxWait %v in whole intervals", seed, need, maxWait)
			}
		}
		slices.SortStableFunc(sends, func(a, b send) int { return a.at.Compare(b.at) })
		var replay ratelimit.State
		for i, sd := range sends {
			if d := r.Decide(&replay, sd.at, sd.cost); !d.Allowed {
				t.Fatalf("seed %d (%s, interval %v, burst %d): send %d of cost %d at %v refused by the rule: %+v", seed, alg, iv, burst, i, sd.cost, sd.at.Sub(start), d)
			}
		}
		if len(sends) < 50 {
			t.Fatalf("seed %d: only %d of 200 reservations admitted; the test exercises too little", seed, len(sends))
		}
	}
}

func TestReservingRefuses(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingLog, ratelimit.SlidingWindow} {
		r := &ratelimit.Rule{Name: "per_minute", Algorithm: alg, Quota: 10, Period: time.Minute}
		_, err := r.Reserving(time.Second)
		if !errors.Is(err, ratelimit.ErrNotReservable) || !strings.Contains(err.Error(), `"per_minute"`) || !strings.Contains(err.Error(), alg.String()) {
			t.Errorf("%s: Reserving = %v; want ErrNotReservable naming the rule and its algorithm", alg, err)
		}
	}
	r := &ratelimit.Rule{Name: "b", Quota: 10, Period: time.Second}
	if _, err := r.Reserving(-time.Second); !errors.Is(err, ratelimit.ErrNotReservable) {
		t.Errorf("negative wait: %v", err)
	}
	// No whole interval in the wait, strict already: the rule itself.
	if rr, _ := r.Reserving(99 * time.Millisecond); rr != r {
		t.Errorf("Reserving(99ms) of 10/s = %+v; want the rule itself", rr)
	}
	// Batched counting: strict for the reservation, capacity unchanged.
	r.Counting = ratelimit.Batched
	if rr, _ := r.Reserving(0); rr == r || rr.Counting != ratelimit.Strict || rr.Capacity() != 10 {
		t.Errorf("Reserving(0) of a batched rule = %+v; want a strict copy", rr)
	}
	// A rule at the edge of Validate's bounds stays valid.
	huge := &ratelimit.Rule{Name: "h", Quota: ratelimit.MaxQuota, Period: time.Hour}
	rr, err := huge.Reserving(time.Hour)
	if err != nil || rr.Validate() != nil || rr.Capacity() > ratelimit.MaxQuota {
		t.Errorf("huge: %+v, %v, validate %v", rr, err, rr.Validate())
	}
}
