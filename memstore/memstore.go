// Package memstore is Sluice's in-memory ratelimit.Store: one process, no
// set-up, exact decisions.
//
// Keys are spread over shards, each a map guarded by its own mutex, so
// unrelated keys rarely contend. Deciding an existing key allocates nothing.
// A Store is safe for concurrent use; its zero value is not usable, call New.
//
// # Bounded memory
//
// The store holds at most Options.MaxKeys keys, so an attacker who chooses
// keys cannot exhaust memory. A janitor goroutine, owned by the Store and
// stopped by Close, reclaims expired keys, whose state equals a fresh one.
//
// A live key's state is worth what forgetting it would give back: the
// capacity it has in use, which its holder could spend again at once. The
// store weighs it as a share of the key's capacity: what the key's last
// decision left in use, less what a bucket (GCRA, LeakyBucket) has refilled
// since. The window and log algorithms are weighed as their last decision
// left them until they expire, which is exact for a fixed window and, for
// the sliding ones, may overstate the share in use but never understates
// it. A key with most of its capacity left is cheap to forget; an exhausted
// key, as a key is while it is denied at cost 1, costs its whole capacity.
// A decision under a raised copy of the key's rule (a settlement's charge
// past the limit, a paced reservation) is measured against the key's own
// capacity, so a key in debt weighs as exhausted.
//
// When a new key needs a place in a full shard, the store samples a few of
// the shard's other keys. It reclaims an expired one if it finds one;
// otherwise it takes the one with the least share in use (the soonest to
// expire among equals) and evicts it only if that share is no greater than
// the share the new key's own first decision used. If it is greater, the
// new key is decided (admitted, as any new key's first request is) but not
// kept: its charge is given back instead, and the shard's keys stay as they
// were. Hence:
//
//   - The store never forgets a key to keep one that has used a smaller
//     share of its capacity: an exhausted key is forgotten only for a new
//     key that its own first request exhausted, never for a fresh one.
//   - A flood of new keys, each charged part of its capacity, resets no key
//     that has used a larger share, however many keys the flood brings:
//     they evict one another, or are not kept.
//   - A new key costs one sample of a few keys. A key of a request is
//     never evicted to make room for another key of the same request; a
//     new key that finds only those is not kept.
//
// Not keeping a new key has a price, paid by that key alone: until its
// shard holds a key no costlier than it (a bucket refills, a window ends),
// each of its requests is decided as a first request, so its own limit is
// not enforced. A store whose MaxKeys exceeds its working set never gets
// there; Stats counts evictions, keys not kept and what both gave back, so
// that an operator can tell.
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
	// MaxKeys bounds the number of keys held; default 1<<20 (about 140 MB,
	// not counting the entries of sliding logs).
	MaxKeys int
	// Shards is the number of independently locked shards, rounded up to
	// a power of two and down to no more than MaxKeys; default 64 per CPU.
	Shards int
	// Now is the clock; default time.Now.
	Now func() time.Time
	// MaxReservations bounds the reservation records held (the Store as
	// a ratelimit.Ledger); default 1<<18, a few hundred bytes each: at
	// the default TTL of 5 minutes, enough for some 870 reservations a
	// second.
	MaxReservations int
	// JanitorInterval is how often expired keys are reclaimed; default
	// 10 s. Negative disables the janitor: expired keys are then reclaimed
	// only when a full shard needs room.
	JanitorInterval time.Duration
}

// Stats are counters of a Store's life. Evictions, Unkept and GaveBack are
// what bounding the number of keys cost (see the package doc); they stay
// zero in a store whose MaxKeys exceeds its working set.
type Stats struct {
	// Keys is the number of keys held now.
	Keys int
	// Reclaimed counts expired keys removed, which gave nothing back.
	Reclaimed uint64
	// Evictions counts live keys forgotten to make room for a new key, and
	// EvictedExhausted those of them that had no capacity left.
	Evictions        uint64
	EvictedExhausted uint64
	// Unkept counts new keys decided but not kept, because their shard
	// had no key to evict that was as cheap to forget.
	Unkept uint64
	// GaveBack is the capacity, in units of cost summed over every rule,
	// that evicted and unkept keys had in use when they were forgotten:
	// what their holders may spend again.
	GaveBack uint64
}

