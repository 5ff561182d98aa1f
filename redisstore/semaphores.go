package redisstore

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
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

//go:embed semaphore_fair.lua
var semaphoreFairLua string

//go:embed semaphore_release.lua
var semaphoreReleaseLua string

//go:embed semaphore_holders.lua
var semaphoreHoldersLua string

// semaphorePreludeLua is loaded in front of every semaphore script: the
// functions they share.
//
//go:embed semaphore_prelude.lua
var semaphorePreludeLua string

// DefaultSemaphorePrefix is the default SemaphoreOptions.Prefix.
const DefaultSemaphorePrefix = "sluice:sem:"

// DefaultSemaphoreHold is the default SemaphoreOptions.Hold.
const DefaultSemaphoreHold = 100 * time.Millisecond

// SemaphoreOptions configure a SemaphoreStore.
type SemaphoreOptions struct {
	// Prefix starts every key the store writes; it must not contain "{"
	// or "}". Default DefaultSemaphorePrefix.
	Prefix string
	// Hold is how long a waiter the store names when room opens has that
	// room to itself (see SemaphoreStore, Holds): long enough for the
	// message to reach it and its acquire to come back, short enough
	// that a waiter that died or gave up keeps the room from the others
	// only briefly. Default DefaultSemaphoreHold; negative: hold nothing
	// (whoever asks first takes the room).
	Hold time.Duration
	// Replicated, when it asks for replicas, counts a grant or renewal
	// only once that many replicas acknowledged it (see Replicated).
	// The zero value waits for none.
	Replicated Replicated
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
// renew extends a token (and keeps its weight and fence) only if it is
// present and unexpired; release removes the caller's own token (and its
// weight and fence).
//
// Each permit's fence (see concurrency.Store) is taken by the acquire
// script from a counter, Key + ":fence" (INCR), and kept for its holder in
// a hash, Key + ":f", that renewals leave as it is; both share the name's
// hash tag, so the grant and its fence are one step on a Cluster too. The
// counter has no expiry, so that a name's fences never go back when its
// holders have all gone: it is one small key for every name ever
// acquired. A server that loses it (see below) starts the name's fences
// again from 1.
//
// The instant of each grant, in milliseconds of the server's clock, is
// kept the same way in a hash, Key + ":since", written by the acquire
// scripts when they grant (not when they renew) and left as it is by
// renewals, so that Holders can say how long each permit has been held.
// A holder granted by a Sluice from before it has no entry and is listed
// with concurrency.HeldForUnknown; an older Sluice releasing a permit
// leaves its entry behind, unread (Holders reads only the holders' set's
// unexpired tokens) until the hash expires with the holders.
//
// It is a concurrency.FairStore: beside the holders' set, a semaphore has
// a hash of the weights above 1 (Key + ":w"), a sorted set of waiters
// scored by a ticket from a counter (":q", ":seq") and a hash of the
// instants their places lapse (":qt"), all under the name's hash tag.
// AcquireFair is one script: it forgets expired holders and lapsed
// waiters at the head of the line, grants the token if it is first (or
// nobody waits) and its weight fits under the limit, and otherwise queues
// it or refreshes its place. The waiters' keys expire by themselves when
// nobody waits. A semaphore therefore costs one round
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
// It is a concurrency.Notifier: the scripts PUBLISH on the semaphore's
// channel, Key(name) + ":freed", in the same round trip as the change,
// whenever room may have opened for a waiter: a release; the departure
// of the first waiter; an acquire that forgot expired holders (the only
// moment Redis notices an expiry) and left room; a fair grant that left
// room for the next in line. When the last holder's permit expires, the
// set expires with it and nothing is published: the waiters find the
// room by polling. The message names the waiter to wake: the token first
// in line when waiters queue (AcquireFair); otherwise as many of the
// plain waiters as there is room for (the weight released, or the room an
// acquire left), one message each. A plain waiter is recorded by its
// refused Acquire (with wait > 0) in a sorted set, Key + ":pw", scored by
// the instant its place lapses, and forgotten once named, granted,
// dequeued or lapsed; so a release of one permit wakes one waiter in one
// process, not one in every process. With no plain waiter recorded, the
// message is "" (one waiter of each process that has one asks; a waiter
// of an older Sluice records nothing).
//
// Holds: each plain waiter a script names gets the room it is named for
// held, in a sorted set Key + ":hold" (token → the instant, in
// milliseconds of the server's clock, the hold lapses: Hold from the
// naming, or the waiter's place's lapse if that is sooner), so that the
// holder who released and asks again at once does not take the room
// before the waiter it woke can ask (see concurrency.Notifier). Every
// acquire script counts the holds of other tokens as units used; the
// named token's acquire takes its hold in place of room and, granted,
// consumes it. The scripts forget lapsed holds first and pass that room
// on (to the first fair waiter, or the next plain ones, with new holds);
// a release or dequeue of a token gives its hold up the same way. A
// release names as many waiters as the weight it frees: its script knows
// no limit, and the permits and holds cannot exceed it by that. The first
// fair waiter needs no hold: nobody overtakes the line. The key shares
// the name's hash tag and expires a hold's length after its last write.
// A Sluice from before holds neither reads nor writes it: its acquires
// may take held room (the waiter is then refused and recorded again, as
// before).
//
// Watch SUBSCRIBEs to the channel. Pub/sub delivers at most
// once, to the subscribers connected then; a message lost (to a
// reconnection, a full channel) costs the waiters one poll interval, since
// they keep polling. On a Cluster, PUBLISH reaches the subscribers of
// every node.
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
	hold    int64 // Hold in milliseconds; 0: none
	acquire *redis.Script
	renew   *redis.Script
	fair    *redis.Script
	release *redis.Script
	holders *redis.Script
	sclock  *serverClock
	repl    Replicated
}

