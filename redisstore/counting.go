package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// This file holds the counters of rules whose Counting is Batched or
// Approximate (see the package documentation, "Where the counter lives"):
// per (key, rule), what this replica holds of the shared counter, and the
// one goroutine that reconciles and gives back.

// Defaults of the counting options.
const (
	DefaultReconcileInterval = 25 * time.Millisecond
	DefaultBlockSpan         = 50 * time.Millisecond
	DefaultBlockHold         = 50 * time.Millisecond
)

// counters is the Store's part for batched and approximate rules.
type counters struct {
	s        *Store
	seed     maphash.Seed
	shards   [counterShards]counterShard
	interval time.Duration // between reconciliations (approximate)
	span     time.Duration // demand a block covers (batched)
	hold     time.Duration // longest a bucket's block is held (batched)
	stale    time.Duration // longest an approximate view is used unreconciled: 40 intervals
	replicas int64

	infos  sync.Map // *ratelimit.Rule → *countInfo
	ninfos atomic.Int64

	tmu     sync.Mutex
	touched []*entry // approximate entries with hits or asks since the last reconciliation

	hmu     sync.Mutex
	holding []*entry // batched entries that took blocks since the last giveBackIdle, or still hold some

	gmu    sync.RWMutex // held to start a goroutine; closed under it
	closed bool
	start  sync.Once // the loop, started with the first entry
	wg     sync.WaitGroup
	quit   chan struct{}

	leases, givebacks, reconciles, counted, stranded atomic.Uint64
}

const counterShards = 64

// forgetAfter is how long an entry that holds nothing is kept unused.
const forgetAfter = 10 * time.Second

type counterShard struct {
	mu sync.Mutex
	m  map[counterKey]*entry
}

type counterKey struct {
	key  string
	rule *ratelimit.Rule
}

// countInfo is what a rule needs to be counted locally, derived once.
type countInfo struct {
	rule *ratelimit.Rule
	// Batched: lease is the rule blocks are taken under (for a bucket, the
	// rule with its capacity lowered by what a held block could add; see
	// the package documentation), hold how long a bucket's block may be
	// held (0: blocks are spent at once; for FixedWindow, blocks end with
	// their window instead), maxBlock the largest block.
	lease    *ratelimit.Rule
	hold     time.Duration
	maxBlock int64
	// Approximate: push is the rule hits are reconciled under (capacity
	// doubled, so that hits already admitted are never refused), local the
	// rule local decisions are taken with (GCRA, as LeakyBucket decides).
	push, local *ratelimit.Rule
}

// An entry is one key of one rule in this replica.
type entry struct {
	mu   sync.Mutex
	key  string
	rkey string // its Redis key
	slot uint16 // rkey's hash slot, on a Cluster
	info *countInfo
	// busy is non-nil while a lease or a first reconciliation is in
	// flight; closed when it ends.
	busy chan struct{}
	used time.Time // last decision

	// Batched.
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

	// Approximate.
	view    ratelimit.State // the shared state, as this replica sees it
	synced  time.Time       // when view was last set from Redis; zero: never
	pending int64           // hits admitted, not yet sent
	kept    time.Time       // since when pending hits have been kept back; zero: none
	sending int64           // hits of the reconciliation in flight
	queued  bool            // in counters.touched
	listed  bool            // in counters.holding
}

// A block is capacity taken from the shared counter, valid until end.
type block struct {
	n   int64
	end time.Time
}

func newCounters(s *Store, opts *Options) *counters {
	c := &counters{
		s:        s,
		seed:     maphash.MakeSeed(),
		interval: opts.ReconcileInterval,
		span:     opts.BlockSpan,
		hold:     opts.BlockHold,
		replicas: int64(opts.Replicas),
		quit:     make(chan struct{}),
	}
	c.stale = 40 * c.interval
	return c
}

// stop ends the reconciler and waits for every lease in flight.
func (c *counters) stop() {
	c.gmu.Lock()
	c.closed = true
	close(c.quit)
	c.gmu.Unlock()
	c.wg.Wait()
}

