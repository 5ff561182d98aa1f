package redisstore

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// breaker is a circuit breaker. Closed, it lets every call through and
// counts consecutive failures; at threshold it opens for cooldown, during
// which allow says no; then it lets one probe through (half-open): the
// probe's success closes it, its failure opens it again.
//
// An outage, for the log, runs from the failure that first opens the
// breaker to the success that closes it: one line at each end, however
// many times the breaker re-opens in between.
type breaker struct {
	threshold int64
	cooldown  time.Duration
	now       func() time.Time // time.Now; tests replace it
	log       *slog.Logger

	fails atomic.Int64 // consecutive failures
	trips atomic.Uint64

	mu        sync.Mutex
	openUntil time.Time
	probing   bool
	outage    time.Time // when the current outage began; zero when none
}

func (b *breaker) allow() bool {
	if b.fails.Load() < b.threshold {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fails.Load() < b.threshold {
		return true
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
			b.fails.Store(0)
			b.probing = false
			if !b.outage.IsZero() {
				b.log.Info("Redis answers again; decisions are back on Redis",
					"outage", b.now().Sub(b.outage).Round(time.Millisecond).String())
				b.outage = time.Time{}
			}
			b.mu.Unlock()
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.fails.Add(1)
	if n >= b.threshold && (n == b.threshold || b.probing) {
		now := b.now()
		b.openUntil = now.Add(b.cooldown)
		b.trips.Add(1)
		if b.outage.IsZero() {
			b.outage = now
			b.log.Warn("Redis does not answer; deciding by each rule's failure mode until it does",
				"failures", n, "err", err)
		}
	}
	b.probing = false
}

// abandon ends a call that says nothing about Redis (its caller gave up):
// a half-open breaker may send another probe.
func (b *breaker) abandon() {
	if b.fails.Load() < b.threshold {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

func (b *breaker) isOpen() bool {
	if b.fails.Load() < b.threshold {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now().Before(b.openUntil)
}

// fallback decides items by their rules' failure modes.
type fallback struct {
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

func (f *fallback) decide(dst []ratelimit.Decision, items []ratelimit.Item) []ratelimit.Decision {
	anyClosed, nLocal := false, 0
	for i := range items {
		switch items[i].Rule.Failure {
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
			if it := items[i]; it.Rule.Failure == ratelimit.FailLocal {
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
		switch r.Failure {
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
