package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// This file holds the counter of batched rules (see the package
// documentation, "Where the counter lives", and docs/redisstore.md for the
// bounds): per key of a rule, the blocks of capacity this replica leased
// from the shared counter and spends in process.

// batchedCounter counts the keys of batched rules.
type batchedCounter struct {
	s        *Store
	c        *counting
	entries  table[batchedEntry]
	rules    ruleCache[batchedRule]
	span     time.Duration // demand a block covers
	hold     time.Duration // longest a bucket's block is held
	replicas int64

	hmu     sync.Mutex
	holding []*batchedEntry // entries that took blocks since the last giveBackIdle, or still hold some

	counted, leases, givebacks, stranded atomic.Uint64
}

// batchedRule is a batched rule and what counting it in blocks needs,
// derived once.
type batchedRule struct {
	*ratelimit.Rule
	// lease is the rule blocks are taken under (for a bucket, the rule
	// with its capacity lowered by what a held block could add; see
	// docs/redisstore.md), hold how long a bucket's block may be held (0:
	// blocks are spent at once; for FixedWindow, blocks end with their
	// window instead), maxBlock the largest block.
	lease    *ratelimit.Rule
	hold     time.Duration
	maxBlock int64
}

// A batchedEntry is one key of one batched rule in this replica.
type batchedEntry struct {
	mu   sync.Mutex
	key  string
	rule *batchedRule
	// busy is non-nil while a lease is in flight; closed when it ends.
	busy chan struct{}
	used time.Time // last decision
	// failedLease is the busy channel of the last lease Redis could not
	// decide, failed its error: the callers that waited for that lease
	// are decided by the failure mode at once, rather than each starting
	// a lease of its own and waiting another timeout behind the last.
	failedLease chan struct{}
	failed      error

	blocks []block // by end, earliest first
	spent  int64   // units spent since since
	since  time.Time
	rate   float64 // demand, units per second, smoothed
	// denied is Redis's last refusal of a lease: until deniedUntil, a
	// cost of deniedCost or more that the blocks cannot cover is denied
	// here, without asking again.
	denied      ratelimit.Decision
	deniedCost  int64
	deniedUntil time.Time
	// remote is what Redis said remained after the last lease: a
	// decision reports it plus what the blocks hold.
	remote int64
	// shortUntil is when the key stops counting as saturated: Redis
	// refused its last lease, or gave less than was asked or could not
	// give another block of that size. Until then, a cost the blocks
	// cannot cover while a lease is in flight is denied here at once
	// (shortDenial) instead of waiting for the lease.
	shortUntil time.Time
	listed     bool // in batchedCounter.holding
}

// A block is capacity taken from the shared counter, valid until end.
type block struct {
	n   int64
	end time.Time
}

func newBatchedCounter(s *Store, c *counting, opts *Options) *batchedCounter {
	return &batchedCounter{
		s:        s,
		c:        c,
		entries:  newTable[batchedEntry](),
		span:     opts.BlockSpan,
		hold:     opts.BlockHold,
		replicas: int64(opts.Replicas),
	}
}

func (b *batchedCounter) entry(key string, r *ratelimit.Rule) *batchedEntry {
	e, made := b.entries.entry(key, r, b.newEntry)
	if made {
		b.c.started()
	}
	return e
}

func (b *batchedCounter) newEntry(key string, r *ratelimit.Rule) *batchedEntry {
	return &batchedEntry{key: key, rule: b.rules.get(r, b.derive)}
}

// holdsBlocks reports whether r's blocks can be held at all: a fixed
// window's until the window ends, a bucket's when it is large enough to
// keep a block Options.BlockHold (derive's hold is not 0). A rule whose
// blocks cannot be held is decided at Redis (counting.decidesHere).
func (b *batchedCounter) holdsBlocks(r *ratelimit.Rule) bool {
	return r.Algorithm == ratelimit.FixedWindow || (r.Capacity()/8 > 0 && b.hold >= r.Interval())
}

// derive is what r needs to be counted in blocks.
func (b *batchedCounter) derive(r *ratelimit.Rule) *batchedRule {
	br := &batchedRule{Rule: r}
	l := *r
	l.Counting = ratelimit.Strict
	switch capacity := r.Capacity(); {
	case r.Algorithm == ratelimit.FixedWindow:
		br.maxBlock = max(1, r.Quota/(4*b.replicas))
	case capacity > 0:
		iv := r.Interval()
		k := min(capacity/8, int64(b.hold/iv))
		br.hold = time.Duration(k) * iv
		l.Burst = capacity - k
		br.maxBlock = max(1, l.Burst/(4*b.replicas))
	}
	br.lease = &l
	return br
}