var (
	_ concurrency.FairStore = (*SemaphoreStore)(nil)
	_ concurrency.Notifier  = (*SemaphoreStore)(nil)
)

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
	repl, err := o.Replicated.check()
	if err != nil {
		return nil, err
	}
	hold := int64(0)
	if o.Hold == 0 {
		o.Hold = DefaultSemaphoreHold
	}
	if o.Hold > 0 {
		hold = ttlMillis(o.Hold)
	}
	return &SemaphoreStore{
		c:       c,
		prefix:  o.Prefix,
		hold:    hold,
		acquire: redis.NewScript(semaphorePreludeLua + semaphoreAcquireLua),
		renew:   redis.NewScript(semaphorePreludeLua + semaphoreRenewLua),
		fair:    redis.NewScript(semaphorePreludeLua + semaphoreFairLua),
		release: redis.NewScript(semaphorePreludeLua + semaphoreReleaseLua),
		holders: redis.NewScript(semaphoreHoldersLua),
		sclock:  newServerClock(c, redis.NewScript(timeLua)),
		repl:    repl,
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

// waitMillis converts a waiter's wait to milliseconds, rounded up; 0 (or
// below) stays 0: record nothing.
func waitMillis(wait time.Duration) int64 {
	if wait <= 0 {
		return 0
	}
	return ttlMillis(wait)
}

// cutoff returns the cutoff argument of an acquire on key: the server's
// clock past which the caller has given up, or "" without a deadline.
func (r *SemaphoreStore) cutoff(ctx context.Context, key string) (string, error) {
	now := time.Now()
	d, ok := ctx.Deadline()
	if !ok && r.sclock.readTimeout <= 0 {
		return "", nil
	}
	if !ok {
		d = now.Add(r.sclock.readTimeout)
	}
	ns, err := r.sclock.cutoff(ctx, key, now, d)
	if err != nil {
		return "", fmt.Errorf("redisstore: semaphore acquire: reading the server's clock: %w", markTransient(err))
	}
	return strconv.FormatInt(max(ns, 1e9), 10), nil
}

// AcquireFair implements concurrency.FairStore; it carries a cutoff as
// Acquire does.
func (r *SemaphoreStore) AcquireFair(ctx context.Context, name, token string, weight, limit int64, ttl, wait time.Duration) (concurrency.FairResult, uint64, error) {
	key := r.Key(name)
	cut, err := r.cutoff(ctx, key)
	if err != nil {
		return concurrency.Queued, 0, err
	}
	keys := []string{key, key + ":w", key + ":q", key + ":qt", key + ":seq", key + ":freed", key + ":f", key + ":fence", key + ":since", key + ":hold", key + ":pw"}
	cmd, acked := r.repl.run(ctx, r.c, r.fair, keys, token, weight, limit, ttlMillis(ttl), waitMillis(wait), cut, r.hold)
	res, err := cmd.Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("semaphore_fair.lua answered %v", res)
	}
	if err == nil {
		err = r.checkCutoff(ctx, key, res[0])
	}
	if err == nil && res[0] == 2 && !acked {
		err = r.unreplicated(ctx, name, token)
	}
	if err != nil {
		return concurrency.Queued, 0, fmt.Errorf("redisstore: semaphore acquire: %w", markTransient(err))
	}
	switch res[0] {
	case 2:
		return concurrency.Granted, uint64(res[1]), nil
	case 1:
		return concurrency.First, 0, nil
	}
	return concurrency.Queued, 0, nil
}

// unreplicated releases a grant too few replicas acknowledged (best
// effort: a release that fails leaves the permit to expire with its TTL)
// and returns the transient error that answers it.
func (r *SemaphoreStore) unreplicated(ctx context.Context, name, token string) error {
	_, _ = r.runRelease(context.WithoutCancel(ctx), name, token, "release")
	return transientError{errUnreplicated}
}

// checkCutoff returns errExpired when an acquire script answered n == -1,
// having done nothing past its cutoff, and then, if the call was answered
// before its deadline, has the server's clock on key measured again.
func (r *SemaphoreStore) checkCutoff(ctx context.Context, key string, n int64) error {
	if n != -1 {
		return nil
	}
	if d, ok := ctx.Deadline(); ok && time.Now().Before(d) {
		r.sclock.expired(ctx, key) // answered in time, yet past the cutoff: measure again
	}
	return errExpired
}

