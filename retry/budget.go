package retry

import (
	"sync"
	"time"
)

// Default values of NewBudget's arguments, the clients' documented
// defaults.
const (
	DefaultRatio      = 0.1
	DefaultWindow     = 10 * time.Second
	DefaultMinRetries = 10
)

// slots is the number of slots of the sliding window.
const slots = 10

// A Budget bounds the retries of a client, in the spirit of gRPC's retry
// throttling: it counts requests and retries in a sliding window of ten
// slots and allows a retry while retries, that one included, stay within
// minRetries + ratio × requests. A client that shares one Budget among all
// its calls thus adds at most that fraction of load to a service that is
// refusing it, however many calls fail at once, while a quiet client may
// still retry minRetries times per window.
//
// Its methods take the time, so that tests may use fixed instants (or a
// caller its own clock). Make one with NewBudget; the zero value is not
// usable. A Budget is safe for concurrent use.
type Budget struct {
	ratio float64
	min   int64
	slot  time.Duration // the length of one slot

	mu    sync.Mutex
	slots [slots]slot
}

// A slot counts the requests and retries of one slot of time.
type slot struct {
	index             int64 // which slot of time this is
	requests, retries int64
}

// NewBudget returns a Budget that allows ratio retries per request of the
// last window, plus minRetries. Each takes its default when 0 (ratio and
// window also when negative); a negative minRetries means none.
func NewBudget(ratio float64, minRetries int, window time.Duration) *Budget {
	if ratio <= 0 {
		ratio = DefaultRatio
	}
	if window <= 0 {
		window = DefaultWindow
	}
	switch {
	case minRetries == 0:
		minRetries = DefaultMinRetries
	case minRetries < 0:
		minRetries = 0
	}
	return &Budget{ratio: ratio, min: int64(minRetries), slot: max(window/slots, 1)}
}

// at returns the slot of now, reset if it held an older slot of time;
// b.mu is held.
func (b *Budget) at(now time.Time) *slot {
	i := now.UnixNano() / int64(b.slot)
	s := &b.slots[(i%slots+slots)%slots]
	if s.index != i {
		*s = slot{index: i}
	}
	return s
}

// Request counts a request made at now (not its retries).
func (b *Budget) Request(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.at(now).requests++
}

// Retry reports whether a retry at now is within the budget, and if so
// counts it.
func (b *Budget) Retry(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.at(now)
	var reqs, retries int64
	for i := range b.slots {
		if s := &b.slots[i]; cur.index-s.index < slots {
			reqs += s.requests
			retries += s.retries
		}
	}
	if float64(retries+1) > float64(b.min)+b.ratio*float64(reqs) {
		return false
	}
	cur.retries++
	return true
}
