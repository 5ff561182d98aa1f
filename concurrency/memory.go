package concurrency

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// A MemoryStore is a Store in this process's memory, for tests and for
// programs that run as a single process: a FairStore, with weighted
// permits and waiters in arrival order. Expiry is measured on the
// process's monotonic clock. A semaphore's entry is deleted when its last
// holder and waiter leave, so memory is bounded by the permits held and
// the waiters queued, plus one fence counter (a uint64) for every name
// ever granted: a fence never goes back, so the counter outlives the
// holders.
//
// A MemoryStore is safe for concurrent use; its zero value is ready to
// use.
type MemoryStore struct {
	mu     sync.Mutex
	sems   map[string]*memSem
	fences map[string]uint64 // the last fence granted, per name
}

var _ FairStore = (*MemoryStore)(nil)

// memSem is one semaphore: its holders, and its waiters in arrival order
// with the instant each one's place lapses.
type memSem struct {
	holders map[string]memHolder
	queue   []string
	placed  map[string]time.Time
}

type memHolder struct {
	expiry time.Time
	since  time.Time // the grant; a renewal keeps it
	weight int64
	fence  uint64
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

// Acquire implements Store. It records no waiter: a MemoryStore is no
// Notifier, and its Distributed wakes its own waiters.
func (m *MemoryStore) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	return m.AcquireAt(time.Now(), name, token, limit, ttl), nil
}

// AcquireFair implements FairStore.
func (m *MemoryStore) AcquireFair(ctx context.Context, name, token string, weight, limit int64, ttl, wait time.Duration) (FairResult, uint64, error) {
	res, fence := m.AcquireFairAt(time.Now(), name, token, weight, limit, ttl, wait)
	return res, fence, nil
}

// Dequeue implements FairStore.
func (m *MemoryStore) Dequeue(ctx context.Context, name, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sems[name]; s != nil {
		s.unqueue(token)
		m.forgetEmpty(name, s)
	}
	return nil
}

// Renew implements Store.
func (m *MemoryStore) Renew(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	return m.RenewAt(time.Now(), name, token, ttl), nil
}

// Release implements Store.
func (m *MemoryStore) Release(ctx context.Context, name, token string) (bool, error) {
	return m.ReleaseToken(name, token), nil
}

// sem returns name's semaphore, created if need be, with its expired
// holders forgotten at now. m.mu is held.
func (m *MemoryStore) sem(now time.Time, name string) *memSem {
	s := m.sems[name]
	if s == nil {
		if m.sems == nil {
			m.sems = make(map[string]*memSem)
		}
		s = &memSem{holders: map[string]memHolder{}, placed: map[string]time.Time{}}
		m.sems[name] = s
	}
	for tok, h := range s.holders {
		if !now.Before(h.expiry) {
			delete(s.holders, tok)
		}
	}
	return s
}

// used returns the weight held.
func (s *memSem) used() int64 {
	var n int64
	for _, h := range s.holders {
		n += h.weight
	}
	return n
}

// lapse takes the waiters whose place lapsed at now off the head of the
// line.
func (s *memSem) lapse(now time.Time) {
	for len(s.queue) > 0 && !now.Before(s.placed[s.queue[0]]) {
		delete(s.placed, s.queue[0])
		s.queue = s.queue[1:]
	}
}

func (s *memSem) unqueue(token string) {
	if _, ok := s.placed[token]; ok {
		delete(s.placed, token)
		s.queue = slices.DeleteFunc(s.queue, func(t string) bool { return t == token })
	}
}

// AcquireAt is Acquire at the instant now: a permit of weight 1, unless
// waiters queue (AcquireFairAt). It returns the permit's fence, or 0 when
// the semaphore is full or others queue.
func (m *MemoryStore) AcquireAt(now time.Time, name, token string, limit int64, ttl time.Duration) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sem(now, name)
	if h, held := s.holders[token]; held {
		return s.extend(token, h, now.Add(ttl))
	}
	s.lapse(now)
	if len(s.queue) > 0 || s.used()+1 > limit {
		m.forgetEmpty(name, s)
		return 0
	}
	return m.grant(s, name, token, memHolder{expiry: now.Add(ttl), since: now, weight: 1})
}

