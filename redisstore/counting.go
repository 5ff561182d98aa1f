package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// This file holds what the two counting modes share (see the package
// documentation, "Where the counter lives"): a request whose items are
// decided here in part (decideCounted), the one goroutine that reconciles,
// gives back and forgets, and the tables of entries and rules. Each mode
// is its own counter: batchedCounter (batched.go) and approximateCounter
// (approximate.go).

// Defaults of the counting options.
const (
	DefaultReconcileInterval = 25 * time.Millisecond
	DefaultBlockSpan         = 50 * time.Millisecond
	DefaultBlockHold         = 50 * time.Millisecond
)

// forgetAfter is how long an entry that holds nothing is kept unused.
const forgetAfter = 10 * time.Second

// counting is the Store's part for batched and approximate rules: the
// counter of each mode, and the goroutines they run (the loop, and the
// leases taken in the background).
type counting struct {
	batched     *batchedCounter
	approximate *approximateCounter
	interval    time.Duration // between reconciliations (approximate)

	gmu    sync.RWMutex // held to start a goroutine; closed under it
	closed bool
	start  sync.Once // the loop, started with the first entry
	wg     sync.WaitGroup
	quit   chan struct{}
}

func newCounting(s *Store, opts *Options) *counting {
	c := &counting{interval: opts.ReconcileInterval, quit: make(chan struct{})}
	c.batched = newBatchedCounter(s, c, opts)
	c.approximate = newApproximateCounter(s, c, opts)
	return c
}

// stop ends the loop and waits for every lease in flight.
func (c *counting) stop() {
	c.gmu.Lock()
	c.closed = true
	close(c.quit)
	c.gmu.Unlock()
	c.wg.Wait()
}

// goAsync runs f in a goroutine of c, unless c is stopped.
func (c *counting) goAsync(f func()) bool {
	c.gmu.RLock()
	defer c.gmu.RUnlock()
	if c.closed {
		return false
	}
	c.wg.Go(f)
	return true
}

// started starts the loop, once: a counter calls it with its first entry.
func (c *counting) started() {
	c.start.Do(func() { c.goAsync(c.loop) })
}

// loop reconciles approximate keys every interval; every fourth, it gives
// back what idle batched keys hold, and every fortieth it forgets the
// entries unused for long. (Visiting every entry costs a cache miss each:
// at 10,000 keys, doing it every fourth interval took 5 % of a service's
// CPU.)
func (c *counting) loop() {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-c.quit:
			c.approximate.flush() // what was kept back, before the Store closes
			return
		case <-t.C:
		}
		c.approximate.reconcile()
		if tick%4 == 3 {
			c.batched.giveBackIdle()
		}
		if tick%40 == 39 {
			c.batched.forget()
			c.approximate.forget()
		}
	}
}

// decidesHere reports whether item is decided by a counter: a positive
// cost of a batched or approximate rule that a block or a share can hold.
// Checks and refunds go to Redis as they would in strict mode, and so does
// a batched bucket too small to hold a block: a lease of it would be spent
// at once, a round trip per decision as strict mode's, with nothing gained.
func (c *counting) decidesHere(it *ratelimit.Item) bool {
	r := it.Rule
	if it.Cost <= 0 || it.Cost > r.Capacity() {
		return false
	}
	switch r.Counting {
	case ratelimit.Batched:
		return c.batched.holdsBlocks(r)
	case ratelimit.Approximate:
		return it.Cost <= r.Capacity()/c.approximate.replicas
	}
	return false
}

// take decides item, which decidesHere took, by its rule's counter. It
// returns errUnavailable when neither what the replica holds nor Redis
// can decide it; undo gives back what an admitted decision took.
func (c *counting) take(ctx context.Context, it *ratelimit.Item) (d ratelimit.Decision, undo func(), err error) {
	if it.Rule.Counting == ratelimit.Batched {
		return c.batched.take(ctx, it.Key, it.Rule, it.Cost)
	}
	return c.approximate.take(it.Key, it.Rule, it.Cost)
}

