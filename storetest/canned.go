package storetest

import (
	"context"

	"github.com/sluicehq/sluice/ratelimit"
)

// A Canned store answers every Decide with the same decisions and error,
// whatever it is asked: a stand-in for a store that misbehaves (fails,
// fails closed, answers the wrong number of decisions), for the tests of
// code that must cope with one. Its decision i carries the rule name and
// capacity of item i, when there is one. It keeps no state and is safe for
// concurrent use.
type Canned struct {
	Decisions []ratelimit.Decision
	Err       error
}

// Decide implements ratelimit.Store.
func (s Canned) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	for i, d := range s.Decisions {
		if i < len(items) {
			d.Rule, d.Capacity = items[i].Rule.Name, items[i].Rule.Capacity()
		}
		dst = append(dst, d)
	}
	return dst, s.Err
}
