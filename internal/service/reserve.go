package service

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// Reservations (paced waiting)
//
// Reserve answers "how long must I wait to send this?" instead of "may
// this go now?": the same request, decided as Decide does (all or
// nothing, or independently; shadow and quota-mode limits apart), but
// every limit of the request is decided as a reservation that may wait up
// to maxWait (ratelimit.Rule.Reserving, which has the arithmetic): under
// a copy of its rule whose capacity is raised by what refills in maxWait
// (in whole emission intervals), decided at the shared counter (Strict,
// whatever the rule's counting). Admitted, the cost is taken now and the
// caller must wait Reservation.Wait before it sends: the longest of its
// limits' waits. Denied, nothing is taken, and the statuses' RetryAfter
// say when a reservation within maxWait would be admitted.
//
//   - Only gcra and leaky_bucket limits can be reserved: a request that
//     matches a window limit (fixed_window, the default of a plain
//     envoyproxy/ratelimit rule, an inline limit; sliding_log,
//     sliding_window) is refused as invalid, naming the limit.
//   - Shadow-mode limits never make anyone wait: a gcra or leaky_bucket
//     one is reserved too, and its status reports what it would have
//     answered, but its wait is not the caller's; a shadow limit of
//     another algorithm is decided as Decide decides it.
//   - Quota-mode limits are soft: they are decided as Decide decides
//     them, at once, and never waited for.
//   - A cost of 0 or less (a check, a refund) waits for nothing; a cost
//     above a limit's capacity is denied as by Decide, never to succeed.
//   - A limit admitted by its fail_open failure mode tells no wait: the
//     store could not be asked.
//
// A request whose limits tell different waits is sent at the longest:
// each limit is exact on its own (its units are placed where its rule
// admits them), but a limit whose own wait was shorter receives the send
// later than its place, which its rule would count as up to the request's
// cost early for the reservations queued behind it, when that lateness
// exceeds the limit's spare burst. A request of one limit, or of limits
// that agree, is exact.

// DefaultMaxReserveWait is the longest wait a reservation may ask for
// unless Options.MaxReserveWait says otherwise.
const DefaultMaxReserveWait = time.Minute

// A Reservation is what Reserve tells besides the Response.
type Reservation struct {
	// Wait is how long the caller must wait, from when it was answered,
	// before it sends: 0 when the request was denied (nothing taken) or
	// may go at once.
	Wait time.Duration
	// Waits is each descriptor's wait, in order: the longest of its
	// limits' (shadow and quota-mode limits excluded).
	Waits []time.Duration
}

// Reserve decides req as a reservation that may wait up to maxWait (see
// "Reservations" above) into resp, and returns its wait. Its errors are
// Decide's, and an error wrapping ErrInvalidRequest for a maxWait that is
// negative or above the Service's bound, or a limit that cannot be
// reserved.
func (s *Service) Reserve(ctx context.Context, req *Request, maxWait time.Duration, resp *Response) (Reservation, error) {
	if maxWait < 0 {
		return Reservation{}, invalid("max wait %v is negative", maxWait)
	}
	if maxWait > s.reserve.max {
		return Reservation{}, invalid("max wait %v exceeds this server's bound of %v (--max-reserve-wait)", maxWait, s.reserve.max)
	}
	rv := &reservation{maxWait: maxWait, waits: make([]time.Duration, len(req.Descriptors))}
	err := s.decideRequest(ctx, req, resp, rv)
	res := Reservation{Waits: rv.waits}
	if err != nil || resp.Code != OK {
		clear(res.Waits)
		return res, err
	}
	for _, w := range res.Waits {
		res.Wait = max(res.Wait, w)
	}
	return res, nil
}

// reservation is one Reserve's state through decideRequest.
type reservation struct {
	maxWait time.Duration
	waits   []time.Duration // per descriptor
}

// reserving replaces the rule of every item of the request that is
// reserved (the real limits, and the shadow ones that can be) by its
// reserving rule, and refuses a real limit that cannot be reserved.
func (s *Service) reserving(sc *scratch, req *Request, rv *reservation) error {
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.rule == nil || c.quota {
			continue
		}
		it := sc.item(c)
		rr, err := s.reserve.get(c.rule, it.Cost, rv.maxWait)
		switch {
		case err == nil:
			it.Rule = rr
		case c.shadow: // decided as Decide decides it
		case c.spec == nil:
			return invalid("descriptor %d: its inline limit (%s) cannot be reserved: %v", c.desc, c.rule.Name, err)
		default:
			return invalid("descriptor %d: limit %q of domain %q cannot be reserved (give it algorithm: gcra, or leaky_bucket): %v", c.desc, c.rule.Name, req.Domain, err)
		}
	}
	return nil
}

// outcome reads the decisions of the reserved items back in their own
// rules' terms and records each descriptor's wait.
func (rv *reservation) outcome(sc *scratch) {
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.rule == nil || c.quota {
			continue
		}
		it := sc.item(c)
		if it.Rule == c.rule && c.rule.Algorithm != ratelimit.GCRA && c.rule.Algorithm != ratelimit.LeakyBucket {
			continue // a shadow window limit, decided as Decide does
		}
		w := c.rule.ReserveOutcome(sc.decision(c))
		if it.Cost > 0 && !c.shadow {
			rv.waits[c.desc] = max(rv.waits[c.desc], w)
		}
	}
}

// reserveRules caches the reserving rules, so that reservations of one
// rule and wait share one *ratelimit.Rule (a store caches its work per
// rule). Bounded: past maxReserveRules, it starts afresh.
type reserveRules struct {
	max time.Duration // the longest wait a reservation may ask for
	mu  sync.RWMutex
	m   map[reserveKey]*ratelimit.Rule
}

// reserveKey is a rule and a wait in whole intervals of it, which is all
// that Reserving reads of the wait.
type reserveKey struct {
	rule *ratelimit.Rule
	wait time.Duration
}

const maxReserveRules = 4096

func (c *reserveRules) get(r *ratelimit.Rule, cost int64, maxWait time.Duration) (*ratelimit.Rule, error) {
	if r.Algorithm != ratelimit.GCRA && r.Algorithm != ratelimit.LeakyBucket {
		return r.Reserving(maxWait) // its error
	}
	if cost <= 0 || cost > r.Capacity() {
		return r, nil
	}
	k := reserveKey{r, r.ReserveWait(maxWait)}
	c.mu.RLock()
	rr := c.m[k]
	c.mu.RUnlock()
	if rr != nil {
		return rr, nil
	}
	rr, err := r.Reserving(k.wait)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxReserveRules {
		c.m = make(map[reserveKey]*ratelimit.Rule)
	}
	c.m[k] = rr
	c.mu.Unlock()
	return rr, nil
}
