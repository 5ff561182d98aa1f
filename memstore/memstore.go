// Package memstore is Sluice's in-memory ratelimit.Store: one process, no
// set-up, exact decisions.
//
// Keys are spread over shards, each a map guarded by its own mutex, so
// unrelated keys rarely contend. The store is bounded: it holds at most
// Options.MaxKeys keys, and when a shard is full a new key evicts an expired
// key or, failing that, the sampled key closest to expiring (its state is
// the least valuable to keep), so an attacker who chooses keys cannot
// exhaust memory — at worst they make the store forget nearly expired
// state. A janitor goroutine, owned by the Store and stopped by Close,
// reclaims expired keys.
//
// Deciding an existing key allocates nothing. A Store is safe for
// concurrent use; its zero value is not usable, call New.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Options configure a Store. The zero value is a good default.
type Options struct {
	// MaxKeys bounds the number of keys held; default 1<<20 (about 100 MB
	// at the largest state).
	MaxKeys int
	// Shards is the number of independently locked shards, rounded up to
	// a power of two; default 64 per CPU.
	Shards int
	// Now is the clock; default time.Now.
	Now func() time.Time
	// JanitorInterval is how often expired keys are reclaimed; default
	// 10 s. Negative disables the janitor: expired keys are then reclaimed
	// only when a full shard needs room.
	JanitorInterval time.Duration
}

// Stats are counters of a Store's life.
type Stats struct {
	Keys      int    // keys held now
	Evictions uint64 // live keys evicted to make room
	Reclaimed uint64 // expired keys removed
}

// Store is the in-memory ratelimit.Store.
type Store struct {
	shards      []shard
	mask        uint64
	seed, seed2 maphash.Seed
	now         func() time.Time
	maxPerShard int

	evictions atomic.Uint64
	reclaimed atomic.Uint64

	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// A shard maps a 64-bit hash of each key to its entry. A second,
// independent hash, kept in the entry, tells keys apart when the first
// collides (with 2^-128 odds of failing); the rare key whose first hash is
// taken by another key lives in spill, by its full key. Keys are not kept,
// so a lookup touches no string memory.
type shard struct {
	mu    sync.Mutex
	m     map[uint64]*entry
	spill map[string]*entry
	_     [40]byte // keep shards on separate cache lines
}

type entry struct {
	check   uint64 // the key's second hash
	expires int64  // Unix ns from which the state equals a fresh one
	state   ratelimit.State
}

// A keyRef is a key and its two hashes.
type keyRef struct {
	h, check uint64
	key      string
}

func (sh *shard) get(k *keyRef) *entry {
	if e := sh.m[k.h]; e != nil && e.check == k.check {
		return e
	}
	if len(sh.spill) > 0 {
		return sh.spill[k.key]
	}
	return nil
}

// insert adds a fresh entry for a key that get did not find.
func (sh *shard) insert(k *keyRef) *entry {
	e := &entry{check: k.check}
	if _, taken := sh.m[k.h]; taken {
		if sh.spill == nil {
			sh.spill = make(map[string]*entry)
		}
		sh.spill[k.key] = e
	} else {
		sh.m[k.h] = e
	}
	return e
}

func (sh *shard) del(k *keyRef) {
	if e := sh.m[k.h]; e != nil && e.check == k.check {
		delete(sh.m, k.h)
		return
	}
	delete(sh.spill, k.key)
}

func (sh *shard) len() int { return len(sh.m) + len(sh.spill) }

var _ ratelimit.Store = (*Store)(nil)

// ErrClosed is returned by Decide after Close.
var ErrClosed = errors.New("memstore: store closed")

// New returns a Store and starts its janitor; call Close to stop it.
func New(opts Options) *Store {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = 1 << 20
	}
	if opts.Shards <= 0 {
		opts.Shards = 64 * runtime.GOMAXPROCS(0)
	}
	n := 1 << bits.Len(uint(opts.Shards-1))
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.JanitorInterval == 0 {
		opts.JanitorInterval = 10 * time.Second
	}
	s := &Store{
		shards:      make([]shard, n),
		mask:        uint64(n - 1),
		seed:        maphash.MakeSeed(),
		seed2:       maphash.MakeSeed(),
		now:         opts.Now,
		maxPerShard: max(1, (opts.MaxKeys+n-1)/n),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[uint64]*entry)
	}
	if opts.JanitorInterval > 0 {
		go s.janitor(opts.JanitorInterval)
	} else {
		close(s.done)
	}
	return s
}

