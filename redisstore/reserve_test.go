package redisstore

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestReservations decides random reservations (ratelimit.Rule.Reserving:
// the rule with a larger burst, Strict) on Redis and in process, by one
// stepped clock, and wants the same decisions, so that the waits a
// reservation is told (from ResetAfter) and its RetryAfter are the
// algorithms' own on every path decide.lua takes: GCRA and LeakyBucket, a
// batched rule's reservation (decided at the shared counter, as strict),
// costs above the capacity.
func TestReservations(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Unix(1_800_000_000, 0)
	s := newTestStore(t, []string{srv.Addr()}, func() time.Time { return now }, nil)
	rnd := rand.New(rand.NewPCG(1, 2))
	rules := []*ratelimit.Rule{
		{Name: "gcra", Quota: 20, Period: time.Second, Burst: 2},
		{Name: "leaky", Algorithm: ratelimit.LeakyBucket, Quota: 20, Period: time.Second, Burst: 3},
		{Name: "batched", Quota: 20, Period: time.Second, Burst: 2, Counting: ratelimit.Batched},
	}
	for _, r := range rules {
		var local ratelimit.State
		key := "reserve:" + r.Name
		admitted := 0
		for i := range 300 {
			now = now.Add(time.Duration(rnd.Int64N(int64(60 * time.Millisecond))))
			cost := 1 + rnd.Int64N(r.Capacity()+1) // now and then above the capacity
			maxWait := time.Duration(rnd.Int64N(int64(500 * time.Millisecond)))
			rr, err := r.ReservingFor(cost, maxWait)
			if err != nil {
				t.Fatal(err)
			}
			ds, err := s.Decide(t.Context(), nil, []ratelimit.Item{{Key: key, Rule: rr, Cost: cost}})
			if err != nil {
				t.Fatal(err)
			}
			want := rr.Decide(&local, now, cost)
			got := ds[0]
			if got.Allowed != want.Allowed || got.Reason != want.Reason || got.ResetAfter != want.ResetAfter || got.RetryAfter != want.RetryAfter || got.Remaining != want.Remaining {
				t.Fatalf("%s, step %d (cost %d, max wait %v):\nRedis      %+v\nin process %+v", r.Name, i, cost, maxWait, got, want)
			}
			if r.ReserveOutcome(&got) > maxWait {
				t.Fatalf("%s, step %d: told to wait more than %v", r.Name, i, maxWait)
			}
			if got.Allowed {
				admitted++
			}
		}
		if admitted < 50 || admitted > 250 {
			t.Errorf("%s: %d of 300 admitted; the test exercises too little", r.Name, admitted)
		}
	}
}