// Store is the in-memory ratelimit.Store.
type Store struct {
	shards      []shard
	mask        uint64
	seed, seed2 maphash.Seed
	now         func() time.Time

	reclaimed, evictions, evictedExhausted, unkept, gaveBack atomic.Uint64

	ledger ledger

	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// A shard maps a 64-bit hash of each key to its entry. A second,
// independent hash, kept in the entry, tells keys apart when the first
// collides (with 2^-128 odds of failing); the rare key whose first hash is
// taken by another key lives in spill, by its full key, where it is
// reclaimed once expired but never evicted. Keys are not kept, so a lookup
// touches no string memory.
type shard struct {
	mu    sync.Mutex
	m     map[uint64]*entry
	spill map[string]*entry
	max   int      // the number of keys the shard may hold
	_     [32]byte // keep shards on separate cache lines
}

type entry struct {
	check   uint64 // the key's second hash
	expires int64  // Unix ns from which the state equals a fresh one
	last    share  // the capacity in use after the last decision
	state   ratelimit.State
}

// decided records what a decision at now (Unix ns) left of the entry's
// key. A decision under a rule of larger capacity than the key's last (a
// settlement's ratelimit.Rule.Settling, a paced reservation's
// Rule.Reserving) measures what the key uses against the key's last
// capacity: a key a settlement charged past its limit weighs as
// exhausted, not as nearly unused. (A key whose rule was raised for good
// stays measured against the lower capacity, which only makes it costlier
// to forget.)
func (e *entry) decided(d *ratelimit.Decision, now int64) {
	sh := shareOf(d)
	if e.last.of > 0 && sh.of > e.last.of {
		sh.of = e.last.of
	}
	e.expires, e.last = now+int64(d.ResetAfter), sh
}

// inUse is the share of its capacity the entry's key has in use at now,
// before it expires: what forgetting it would give back. A bucket refills
// one unit per interval until it expires, full: a GCRA state keeps its
// interval in N, and a leaky bucket's level N leaks from T to the expiry.
// Other algorithms hold what their last decision left until they expire.
func (e *entry) inUse(now int64) share {
	left := e.expires - now
	var unit int64
	switch st := &e.state; st.Algorithm {
	case ratelimit.GCRA:
		unit = st.N
	case ratelimit.LeakyBucket:
		if st.N > 0 {
			unit = (e.expires - st.T) / st.N
		}
	}
	if unit <= 0 {
		return e.last
	}
	return share{min(e.last.used, (left-1)/unit+1), e.last.of}
}

// A share is used units of cost in use of a capacity of units.
type share struct{ used, of int64 }

// shareOf is the share a decision left in use.
func shareOf(d *ratelimit.Decision) share {
	return share{d.Capacity - d.Remaining, d.Capacity}
}

// less reports whether a is a smaller share than b. A key without capacity
// has nothing in use.
func (a share) less(b share) bool {
	if a.of == b.of { // the same rule, most often
		return a.used < b.used
	}
	ah, al := bits.Mul64(uint64(a.used), uint64(max(b.of, 1)))
	bh, bl := bits.Mul64(uint64(b.used), uint64(max(a.of, 1)))
	return ah < bh || ah == bh && al < bl
}

// exhausted reports whether nothing of the capacity is left.
func (a share) exhausted() bool { return a.of > 0 && a.used >= a.of }

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
	if n > opts.MaxKeys {
		n = 1 << (bits.Len(uint(opts.MaxKeys)) - 1)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.JanitorInterval == 0 {
		opts.JanitorInterval = 10 * time.Second
	}
	if opts.MaxReservations <= 0 {
		opts.MaxReservations = 1 << 18
	}
	s := &Store{
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		seed:   maphash.MakeSeed(),
		seed2:  maphash.MakeSeed(),
		now:    opts.Now,
		ledger: ledger{max: opts.MaxReservations},
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[uint64]*entry)
		sh.max = opts.MaxKeys / n
		if i < opts.MaxKeys%n {
			sh.max++
		}
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
	return s.DecideAt(ctx, s.now(), dst, items)
}

// Now reads the store's clock (Options.Now).
func (s *Store) Now() time.Time { return s.now() }

// DecideAt is Decide at now, for a caller that reads the clock once (Now)
// and records the decisions with their instant. As everywhere in Sluice,
// an instant older than a key's state never creates capacity.
func (s *Store) DecideAt(ctx context.Context, now time.Time, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
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
	case r.Calendar == ratelimit.NoCalendar && r.Period <= 0, r.Quota < 0, r.Burst < 0, r.Block != (r.Quota == 0):
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
		e.decided(d, now.UnixNano())
		sh.mu.Unlock()
		return
	}
	// Only a key whose state changed is worth a place in the map.
	var st ratelimit.State
	it.Rule.DecideInto(d, &st, now, it.Cost)
	if d.Allowed && it.Cost > 0 && s.makeRoom(sh, now.UnixNano(), shareOf(d), nil) {
		e := sh.insert(&k)
		e.state = st
		e.decided(d, now.UnixNano())
	}
	sh.mu.Unlock()
}

