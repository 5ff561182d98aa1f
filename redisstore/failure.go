package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// breaker is a circuit breaker. Closed, it lets every call through and
// counts consecutive failures; at threshold it opens for cooldown, during
// which allow says no; then it lets one probe through (half-open): the
// probe's success closes it, its failure opens it again.
//
// A slow Redis is not a dead one. A call that got no answer within its
// timeout (a timeout, an expired cutoff, no pooled connection in time)
// says only that Redis was slow (go-redis retries a refused dial past the
// call's timeout, so a refused connection often ends so too); one reset,
// or answered with an error that says Redis cannot serve, says it is
// down. So when the failure
// that reaches the threshold (or fails the half-open probe) is a timeout
// and check is set, the breaker does not open yet: it asks Redis, once, in
// the background, whether it answers at all within a longer deadline
// (check: a PING that may take Options.LivenessTimeout). Meanwhile a
// closed breaker keeps letting calls through (each still bounded by the
// timeout, and decided by the failure mode when it gets no answer) and a
// half-open one lets none. An answer means Redis is alive and slow: the
// breaker closes (Stats.Slow counts it), so a busy Redis keeps deciding
// what it answers in time instead of every decision falling to the
// failure mode for a cooldown. No answer opens it, as before.
//
// An outage, for the log, runs from the failure that first opens the
// breaker to the success that closes it: one line at each end, however
// many times the breaker re-opens in between, naming the node on a
// Cluster.
//
// A Store has one breaker per server it calls (see breakers): one for a
// standalone server or Sentinel's master, one per master on a Cluster.
type breaker struct {
	threshold int64
	cooldown  time.Duration
	now       func() time.Time // time.Now; tests replace it
	log       *slog.Logger
	node      string // the master's address on a Cluster, for the log; "" for one server
	// openNow, when set, counts the breakers of its set that are open or
	// half-open (see breakers.anyOpen).
	openNow *atomic.Int64
	// check asks Redis whether it answers at all (nil: a timeout opens
	// the breaker as any failure does); spawn runs it (go f; tests
	// replace it).
	check func() error
	spawn func(func())

	fails atomic.Int64 // consecutive failures
	trips atomic.Uint64
	slow  atomic.Uint64 // checks Redis answered: slow, not dead

	mu        sync.Mutex
	opened    bool // open or half-open (fails ≥ threshold while closed is a check in flight)
	openUntil time.Time
	probing   bool
	checking  bool
	outage    time.Time // when the current outage began; zero when none
}

