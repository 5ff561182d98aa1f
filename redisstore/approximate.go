package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// This file holds the counter of approximate rules (see the package
// documentation, "Where the counter lives", and docs/redisstore.md for the
// bound): per key of a rule, a view of the shared state that decides in
// process, and the hits admitted on it, which each reconciliation sends
// (reconcile.go) and whose reply sets the view again.

// approximateCounter counts the keys of approximate rules.
type approximateCounter struct {
	s        *Store
	c        *counting
	entries  table[approximateEntry]
	rules    ruleCache[approximateRule]
	stale    time.Duration // longest a view is used unreconciled with the breaker open, and hits kept back: 40 intervals
	replicas int64

	tmu     sync.Mutex
	touched []*approximateEntry // entries with hits or looks since the last reconciliation

	counted, reconciles atomic.Uint64
}

// approximateRule is what an approximate rule needs, derived once: push is
// the rule hits are reconciled under (capacity doubled, so that hits
// already admitted are never refused), local the rule local decisions are
// taken with (GCRA, as LeakyBucket decides).
type approximateRule struct {
	push, local *ratelimit.Rule
}

// An approximateEntry is one key of one approximate rule in this replica.
type approximateEntry struct {
	mu   sync.Mutex
	key  string
	rkey string // its Redis key
	slot uint16 // rkey's hash slot, on a Cluster
	rule *approximateRule
	used time.Time // last decision

	view    ratelimit.State // the shared state, as this replica sees it
	synced  time.Time       // when view was last set from Redis; zero: never
	pending int64           // hits admitted, not yet sent
	kept    time.Time       // since when pending hits have been kept back; zero: none
	sending int64           // hits of the reconciliation in flight
	queued  bool            // in approximateCounter.touched
}

func newApproximateCounter(s *Store, c *counting, opts *Options) *approximateCounter {
	return &approximateCounter{
		s:        s,
		c:        c,
		entries:  newTable[approximateEntry](),
		stale:    40 * opts.ReconcileInterval,
		replicas: int64(opts.Replicas),
	}
}

func (a *approximateCounter) entry(key string, r *ratelimit.Rule) *approximateEntry {
	e, made := a.entries.entry(key, r, a.newEntry)
	if made {
		a.c.started()
	}
	return e
}

func (a *approximateCounter) newEntry(key string, r *ratelimit.Rule) *approximateEntry {
	s := a.s
	e := &approximateEntry{key: key, rkey: s.redisKey(key), rule: a.rule(r)}
	if s.cluster {
		e.slot = slot(e.rkey)
	}
	return e
}

// rule is what r needs to be counted on a view, derived once.
func (a *approximateCounter) rule(r *ratelimit.Rule) *approximateRule {
	return a.rules.get(r, deriveApproximate)
}

// deriveApproximate is what r needs to be counted on a view.
func deriveApproximate(r *ratelimit.Rule) *approximateRule {
	capacity := r.Capacity()
	p := *r
	p.Counting = ratelimit.Strict
	if capacity > 0 && capacity <= ratelimit.MaxQuota/2 {
		p.Burst = 2 * capacity
		if p.Validate() != nil { // 2 × capacity × interval overflows
			p.Burst = capacity
		}
	}
	l := *r
	l.Algorithm, l.Counting = ratelimit.GCRA, ratelimit.Strict
	return &approximateRule{push: &p, local: &l}
}

// take decides a positive cost of key under r on its view, charging it
// Replicas-fold. It returns errUnavailable when the view may no longer be
// used; undo gives back what an admitted decision took.
func (a *approximateCounter) take(key string, r *ratelimit.Rule, cost int64) (ratelimit.Decision, func(), error) {
	e := a.entry(key, r)
	now := a.s.localNow()
	e.mu.Lock()
	e.used = now
	// A view is used while Redis answers, however old (a view that missed
	// others' hits admits at most this replica's share, which the bound
	// counts); while the breaker of its node is open, for 40 intervals
	// after its last reconciliation. A key with no view yet starts from a
	// fresh state.
	if a.s.brks.anyOpen() && a.s.brks.forKey(context.Background(), e.rkey).isOpen() && (e.synced.IsZero() || now.Sub(e.synced) >= a.stale) {
		e.mu.Unlock()
		return ratelimit.Decision{}, nil, errUnavailable
	}
	var d ratelimit.Decision
	e.rule.local.DecideInto(&d, &e.view, now, cost*a.replicas)
	if d.Allowed {
		e.pending += cost
	}
	a.queue(e)
	e.mu.Unlock()
	a.counted.Add(1)
	d.Capacity, d.Rule = r.Capacity(), r.Name
	if !d.Allowed {
		d.Reason = ratelimit.ReasonLimited
		return d, nil, nil
	}
	return d, func() { a.untake(e, cost) }, nil
}

// untake gives back cost, admitted on e's view (an undone decision).
func (a *approximateCounter) untake(e *approximateEntry, cost int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending -= min(cost, e.pending)
	e.rule.local.Decide(&e.view, a.s.localNow(), -cost*a.replicas)
}

