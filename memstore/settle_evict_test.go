package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// TestSettledKeyKept: a key a settlement charged past its limit weighs as
// exhausted, not as nearly unused under the settling rule's capacity: a
// flood of fresh keys in its full shard does not evict it (which would
// forget its debt).
func TestSettledKeyKept(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	s := New(Options{MaxKeys: 4, Shards: 1, JanitorInterval: -1, Now: clock.Now})
	defer s.Close()
	ctx := context.Background()
	r := &ratelimit.Rule{Name: "debt", Quota: 10, Period: time.Hour}
	rs := &ratelimit.Reservations{Store: s, Ledger: s, Now: clock.Now}
	id, _, err := rs.Reserve(ctx, nil, []ratelimit.Item{{Key: "debt", Rule: r, Cost: 5}})
	if err != nil || id == "" {
		t.Fatalf("Reserve: %q %v", id, err)
	}
	if _, err := rs.Settle(ctx, id, func(int, *ratelimit.Reserved) (int64, error) { return 30, nil }); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if _, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: fmt.Sprint("fresh", i), Rule: r, Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.State("debt"); !ok {
		t.Fatal("a flood of fresh keys evicted the key in debt")
	}
	ds, _ := s.Decide(ctx, nil, []ratelimit.Item{{Key: "debt", Rule: r, Cost: 1}})
	if ds[0].Allowed {
		t.Fatalf("the key in debt admitted a unit: %+v", ds[0])
	}
}
