package storetest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// refStore is the smallest Store that should pass the suite: one mutex,
// a map of states, and Rule.Decide with a snapshot to roll back.
type refStore struct {
	now    func() time.Time
	mu     sync.Mutex
	states map[string]*ratelimit.State
}

func (s *refStore) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	for _, it := range items {
		if it.Rule == nil {
			return dst, fmt.Errorf("refstore: key %q: %w: no rule", it.Key, ratelimit.ErrInvalidRule)
		}
		if err := it.Rule.Validate(); err != nil {
			return dst, fmt.Errorf("refstore: key %q: %w", it.Key, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	saved := make(map[string]ratelimit.State, len(items))
	allowed := true
	for _, it := range items {
		st, ok := s.states[it.Key]
		if !ok {
			st = &ratelimit.State{}
			s.states[it.Key] = st
		}
		if _, ok := saved[it.Key]; !ok {
			c := *st
			c.Log = append([]ratelimit.LogEntry(nil), st.Log...)
			saved[it.Key] = c
		}
		d := it.Rule.Decide(st, now, it.Cost)
		allowed = allowed && d.Allowed
		dst = append(dst, d)
	}
	if !allowed {
		for k, st := range saved {
			*s.states[k] = st
		}
	}
	return dst, nil
}

func TestReferenceStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		return &refStore{now: now, states: map[string]*ratelimit.State{}}
	})
}