// goAsync runs f in a goroutine the counters own, unless they are stopped.
func (c *counters) goAsync(f func()) bool {
	c.gmu.RLock()
	defer c.gmu.RUnlock()
	if c.closed {
		return false
	}
	c.wg.Go(f)
	return true
}

const maxCountInfos = 4096

func (c *counters) info(r *ratelimit.Rule) *countInfo {
	if v, ok := c.infos.Load(r); ok {
		return v.(*countInfo)
	}
	ci := &countInfo{rule: r}
	capacity := r.Capacity()
	switch r.Counting {
	case ratelimit.Batched:
		l := *r
		l.Counting = ratelimit.Strict
		if r.Algorithm == ratelimit.FixedWindow {
			ci.maxBlock = max(1, r.Quota/(4*c.replicas))
		} else if capacity > 0 {
			iv := r.Interval()
			k := min(capacity/8, int64(c.hold/iv))
			ci.hold = time.Duration(k) * iv
			l.Burst = capacity - k
			ci.maxBlock = max(1, l.Burst/(4*c.replicas))
		}
		ci.lease = &l
	case ratelimit.Approximate:
		p := *r
		p.Counting = ratelimit.Strict
		if capacity > 0 && capacity <= ratelimit.MaxQuota/2 {
			p.Burst = 2 * capacity
			if p.Validate() != nil { // 2 × capacity × interval overflows
				p.Burst = capacity
			}
		}
		ci.push = &p
		l := *r
		l.Algorithm, l.Counting = ratelimit.GCRA, ratelimit.Strict
		ci.local = &l
	}
	if c.ninfos.Add(1) > maxCountInfos {
		c.infos.Clear()
		c.ninfos.Store(1)
	}
	c.infos.Store(r, ci)
	return ci
}

func (c *counters) entry(key string, r *ratelimit.Rule) *entry {
	sh := &c.shards[maphash.String(c.seed, key)%counterShards]
	k := counterKey{key, r}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok {
		return e
	}
	if sh.m == nil {
		sh.m = make(map[counterKey]*entry)
	}
	e := &entry{key: key, rkey: string(appendKey(nil, c.s.prefix, c.s.tagOf(key), key)), info: c.info(r)}
	if c.s.cluster {
		e.slot = slot(e.rkey)
	}
	sh.m[k] = e
	c.start.Do(func() { c.goAsync(c.loop) })
	return e
}

// decidesHere reports whether item is decided by the counters: a positive cost
// of a batched or approximate rule that a block or a share can hold.
// Checks and refunds go to Redis as they would in strict mode.
func (c *counters) decidesHere(it *ratelimit.Item) bool {
	r := it.Rule
	if it.Cost <= 0 || it.Cost > r.Capacity() {
		return false
	}
	switch r.Counting {
	case ratelimit.Batched:
		return true
	case ratelimit.Approximate:
		return it.Cost <= r.Capacity()/c.replicas
	}
	return false
}

// take decides a positive cost of a local item. It returns errUnavailable
// when neither what the replica holds nor Redis can decide it; undo gives
// back what an admitted decision took.
func (c *counters) take(ctx context.Context, it *ratelimit.Item) (d ratelimit.Decision, undo func(), err error) {
	e := c.entry(it.Key, it.Rule)
	if it.Rule.Counting == ratelimit.Batched {
		return c.takeBlock(ctx, e, it.Cost)
	}
	return c.takeShare(ctx, e, it.Cost)
}

// --- batched ---

// available is what e's valid blocks hold at now, after dropping the
// expired ones.
func (e *entry) available(now time.Time, c *counters) int64 {
	var n int64
	i := 0
	for _, b := range e.blocks {
		if now.Before(b.end) {
			e.blocks[i] = b
			i++
			n += b.n
		} else {
			c.stranded.Add(uint64(b.n))
		}
	}
	clear(e.blocks[i:])
	e.blocks = e.blocks[:i]
	return n
}

// spend takes n ≤ available from the blocks that end first, returning the
// end of the last block it took from.
func (e *entry) spend(n int64) time.Time {
	var end time.Time
	for n > 0 && len(e.blocks) > 0 {
		b := &e.blocks[0]
		t := min(b.n, n)
		b.n -= t
		n -= t
		end = b.end
		if b.n == 0 {
			e.blocks = e.blocks[1:]
		}
	}
	return end
}