// extend moves held token's expiry and returns its fence, which a renewal
// keeps.
func (s *memSem) extend(token string, h memHolder, expiry time.Time) uint64 {
	h.expiry = expiry
	s.holders[token] = h
	return h.fence
}

// grant adds token as a holder of name with the next fence of name, and
// returns that fence. m.mu is held.
func (m *MemoryStore) grant(s *memSem, name, token string, h memHolder) uint64 {
	if m.fences == nil {
		m.fences = make(map[string]uint64)
	}
	m.fences[name]++
	h.fence = m.fences[name]
	s.holders[token] = h
	return h.fence
}

// AcquireFairAt is AcquireFair at the instant now.
func (m *MemoryStore) AcquireFairAt(now time.Time, name, token string, weight, limit int64, ttl, wait time.Duration) (FairResult, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sem(now, name)
	if h, held := s.holders[token]; held {
		return Granted, s.extend(token, h, now.Add(ttl))
	}
	s.lapse(now)
	first := len(s.queue) == 0 || s.queue[0] == token
	if first && s.used()+weight <= limit {
		s.unqueue(token)
		return Granted, m.grant(s, name, token, memHolder{expiry: now.Add(ttl), since: now, weight: weight})
	}
	if wait > 0 {
		if _, queued := s.placed[token]; !queued {
			s.queue = append(s.queue, token)
		}
		s.placed[token] = now.Add(wait)
	}
	m.forgetEmpty(name, s)
	if first {
		return First, 0
	}
	return Queued, 0
}

// RenewAt is Renew at the instant now.
func (m *MemoryStore) RenewAt(now time.Time, name, token string, ttl time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sems[name]
	if s == nil {
		return false
	}
	h, ok := s.holders[token]
	if !ok {
		return false
	}
	if !now.Before(h.expiry) {
		delete(s.holders, token)
		m.forgetEmpty(name, s)
		return false
	}
	h.expiry = now.Add(ttl)
	s.holders[token] = h
	return true
}

// ReleaseToken removes token's permit of name and reports whether there was
// one (expired or not).
func (m *MemoryStore) ReleaseToken(name, token string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sems[name]
	if s == nil {
		return false
	}
	if _, ok := s.holders[token]; !ok {
		return false
	}
	delete(s.holders, token)
	m.forgetEmpty(name, s)
	return true
}

// Holders implements Store.
func (m *MemoryStore) Holders(ctx context.Context, name string) (Listing, error) {
	return m.ListAt(time.Now(), name), nil
}

// ListAt is Holders at the instant now. It forgets nothing: a holder
// expired at now is left out of the listing, not removed.
func (m *MemoryStore) ListAt(now time.Time, name string) Listing {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := Listing{Holders: []Holder{}}
	s := m.sems[name]
	if s == nil {
		return l
	}
	for _, h := range s.holders {
		if now.Before(h.expiry) {
			l.Holders = append(l.Holders, Holder{Fence: h.fence, Weight: h.weight, HeldFor: max(now.Sub(h.since), 0), ExpiresIn: h.expiry.Sub(now)})
		}
	}
	slices.SortFunc(l.Holders, func(a, b Holder) int { return cmp.Compare(a.Fence, b.Fence) })
	for _, tok := range s.queue {
		if now.Before(s.placed[tok]) {
			l.Queued++
		}
	}
	return l
}

// HoldersAt returns the number of unexpired permits of name at now.
func (m *MemoryStore) HoldersAt(now time.Time, name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	if s := m.sems[name]; s != nil {
		for _, h := range s.holders {
			if now.Before(h.expiry) {
				n++
			}
		}
	}
	return n
}

func (m *MemoryStore) forgetEmpty(name string, s *memSem) {
	if len(s.holders) == 0 && len(s.queue) == 0 {
		delete(m.sems, name)
	}
}
