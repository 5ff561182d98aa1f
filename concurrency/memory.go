package concurrency

import (
	"context"
	"sync"
	"time"
)

// A MemoryStore is a Store in this process's memory, for tests and for
// programs that run as a single process. Expiry is measured on the
// process's monotonic clock. A semaphore's entry is deleted when its last
// holder leaves, so memory is bounded by the permits held.
//
// A MemoryStore is safe for concurrent use; its zero value is ready to
// use.
type MemoryStore struct {
	mu   sync.Mutex
	sems map[string]map[string]time.Time // name -> token -> expiry
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

// Acquire implements Store.
func (m *MemoryStore) Acquire(ctx context.Context, name, token string, limit int64, ttl time.Duration) (bool, error) {
	return m.AcquireAt(time.Now(), name, token, limit, ttl), nil
}

// Renew implements Store.
func (m *MemoryStore) Renew(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	return m.RenewAt(time.Now(), name, token, ttl), nil
}

// Release implements Store.
func (m *MemoryStore) Release(ctx context.Context, name, token string) (bool, error) {
	return m.ReleaseToken(name, token), nil
}

// AcquireAt is Acquire at the instant now.
func (m *MemoryStore) AcquireAt(now time.Time, name, token string, limit int64, ttl time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	holders := m.sems[name]
	for tok, exp := range holders {
		if !now.Before(exp) {
			delete(holders, tok)
		}
	}
	if _, ok := holders[token]; !ok && int64(len(holders)) >= limit {
		m.forgetEmpty(name, holders)
		return false
	}
	if holders == nil {
		if m.sems == nil {
			m.sems = make(map[string]map[string]time.Time)
		}
		holders = make(map[string]time.Time)
		m.sems[name] = holders
	}
	holders[token] = now.Add(ttl)
	return true
}

// RenewAt is Renew at the instant now.
func (m *MemoryStore) RenewAt(now time.Time, name, token string, ttl time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	holders := m.sems[name]
	exp, ok := holders[token]
	if !ok {
		return false
	}
	if !now.Before(exp) {
		delete(holders, token)
		m.forgetEmpty(name, holders)
		return false
	}
	holders[token] = now.Add(ttl)
	return true
}

// ReleaseToken removes token's permit of name and reports whether there was
// one (expired or not).
func (m *MemoryStore) ReleaseToken(name, token string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	holders := m.sems[name]
	if _, ok := holders[token]; !ok {
		return false
	}
	delete(holders, token)
	m.forgetEmpty(name, holders)
	return true
}

// HoldersAt returns the number of unexpired permits of name at now.
func (m *MemoryStore) HoldersAt(now time.Time, name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, exp := range m.sems[name] {
		if now.Before(exp) {
			n++
		}
	}
	return n
}

func (m *MemoryStore) forgetEmpty(name string, holders map[string]time.Time) {
	if len(holders) == 0 {
		delete(m.sems, name)
	}
}