// addBlock adds a block of n units ending at end to e, and puts e in the
// list of entries holding blocks (c.holding). Called with e.mu held.
func (c *counters) addBlock(e *entry, n int64, end time.Time) {
	if n <= 0 {
		return
	}
	c.list(e)
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

// blockSize is the next block for e: span of its recent demand, at least
// need, at most the rule's maxBlock (or need, when bigger). Called with
// e.mu held.
func (e *entry) blockSize(c *counters, now time.Time, need int64) int64 {
	ci := e.info
	if ci.hold == 0 && ci.rule.Algorithm != ratelimit.FixedWindow {
		return need // nothing can be held: ask for what is spent now
	}
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
	span := c.span
	if ci.hold > 0 {
		span = min(span, ci.hold)
	}
	n := int64(e.rate * span.Seconds()) // rounded down: a unit the demand would not spend within the hold strands
	return max(need, min(n, ci.maxBlock))
}

func (c *counters) takeBlock(ctx context.Context, e *entry, cost int64) (ratelimit.Decision, func(), error) {
	r := e.info.rule
	for {
		now := c.s.localNow()
		e.mu.Lock()
		e.used = now
		if avail := e.available(now, c); avail >= cost {
			end := e.spend(cost)
			e.spent += cost // demand is what is admitted: a block that would not be spent only strands
			left := avail - cost
			c.maybePrefetch(e, now, left)
			d := ratelimit.Decision{Allowed: true, Capacity: r.Capacity(), Remaining: min(r.Capacity(), left+e.remote), Rule: r.Name}
			e.mu.Unlock()
			c.counted.Add(1)
			return d, func() { c.giveBack(e, cost, end) }, nil
		}
		if cost >= e.deniedCost && now.Before(e.deniedUntil) {
			d := e.denied
			d.RetryAfter = e.deniedUntil.Sub(now)
			e.mu.Unlock()
			c.counted.Add(1)
			return d, nil, nil
		}
		if ch := e.busy; ch != nil {
			e.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ratelimit.Decision{}, nil, ctx.Err()
			}
		}
		n := e.blockSize(c, now, cost)
		ch := make(chan struct{})
		e.busy = ch
		e.mu.Unlock()
		d, end, err := c.lease(ctx, e, n, cost, ch)
		if err != nil || !d.Allowed {
			d.Capacity, d.Rule = r.Capacity(), r.Name
			return d, nil, err
		}
		return d, func() { c.giveBack(e, cost, end) }, nil
	}
}

// maybePrefetch starts a lease in the background when e's blocks run low
// (below half the next block) and none is in flight. Called with e.mu held.
func (c *counters) maybePrefetch(e *entry, now time.Time, left int64) {
	ci := e.info
	if e.busy != nil || (ci.hold == 0 && ci.rule.Algorithm != ratelimit.FixedWindow) {
		return
	}
	span := c.span
	if ci.hold > 0 {
		span = min(span, ci.hold)
	}
	want := min(ci.maxBlock, int64(e.rate*span.Seconds()))
	if want <= 0 || left*2 >= want {
		return
	}
	n := e.blockSize(c, now, 1)
	ch := make(chan struct{})
	e.busy = ch
	if !c.goAsync(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.s.timeout)
		defer cancel()
		c.lease(ctx, e, n, 0, ch) //nolint:errcheck // a failed prefetch leaves the caller to lease
	}) {
		e.busy = nil
		close(ch)
	}
}