// Close stops the janitor. Decide fails with ErrClosed afterwards.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
	})
	<-s.done
	return nil
}

// Decide implements ratelimit.Store: it decides items all or nothing at the
// store's clock.
func (s *Store) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	if s.closed.Load() {
		return dst, ErrClosed
	}
	for i := range items {
		if err := check(&items[i]); err != nil {
			return dst, err
		}
	}
	now := s.now()
	if len(items) == 1 {
		dst = append(dst, ratelimit.Decision{})
		s.decideOne(&dst[len(dst)-1], &items[0], now)
		return dst, nil
	}
	return s.decideMany(dst, items, now), nil
}

// check rejects what would make an algorithm divide by zero or misbehave;
// full validation belongs where rules are configured (Rule.Validate).
func check(it *ratelimit.Item) error {
	r := it.Rule
	switch {
	case r == nil:
		return fmt.Errorf("%w: item %q has no rule", ratelimit.ErrInvalidRule, it.Key)
	case r.Calendar == ratelimit.NoCalendar && r.Period <= 0, r.Quota < 0, r.Burst < 0:
		return r.Validate()
	}
	return nil
}

func (s *Store) ref(key string) keyRef {
	return keyRef{h: maphash.String(s.seed, key), check: maphash.String(s.seed2, key), key: key}
}

func (s *Store) shardOf(k *keyRef) *shard {
	return &s.shards[k.h&s.mask]
}

func (s *Store) decideOne(d *ratelimit.Decision, it *ratelimit.Item, now time.Time) {
	k := s.ref(it.Key)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	if e := sh.get(&k); e != nil {
		it.Rule.DecideInto(d, &e.state, now, it.Cost)
		e.expires = now.UnixNano() + int64(d.ResetAfter)
		sh.mu.Unlock()
		return
	}
	// Only a key whose state changed is worth a place in the map.
	var st ratelimit.State
	it.Rule.DecideInto(d, &st, now, it.Cost)
	if d.Allowed && it.Cost > 0 {
		s.makeRoom(sh, now.UnixNano(), 1, nil)
		e := sh.insert(&k)
		e.state, e.expires = st, now.UnixNano()+int64(d.ResetAfter)
	}
	sh.mu.Unlock()
}