// take decides a positive cost of key under r: from the blocks held, from
// a lease Redis refused until later, or from a new lease it waits for.
// undo gives back what an admitted decision took.
func (b *batchedCounter) take(ctx context.Context, key string, r *ratelimit.Rule, cost int64) (ratelimit.Decision, func(), error) {
	e := b.entry(key, r)
	for {
		now := b.s.localNow()
		e.mu.Lock()
		e.used = now
		if d, end, ok := b.takeHeld(e, now, cost); ok {
			e.mu.Unlock()
			b.counted.Add(1)
			if !d.Allowed {
				return d, nil, nil
			}
			return d, func() { b.giveBack(e, cost, end) }, nil
		}
		if ch := e.busy; ch != nil {
			if now.Before(e.shortUntil) {
				d := e.shortDenial(now, cost)
				e.mu.Unlock()
				b.counted.Add(1)
				return d, nil, nil
			}
			if b.s.brks.anyOpen() && b.s.brks.forKey(ctx, b.s.redisKey(key)).down() {
				// The key's node has not answered since its breaker
				// opened: the lease in flight is its probe (or was sent
				// before), and waiting for it would add up to a timeout
				// to what the failure mode decides anyway.
				e.mu.Unlock()
				return ratelimit.Decision{Capacity: r.Capacity(), Rule: r.Name}, nil, errUnavailable
			}
			e.mu.Unlock()
			select {
			case <-ch:
				e.mu.Lock()
				failed, err := e.failedLease == ch, e.failed
				e.mu.Unlock()
				if failed {
					return ratelimit.Decision{Capacity: r.Capacity(), Rule: r.Name}, nil, err
				}
				continue
			case <-ctx.Done():
				return ratelimit.Decision{}, nil, ctx.Err()
			}
		}
		n := e.blockSize(b, now, cost)
		ch := make(chan struct{})
		e.busy = ch
		e.mu.Unlock()
		d, end, err := b.lease(ctx, e, n, cost, ch)
		if err != nil || !d.Allowed {
			d.Capacity, d.Rule = r.Capacity(), r.Name
			return d, nil, err
		}
		return d, func() { b.giveBack(e, cost, end) }, nil
	}
}

// takeHeld decides cost without Redis when it can: admitted from the
// blocks held (end is the end of the last block it took from), or denied
// by the refusal of a lease that still stands. Called with e.mu held.
func (b *batchedCounter) takeHeld(e *batchedEntry, now time.Time, cost int64) (d ratelimit.Decision, end time.Time, ok bool) {
	r := e.rule
	if avail := e.available(now, b); avail >= cost {
		end := e.spend(cost)
		e.spent += cost // demand is what is admitted: a block that would not be spent only strands
		left := avail - cost
		b.maybePrefetch(e, now, left)
		return ratelimit.Decision{Allowed: true, Capacity: r.Capacity(), Remaining: min(r.Capacity(), left+e.remote), Rule: r.Name}, end, true
	}
	if cost >= e.deniedCost && now.Before(e.deniedUntil) {
		d := e.denied
		d.RetryAfter = e.deniedUntil.Sub(now)
		return d, time.Time{}, true
	}
	return ratelimit.Decision{}, time.Time{}, false
}

// shortDenial is the denial of cost on a saturated key whose blocks cannot
// cover it while a lease is in flight: what Redis would most likely answer
// (the lease in flight takes what it holds), without waiting a round trip
// behind it. Denying more than Redis would is on the safe side of the
// limit; what is not admitted stays in Redis, for the next lease. Called
// with e.mu held.
func (e *batchedEntry) shortDenial(now time.Time, cost int64) ratelimit.Decision {
	r := e.rule
	retry := e.shortUntil.Sub(now)
	if r.Algorithm != ratelimit.FixedWindow {
		retry = min(retry, time.Duration(min(cost, r.Capacity()))*r.Interval())
	}
	// ResetAfter: the last refusal's, timed from when its lease was sent,
	// at least the RetryAfter.
	reset := retry
	if !e.deniedUntil.IsZero() {
		reset = max(reset, e.deniedUntil.Add(e.denied.ResetAfter-e.denied.RetryAfter).Sub(now))
	}
	return ratelimit.Decision{Allowed: false, Reason: ratelimit.ReasonLimited, Capacity: r.Capacity(), ResetAfter: reset, RetryAfter: retry, Rule: r.Name}
}

// held answers cost of key under r as a check, Allowed, when the blocks
// held cover it: what a request of that item alone would get.
func (b *batchedCounter) held(key string, r *ratelimit.Rule, cost int64) (ratelimit.Decision, bool) {
	e := b.entry(key, r)
	e.mu.Lock()
	defer e.mu.Unlock()
	avail := e.available(b.s.localNow(), b)
	if avail < cost {
		return ratelimit.Decision{}, false
	}
	return ratelimit.Decision{Allowed: true, Capacity: r.Capacity(), Remaining: min(r.Capacity(), avail+e.remote), Rule: r.Name}, true
}