// lease takes a block of n units from Redis, of which the caller spends
// need at once (0 for a prefetch): when n is denied, it asks for what
// remains if that covers need, else for need alone (so that the refusal's
// RetryAfter is need's). It ends e's busy state ch.
func (c *counters) lease(ctx context.Context, e *entry, n, need int64, ch chan struct{}) (ratelimit.Decision, time.Time, error) {
	ci := e.info
	sent := c.s.localNow()
	item := []ratelimit.Item{{Key: e.key, Rule: ci.lease, Cost: n}}
	ds, err := c.s.decideRedis(ctx, nil, item)
	c.leases.Add(1)
	if err == nil && !ds[0].Allowed && ds[0].Reason == ratelimit.ReasonLimited && n > need && need > 0 {
		item[0].Cost = max(need, ds[0].Remaining)
		ds, err = c.s.decideRedis(ctx, nil, item)
		c.leases.Add(1)
	}
	var d ratelimit.Decision
	var end time.Time
	e.mu.Lock()
	e.busy = nil
	close(ch)
	if err == nil {
		d = ds[0]
		if d.Allowed {
			end = sent.Add(ci.hold)
			if ci.rule.Algorithm == ratelimit.FixedWindow {
				end = sent.Add(d.ResetAfter)
			}
			c.addBlock(e, item[0].Cost-need, end)
			e.spent += need
			e.remote = d.Remaining
			d.Remaining = min(ci.rule.Capacity(), d.Remaining+e.available(c.s.localNow(), c))
		} else if need > 0 && d.Reason == ratelimit.ReasonLimited {
			d.Capacity, d.Rule = ci.rule.Capacity(), ci.rule.Name
			e.denied, e.deniedCost, e.deniedUntil = d, item[0].Cost, sent.Add(d.RetryAfter)
		}
	}
	e.mu.Unlock()
	return d, end, err
}

// giveBack returns n units taken from a block ending at end (an undone
// decision) to e, if the block is still valid.
func (c *counters) giveBack(e *entry, n int64, end time.Time) {
	e.mu.Lock()
	if c.s.localNow().Before(end) {
		c.addBlock(e, n, end)
	}
	e.mu.Unlock()
}

// returnIdle gives back to Redis what e's blocks hold once its demand has
// stopped (no decision for two spans), in one refund under the lease rule.
func (c *counters) returnIdle(e *entry, now time.Time) {
	e.mu.Lock()
	if e.busy != nil || now.Sub(e.used) < 2*c.span {
		e.mu.Unlock()
		return
	}
	n := e.available(now, c)
	e.blocks = e.blocks[:0]
	e.rate = 0
	e.mu.Unlock()
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.s.timeout)
	defer cancel()
	if _, err := c.s.decideRedis(ctx, nil, []ratelimit.Item{{Key: e.key, Rule: e.info.lease, Cost: -n}}); err == nil {
		c.givebacks.Add(uint64(n))
	} else {
		c.stranded.Add(uint64(n))
	}
}

// --- approximate ---

func (c *counters) takeShare(ctx context.Context, e *entry, cost int64) (ratelimit.Decision, func(), error) {
	ci := e.info
	r := ci.rule
	now := c.s.localNow()
	e.mu.Lock()
	e.used = now
	// A view is used while Redis answers, however old (a view that missed
	// others' hits admits at most this replica's share, which the bound
	// counts); while the breaker is open, for 40 intervals after its last
	// reconciliation. A key with no view yet starts from a fresh state.
	if c.s.brk.isOpen() && (e.synced.IsZero() || now.Sub(e.synced) >= c.stale) {
		e.mu.Unlock()
		return ratelimit.Decision{}, nil, errUnavailable
	}
	var d ratelimit.Decision
	ci.local.DecideInto(&d, &e.view, now, cost*c.replicas)
	if d.Allowed {
		e.pending += cost
	}
	c.queue(e)
	e.mu.Unlock()
	c.counted.Add(1)
	d.Capacity, d.Rule = r.Capacity(), r.Name
	if !d.Allowed {
		d.Reason = ratelimit.ReasonLimited
		return d, nil, nil
	}
	return d, func() { c.unshare(e, cost) }, nil
}

// setView sets e's view from the shared state's debt (ResetAfter: the time
// until the key is back to full capacity) for a call sent at sent, plus
// the hits this replica admitted that Redis has not counted yet. Timed
// from when the call was sent, the view is ahead of the shared state by
// up to a round trip: what that admits beyond the share is counted at the
// next reconciliation, and is in the bound. Called with e.mu held.
func (e *entry) setView(debt time.Duration, recv time.Time, replicas int64) {
	iv := e.info.local.Interval()
	t := recv.Add(debt).UnixNano()
	extra := (e.pending + e.sending) * replicas
	e.view = ratelimit.State{Algorithm: ratelimit.GCRA, T: t + int64(iv)*extra, N: int64(iv), Seen: recv.UnixNano()}
	e.synced = recv
}

