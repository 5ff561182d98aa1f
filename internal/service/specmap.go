package service

import (
	"maps"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/rules"
)

// A specMap holds a value per rule (a rule's counters, its tracker) for the
// decision path to read without a lock. It publishes the entries of the
// newest rule set and those of the set before it: SetRules prepares the
// new set's entries before the new set is in use, and a decision made on
// the set being replaced looks its rule up after, so without the older
// entries it would find none (and be counted nowhere, or as another
// rule's). Entries older than that are dropped, so memory is two sets'
// worth. The zero value publishes nothing; publish is called with the
// owner's lock held.
type specMap[T any] struct {
	newest map[*rules.Spec]T
	all    atomic.Pointer[map[*rules.Spec]T]
}

// publish makes next the newest set's entries.
func (m *specMap[T]) publish(next map[*rules.Spec]T) {
	both := maps.Clone(next)
	for sp, v := range m.newest {
		if _, ok := both[sp]; !ok {
			both[sp] = v
		}
	}
	m.newest = next
	m.all.Store(&both)
}

// load returns the entries published, for a request to look its rules up
// in with one atomic load; nil (no entries) before the first publish.
func (m *specMap[T]) load() map[*rules.Spec]T {
	if p := m.all.Load(); p != nil {
		return *p
	}
	return nil
}