// Dequeue implements concurrency.FairStore. When token was first in
// line, it wakes the waiter now first.
func (r *SemaphoreStore) Dequeue(ctx context.Context, name, token string) error {
	if _, err := r.runRelease(ctx, name, token, "dequeue"); err != nil {
		return fmt.Errorf("redisstore: semaphore dequeue: %w", err)
	}
	return nil
}

// runRelease runs semaphore_release.lua in mode "release" or "dequeue".
func (r *SemaphoreStore) runRelease(ctx context.Context, name, token, mode string) (bool, error) {
	key := r.Key(name)
	keys := []string{key, key + ":w", key + ":q", key + ":qt", key + ":freed", key + ":f", key + ":pw", key + ":since", key + ":hold"}
	n, err := r.release.Run(ctx, r.c, keys, token, mode, r.hold).Int64()
	return n == 1, err
}

// Watch implements concurrency.Notifier: it subscribes to the channel of
// semaphore name (a connection of its own, held until ctx is done) and
// returns once Redis has confirmed the subscription, within the client's
// read timeout (watchTimeout without one). The channel receives
// each message published (the token first in line, or "") and is closed
// when ctx is done; messages that find it full are dropped. Its goroutine
// ends with ctx.
func (r *SemaphoreStore) Watch(ctx context.Context, name string) (<-chan string, error) {
	return subscribe(ctx, r.c, r.Key(name)+":freed", r.sclock.readTimeout, "semaphore")
}

// Acquire implements concurrency.Store. A call with a deadline (the
// context's, or the client's read timeout) carries its cutoff: if Redis
// runs it only after the caller gave up, it adds no holder (see the
// package documentation, Deadlines).
func (r *SemaphoreStore) Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (uint64, error) {
	key := r.Key(name)
	cut, err := r.cutoff(ctx, key)
	if err != nil {
		return 0, err
	}
	keys := []string{key, key + ":w", key + ":freed", key + ":f", key + ":fence", key + ":pw", key + ":since", key + ":q", key + ":qt", key + ":hold"}
	cmd, acked := r.repl.run(ctx, r.c, r.acquire, keys, token, limit, ttlMillis(ttl), cut, waitMillis(wait), r.hold)
	n, err := cmd.Int64()
	if err == nil {
		err = r.checkCutoff(ctx, key, n)
	}
	if err == nil && n > 0 && !acked {
		err = r.unreplicated(ctx, name, token)
	}
	if err != nil {
		return 0, fmt.Errorf("redisstore: semaphore acquire: %w", markTransient(err))
	}
	return uint64(n), nil
}

// Renew implements concurrency.Store.
func (r *SemaphoreStore) Renew(ctx context.Context, name, token string, ttl time.Duration) (bool, error) {
	key := r.Key(name)
	cmd, acked := r.repl.run(ctx, r.c, r.renew, []string{key, key + ":w", key + ":f", key + ":since"}, token, ttlMillis(ttl))
	n, err := cmd.Int64()
	if err == nil && n == 1 && !acked {
		err = transientError{errUnreplicated} // extends nothing for the holder; the permit stays until its validity ends
	}
	if err != nil {
		return false, fmt.Errorf("redisstore: semaphore renew: %w", err)
	}
	return n == 1, nil
}

// Release implements concurrency.Store; it wakes the waiters (see Watch).
func (r *SemaphoreStore) Release(ctx context.Context, name, token string) (bool, error) {
	ok, err := r.runRelease(ctx, name, token, "release")
	if err != nil {
		return false, fmt.Errorf("redisstore: semaphore release: %w", err)
	}
	return ok, nil
}

// Holders implements concurrency.Store: one read-only script
// (semaphore_holders.lua) on the name's hash tag lists the unexpired
// holders by the server's clock, in milliseconds, and counts the fair
// waiters whose place has not lapsed. A holder granted by a Sluice that
// recorded no grant instant is listed with concurrency.HeldForUnknown.
func (r *SemaphoreStore) Holders(ctx context.Context, name string) (concurrency.Listing, error) {
	key := r.Key(name)
	res, err := r.holders.Run(ctx, r.c, []string{key, key + ":w", key + ":f", key + ":since", key + ":qt"}).Int64Slice()
	if err == nil && (len(res) == 0 || (len(res)-1)%4 != 0) {
		err = fmt.Errorf("semaphore_holders.lua answered %d values", len(res))
	}
	if err != nil {
		return concurrency.Listing{}, fmt.Errorf("redisstore: semaphore holders: %w", err)
	}
	l := concurrency.Listing{Queued: int(res[0]), Holders: make([]concurrency.Holder, 0, (len(res)-1)/4)}
	for i := 1; i < len(res); i += 4 {
		h := concurrency.Holder{Fence: uint64(res[i]), Weight: res[i+1], HeldFor: concurrency.HeldForUnknown, ExpiresIn: time.Duration(res[i+3]) * time.Millisecond}
		if res[i+2] >= 0 {
			h.HeldFor = time.Duration(res[i+2]) * time.Millisecond
		}
		l.Holders = append(l.Holders, h)
	}
	slices.SortFunc(l.Holders, func(a, b concurrency.Holder) int { return cmp.Compare(a.Fence, b.Fence) })
	return l, nil
}