func (c *counters) unshare(e *entry, cost int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending -= min(cost, e.pending)
	e.info.local.Decide(&e.view, c.s.localNow(), -cost*c.replicas)
}

// queue puts e in the next reconciliation. Called with e.mu held.
func (c *counters) queue(e *entry) {
	if e.queued {
		return
	}
	e.queued = true
	c.tmu.Lock()
	c.touched = append(c.touched, e)
	c.tmu.Unlock()
}

// list puts e in c.holding, once. Called with e.mu held.
func (c *counters) list(e *entry) {
	if e.listed {
		return
	}
	e.listed = true
	c.hmu.Lock()
	c.holding = append(c.holding, e)
	c.hmu.Unlock()
}

// loop reconciles approximate keys every interval; every fourth, it gives
// back what idle batched keys hold, and every fortieth it forgets the
// entries unused for long. (Visiting every entry costs a cache miss each:
// at 10,000 keys, doing it every fourth interval took 5 % of a service's
// CPU.)
func (c *counters) loop() {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-c.quit:
			c.flush() // what was kept back, before the Store closes
			return
		case <-t.C:
		}
		c.reconcile()
		if tick%4 == 3 {
			c.giveBackIdle()
		}
		if tick%40 == 39 {
			c.forget()
		}
	}
}

// reconcile sends, in one pipeline, the hits of every approximate key
// touched since the last reconciliation, or a look (no hits) for a key
// whose hits may be kept back (keepBack) or that has none (one denied
// here), and sets each key's view from the reply. A key that is not
// touched is not sent: its view is refreshed by the reconciliation after
// its next use, and forget queues one whose hits were kept back too long.
// A key whose reconciliation failed keeps its hits for the next one; a
// call answered as failed never took effect (its cutoff, see Deadlines),
// so nothing is counted twice.
func (c *counters) reconcile() { c.send(false) }

// flush sends every hit pending, touched or kept back.
func (c *counters) flush() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			e.mu.Lock()
			if e.pending > 0 {
				c.queue(e)
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	c.send(true)
}

// send is reconcile; with all, it sends every hit, keeping none back.
func (c *counters) send(all bool) {
	c.tmu.Lock()
	es := c.touched
	c.touched = nil
	c.tmu.Unlock()
	if len(es) == 0 {
		return
	}
	now := c.s.localNow()
	ps := make([]push, len(es))
	for i, e := range es {
		e.mu.Lock()
		e.queued = false
		n := e.pending
		if !all && c.keepBack(e, now) {
			n = 0
			if e.kept.IsZero() {
				e.kept = now
			}
		}
		// At most the push rule's capacity at once (the rest next time):
		// more would be refused as beyond capacity whatever the state.
		e.sending = min(n, e.info.push.Capacity())
		e.pending -= e.sending
		if e.sending > 0 || e.pending == 0 {
			e.kept = time.Time{} // nothing kept; what is left past the push rule's capacity goes next time
		}
		ps[i] = push{e: e, cost: e.sending}
		e.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.s.timeout)
	defer cancel()
	sent := c.s.localNow()
	c.s.pushAll(ctx, ps)
	c.reconciles.Add(1)
	for i := range ps {
		p := &ps[i]
		e := p.e
		e.mu.Lock()
		if p.err != nil || !p.counted {
			e.pending += e.sending // not counted: sent again next time
		}
		e.sending = 0
		if p.err == nil {
			e.setView(p.debt, sent, c.replicas)
		}
		if e.pending > 0 && e.kept.IsZero() {
			c.queue(e)
		}
		e.mu.Unlock()
	}
}

