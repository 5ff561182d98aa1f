package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

func TestStateAndReset(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, []string{srv.Addr()}, nil, nil)
	ctx := context.Background()
	gcra := &ratelimit.Rule{Name: "g", Quota: 5, Period: time.Minute}
	log := &ratelimit.Rule{Name: "l", Algorithm: ratelimit.SlidingLog, Quota: 5, Period: time.Minute}
	for _, it := range []ratelimit.Item{{Key: "{t}g", Rule: gcra, Cost: 5}, {Key: "{t}l", Rule: log, Cost: 2}, {Key: "{t}l", Rule: log, Cost: 1}} {
		if ds, err := s.Decide(ctx, nil, []ratelimit.Item{it}); err != nil || !ds[0].Allowed {
			t.Fatalf("%s: %v %+v", it.Key, err, ds)
		}
	}
	if st, ok, err := s.State(ctx, "{t}g"); err != nil || !ok || st.Algorithm != ratelimit.GCRA || st.T == 0 {
		t.Fatalf("State(g) = %+v, %v, %v", st, ok, err)
	}
	if st, ok, err := s.State(ctx, "{t}l"); err != nil || !ok || st.Algorithm != ratelimit.SlidingLog || st.N != 3 || len(st.Log) == 0 {
		t.Fatalf("State(l) = %+v, %v, %v", st, ok, err)
	}
	if _, ok, err := s.State(ctx, "{t}never"); err != nil || ok {
		t.Fatalf("State of an unknown key: %v %v", ok, err)
	}
	for _, k := range []string{"{t}g", "{t}l"} {
		if err := s.Reset(ctx, k); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.State(ctx, k); err != nil || ok {
			t.Fatalf("%s still held after Reset: %v %v", k, ok, err)
		}
	}
	if ds, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "{t}g", Rule: gcra, Cost: 5}}); err != nil || !ds[0].Allowed {
		t.Fatalf("after Reset the full capacity is not back: %v %+v", err, ds)
	}
}