// available is what e's valid blocks hold at now, after dropping the
// expired ones. Called with e.mu held.
func (e *batchedEntry) available(now time.Time, b *batchedCounter) int64 {
	var n int64
	i := 0
	for _, bl := range e.blocks {
		if now.Before(bl.end) {
			e.blocks[i] = bl
			i++
			n += bl.n
		} else {
			b.stranded.Add(uint64(bl.n))
		}
	}
	clear(e.blocks[i:])
	e.blocks = e.blocks[:i]
	return n
}

// spend takes n ≤ available from the blocks that end first, returning the
// end of the last block it took from. Called with e.mu held.
func (e *batchedEntry) spend(n int64) time.Time {
	var end time.Time
	for n > 0 && len(e.blocks) > 0 {
		bl := &e.blocks[0]
		t := min(bl.n, n)
		bl.n -= t
		n -= t
		end = bl.end
		if bl.n == 0 {
			e.blocks = e.blocks[1:]
		}
	}
	return end
}

// addBlock adds a block of n units ending at end to e, and puts e in the
// list of entries holding blocks (b.holding). Called with e.mu held.
func (b *batchedCounter) addBlock(e *batchedEntry, n int64, end time.Time) {
	if n <= 0 {
		return
	}
	b.list(e)
	i := len(e.blocks)
	for i > 0 && e.blocks[i-1].end.After(end) {
		i--
	}
	if i > 0 && e.blocks[i-1].end.Equal(end) {
		e.blocks[i-1].n += n
		return
	}
	e.blocks = append(e.blocks, block{})
	copy(e.blocks[i+1:], e.blocks[i:])
	e.blocks[i] = block{n, end}
}

// spanOf is how much demand one of e's blocks covers: the counter's span,
// at most e's hold. Called with e.mu held.
func (b *batchedCounter) spanOf(e *batchedEntry) time.Duration {
	if e.rule.hold > 0 {
		return min(b.span, e.rule.hold)
	}
	return b.span
}

// blockSize is the next block for e: span of its recent demand, at least
// need, at most the rule's maxBlock (or need, when bigger). Called with
// e.mu held.
func (e *batchedEntry) blockSize(b *batchedCounter, now time.Time, need int64) int64 {
	if !e.since.IsZero() {
		if dt := now.Sub(e.since).Seconds(); dt > 0 {
			inst := float64(e.spent) / dt
			if e.rate == 0 {
				e.rate = inst
			} else {
				e.rate = 0.5*e.rate + 0.5*inst
			}
		}
	}
	e.spent, e.since = 0, now
	n := int64(e.rate * b.spanOf(e).Seconds()) // rounded down: a unit the demand would not spend within the hold strands
	return max(need, min(n, e.rule.maxBlock))
}

// maybePrefetch starts a lease in the background when e's blocks run low
// (below half the next block) and none is in flight. Called with e.mu held.
func (b *batchedCounter) maybePrefetch(e *batchedEntry, now time.Time, left int64) {
	if e.busy != nil {
		return
	}
	want := min(e.rule.maxBlock, int64(e.rate*b.spanOf(e).Seconds()))
	if want <= 0 || left*2 >= want {
		return
	}
	n := e.blockSize(b, now, 1)
	ch := make(chan struct{})
	e.busy = ch
	if !b.c.goAsync(func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.s.timeout)
		defer cancel()
		b.lease(ctx, e, n, 0, ch) //nolint:errcheck // a failed prefetch leaves the caller to lease
	}) {
		e.busy = nil
		close(ch)
	}
}

// lease takes a block of n units from Redis, of which the caller spends
// need at once (0 for a prefetch): when n is denied, it asks for what
// remains if that covers need, else for need alone (so that the refusal's
// RetryAfter is need's). It ends e's busy state ch.
func (b *batchedCounter) lease(ctx context.Context, e *batchedEntry, n, need int64, ch chan struct{}) (ratelimit.Decision, time.Time, error) {
	sent := b.s.localNow()
	item := []ratelimit.Item{{Key: e.key, Rule: e.rule.lease, Cost: n}}
	ds, err := b.s.decideRedis(ctx, nil, item)
	b.leases.Add(1)
	if err == nil && !ds[0].Allowed && ds[0].Reason == ratelimit.ReasonLimited && n > need && need > 0 {
		item[0].Cost = max(need, ds[0].Remaining)
		ds, err = b.s.decideRedis(ctx, nil, item)
		b.leases.Add(1)
	}
	var d ratelimit.Decision
	var end time.Time
	e.mu.Lock()
	e.busy = nil
	if errors.Is(err, errUnavailable) {
		e.failedLease, e.failed = ch, err
	}
	close(ch)
	if err == nil {
		d = ds[0]
		end = b.leased(e, &d, sent, n, item[0].Cost, need)
	}
	e.mu.Unlock()
	return d, end, err
}