// decideMany locks every shard the items touch, in index order, and decides
// the items with ratelimit.DecideMany against their keys' entries. Only
// when every item is admitted does it store the working states and update
// the keys' expiry; a new key takes a place only once an item charges it
// (a positive cost), as in decideOne, and room is made for it without
// evicting a key of the request.
func (s *Store) decideMany(dst []ratelimit.Decision, items []ratelimit.Item, now time.Time) []ratelimit.Decision {
	var (
		refBuf    [8]keyRef
		lockedBuf [8]uint64
		entBuf    [8]*entry
		keptBuf   [8]*ratelimit.State
		workBuf   [8]ratelimit.State
	)
	refs, locked, ents, kept, work := refBuf[:0], lockedBuf[:0], entBuf[:0], keptBuf[:0], workBuf[:]
	if len(items) > len(work) {
		work = make([]ratelimit.State, len(items))
	}
	for i := range items {
		refs = append(refs, s.ref(items[i].Key))
		locked = append(locked, refs[i].h&s.mask)
	}
	slices.Sort(locked)
	locked = slices.Compact(locked)
	for _, i := range locked {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range locked {
			s.shards[i].mu.Unlock()
		}
	}()
	for i := range refs {
		e := s.shardOf(&refs[i]).get(&refs[i])
		var st *ratelimit.State
		if e != nil {
			st = &e.state
		}
		ents, kept = append(ents, e), append(kept, st)
	}
	base := len(dst)
	dst, allowed := ratelimit.DecideMany(dst, items, now, kept, work)
	if !allowed {
		return dst
	}
	// In order, so that a key's last item leaves its state and expiry.
	for i, e := range ents {
		if e == nil { // new, or inserted by an earlier item
			k := &refs[i]
			sh := s.shardOf(k)
			if e = sh.get(k); e == nil {
				if items[i].Cost <= 0 {
					continue // checked or refunded only
				}
				s.makeRoom(sh, now.UnixNano(), 1, refs)
				e = sh.insert(k)
			}
		}
		e.state, e.expires = work[i], now.UnixNano()+int64(dst[base+i].ResetAfter)
	}
	return dst
}

// makeRoom evicts keys until n new ones fit in the shard, never one of
// keep (the request's own), and stops when nothing else is left. The shard
// is locked.
func (s *Store) makeRoom(sh *shard, now int64, n int, keep []keyRef) {
	for sh.len()+n > s.maxPerShard && s.evictOne(sh, now, keep) {
	}
}

// evictOne evicts a key that is not one of keep: an expired key if one is
// among a few sampled, else the sampled key closest to expiring. It reports
// whether there was one.
func (s *Store) evictOne(sh *shard, now int64, keep []keyRef) bool {
	const samples = 8
	var victim uint64
	soonest := int64(0)
	n := 0
	for h, e := range sh.m {
		if slices.ContainsFunc(keep, func(k keyRef) bool { return k.h == h && k.check == e.check }) {
			continue
		}
		if e.expires <= now {
			delete(sh.m, h)
			s.reclaimed.Add(1)
			return true
		}
		if n == 0 || e.expires < soonest {
			victim, soonest = h, e.expires
		}
		if n++; n == samples {
			break
		}
	}
	if n > 0 {
		delete(sh.m, victim)
		s.evictions.Add(1)
		return true
	}
	for key := range sh.spill {
		if !slices.ContainsFunc(keep, func(k keyRef) bool { return k.key == key }) {
			delete(sh.spill, key)
			s.evictions.Add(1)
			return true
		}
	}
	return false
}

func (s *Store) janitor(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.reclaim()
		}
	}
}

// reclaim removes every expired key, one shard at a time.
func (s *Store) reclaim() {
	for i := range s.shards {
		now := s.now().UnixNano()
		sh := &s.shards[i]
		sh.mu.Lock()
		n := sh.len()
		maps.DeleteFunc(sh.m, func(_ uint64, e *entry) bool { return e.expires <= now })
		maps.DeleteFunc(sh.spill, func(_ string, e *entry) bool { return e.expires <= now })
		s.reclaimed.Add(uint64(n - sh.len()))
		sh.mu.Unlock()
	}
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{Evictions: s.evictions.Load(), Reclaimed: s.reclaimed.Load()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += sh.len()
		sh.mu.Unlock()
	}
	return st
}

// State returns a copy of the state held for key, if any.
func (s *Store) State(key string) (ratelimit.State, bool) {
	k := s.ref(key)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.get(&k)
	if e == nil {
		return ratelimit.State{}, false
	}
	st := e.state
	st.Log = slices.Clone(st.Log)
	return st, true
}

// Reset forgets key, so its next request starts from full capacity.
func (s *Store) Reset(key string) {
	k := s.ref(key)
	sh := s.shardOf(&k)
	sh.mu.Lock()
	sh.del(&k)
	sh.mu.Unlock()
}
