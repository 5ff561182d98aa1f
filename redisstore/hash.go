package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed hash_put.lua
var hashPutLua string

//go:embed hash_list.lua
var hashListLua string

// An ExpiringHash is a small table of string entries, each with its own
// time to live, in one Redis hash: for settings that every replica of a
// service must see, such as runtime overrides of rule limits. An entry's
// expiry is an instant of the Redis server's clock (TIME), set and compared
// there only, so replicas never compare their own clocks; List removes the
// expired entries it meets. Every entry lives in one key, so the table
// suits tens or hundreds of entries, not millions.
//
// An ExpiringHash is safe for concurrent use. Use NewExpiringHash.
type ExpiringHash struct {
	c         redis.UniversalClient
	key       string
	put, list *redis.Script
}

// A HashEntry is one entry of an ExpiringHash and the time it has left.
type HashEntry struct {
	Field, Value string
	TTL          time.Duration
}

// NewExpiringHash returns the table at Redis key key on c, which the caller
// owns and closes.
func NewExpiringHash(c redis.UniversalClient, key string) (*ExpiringHash, error) {
	if c == nil {
		return nil, errors.New("redisstore: nil Redis client")
	}
	if key == "" {
		return nil, errors.New("redisstore: empty hash key")
	}
	return &ExpiringHash{c: c, key: key, put: redis.NewScript(hashPutLua), list: redis.NewScript(hashListLua)}, nil
}

// Put sets field to value for ttl (at least a millisecond), replacing any
// previous value.
func (h *ExpiringHash) Put(ctx context.Context, field, value string, ttl time.Duration) error {
	ms := max(ttl.Milliseconds(), 1)
	if err := h.put.Run(ctx, h.c, []string{h.key}, field, value, ms).Err(); err != nil {
		return fmt.Errorf("redisstore: setting %q in hash %q: %w", field, h.key, err)
	}
	return nil
}

// List returns the entries that have not expired, each with the time it
// has left by the server's clock, and removes the expired ones.
func (h *ExpiringHash) List(ctx context.Context) ([]HashEntry, error) {
	res, err := h.list.Run(ctx, h.c, []string{h.key}).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("redisstore: listing hash %q: %w", h.key, err)
	}
	if len(res)%3 != 0 {
		return nil, fmt.Errorf("redisstore: listing hash %q: %d values, not triples", h.key, len(res))
	}
	out := make([]HashEntry, 0, len(res)/3)
	for i := 0; i < len(res); i += 3 {
		ms, err := strconv.ParseInt(res[i+2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("redisstore: hash %q: time left %q: %w", h.key, res[i+2], err)
		}
		out = append(out, HashEntry{Field: res[i], Value: res[i+1], TTL: time.Duration(ms) * time.Millisecond})
	}
	return out, nil
}

// Delete removes field and reports whether it was there (expired or not).
func (h *ExpiringHash) Delete(ctx context.Context, field string) (bool, error) {
	n, err := h.c.HDel(ctx, h.key, field).Result()
	if err != nil {
		return false, fmt.Errorf("redisstore: deleting %q from hash %q: %w", field, h.key, err)
	}
	return n > 0, nil
}
