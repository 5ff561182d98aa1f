package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/service"
)

// An OverrideStore keeps the runtime overrides of rule limits where every
// replica of the service finds them. Expiry is given as a duration, so a
// shared store measures it on its own clock; List converts what remains
// into instants of this process's clock.
type OverrideStore interface {
	// List returns the overrides in force.
	List(ctx context.Context) ([]service.RuleOverride, error)
	// Put sets the override of o.Domain/o.Rule (o.Expires is ignored) for
	// ttl, replacing any previous one.
	Put(ctx context.Context, o service.RuleOverride, ttl time.Duration) error
	// Delete removes the override of domain/rule and reports whether
	// there was one.
	Delete(ctx context.Context, domain, rule string) (bool, error)
}

// MemoryOverrides is an OverrideStore in this process only: for a single
// replica, or replicas with separate counters (the memory store). Its zero
// value is ready to use, with time.Now as the clock; it is safe for
// concurrent use.
type MemoryOverrides struct {
	Now func() time.Time // nil means time.Now

	mu sync.Mutex
	m  map[[2]string]service.RuleOverride
}

func (m *MemoryOverrides) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// List implements OverrideStore; it forgets expired overrides.
func (m *MemoryOverrides) List(context.Context) ([]service.RuleOverride, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make([]service.RuleOverride, 0, len(m.m))
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

// Put implements OverrideStore.
func (m *MemoryOverrides) Put(_ context.Context, o service.RuleOverride, ttl time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = make(map[[2]string]service.RuleOverride)
	}
	o.Expires = m.now().Add(ttl)
	m.m[[2]string{o.Domain, o.Rule}] = o
	return nil
}

// Delete implements OverrideStore.
func (m *MemoryOverrides) Delete(_ context.Context, domain, rule string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{domain, rule}
	_, ok := m.m[k]
	delete(m.m, k)
	return ok, nil
}

func sortOverrides(list []service.RuleOverride) {
	sort.Slice(list, func(i, j int) bool {
		if list[i].Domain != list[j].Domain {
			return list[i].Domain < list[j].Domain
		}
		return list[i].Rule < list[j].Rule
	})
}

// RedisOverrides is an OverrideStore in one Redis hash, shared by every
// replica that uses the same Redis and prefix. Expiry is kept as an
// instant of the Redis server's clock (TIME) and compared with it only,
// so replicas never compare their own clocks. Replicas learn of a change
// by polling (see OverrideSync), so a change reaches every replica within
// one poll interval plus a round trip; the replica that made it applies it
// at once.
type RedisOverrides struct {
	c         redis.UniversalClient
	key       string
	put, list *redis.Script
}

// NewRedisOverrides returns a RedisOverrides in the hash prefix+"overrides".
func NewRedisOverrides(c redis.UniversalClient, prefix string) *RedisOverrides {
	return &RedisOverrides{c: c, key: prefix + "overrides", put: redis.NewScript(putLua), list: redis.NewScript(listLua)}
}

// Both scripts read the server's clock in milliseconds.
const (
	// putLua: KEYS[1] hash, ARGV[1] field, ARGV[2] value, ARGV[3] ttl ms.
	putLua = `local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', exp) .. '|' .. ARGV[2])
return 1`
	// listLua: returns the server time in ms and the fields in force with
	// their remaining ms; deletes the expired ones.
	listLua = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local v = all[i + 1]
  local sep = string.find(v, '|', 1, true)
  local exp = sep and tonumber(string.sub(v, 1, sep - 1))
  if not exp or exp <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    table.insert(out, string.format('%d', exp - now))
    table.insert(out, string.sub(v, sep + 1))
  end
end
return out`
)

// redisOverride is the JSON value of one override in the hash.
type redisOverride struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	Limit  int64  `json:"limit"`
	Burst  int64  `json:"burst,omitempty"`
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}

func redisField(domain, rule string) string {
	b, _ := json.Marshal([2]string{domain, rule})
	return string(b)
}

// List implements OverrideStore.
func (r *RedisOverrides) List(ctx context.Context) ([]service.RuleOverride, error) {
	start := time.Now()
	res, err := r.list.Run(ctx, r.c, []string{r.key}).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("httpapi: listing overrides in Redis: %w", err)
	}
	out := make([]service.RuleOverride, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		ms, err := strconv.ParseInt(res[i], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("httpapi: override expiry %q: %w", res[i], err)
		}
		var v redisOverride
		if err := json.Unmarshal([]byte(res[i+1]), &v); err != nil {
			return nil, fmt.Errorf("httpapi: override value %q: %w", res[i+1], err)
		}
		out = append(out, service.RuleOverride{
			Domain: v.Domain, Rule: v.Rule, Limit: v.Limit, Burst: v.Burst, By: v.By, Reason: v.Reason,
			// Measured from before the call: an override never lasts
			// longer here than on the server.
			Expires: start.Add(time.Duration(ms) * time.Millisecond),
		})
	}
	sortOverrides(out)
	return out, nil
}

// Put implements OverrideStore.
func (r *RedisOverrides) Put(ctx context.Context, o service.RuleOverride, ttl time.Duration) error {
	v, err := json.Marshal(redisOverride{Domain: o.Domain, Rule: o.Rule, Limit: o.Limit, Burst: o.Burst, By: o.By, Reason: o.Reason})
	if err != nil {
		return err
	}
	ms := max(ttl.Milliseconds(), 1)
	if err := r.put.Run(ctx, r.c, []string{r.key}, redisField(o.Domain, o.Rule), string(v), ms).Err(); err != nil {
		return fmt.Errorf("httpapi: storing an override in Redis: %w", err)
	}
	return nil
}

// Delete implements OverrideStore.
func (r *RedisOverrides) Delete(ctx context.Context, domain, rule string) (bool, error) {
	n, err := r.c.HDel(ctx, r.key, redisField(domain, rule)).Result()
	if err != nil {
		return false, fmt.Errorf("httpapi: deleting an override in Redis: %w", err)
	}
	return n > 0, nil
}

// DefaultOverridePoll is how often OverrideSync re-reads a shared store
// when OverrideSync.Every is 0: the propagation delay of an override to
// the other replicas.
const DefaultOverridePoll = time.Second

// OverrideSync keeps a service's Overrides equal to an OverrideStore.
// Run polls; Sync reads once (the admin API calls it after each change,
// so the replica that made a change applies it at once).
type OverrideSync struct {
	Store     OverrideStore
	Overrides *service.Overrides
	// Every is the poll interval; 0 means DefaultOverridePoll.
	Every time.Duration
	// Logger logs failed polls; nil discards.
	Logger *slog.Logger

	mu      sync.Mutex // serialises syncs
	lastErr string
}

// Sync reads the store once and applies what it holds.
func (s *OverrideSync) Sync(ctx context.Context) error {
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
func (s *OverrideSync) Run(ctx context.Context) error {
	every := s.Every
	if every <= 0 {
		every = DefaultOverridePoll
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
