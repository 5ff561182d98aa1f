package overrides

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/redisstore"
)

// A Store keeps the runtime overrides of rule limits where every replica
// of the service finds them. Expiry is given as a duration, so a
// shared store measures it on its own clock; List converts what remains
// into instants of this process's clock.
type Store interface {
	// List returns the overrides in force.
	List(ctx context.Context) ([]service.Override, error)
	// Put sets the override of o.Domain/o.Rule (o.Expires is ignored) for
	// ttl, replacing any previous one.
	Put(ctx context.Context, o service.Override, ttl time.Duration) error
	// Delete removes the override of domain/rule and reports whether
	// there was one.
	Delete(ctx context.Context, domain, rule string) (bool, error)
}

// MemoryStore is a Store in this process only: for a single
// replica, or replicas with separate counters (the memory store). Its zero
// value is ready to use, with time.Now as the clock; it is safe for
// concurrent use.
type MemoryStore struct {
	Now func() time.Time // nil means time.Now

	mu sync.Mutex
	m  map[[2]string]service.Override
}

func (m *MemoryStore) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// List implements Store; it forgets expired overrides.
func (m *MemoryStore) List(context.Context) ([]service.Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make([]service.Override, 0, len(m.m))
	for k, o := range m.m {
		if !now.Before(o.Expires) {
			delete(m.m, k)
			continue
		}
		out = append(out, o)
	}
	sortOverrides(out)
	return out, nil
}

// Put implements Store.
func (m *MemoryStore) Put(_ context.Context, o service.Override, ttl time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = make(map[[2]string]service.Override)
	}
	o.Expires = m.now().Add(ttl)
	m.m[[2]string{o.Domain, o.Rule}] = o
	return nil
}

// Delete implements Store.
func (m *MemoryStore) Delete(_ context.Context, domain, rule string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{domain, rule}
	_, ok := m.m[k]
	delete(m.m, k)
	return ok, nil
}

func sortOverrides(list []service.Override) {
	sort.Slice(list, func(i, j int) bool {
		if list[i].Domain != list[j].Domain {
			return list[i].Domain < list[j].Domain
		}
		return list[i].Rule < list[j].Rule
	})
}

// RedisStore is a Store in a redisstore.ExpiringHash, shared by every
// replica that uses the same Redis and prefix: each override is one entry,
// expiring by the Redis server's clock. Replicas learn of a change by
// polling (see Sync), so a change reaches every replica
// within one poll interval plus a round trip; the replica that made it
// applies it at once.
type RedisStore struct {
	h *redisstore.ExpiringHash
}

// NewRedisStore returns a RedisStore in h.
func NewRedisStore(h *redisstore.ExpiringHash) *RedisStore {
	return &RedisStore{h: h}
}

// redisOverride is the JSON value of one override in the hash.
type redisOverride struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	Limit  int64  `json:"limit"`
	Burst  int64  `json:"burst,omitempty"`
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// ValidTarget refuses a domain or rule name that is not valid UTF-8: no
// rule file can define one, and JSON, which replaces invalid bytes, would
// store two such names under one field of a RedisStore. The admin API
// checks it before it asks a store, so that such a name is a client's
// error, not the store's.
func ValidTarget(domain, rule string) error {
	if !utf8.ValidString(domain) || !utf8.ValidString(rule) {
		return fmt.Errorf("override of %q/%q: a domain or rule name must be valid UTF-8", domain, rule)
	}
	return nil
}

// redisField is the hash field of the override of domain/rule: the JSON
// array [domain, rule], one field per target since both are valid UTF-8
// (ValidTarget).
func redisField(domain, rule string) string {
	b, _ := json.Marshal([2]string{domain, rule})
	return string(b)
}

