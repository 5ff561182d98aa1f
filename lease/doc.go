// Package lease shares one throttled service's capacity among many
// uncoordinated processes with short, renewable, exclusive leases.
//
// # Model
//
// A service that allows C units a second (requests, or any cost) is cut
// into P partitions of C/P each: 500 req/s as 20 partitions of 25. Each
// process runs one Holder per service; the holders of a service share a
// Store that grants leases on partitions: MemoryStore for the holders of
// one process, redisstore.LeaseStore for processes on many machines. A holder's
// rate is the sum of its valid leases plus an optional reserved capacity
// of its own, and its Limiter releases work at that rate, paced so that no
// window of the service's (one second, or RateLimit-Policy's w) ever
// receives more than the capacity. A process that stops needing capacity
// releases it; a process that dies loses it when its leases expire.
//
// Compared with a shared counter (one store round trip per request) a
// lease costs a few round trips a second per process whatever the
// request rate: the Holder's goroutine sends a heartbeat and one renewal
// per period (a third of the TTL), and an acquire or a release only when
// its share changes. Compared with a static split (C/N per process) idle
// capacity moves at once to the processes that need it: on a store that
// notifies (MemoryStore, redisstore.LeaseStore over pub/sub) within a few
// round trips, and within a period when notifications are lost. The price
// is granularity (capacity moves in partitions of C/P), 2 % of the rate
// for window pacing, and a TTL to recover a dead member's partitions.
//
// # Fair share and demand
//
// Members publish their presence, weight and need in partitions. Each
// holder computes every member's share of P, weighted, where whatever a
// member does not need goes to the others (water-filling), rounded up. It
// takes free partitions up to its need (up to its share while others lack
// theirs), found from one view of the store and chosen from a random
// offset, so holders do not collide blindly; it yields partitions above
// its share when others lack theirs and nothing is free. The need is
// estimated as a rate — the arrival rate of units at the limiter plus the
// backlog divided by a target drain time, with some headroom — so a
// process never holds more than it can use. Callers blocked in the
// Limiter's Wait are demand the estimate cannot see: while they wait on an
// empty bucket a holder asks for at least its even share, and once it has
// used all it was offered with callers waiting, for everything, so that
// water-filling gives it its fair share at once. Two holders starting
// together on idle capacity use ≥ 95 % of it within a renewal period and
// a round trip (measured on a real Redis, 100/s in 10 partitions: 96–98 a
// second split evenly from the first second on; 87 in the first second
// when notifications are lost, then the same).
//
// A caller that paces itself instead of calling the Limiter (sluice serve
// holds a Holder for each program that leases over its API, in any
// language) states its demand with SetDemand: a rate and a backlog of
// units held back for want of rate, which replace what the Limiter
// counts (a backlog counts as callers blocked on a limiter used to the
// full). It reads what to pace with from AllowanceAt: the rate, the token
// bucket the Limiter would admit from, the window and the deadline.
// httplimit.Budgets.Share is such a caller: processes that spend one
// account of a service that announces its budgets (an LLM API) each hold
// a Holder whose Capacity stands for the whole account, and pace every
// dimension the service announces to their rate's fraction of Capacity;
// the announced budget is the capacity the leases divide.
//
// # Pacing to the service's window
//
// A service that counts in fixed windows refuses whatever one window
// receives beyond its limit, however smooth the average. A token bucket at
// rate r with burst b lets b + r·W through in any window W, so the
// Limiter's bucket has a burst of a hundredth of W's worth and runs at r
// less that burst over W and less 1 % (490/s of 500 leased, W = 1 s;
// ratelimit.WindowPacing): no
// window of W, wherever it starts, receives more than 99 % of the leased
// capacity. That holds for the holders together, because a holder's
// bucket holds at most its burst, a share of its rate at that instant,
// and the valid leases never add up to more than C at any instant. A guard
// counts the units admitted in the last W by the instants at which the
// callers return and holds them within the capacity the holder had over
// that W (its rate integrated over the window), so that waiters woken late
// together (a stalled process) do not bunch, and a holder that yields
// partitions goes on at its new rate at once. When the rate falls, the
// waiters' turns move back with the bucket's debt and keep their order. Options.Window sets W (a RateLimit-Policy w seen by Observe
// replaces it); a negative one turns pacing off.
//
// # Validity and fencing
//
// Every lease is valid, for the holder, until the instant its acquire or
// renew request was sent plus the TTL, less a drift and safety margin,
// measured on the monotonic clock; the store expires it half the safety
// margin short of a TTL after it received the request, by its own clock,
// so a dead member's partitions are taken by the others within a TTL of
// its last renewal. Clocks of different machines are never compared. Each
// grant carries an epoch that increases with every lease of the
// partition: a store-side check (MemoryStore.Valid, redisstore.LeaseStore.Valid) refuses a
// stale holder, and a stale holder's renewal or release is refused too. A
// lost lease is reported (Stats.Losses), never silently taken again under
// the same epoch.
//
// # The throttle controller
//
// A throttled answer (Holder.Throttled, ThrottledAfter, or Observe with
// the response's status and header fields, which reads Retry-After,
// Retry-After-Ms, X-Ms-Retry-After-Ms and RateLimit's t through
// limitheader) is taken in proportion:
//
//   - a retry hint pauses the holder's Limiter for that long (at most
//     Options.MaxPause); a 503 with a hint pauses too, and counts as
//     overload, not throttling;
//   - the 429s that arrive until the pause has ended, and the requests in
//     flight at the first have been answered, are one episode: sent
//     before the holder could react, they cut nothing;
//   - a 429 after an episode, within two periods or two windows of it, is
//     a repeat: the ceiling on the rate is cut by the overshoot observed,
//     the last episode's 429s over the units admitted in the last window,
//     never below Options.Backoff (¾) of the rate;
//   - a cut ceiling climbs back linearly to the rate it was cut from in
//     Options.Recovery (two periods), and is then gone.
//
// A lone 429 therefore costs its pause and no more (measured in the
// simulation: 2 ms of throughput without a hint, 0.30 s with a 300 ms
// one), and a service whose real limit is below the leased one sees its
// 429s repeat and the ceiling settle at what it accepts. A lowered ceiling
// lowers the need, so unused partitions go back to the pool.
//
// In the published example (500/s as 20 × 25, processor A with 10,000
// records and B with 5,000, separate OS processes on one Redis, a service
// counting fixed one-second windows and answering 429 with Retry-After),
// A finishes in 30.6 s and B in 20.4–20.5 s against lower bounds of 30 s
// and 20 s, with no 429 at all and A at B's half within a few
// milliseconds of B's end (bench/RESULTS.md, section 16).
//
// # Outages
//
// When the store cannot be reached the leases lapse at their deadlines and
// the holder falls back to its reserved capacity, or to its share C/N of
// the members it saw last (Options.Outage); Stats says so.
package lease