// keepBack reports whether e's pending hits may wait for a later
// reconciliation, which then sends them all at once: while its view
// (which charges them Replicas-fold until they are sent) is at most half
// used, and for at most c.stale. A replica's view limits what it admits
// whether its hits are sent or kept, so the bound is the same; what
// keeping them costs is that the other replicas see them later, which
// matters only near the limit, where they are sent every interval. Most
// keys, far below their limits, then cost Redis a look (a read) after
// each use and a write every c.stale, instead of a write after each use.
// Called with e.mu held.
func (c *counters) keepBack(e *entry, now time.Time) bool {
	if e.pending == 0 || c.keptTooLong(e, now) {
		return false
	}
	l := e.info.local
	debt := e.view.T - now.UnixNano()
	return float64(debt) <= 0.5*float64(l.Capacity())*float64(l.Interval())
}

// keptTooLong reports whether e has kept hits back for c.stale. Called
// with e.mu held.
func (c *counters) keptTooLong(e *entry, now time.Time) bool {
	return !e.kept.IsZero() && now.Sub(e.kept) >= c.stale
}

// giveBackIdle gives back the blocks of the idle batched keys in
// c.holding; those that still hold blocks stay in it.
func (c *counters) giveBackIdle() {
	now := c.s.localNow()
	c.hmu.Lock()
	es := c.holding
	c.holding = nil
	c.hmu.Unlock()
	for _, e := range es {
		c.returnIdle(e, now)
		e.mu.Lock()
		e.listed = false
		if len(e.blocks) > 0 {
			c.list(e)
		}
		e.mu.Unlock()
	}
}

