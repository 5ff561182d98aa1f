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
// many times the breaker re-opens in between.
type breaker struct {
	threshold int64
	cooldown  time.Duration
	now       func() time.Time // time.Now; tests replace it
	log       *slog.Logger
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
	b.opened, b.probing = false, false
	if !b.outage.IsZero() {
		b.log.Info("Redis answers again; decisions are back on Redis",
			"outage", b.now().Sub(b.outage).Round(time.Millisecond).String())
		b.outage = time.Time{}
	}
}

// openLocked opens the breaker for a cooldown after n failures, the last err.
func (b *breaker) openLocked(n int64, err error) {
	now := b.now()
	b.opened = true
	b.openUntil = now.Add(b.cooldown)
	b.trips.Add(1)
	if b.outage.IsZero() {
		b.outage = now
		b.log.Warn("Redis does not answer; deciding by each rule's failure mode until it does",
			"failures", n, "err", err)
	}
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
