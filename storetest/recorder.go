package storetest

import (
	"context"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/ratelimit"
)

// A Recorder is a store that admits everything and records the key of
// every item it is asked to decide: for tests of what keys a caller
// builds (that two different requests never share one, say). Its zero
// value is ready to use, and it is safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	keys []string
}

// Decide implements ratelimit.Store: each item is admitted with one unit
// remaining.
func (r *Recorder) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range items {
		r.keys = append(r.keys, it.Key)
		dst = append(dst, ratelimit.Decision{Allowed: true, Capacity: it.Rule.Capacity(), Remaining: 1, Rule: it.Rule.Name})
	}
	return dst, nil
}

// Take returns the keys recorded since the last Take, sorted, and forgets
// them.
func (r *Recorder) Take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys
	r.keys = nil
	slices.Sort(k)
	return k
}