// encodeOverride returns the hash field and value of o. It refuses o
// unless every string in it is valid UTF-8, so that decodeOverride gives
// o back (its expiry aside) and distinct targets never share a field.
func encodeOverride(o *service.Override) (field, value string, err error) {
	if err := ValidTarget(o.Domain, o.Rule); err != nil {
		return "", "", fmt.Errorf("overrides: %w", err)
	}
	if !utf8.ValidString(o.By) || !utf8.ValidString(o.Reason) {
		return "", "", fmt.Errorf("overrides: override of %q/%q: by and reason must be valid UTF-8", o.Domain, o.Rule)
	}
	v, err := json.Marshal(redisOverride{Domain: o.Domain, Rule: o.Rule, Limit: o.Quota, Burst: o.Burst, By: o.By, Reason: o.Reason})
	if err != nil {
		return "", "", err
	}
	return redisField(o.Domain, o.Rule), string(v), nil
}

// decodeOverride decodes the value of a hash entry; the override expires
// at expires.
func decodeOverride(value string, expires time.Time) (service.Override, error) {
	var v redisOverride
	if err := json.Unmarshal([]byte(value), &v); err != nil {
		return service.Override{}, fmt.Errorf("overrides: override value %q: %w", value, err)
	}
	return service.Override{Domain: v.Domain, Rule: v.Rule, Quota: v.Limit, Burst: v.Burst, By: v.By, Reason: v.Reason, Expires: expires}, nil
}

// List implements Store.
func (r *RedisStore) List(ctx context.Context) ([]service.Override, error) {
	start := time.Now()
	entries, err := r.h.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("overrides: listing overrides: %w", err)
	}
	out := make([]service.Override, 0, len(entries))
	for _, e := range entries {
		// Measured from before the call: an override never lasts longer
		// here than on the server.
		o, err := decodeOverride(e.Value, start.Add(e.TTL))
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	sortOverrides(out)
	return out, nil
}

// Put implements Store.
func (r *RedisStore) Put(ctx context.Context, o service.Override, ttl time.Duration) error {
	field, v, err := encodeOverride(&o)
	if err != nil {
		return err
	}
	if err := r.h.Put(ctx, field, v, ttl); err != nil {
		return fmt.Errorf("overrides: storing an override: %w", err)
	}
	return nil
}

// Delete implements Store.
func (r *RedisStore) Delete(ctx context.Context, domain, rule string) (bool, error) {
	if err := ValidTarget(domain, rule); err != nil {
		return false, fmt.Errorf("overrides: %w", err)
	}
	ok, err := r.h.Delete(ctx, redisField(domain, rule))
	if err != nil {
		return false, fmt.Errorf("overrides: deleting an override: %w", err)
	}
	return ok, nil
}

// DefaultPoll is how often a Sync re-reads a shared store when its Every
// is 0: the propagation delay of an override to the other replicas.
const DefaultPoll = time.Second

// Sync keeps a service's Overrides (the table it decides with) equal to a
// Store. Run polls; Sync reads once (the admin API calls it after each
// change, so the replica that made a change applies it at once).
type Sync struct {
	Store     Store
	Overrides *service.Overrides
	// Every is the poll interval; 0 means DefaultPoll.
	Every time.Duration
	// Logger logs failed polls; nil discards.
	Logger *slog.Logger

	mu      sync.Mutex // serialises syncs
	lastErr string
}

// Sync reads the store once and applies what it holds.
func (s *Sync) Sync(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	list, err := s.Store.List(ctx)
	if err != nil {
		return err
	}
	if err := s.Overrides.Replace(list); err != nil {
		// Overrides that do not fit this replica's rules (a rolling
		// update): kept, not applied. Log each distinct error once.
		if msg := err.Error(); msg != s.lastErr && s.Logger != nil {
			s.Logger.Warn("some overrides do not apply to the loaded rules", "err", err)
			s.lastErr = msg
		}
	} else {
		s.lastErr = ""
	}
	return nil
}

// Run polls the store until ctx is done; it returns nil then.
func (s *Sync) Run(ctx context.Context) error {
	every := s.Every
	if every <= 0 {
		every = DefaultPoll
	}
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := s.Sync(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			if s.Logger != nil {
				s.Logger.Warn("reading the overrides failed; keeping the last ones read", "err", err)
			}
			failing = true
		case err == nil && failing:
			if s.Logger != nil {
				s.Logger.Info("reading the overrides works again")
			}
			failing = false
		}
	}
}