// decideCounted decides a request with an item of a batched or
// approximate rule. Its local items (counting.decidesHere) are taken from
// what this replica holds, in order; if they all are admitted, the other
// items are decided at Redis together, and if those are denied the local
// items are given back. So the request is all or nothing, though for a
// moment other requests of this replica may see the local items'
// capacity taken (they can only be denied by it, never admitted). When
// Redis cannot decide a local item, that item is decided by its rule's
// failure mode.
func (s *Store) decideCounted(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if err := s.checkRules(items); err != nil {
		return dst, err
	}
	// The slices stay in this function, so that Go keeps them on the stack.
	out := make([]ratelimit.Decision, len(items))
	var undos []func()
	var rest []ratelimit.Item
	var restIdx []int // each of rest's index in items
	for i := range items {
		if !s.counting.decidesHere(&items[i]) {
			rest, restIdx = append(rest, items[i]), append(restIdx, i)
			continue
		}
		d, undo, err := s.takeLocal(ctx, items[i:i+1])
		if err != nil {
			undoAll(undos)
			return dst, err
		}
		out[i] = d
		if undo != nil {
			undos = append(undos, undo)
		}
		if !d.Allowed {
			undoAll(undos)
			if err := s.checkUndecided(ctx, out, items, i, rest[:0], restIdx[:0]); err != nil {
				return dst, err
			}
			return append(dst, out...), nil
		}
	}
	if len(rest) > 0 {
		ds, err := s.decideStrict(ctx, nil, rest)
		if err != nil {
			undoAll(undos)
			return dst, err
		}
		if !ratelimit.Allowed(ds) {
			undoAll(undos)
		}
		for j, i := range restIdx {
			out[i] = ds[j]
		}
	}
	return append(dst, out...), nil
}

// checkRules checks that every item has a valid rule.
func (s *Store) checkRules(items []ratelimit.Item) error {
	for i := range items {
		if items[i].Rule == nil {
			return fmt.Errorf("%w: item %q has no rule", ratelimit.ErrInvalidRule, items[i].Key)
		}
		if _, err := s.ruleArgs(items[i].Rule); err != nil {
			return err
		}
	}
	return nil
}

// takeLocal decides item, a local one, by its counter, or by its rule's
// failure mode when neither the counter nor Redis can.
func (s *Store) takeLocal(ctx context.Context, item []ratelimit.Item) (ratelimit.Decision, func(), error) {
	d, undo, err := s.counting.take(ctx, &item[0])
	if errors.Is(err, errUnavailable) {
		return s.fb.decide(nil, item)[0], nil, nil
	}
	return d, undo, err
}

// undoAll gives back what local items took.
func undoAll(undos []func()) {
	for _, u := range undos {
		u()
	}
}

// checkUndecided answers, once item denied is denied, the items not
// decided yet as the other items of a denied request (Store.peek): each
// with what it alone would get. check and idx are room for them.
func (s *Store) checkUndecided(ctx context.Context, out []ratelimit.Decision, items []ratelimit.Item, denied int, check []ratelimit.Item, idx []int) error {
	for i := range items {
		if i != denied && (out[i] == ratelimit.Decision{}) {
			check, idx = append(check, items[i]), append(idx, i)
		}
	}
	if len(check) == 0 {
		return nil
	}
	ds, err := s.peek(ctx, check)
	if err != nil {
		return err
	}
	for j, i := range idx {
		out[i] = ds[j]
		it := &items[i]
		if !ds[j].Allowed && it.Rule.Counting == ratelimit.Batched && s.counting.decidesHere(it) {
			// What Redis lacks may be held here (given back by the
			// items undone).
			if d, ok := s.counting.batched.held(it.Key, it.Rule, it.Cost); ok {
				out[i] = d
			}
		}
	}
	return nil
}

// A counterKey names an entry: one key of one rule in this replica.
type counterKey struct {
	key  string
	rule *ratelimit.Rule
}

const counterShards = 64

// A table holds a counter's entries, of type E, by counterKey, in shards.
type table[E any] struct {
	seed   maphash.Seed
	shards [counterShards]tableShard[E]
}

type tableShard[E any] struct {
	mu sync.Mutex
	m  map[counterKey]*E
}

func newTable[E any]() table[E] { return table[E]{seed: maphash.MakeSeed()} }

// entry returns the entry of key and r, made by newEntry when there is
// none; made reports whether it was.
func (t *table[E]) entry(key string, r *ratelimit.Rule, newEntry func(string, *ratelimit.Rule) *E) (e *E, made bool) {
	sh := &t.shards[maphash.String(t.seed, key)%counterShards]
	k := counterKey{key, r}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok {
		return e, false
	}
	if sh.m == nil {
		sh.m = make(map[counterKey]*E)
	}
	e = newEntry(key, r)
	sh.m[k] = e
	return e, true
}

// each calls f on every entry, its shard locked, and deletes those for
// which f says so.
func (t *table[E]) each(f func(*E) (drop bool)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if f(e) {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// maxCountedRules bounds a ruleCache (callers that make a Rule per
// request only refill it).
const maxCountedRules = 4096

// A ruleCache holds what a counter derives from each rule, V, once per
// rule.
type ruleCache[V any] struct {
	m sync.Map // *ratelimit.Rule → *V
	n atomic.Int64
}

// get returns what derive made of r, calling it on first use.
func (c *ruleCache[V]) get(r *ratelimit.Rule, derive func(*ratelimit.Rule) *V) *V {
	if v, ok := c.m.Load(r); ok {
		return v.(*V)
	}
	v := derive(r)
	if c.n.Add(1) > maxCountedRules {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(r, v)
	return v
}
