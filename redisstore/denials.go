package redisstore

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// denialCache remembers, per key, that Redis denied a cost under a rule
// until an instant, and answers a request of that one item (the same cost
// under the same *ratelimit.Rule) locally until then, without a round
// trip.
//
// A denial's RetryAfter is the earliest instant at which the cost could be
// admitted if nothing else consumed, and consumption by anyone only moves
// that instant later, so while nothing gives capacity back the cached
// denial is right. It is kept for GCRA and FixedWindow, where every field
// of the answer is exact too: a fixed window's count stays as it was until
// the window ends (RetryAfter), and a bucket's remaining capacity follows
// from the instant it is full again (ResetAfter), which nears one for one
// with the clock (save after a change of rate, see below). LeakyBucket,
// SlidingWindow and SlidingLog are not cached: their remaining capacity
// changes in steps the cache cannot reproduce exactly. Denials that end
// within minCachedDenial are not cached either: a round trip takes about
// as long, and a cached denial is timed from when the request was sent, a
// little later than need be, which at a saturated key that refills fast
// would leave capacity unused. With the server's clock, the instant is
// kept in this process's clock from the moment the request was sent,
// before Redis read its own, so it is never later than the true one.
//
// What invalidates it: a refund (a negative cost), a consumption (after
// which the remembered Remaining and ResetAfter are stale) or a Reset of
// the key, and a decision on the key under another rule (whose rate may
// rescale the state). Those made through this Store forget the key's
// entry; those made through another replica are not seen, so this replica
// may deny a key until the remembered instant although a refund elsewhere
// freed capacity: it never admits too much, and may admit too little for
// at most the RetryAfter Redis gave. A rule replaced by a runtime override
// or a reloaded file is another *Rule, which the entry does not match.
//
// A denial on a GCRA state written at another rate (the rule's changed
// since) is not kept at all: ratelimit rescales that state's debt to the
// rule's rate at each decision, but until an admission rewrites the state
// the debt runs down at the old rate, so the denial's reset and retry do
// not shorten one for one with the clock. Redis reports such a denial
// (parse's rescaled).
type denialCache struct {
	seed   maphash.Seed
	shards [denialShards]denialShard
	hits   atomic.Uint64
}

const (
	// minCachedDenial is the shortest denial the cache keeps.
	minCachedDenial = 10 * time.Millisecond
	denialShards    = 32
	// maxDenials bounds the entries of one shard; a full shard drops its
	// expired entries, and if none, all of them.
	maxDenials = 4096
)

type denialShard struct {
	mu sync.Mutex
	m  map[string]denial
}

// A denial is what Redis answered for one key.
type denial struct {
	rule      *ratelimit.Rule
	cost      int64     // the cost denied
	sent      time.Time // when the denied request was sent
	until     time.Time // when that cost could be admitted, at the earliest
	resetAt   time.Time
	remaining int64
}

func newDenialCache() *denialCache {
	return &denialCache{seed: maphash.MakeSeed()}
}

func (c *denialCache) shard(key string) *denialShard {
	return &c.shards[maphash.String(c.seed, key)%denialShards]
}

// lookup returns the entry that denies cost under r on key at now.
func (c *denialCache) lookup(key string, r *ratelimit.Rule, cost int64, now time.Time) (denial, bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	d, ok := sh.m[key]
	sh.mu.Unlock()
	if !ok || d.rule != r || cost != d.cost || now.Before(d.sent) || !now.Before(d.until) {
		return denial{}, false
	}
	return d, true
}

func (c *denialCache) forget(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}

// forgetUnless forgets key's entry unless it is of rule r and keep is
// set: a refund or a consumption forgets it, and so does a decision under
// another rule.
func (c *denialCache) forgetUnless(key string, r *ratelimit.Rule, keep bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	if d, ok := sh.m[key]; ok && (!keep || d.rule != r) {
		delete(sh.m, key)
	}
	sh.mu.Unlock()
}

