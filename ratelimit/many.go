package ratelimit

import "time"

// DecideMany decides the items of one request all or nothing, as a Store
// must, against the states the Store keeps, which it only reads: kept[i]
// is the state of the key of items[i], or nil for a key the Store does not
// hold (the zero State). Items of one key are those with the same kept
// state or, for keys not held, the same Key.
//
// The items are decided in order, each on a working copy of its key's
// state, work[i]: the state as the key's previous item in the request left
// it, or as kept for the key's first item. So a key's second item sees what
// its first consumed. Deciding stops at the first denial. work must hold at
// least len(items) states, which DecideMany overwrites. It appends one
// Decision per item to dst and reports whether every item was admitted.
//
// When every item is admitted, work[i] is the state of the key of items[i]
// after that item, and the Store keeps, for each key, the work of its last
// item (as it does when it stores work[0], work[1] and so on in turn). When
// an item is denied, the Store keeps nothing, so nothing is consumed, and
// the decisions report each item as it stands: the denied item with its
// decision (taken on its working state, so after what earlier items of its
// key consumed); every other item with what it alone would get, a Peek at
// its cost against its kept state. An item that would be admitted alone is
// reported as a check at cost 0, since nothing was taken: Allowed, with
// Remaining as it stands.
func DecideMany(dst []Decision, items []Item, now time.Time, kept []*State, work []State) ([]Decision, bool) {
	base := len(dst)
	denied := -1
	for i := range items {
		switch j := sameKeyBefore(items, kept, i); {
		case j >= 0:
			work[i] = work[j].clone()
		case kept[i] != nil:
			work[i] = kept[i].clone()
		default:
			work[i] = State{}
		}
		it := &items[i]
		dst = append(dst, Decision{})
		d := &dst[len(dst)-1]
		it.Rule.DecideInto(d, &work[i], now, it.Cost)
		if !d.Allowed {
			denied = i
			break
		}
	}
	if denied < 0 {
		return dst, true
	}
	dst = append(dst, make([]Decision, len(items)-denied-1)...)
	var fresh State
	for i := range items {
		if i == denied {
			continue
		}
		it, st := &items[i], kept[i]
		if st == nil {
			st = &fresh
		}
		d := it.Rule.Peek(st, now, it.Cost)
		if d.Allowed {
			d = it.Rule.Peek(st, now, 0)
		}
		dst[base+i] = d
	}
	return dst, false
}

// sameKeyBefore returns the last item before item i on the same key, or -1.
func sameKeyBefore(items []Item, kept []*State, i int) int {
	for j := i - 1; j >= 0; j-- {
		if kept[j] == kept[i] && (kept[i] != nil || items[j].Key == items[i].Key) {
			return j
		}
	}
	return -1
}