// forget forgets the entries that hold nothing and have been idle for
// forgetAfter, and queues those whose hits were kept back for c.stale.
func (c *counters) forget() {
	now := c.s.localNow()
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			e.mu.Lock()
			if e.pending > 0 && c.keptTooLong(e, now) {
				c.queue(e) // kept back long enough, and not used since: sent next time
			}
			if now.Sub(e.used) > forgetAfter && e.busy == nil && len(e.blocks) == 0 && e.pending == 0 && e.sending == 0 && !e.queued && !e.listed {
				delete(sh.m, k)
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
}

// A push is one key's part of a reconciliation: the hits sent, and what
// Redis answered.
type push struct {
	e    *entry
	cost int64
	// Once answered without err: debt is the key's ResetAfter, counted
	// whether the hits were counted (if not, they were beyond even the
	// push rule's capacity, and nothing was written).
	debt    time.Duration
	counted bool
	err     error
}

// maxReconcileKeys bounds the keys of one reconciliation script call: the
// script reads their states with one MGET (Lua's unpack takes a few
// thousand values at most), and Redis serves no one else while it runs.
const maxReconcileKeys = 256

// reconcileCount, in argCount, marks decide.lua's reconciliation form.
const reconcileCount = "r"

// A pushGroup is keys that can share a reconciliation script call: of one
// GCRA rule within the script's doubles (its arguments) and, on a
// Cluster, of one slot.
type pushGroup struct {
	ra   *ruleArgs
	slot uint16
}

// pushRequest makes the reconciliation call of the pushes idx, all of
// group g.
func (s *Store) pushRequest(g pushGroup, ps []push, idx []int, nowArg any) *request {
	req := &request{keys: make([]string, len(idx)), args: make([]any, argHeader+itemFields+len(idx)), whole: true}
	req.args[argNow], req.args[argSlack], req.args[argCount] = nowArg, s.slackMS, reconcileCount
	req.args[argMask], req.args[argDeadline] = s.small(1<<ratelimit.GCRA), ""
	copy(req.args[argHeader:], g.ra.fields[:])
	req.args[argHeader+fieldKey], req.args[argHeader+fieldCost] = s.small(0), s.small(0)
	for j, i := range idx {
		req.keys[j] = ps[i].e.rkey
		req.args[argHeader+itemFields+j] = s.small(ps[i].cost)
		req.takes = req.takes || ps[i].cost > 0
	}
	return req
}

// pushAll sends every push's hits to Redis under its key's push rule, and
// sets each push's answer. The keys of a pushGroup go in script calls of
// up to maxReconcileKeys keys each (decide.lua's reconciliation form),
// any other key (a LeakyBucket rule, one beyond the script's doubles) as
// a request of its own; all in one pipeline when the Store coalesces
// (on a Cluster, one per node), else one call after the other. A key the
// reconciliation form does not take (a stored state it does not read,
// written under another rule, or too far from now) is sent again on its
// own, after the pipeline.
func (s *Store) pushAll(ctx context.Context, ps []push) {
	if !s.brk.allow() {
		for i := range ps {
			ps[i].err = errUnavailable
		}
		return
	}
	deadline := time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var nowArg any = ""
	if s.now != nil {
		nowArg = formatNano(s.now())
	}
	// A part is one script call: a group's keys (whole), or one key's
	// request as build makes it.
	type part struct {
		c   *call
		idx []int // its pushes, in ps
	}
	var parts []part
	var alone []int // each decided by decideRedis, on its own
	groups := map[pushGroup][]int{}
	for i := range ps {
		e := ps[i].e
		r := e.info.push
		ra, err := s.ruleArgs(r)
		if err != nil {
			ps[i].err = err
			continue
		}
		if r.Algorithm == ratelimit.GCRA && !ra.exact {
			g := pushGroup{ra: ra}
			if s.cluster {
				g.slot = e.slot
			}
			groups[g] = append(groups[g], i)
			continue
		}
		if s.batch == nil {
			alone = append(alone, i)
			continue
		}
		req, err := s.build([]ratelimit.Item{{Key: e.key, Rule: r, Cost: ps[i].cost}})
		if err != nil || req.exact || req.calendar {
			if err == nil {
				req.release()
			}
			alone = append(alone, i) // decideRedis reports the error, or decides it apart
			continue
		}
		req.args[argNow] = nowArg
		parts = append(parts, part{c: &call{ctx: ctx, deadline: deadline, req: req, done: make(chan struct{}, 1)}, idx: []int{i}})
	}
	for g, idx := range groups {
		for len(idx) > 0 {
			n := min(len(idx), maxReconcileKeys)
			req := s.pushRequest(g, ps, idx[:n], nowArg)
			parts = append(parts, part{c: &call{ctx: ctx, deadline: deadline, req: req, done: make(chan struct{}, 1)}, idx: idx[:n]})
			idx = idx[n:]
		}
	}
	// Every call that takes carries its cutoff, so that one answered
	// late is not counted (and its hits, kept, not counted twice): the
	// batcher sets the pipeline's own over it when it combines calls,
	// not for a lone one.
	calls := make([]*call, 0, len(parts))
	for _, p := range parts {
		c := p.c
		if c.req.takes {
			cut, err := s.sclock.cutoff(ctx, c.req.keys[0], time.Now(), deadline)
			if err != nil {
				c.answer(nil, err)
				continue
			}
			c.req.setCutoff(cut)
		}
		calls = append(calls, c)
	}
	if s.batch != nil {
		s.batch.send(calls)
	} else {
		for _, c := range calls { // whole ones only: every other is alone
			c.answer(s.script.Run(ctx, s.c, c.req.keys, c.req.args...).Slice())
		}
	}
	var failed error
	for _, p := range parts {
		<-p.c.done
		res, err := p.c.res, p.c.err
		if err == nil && len(res) == 1 && res[0] == int64(replyExpired) {
			err = errExpired
		}
		if errors.Is(err, errExpired) && time.Now().Before(deadline) {
			s.sclock.expired(ctx, p.c.req.keys[0]) // answered in time, yet past the cutoff: measure again
		}
		switch {
		case err != nil:
			failed = err
			for _, i := range p.idx {
				ps[i].err = err
			}
		case p.c.req.whole:
			if err := parsePushes(ps, p.idx, res, &alone); err != nil {
				failed = err
			}
		case len(res) == 1 && res[0] == int64(replyFar):
			alone = append(alone, p.idx[0]) // decided on the exact path
		default:
			i := p.idx[0]
			ds, err := parse(nil, []ratelimit.Item{{Rule: ps[i].e.info.push}}, res)
			if err != nil {
				failed, ps[i].err = err, err
			} else {
				ps[i].setDecision(ds[0])
			}
		}
		if !p.c.req.whole {
			p.c.req.release()
		}
	}
	if len(parts) > 0 {
		if failed != nil && !isScriptError(failed) {
			s.errors.Add(1)
			s.brk.done(failed)
		} else {
			s.brk.done(nil)
			s.requests.Add(1)
		}
	}
	for _, i := range alone {
		if ps[i].err != nil {
			continue
		}
		e := ps[i].e
		ds, err := s.decideRedis(ctx, nil, []ratelimit.Item{{Key: e.key, Rule: e.info.push, Cost: ps[i].cost}})
		if err != nil {
			ps[i].err = err
		} else {
			ps[i].setDecision(ds[0])
		}
	}
}

// parsePushes sets the answers of the pushes idx from the reply of their
// reconciliation call, and adds those the call did not take to alone.
func parsePushes(ps []push, idx []int, res []any, alone *[]int) error {
	if len(res) != len(idx) {
		err := fmt.Errorf("redisstore: reconciliation returned %d values for %d keys", len(res), len(idx))
		for _, i := range idx {
			ps[i].err = err
		}
		return err
	}
	for j, i := range idx {
		v, ok := res[j].(int64)
		switch {
		case !ok:
			ps[i].err = fmt.Errorf("redisstore: reconciliation returned %T", res[j])
		case v >= 0:
			ps[i].debt, ps[i].counted = time.Duration(v), true
		case v == replyFar:
			*alone = append(*alone, i)
		default:
			ps[i].debt = time.Duration(-3 - v)
		}
	}
	return nil
}

// setDecision sets p's answer from a decision of its push rule.
func (p *push) setDecision(d ratelimit.Decision) {
	if !d.Allowed && d.Reason != ratelimit.ReasonLimited {
		p.err = fmt.Errorf("redisstore: reconciliation refused: %s", d.Reason)
		return
	}
	p.debt, p.counted = d.ResetAfter, d.Allowed
}

func formatNano(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// decideCounted decides a request with an item of a batched or
// approximate rule. Its local items (counters.decidesHere) are taken from what
// this replica holds, in order; if they all are admitted, the other items
// are decided at Redis together, and if those are denied the local items
// are given back. So the request is all or nothing, though for a moment
// other requests of this replica may see the local items' capacity taken
// (they can only be denied by it, never admitted). When Redis cannot
// decide a local item, that item is decided by its rule's failure mode.
func (s *Store) decideCounted(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	for i := range items {
		if items[i].Rule == nil {
			return dst, fmt.Errorf("%w: item %q has no rule", ratelimit.ErrInvalidRule, items[i].Key)
		}
		if _, err := s.ruleArgs(items[i].Rule); err != nil {
			return dst, err
		}
	}
	out := make([]ratelimit.Decision, len(items))
	var undo []func()
	undoAll := func() {
		for _, u := range undo {
			u()
		}
	}
	var rest []ratelimit.Item
	var restIdx []int
	denied := -1
	for i := range items {
		it := &items[i]
		if !s.count.decidesHere(it) {
			rest, restIdx = append(rest, *it), append(restIdx, i)
			continue
		}
		d, u, err := s.count.take(ctx, it)
		if errors.Is(err, errUnavailable) {
			d = s.fb.decide(nil, items[i:i+1])[0]
		} else if err != nil {
			undoAll()
			return dst, err
		}
		out[i] = d
		if u != nil {
			undo = append(undo, u)
		}
		if !d.Allowed {
			denied = i
			break
		}
	}
	if denied >= 0 {
		undoAll()
		// The items not decided yet are asked as checks.
		rest, restIdx = rest[:0], restIdx[:0]
		for i := range items {
			if i != denied && (out[i] == ratelimit.Decision{}) {
				it := items[i]
				it.Cost = 0
				rest, restIdx = append(rest, it), append(restIdx, i)
			}
		}
		if len(rest) > 0 {
			ds, err := s.decideStrict(ctx, nil, rest)
			if err != nil {
				return dst, err
			}
			for j, i := range restIdx {
				out[i] = ds[j]
				out[i].Allowed = items[i].Cost <= ds[j].Remaining
			}
		}
		return append(dst, out...), nil
	}
	if len(rest) > 0 {
		ds, err := s.decideStrict(ctx, nil, rest)
		if err != nil {
			undoAll()
			return dst, err
		}
		if !ratelimit.Allowed(ds) {
			undoAll()
		}
		for j, i := range restIdx {
			out[i] = ds[j]
		}
	}
	return append(dst, out...), nil
}
