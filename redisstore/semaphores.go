package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/concurrency"
)

//go:embed semaphore_acquire.lua
var semaphoreAcquireLua string

//go:embed semaphore_renew.lua
var semaphoreRenewLua string

// DefaultSemaphorePrefix is the default SemaphoreOptions.Prefix.
const DefaultSemaphorePrefix = "sluice:sem:"

// SemaphoreOptions configure a SemaphoreStore.
type SemaphoreOptions struct {
	// Prefix starts every key the store writes; it must not contain "{"
	// or "}". Default DefaultSemaphorePrefix.
	Prefix string
}

// A SemaphoreStore is a concurrency.Store on Redis (standalone, Sentinel or
// Cluster), shared by every process that uses the same server and prefix.
//
// Each semaphore is one sorted set, at Prefix + "{" + enc(name) + "}", where
// enc is the encoding of every caller-chosen string in this package's keys
// (see keys.go): unpadded URL-safe base64 of the name (or "~" and base64 of
// its SHA-256 for names longer than 128 bytes), so that no byte of a name
// can reach another semaphore's key or choose its Cluster slot. Members are the holders' tokens, scored by their expiry in
// milliseconds of the Redis server's clock (TIME), so that holders on
// machines with different clocks agree. The set expires with its last
// holder.
//
// Every operation is one atomic step: acquire and renew are Lua scripts
// (EVALSHA, falling back to EVAL) that read TIME; acquire first removes the
// expired holders, then adds the token if fewer than the limit remain;
// renew extends a token only if it is present and unexpired; release is a
// ZREM of the caller's own token. A semaphore therefore costs one round
// trip per acquire attempt, renewal and release, and an acquire with a
// deadline one more (TIME) when the store has not sampled the node's clock
// for a second.
//
// An acquire with a deadline (the context's, or the client's read timeout)
// carries a cutoff in the server's clock, as Store's decisions do (see
// Deadlines in the package documentation): an acquire that Redis runs only
// after its caller gave up adds no holder, so that no permit is held that
// nobody owns. One without a deadline has no cutoff.
//
// A server that loses its data (a restart without persistence, a failover
// to a replica that had not received the writes) forgets the permits: their
// next renewal fails and each Permit reports Lost. Holders never re-create a
// permit by renewing it. While Redis is unreachable, renewals fail and every
// permit is lost when its validity ends.
//
// Calls honour the context as far as the client does; configure the
// client's read and write timeouts (or ContextTimeoutEnabled) to bound them.
// A Permit reports Lost at the end of its validity whether or not a renewal
// call has returned.
//
// A SemaphoreStore is safe for concurrent use. Use NewSemaphoreStore.
type SemaphoreStore struct {
	c       redis.UniversalClient
	prefix  string
	acquire *redis.Script
	renew   *redis.Script
	sclock  *serverClock
}

var _ concurrency.Store = (*SemaphoreStore)(nil)

// NewSemaphoreStore returns a store of semaphores on c, which the caller
// owns and closes.
func NewSemaphoreStore(c redis.UniversalClient, o SemaphoreOptions) (*SemaphoreStore, error) {
	if c == nil {
		return nil, errors.New("redisstore: nil Redis client")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultSemaphorePrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		// A brace would change the hash tag Redis Cluster reads: every
		// semaphore in one slot, or a tag the names do not choose.
		return nil, fmt.Errorf("redisstore: semaphore prefix %q contains a hash tag brace", o.Prefix)
	}
	return &SemaphoreStore{
		c:       c,
		prefix:  o.Prefix,
		acquire: redis.NewScript(semaphoreAcquireLua),
		renew:   redis.NewScript(semaphoreRenewLua),
		sclock:  newServerClock(c, redis.NewScript(timeLua)),
	}, nil
}

// Key returns the Redis key of the semaphore named name. The empty name's
// key is Prefix + "{}", in which Redis Cluster reads no hash tag and so
// hashes the whole key; that is harmless, since every operation touches one
// key only, and no other name has that key.
func (r *SemaphoreStore) Key(name string) string {
	b := make([]byte, 0, len(r.prefix)+2+encodedLen(len(name)))
	b = append(b, r.prefix...)
	b = append(b, '{')
	b = appendEncoded(b, name)
	return string(append(b, '}'))
}

// ttlMillis converts ttl to milliseconds, rounded up so that the server
// never expires a permit before its holder stops relying on it.
func ttlMillis(ttl time.Duration) int64 {
	return max(int64((ttl+time.Millisecond-1)/time.Millisecond), 1)
}

// Acquire implements concurrency.Store. A call with a deadline (the
// context's, or the client's read timeout) carries its cutoff: if Redis
// runs it only after the caller gave up, it adds no holder (see the
// package documentation, Deadlines).
func (r *SemaphoreStore) Acquire(ctx context.Context, name, token string, limit int64, ttl time.Duration) (bool, error) {
	key := r.Key(name)
	cut := ""
	now := time.Now()
	if d, ok := ctx.Deadline(); ok || r.sclock.readTimeout > 0 {
		if !ok {
			d = now.Add(r.sclock.readTimeout)
		}
		ns, err := r.sclock.cutoff(ctx, key, now, d)
		if err != nil {
			return false, fmt.Errorf("redisstore: semaphore acquire: reading the server's clock: %w", err)
		}
		cut = strconv.FormatInt(max(ns, 1e9), 10)
	}
	n, err := r.acquire.Run(ctx, r.c, []string{key}, token, limit, ttlMillis(ttl), cut).Int64()
	if err == nil && n == -1 {
		if d, ok := ctx.Deadline(); ok && time.Now().Before(d) {
			r.sclock.expired(ctx, key) // answered in time, yet past the cutoff: measure again
		}
		err = errExpired
	}
	if err != nil {
		return false, fmt.Errorf("redisstore: semaphore acquire: %w", err)
	}
	return n == 1, nil
}

// Renew implements concurrency.Store.
func (r *SemaphoreStore) Renew(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	n, err := r.renew.Run(ctx, r.c, []string{r.Key(name)}, token, ttlMillis(ttl)).Int64()
	if err != nil {
		return false, fmt.Errorf("redisstore: semaphore renew: %w", err)
	}
	return n == 1, nil
}

// Release implements concurrency.Store.
func (r *SemaphoreStore) Release(ctx context.Context, name, token string) (bool, error) {
	n, err := r.c.ZRem(ctx, r.Key(name), token).Result()
	if err != nil {
		return false, fmt.Errorf("redisstore: semaphore release: %w", err)
	}
	return n == 1, nil
}
