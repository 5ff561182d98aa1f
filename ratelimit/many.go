package ratelimit

import "time"

// DecideMany decides items all or nothing, as a Store must, against states
// that the Store keeps; it appends one Decision per item to dst and reports
// whether every item was admitted.
//
// The items are decided in order, each against the working state
// *working(i), and deciding stops at the first denial. working must return
// the same State for items of the same key, so that a key's second item
// sees what its first consumed. When every item is admitted, the working
// states are the request's outcome, for the Store to keep.
//
// When an item is denied, nothing may be consumed. DecideMany then calls
// rollback, if not nil, which must put back every state it changed, and
// reports each item as it stands: the denied item with its decision (taken
// against the working state, so after what earlier items of the same key
// consumed); every other item with what it alone would get, a Peek at its
// cost against original(i), the item's state before the request (the zero
// State for a new key), which Peek only reads. An item that would be
// admitted alone is reported as a check at cost 0, since nothing was taken:
// Allowed, with Remaining as it stands. working is not called after
// rollback, and original only after it.
func DecideMany(dst []Decision, items []Item, now time.Time, working func(i int) *State, rollback func(), original func(i int) State) ([]Decision, bool) {
	base := len(dst)
	denied := -1
	for i := range items {
		it := &items[i]
		dst = append(dst, Decision{})
		d := &dst[len(dst)-1]
		it.Rule.DecideInto(d, working(i), now, it.Cost)
		if !d.Allowed {
			denied = i
			break
		}
	}
	if denied < 0 {
		return dst, true
	}
	if rollback != nil {
		rollback()
	}
	dst = append(dst, make([]Decision, len(items)-denied-1)...)
	for i := range items {
		if i == denied {
			continue
		}
		it := &items[i]
		st := original(i)
		d := it.Rule.Peek(&st, now, it.Cost)
		if d.Allowed {
			d = it.Rule.Peek(&st, now, 0)
		}
		dst[base+i] = d
	}
	return dst, false
}