// leased keeps Redis's answer d to a lease of n units (asked for a block
// of asked) sent at sent, of which need are spent at once: an admitted
// lease's block (whose end it returns), or a refusal to remember; and
// marks whether the key is short (see batchedEntry.shortUntil). Called
// with e.mu held.
func (b *batchedCounter) leased(e *batchedEntry, d *ratelimit.Decision, sent time.Time, asked, n, need int64) time.Time {
	r := e.rule
	if !d.Allowed {
		if d.Reason == ratelimit.ReasonLimited {
			e.short(b, sent, d)
			if need > 0 {
				d.Capacity, d.Rule = r.Capacity(), r.Name
				e.denied, e.deniedCost, e.deniedUntil = *d, n, sent.Add(d.RetryAfter)
			}
		}
		return time.Time{}
	}
	if n < asked || d.Remaining < asked {
		e.short(b, sent, d)
	} else {
		e.shortUntil = time.Time{}
	}
	end := sent.Add(e.rule.hold)
	if r.Algorithm == ratelimit.FixedWindow {
		end = sent.Add(d.ResetAfter)
	}
	b.addBlock(e, n-need, end)
	e.spent += need
	e.remote = d.Remaining
	d.Remaining = min(r.Capacity(), d.Remaining+e.available(b.s.localNow(), b))
	return end
}

// short marks e saturated after Redis's answer d to a lease sent at sent:
// a fixed window until its window ends (the next one starts full), a
// bucket for a span beyond the refusal's RetryAfter (what refills in the
// meantime goes to the next lease). Called with e.mu held.
func (e *batchedEntry) short(b *batchedCounter, sent time.Time, d *ratelimit.Decision) {
	if e.rule.Algorithm == ratelimit.FixedWindow {
		e.shortUntil = sent.Add(d.ResetAfter)
		return
	}
	e.shortUntil = sent.Add(d.RetryAfter + b.spanOf(e))
}

// giveBack returns n units taken from a block ending at end (an undone
// decision) to e, if the block is still valid.
func (b *batchedCounter) giveBack(e *batchedEntry, n int64, end time.Time) {
	e.mu.Lock()
	if b.s.localNow().Before(end) {
		b.addBlock(e, n, end)
	}
	e.mu.Unlock()
}

// list puts e in b.holding, once. Called with e.mu held.
func (b *batchedCounter) list(e *batchedEntry) {
	if e.listed {
		return
	}
	e.listed = true
	b.hmu.Lock()
	b.holding = append(b.holding, e)
	b.hmu.Unlock()
}

// giveBackIdle gives back the blocks of the idle entries in b.holding;
// those that still hold blocks stay in it.
func (b *batchedCounter) giveBackIdle() {
	now := b.s.localNow()
	b.hmu.Lock()
	es := b.holding
	b.holding = nil
	b.hmu.Unlock()
	for _, e := range es {
		b.returnIdle(e, now)
		e.mu.Lock()
		e.listed = false
		if len(e.blocks) > 0 {
			b.list(e)
		}
		e.mu.Unlock()
	}
}

// returnIdle gives back to Redis what e's blocks hold once its demand has
// stopped (no decision for two spans), in one refund under the lease rule.
func (b *batchedCounter) returnIdle(e *batchedEntry, now time.Time) {
	e.mu.Lock()
	if e.busy != nil || now.Sub(e.used) < 2*b.span {
		e.mu.Unlock()
		return
	}
	n := e.available(now, b)
	e.blocks = e.blocks[:0]
	e.rate = 0
	e.mu.Unlock()
	if n > 0 {
		b.refund(e, n)
	}
}

// refund gives n units of e back to Redis, in one refund under the lease
// rule, and forgets the refusal of a lease it remembers (and that the key
// was short), which the units may now cover; what Redis does not take
// back is stranded.
func (b *batchedCounter) refund(e *batchedEntry, n int64) {
	ctx, cancel := context.WithTimeout(context.Background(), b.s.timeout)
	defer cancel()
	if _, err := b.s.decideRedis(ctx, nil, []ratelimit.Item{{Key: e.key, Rule: e.rule.lease, Cost: -n}}); err != nil {
		b.stranded.Add(uint64(n))
		return
	}
	b.givebacks.Add(uint64(n))
	e.mu.Lock()
	e.deniedUntil, e.shortUntil = time.Time{}, time.Time{}
	e.mu.Unlock()
}

// forget forgets the entries that hold nothing and have been idle for
// forgetAfter.
func (b *batchedCounter) forget() {
	now := b.s.localNow()
	b.entries.each(func(e *batchedEntry) bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return now.Sub(e.used) > forgetAfter && e.busy == nil && len(e.blocks) == 0 && !e.listed
	})
}