// refresh follows an admitted consumption d of cost units of key under r,
// sent at sent: a remembered denial under r that still holds at sent
// takes d's Remaining and ResetAfter, and a GCRA denial's instant moves on
// by what was consumed (it held, so the bucket's theoretical arrival time
// was past sent and grew by cost intervals; a fixed window's still ends
// with its window). One under another rule goes, and so does one that had
// run out: the bucket may have drained below it since, so moving its
// instant on would deny too long.
func (c *denialCache) refresh(key string, r *ratelimit.Rule, cost int64, d *ratelimit.Decision, sent time.Time) {
	sh := c.shard(key)
	sh.mu.Lock()
	if e, ok := sh.m[key]; ok {
		if e.rule != r || !sent.Before(e.until) {
			delete(sh.m, key)
		} else {
			e.remaining, e.resetAt = d.Remaining, sent.Add(d.ResetAfter)
			if r.Algorithm == ratelimit.GCRA {
				e.until = e.until.Add(time.Duration(cost) * r.Interval())
			}
			sh.m[key] = e
		}
	}
	sh.mu.Unlock()
}

func (c *denialCache) put(key string, d denial, now time.Time) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = make(map[string]denial)
	}
	if len(sh.m) >= maxDenials {
		for k, e := range sh.m {
			if !now.Before(e.until) {
				delete(sh.m, k)
			}
		}
		if len(sh.m) >= maxDenials {
			clear(sh.m)
		}
	}
	sh.m[key] = d
}

// record keeps the denials of a request Redis decided, sent at sent, and
// follows the keys it changed: a consumption leaves a remembered denial
// true (the cost it denied fits no sooner) and refreshes its Remaining and
// ResetAfter; a refund forgets it. A key named twice in one request is not
// kept: its second item's answer counts the first's cost, which a denied
// request did not consume. Nor is any denial of a request that Redis
// denied on a GCRA state written at another rate (rescaled; see
// denialCache).
func (c *denialCache) record(items []ratelimit.Item, ds []ratelimit.Decision, sent time.Time, rescaled bool) {
	changed := ratelimit.Allowed(ds) // else nothing was consumed or refunded
	for i := range items {
		it := &items[i]
		d := &ds[i]
		alg := it.Rule.Algorithm
		dup := false
		for j := range items {
			if j != i && items[j].Key == it.Key {
				dup = true
				break
			}
		}
		if it.Cost > 0 && d.Allowed && changed && !dup {
			c.refresh(it.Key, it.Rule, it.Cost, d, sent)
			continue
		}
		if it.Cost <= 0 || d.Allowed || d.Reason != ratelimit.ReasonLimited || d.RetryAfter < minCachedDenial ||
			(alg != ratelimit.GCRA && alg != ratelimit.FixedWindow) {
			c.forgetUnless(it.Key, it.Rule, it.Cost == 0 || !changed)
			continue
		}
		if rescaled {
			c.forget(it.Key)
		} else if !dup {
			c.put(it.Key, denial{
				rule: it.Rule, cost: it.Cost, sent: sent, until: sent.Add(d.RetryAfter),
				resetAt: sent.Add(d.ResetAfter), remaining: d.Remaining,
			}, sent)
		}
	}
}

// answer decides a request of one item from the cache when that item is
// a remembered denial; ok is false when it is not. A request of several
// items is left to Redis even when one of them is a remembered denial: its
// other items must each report what it alone would get (beyond its
// capacity, limited with its own RetryAfter, or a check when it would
// fit), as a Store that decided the request says, and only Redis knows
// that; asking it costs the round trip that checking them would.
func (c *denialCache) answer(s *Store, dst []ratelimit.Decision, items []ratelimit.Item) (_ []ratelimit.Decision, ok bool) {
	if len(items) != 1 || items[0].Cost <= 0 {
		return dst, false
	}
	it := &items[0]
	now := s.localNow()
	den, found := c.lookup(it.Key, it.Rule, it.Cost, now)
	if !found {
		return dst, false
	}
	c.hits.Add(1)
	r := it.Rule
	remaining := den.remaining // a fixed window's count stays until its end
	debt := max(0, den.resetAt.Sub(now))
	if r.Algorithm == ratelimit.GCRA {
		iv := r.Interval()
		remaining = int64(max(0, (time.Duration(r.Capacity())*iv-debt)/iv))
	}
	return append(dst, ratelimit.Decision{
		Reason:     ratelimit.ReasonLimited,
		Capacity:   r.Capacity(),
		Remaining:  remaining,
		ResetAfter: debt,
		RetryAfter: max(1, den.until.Sub(now)),
		Rule:       r.Name,
	}), true
}
