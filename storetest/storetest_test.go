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
// a map of states, and ratelimit.DecideMany.
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
	kept := make([]*ratelimit.State, len(items))
	for i, it := range items {
		kept[i] = s.states[it.Key]
	}
	work := make([]ratelimit.State, len(items))
	dst, ok := ratelimit.DecideMany(dst, items, s.now(), kept, work)
	if ok {
		for i, it := range items {
			s.states[it.Key] = &work[i]
		}
	}
	return dst, nil
}

func TestReferenceStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		return &refStore{now: now, states: map[string]*ratelimit.State{}}
	})
}
