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
// of its own, and its Limiter releases work at that rate, smoothly (burst
// of a tenth of a second). A process that stops needing capacity releases
// it; a process that dies loses it when its leases expire.
//
// Compared with a shared counter (one store round trip per request) a
// lease costs a few round trips a second per process whatever the
// request rate: the Holder's goroutine sends a heartbeat and one renewal
// per period (a third of the TTL), and an acquire or a release only when
// its share changes. Compared with a static split (C/N per process) idle
// capacity moves within two renewal periods to the processes that need
// it. The price is granularity (capacity moves in partitions of C/P) and
// the reaction time (a period to yield, a TTL to recover a dead member's
// partitions).
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
// process never holds more than it can use.
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
// # Feedback and outages
//
// A throttled answer from the service (Holder.Throttled) lowers a ceiling
// on the holder's rate to ¾ of it, which then grows by a partition a
// period (AIMD);
// a lowered ceiling lowers the need, so the partitions go back to the
// pool. When the store cannot be reached the leases lapse at their
// deadlines and the holder falls back to its reserved capacity, or to its
// share C/N of the members it saw last (Config.Outage); Stats says so.
package lease