// setView sets e's view from the shared state's debt (ResetAfter: the time
// until the key is back to full capacity) for a call sent at sent, plus
// the hits this replica admitted that Redis has not counted yet. Timed
// from when the call was sent, the view is ahead of the shared state by
// up to a round trip: what that admits beyond the share is counted at the
// next reconciliation, and is in the bound. Called with e.mu held.
func (e *approximateEntry) setView(debt time.Duration, sent time.Time, replicas int64) {
	iv := e.rule.local.Interval()
	t := sent.Add(debt).UnixNano()
	extra := (e.pending + e.sending) * replicas
	e.view = ratelimit.State{Algorithm: ratelimit.GCRA, T: t + int64(iv)*extra, N: int64(iv), Seen: sent.UnixNano()}
	e.synced = sent
}

// queue puts e in the next reconciliation. Called with e.mu held.
func (a *approximateCounter) queue(e *approximateEntry) {
	if e.queued {
		return
	}
	e.queued = true
	a.tmu.Lock()
	a.touched = append(a.touched, e)
	a.tmu.Unlock()
}

// reconcile sends, in one pipeline, the hits of every entry touched since
// the last reconciliation, or a look (no hits) for an entry whose hits may
// be kept back (keepBack) or that has none (one denied here), and sets
// each entry's view from the reply. An entry that is not touched is not
// sent: its view is refreshed by the reconciliation after its next use,
// and forget queues one whose hits were kept back too long. An entry
// whose reconciliation failed keeps its hits for the next one; a call
// answered as failed never took effect (its cutoff, see Deadlines), so
// nothing is counted twice.
func (a *approximateCounter) reconcile() { a.reconcileTouched(false) }

// flush sends every hit pending, touched or kept back.
func (a *approximateCounter) flush() {
	a.entries.each(func(e *approximateEntry) bool {
		e.mu.Lock()
		if e.pending > 0 {
			a.queue(e)
		}
		e.mu.Unlock()
		return false
	})
	a.reconcileTouched(true)
}

// reconcileTouched is reconcile; with all, it sends every hit, keeping
// none back.
func (a *approximateCounter) reconcileTouched(all bool) {
	a.tmu.Lock()
	es := a.touched
	a.touched = nil
	a.tmu.Unlock()
	if len(es) == 0 {
		return
	}
	now := a.s.localNow()
	ps := make([]push, len(es))
	for i, e := range es {
		ps[i] = a.prepare(e, now, all)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.s.timeout)
	defer cancel()
	sent := a.s.localNow()
	a.s.pushAll(ctx, ps)
	a.reconciles.Add(1)
	for i := range ps {
		a.answered(&ps[i], sent)
	}
}

// prepare moves e's hits to send (unless they are kept back, and at most
// the push rule's capacity) from pending to sending, and returns its push.
func (a *approximateCounter) prepare(e *approximateEntry, now time.Time, all bool) push {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.queued = false
	n := e.pending
	if !all && a.keepBack(e, now) {
		n = 0
		if e.kept.IsZero() {
			e.kept = now
		}
	}
	// At most the push rule's capacity at once (the rest next time):
	// more would be refused as beyond capacity whatever the state.
	e.sending = min(n, e.rule.push.Capacity())
	e.pending -= e.sending
	if e.sending > 0 || e.pending == 0 {
		e.kept = time.Time{} // nothing kept; what is left past the push rule's capacity goes next time
	}
	return push{e: e, cost: e.sending}
}

// answered takes p's answer, for a reconciliation sent at sent: hits not
// counted go back to pending, and an answer sets the view.
func (a *approximateCounter) answered(p *push, sent time.Time) {
	e := p.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.err != nil || !p.counted {
		e.pending += e.sending // not counted: sent again next time
	}
	e.sending = 0
	if p.err == nil {
		e.setView(p.debt, sent, a.replicas)
	}
	if e.pending > 0 && e.kept.IsZero() {
		a.queue(e)
	}
}

// keepBack reports whether e's pending hits may wait for a later
// reconciliation, which then sends them all at once: while its view
// (which charges them Replicas-fold until they are sent) is at most half
// used, and for at most a.stale (see docs/redisstore.md, "Keeping hits
// back"). Called with e.mu held.
func (a *approximateCounter) keepBack(e *approximateEntry, now time.Time) bool {
	if e.pending == 0 || a.keptTooLong(e, now) {
		return false
	}
	l := e.rule.local
	debt := e.view.T - now.UnixNano()
	return float64(debt) <= 0.5*float64(l.Capacity())*float64(l.Interval())
}

// keptTooLong reports whether e has kept hits back for a.stale. Called
// with e.mu held.
func (a *approximateCounter) keptTooLong(e *approximateEntry, now time.Time) bool {
	return !e.kept.IsZero() && now.Sub(e.kept) >= a.stale
}

// forget forgets the entries that hold nothing and have been idle for
// forgetAfter, and queues those whose hits were kept back for a.stale.
func (a *approximateCounter) forget() {
	now := a.s.localNow()
	a.entries.each(func(e *approximateEntry) bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.pending > 0 && a.keptTooLong(e, now) {
			a.queue(e) // kept back long enough, and not used since: sent next time
		}
		return now.Sub(e.used) > forgetAfter && e.pending == 0 && e.sending == 0 && !e.queued
	})
}