func (b *breaker) allow() bool {
	if b.fails.Load() < b.threshold {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.opened {
		return true // closed, maybe checking whether Redis is only slow
	}
	if b.probing || b.now().Before(b.openUntil) {
		return false
	}
	b.probing = true
	return true
}

// done records the outcome of a call: err is nil when Redis answered.
func (b *breaker) done(err error) {
	if err == nil {
		if b.fails.Load() != 0 {
			b.mu.Lock()
			b.closeLocked()
			b.mu.Unlock()
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.fails.Add(1)
	switch {
	case n < b.threshold, b.opened && !b.probing, b.checking:
		// Below the threshold; a call let through before the breaker
		// opened; or a check already out, which decides.
	case b.check != nil && noAnswer(err):
		b.checking = true
		b.spawn(b.runCheck) // a half-open breaker stays probing: no call goes
		return
	default:
		b.openLocked(n, err)
	}
	b.probing = false
}

// runCheck asks Redis whether it answers and closes or opens the breaker
// accordingly.
func (b *breaker) runCheck() {
	err := b.check()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.checking = false
	switch {
	case err == nil || isAnswer(err):
		b.slow.Add(1)
		b.closeLocked()
	case b.fails.Load() >= b.threshold: // no call has succeeded meanwhile
		b.openLocked(b.fails.Load(), err)
		b.probing = false
	}
}

// closeLocked closes the breaker: Redis answered.
func (b *breaker) closeLocked() {
	b.fails.Store(0)
	if b.opened && b.openNow != nil {
		b.openNow.Add(-1)
	}
	b.opened, b.probing = false, false
	if !b.outage.IsZero() {
		b.log.Info("Redis answers again; decisions are back on Redis",
			b.attrs("outage", b.now().Sub(b.outage).Round(time.Millisecond).String())...)
		b.outage = time.Time{}
	}
}

// openLocked opens the breaker for a cooldown after n failures, the last err.
func (b *breaker) openLocked(n int64, err error) {
	now := b.now()
	if !b.opened && b.openNow != nil {
		b.openNow.Add(1)
	}
	b.opened = true
	b.openUntil = now.Add(b.cooldown)
	b.trips.Add(1)
	if b.outage.IsZero() {
		b.outage = now
		b.log.Warn("Redis does not answer; deciding by each rule's failure mode until it does",
			b.attrs("failures", n, "err", err)...)
	}
}

// attrs are a log line's attributes: the node's address first, on a
// Cluster.
func (b *breaker) attrs(kv ...any) []any {
	if b.node == "" {
		return kv
	}
	return append([]any{"node", b.node}, kv...)
}

// abandon ends a call that says nothing about Redis (its caller gave up):
// a half-open breaker may send another probe.
func (b *breaker) abandon() {
	if b.fails.Load() < b.threshold {
		return
	}
	b.mu.Lock()
	if !b.checking {
		b.probing = false
	}
	b.mu.Unlock()
}

// down reports whether the breaker is open or half-open: Redis has not
// answered since it opened (isOpen is the cooldown alone).
func (b *breaker) down() bool {
	if b.fails.Load() < b.threshold {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened
}

func (b *breaker) isOpen() bool {
	if b.fails.Load() < b.threshold {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened && b.now().Before(b.openUntil)
}

// maxNodeBreakers bounds a Cluster's breakers. Masters come and go (a
// failover promotes a replica at another address; an operator adds and
// removes nodes): when a new address would pass the bound, the breakers
// of nodes that answer (closed: they hold nothing but counts) are
// dropped, and all of them if every one is down.
const maxNodeBreakers = 256

// breakers are a Store's circuit breakers: the one breaker of a client of
// one server (standalone, Sentinel's failover client, or a client of
// another type, whose nodes the Store cannot tell), or, on a Cluster, one
// per master, by address, so that a master that does not answer sends
// only the keys of its own slots to the failure mode and the other
// masters' keys stay on Redis. forKey finds a key's breaker by asking the
// Cluster client for the master of its slot (go-redis's slot table: no
// call to Redis once the table is loaded, no allocation) and reading an
// immutable map (copied on write, under mu); it is safe for concurrent
// use.
type breakers struct {
	single  *breaker             // nil on a Cluster
	cluster *redis.ClusterClient // nil for one server
	// make returns the breaker of the master at node, whose liveness
	// check asks the master of key's slot.
	make  func(node, key string) *breaker
	nodes atomic.Pointer[map[string]*breaker]
	mu    sync.Mutex // held by writers of nodes
	// trips and slow of the breakers dropped, for Stats.
	dropped struct{ trips, slow uint64 }
	// openNow counts the breakers open or half-open: make gives it to
	// each. A breaker dropped open leaves its count until it closes (a
	// call in flight may still close it): anyOpen may say yes when none
	// is, never no when one is.
	openNow atomic.Int64
}

// anyOpen reports whether a breaker may be open or half-open: when it
// says no, none is, and a caller that needs a key's breaker only if it is
// open need not look it up.
func (bs *breakers) anyOpen() bool { return bs.openNow.Load() != 0 }

// forKey returns the breaker of the server that holds the Redis key rk:
// on a Cluster, its slot's master's; that of address "" when the client
// cannot tell (its slot table not loaded, the Cluster unreachable).
func (bs *breakers) forKey(ctx context.Context, rk string) *breaker {
	if bs.single != nil {
		return bs.single
	}
	addr := ""
	if m, err := bs.cluster.MasterForKey(ctx, rk); err == nil {
		addr = m.Options().Addr
	}
	if m := bs.nodes.Load(); m != nil {
		if b, ok := (*m)[addr]; ok {
			return b
		}
	}
	return bs.add(addr, rk)
}

// add returns the breaker of node, making it if there is none yet (key is
// one of the node's keys, for its liveness check).
func (bs *breakers) add(node, key string) *breaker {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var old map[string]*breaker
	if p := bs.nodes.Load(); p != nil {
		old = *p
	}
	if b, ok := old[node]; ok {
		return b
	}
	full := len(old) >= maxNodeBreakers
	nodes := make(map[string]*breaker, len(old)+1)
	for a, b := range old {
		if full && !b.down() {
			bs.drop(b)
			continue
		}
		nodes[a] = b
	}
	if len(nodes) >= maxNodeBreakers { // every node down: start afresh
		for _, b := range nodes {
			bs.drop(b)
		}
		clear(nodes)
	}
	b := bs.make(node, key)
	nodes[node] = b
	bs.nodes.Store(&nodes)
	return b
}

// drop keeps the counts of b, which leaves the map; mu is held.
func (bs *breakers) drop(b *breaker) {
	bs.dropped.trips += b.trips.Load()
	bs.dropped.slow += b.slow.Load()
}

// each calls f with every breaker.
func (bs *breakers) each(f func(*breaker)) {
	if bs.single != nil {
		f(bs.single)
		return
	}
	if p := bs.nodes.Load(); p != nil {
		for _, b := range *p {
			f(b)
		}
	}
}

// stats returns the times the breakers opened, the checks that found
// Redis slow, and whether a breaker is open now.
func (bs *breakers) stats() (trips, slow uint64, open bool) {
	bs.mu.Lock() // no breaker dropped meanwhile: counted once
	defer bs.mu.Unlock()
	trips, slow = bs.dropped.trips, bs.dropped.slow
	bs.each(func(b *breaker) {
		trips += b.trips.Load()
		slow += b.slow.Load()
		open = open || b.isOpen()
	})
	return trips, slow, open
}

// noAnswer reports whether err says only that Redis did not answer in
// time (it may be slow rather than down): a deadline, a socket timeout, a
// cutoff that expired, no pooled connection in time.
func noAnswer(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isAnswer reports whether err is a reply of Redis (an error reply): it
// is alive, whatever it said.
func isAnswer(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// fallback decides items by their rules' failure modes.
type fallback struct {
	def        ratelimit.FailureMode // for rules of FailDefault: Options.Failure
	replicas   int64
	retryAfter time.Duration
	local      *memstore.Store

	mu    sync.Mutex
	rules map[*ratelimit.Rule]*ratelimit.Rule // rule → its local share

	open, closed, local_ atomic.Uint64
}

// maxLocalRules bounds the cache of scaled rules.
const maxLocalRules = 4096

// share returns r at this replica's share of its limit.
func (f *fallback) share(r *ratelimit.Rule) *ratelimit.Rule {
	if f.replicas <= 1 {
		return r
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.rules[r]; ok {
		return l
	}
	if f.rules == nil || len(f.rules) >= maxLocalRules {
		f.rules = make(map[*ratelimit.Rule]*ratelimit.Rule)
	}
	l := *r
	if l.Quota > 0 {
		l.Quota = max(1, l.Quota/f.replicas)
	}
	if l.Burst > 0 {
		l.Burst = max(1, l.Burst/f.replicas)
	}
	f.rules[r] = &l
	return &l
}

// mode is r's failure mode, the store's default for FailDefault.
func (f *fallback) mode(r *ratelimit.Rule) ratelimit.FailureMode {
	if r.Failure == ratelimit.FailDefault {
		return f.def
	}
	return r.Failure
}

func (f *fallback) decide(dst []ratelimit.Decision, items []ratelimit.Item) []ratelimit.Decision {
	anyClosed, nLocal := false, 0
	for i := range items {
		switch f.mode(items[i].Rule) {
		case ratelimit.FailClosed:
			anyClosed = true
		case ratelimit.FailLocal:
			nLocal++
		}
	}
	var local []ratelimit.Decision
	if nLocal > 0 {
		litems := make([]ratelimit.Item, 0, nLocal)
		for i := range items {
			if it := items[i]; f.mode(it.Rule) == ratelimit.FailLocal {
				it.Rule = f.share(it.Rule)
				if anyClosed { // denied anyway: consume nothing
					it.Cost = min(it.Cost, 0)
				}
				litems = append(litems, it)
			}
		}
		local, _ = f.local.Decide(context.Background(), make([]ratelimit.Decision, 0, nLocal), litems)
	}
	j := 0
	for i := range items {
		r := items[i].Rule
		d := ratelimit.Decision{Capacity: r.Capacity(), Rule: r.Name}
		switch f.mode(r) {
		case ratelimit.FailClosed:
			d.Reason, d.RetryAfter = ratelimit.ReasonFailClosed, max(f.retryAfter, 1)
			f.closed.Add(1)
		case ratelimit.FailLocal:
			if j < len(local) {
				d = local[j]
			}
			j++
			d.Reason, d.Rule = ratelimit.ReasonLocal, r.Name
			f.local_.Add(1)
		default:
			d.Allowed, d.Reason = true, ratelimit.ReasonFailOpen
			f.open.Add(1)
		}
		dst = append(dst, d)
	}
	return dst
}
