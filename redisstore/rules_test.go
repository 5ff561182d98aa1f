package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestRuleValidatedOnce: a valid rule is validated when its arguments are
// first built and then found in the cache; an invalid one is never cached
// and gets Validate's own error on every call, as does a missing rule.
func TestRuleValidatedOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, []string{srv.Addr()}, nil, nil)
	ctx := context.Background()
	good := &ratelimit.Rule{Name: "good", Quota: 5, Period: time.Hour}
	for range 3 {
		if ds, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: good, Cost: 1}}); err != nil || !ds[0].Allowed {
			t.Fatalf("good rule: %v %+v", err, ds)
		}
	}
	if n := s.nrules.Load(); n != 1 {
		t.Fatalf("%d rules cached after three requests of one rule, want 1", n)
	}
	bad := &ratelimit.Rule{Name: "bad", Quota: 5, Period: time.Second, Burst: -1}
	want := bad.Validate()
	for range 2 {
		_, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: good, Cost: 1}, {Key: "b", Rule: bad, Cost: 1}})
		if err == nil || err.Error() != want.Error() || !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Fatalf("invalid rule: error %v, want %v", err, want)
		}
	}
	_, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "n", Rule: nil, Cost: 1}, {Key: "b", Rule: bad, Cost: 1}})
	if err == nil || err.Error() != `ratelimit: invalid rule: item "n" has no rule` || !errors.Is(err, ratelimit.ErrInvalidRule) {
		t.Fatalf("missing rule: error %v", err)
	}
	if n := s.nrules.Load(); n != 1 {
		t.Fatalf("%d rules cached, want 1: an invalid rule must not be cached", n)
	}
	if ds, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: good, Cost: 0}}); err != nil || ds[0].Remaining != 2 {
		t.Fatalf("after the invalid requests: %v %+v, want 2 remaining (only the first three consumed)", err, ds)
	}
}