// decideMany locks every shard the items touch, in index order, and decides
// the items with ratelimit.DecideMany against their keys' entries. Only
// when every item is admitted does it store the working states and update
// the keys' expiry; a new key takes a place only once an item charges it
// (a positive cost) and makeRoom finds it one, as in decideOne, without
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
		d := &dst[base+i]
		if e == nil { // new, or inserted by an earlier item
			k := &refs[i]
			sh := s.shardOf(k)
			if e = sh.get(k); e == nil {
				if items[i].Cost <= 0 || !s.makeRoom(sh, now.UnixNano(), shareOf(d), refs) {
					continue // checked or refunded only, or not kept
				}
				e = sh.insert(k)
			}
		}
		e.state = work[i]
		e.decided(d, now.UnixNano())
	}
	return dst
}

// samples is the number of keys weighed to make room for a new one.
const samples = 8

// makeRoom makes room in the shard for a new key whose first decision left
// fresh of its capacity in use, and reports whether the key may be kept. In
// a full shard, it weighs up to samples keys of m that are not of keep (the
// request's own): it reclaims the first expired one, or evicts the one
// with the least share in use, the soonest to expire among equals, unless
// that share is greater than fresh. The shard is locked.
func (s *Store) makeRoom(sh *shard, now int64, fresh share, keep []keyRef) bool {
	if sh.len() < sh.max {
		return true
	}
	var (
		victim uint64
		v      *entry
		cost   share
		n      int
	)
	for h, e := range sh.m {
		if slices.ContainsFunc(keep, func(k keyRef) bool { return k.h == h && k.check == e.check }) {
			continue
		}
		if e.expires <= now {
			delete(sh.m, h)
			s.reclaimed.Add(1)
			return true
		}
		c := e.inUse(now)
		if n == 0 || c.less(cost) || !cost.less(c) && e.expires < v.expires {
			victim, v, cost = h, e, c
		}
		if n++; n == samples {
			break
		}
	}
	if n == 0 || fresh.less(cost) {
		s.unkept.Add(1)
		s.gaveBack.Add(uint64(fresh.used))
		return false
	}
	delete(sh.m, victim)
	s.evictions.Add(1)
	if cost.exhausted() {
		s.evictedExhausted.Add(1)
	}
	s.gaveBack.Add(uint64(cost.used))
	return true
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
	st := Stats{
		Reclaimed:        s.reclaimed.Load(),
		Evictions:        s.evictions.Load(),
		EvictedExhausted: s.evictedExhausted.Load(),
		Unkept:           s.unkept.Load(),
		GaveBack:         s.gaveBack.Load(),
	}
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
