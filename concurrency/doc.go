// Package concurrency limits how many operations are in flight at once,
// rather than how many start per second.
//
// Two tools are offered:
//
//   - Semaphore, a weighted semaphore for one process. Waiters are served in
//     strict arrival order, so a large request is never starved by a stream
//     of small ones, and a waiter whose context ends leaves the queue at once.
//
//   - Distributed, a semaphore shared by many processes through a Store
//     (MemoryStore in one process, redisstore.SemaphoreStore across
//     processes). At most Limit units of one named semaphore are held at
//     any moment; on a FairStore (both of those) permits may weigh more
//     than one unit (AcquireN) and, with Fair, waiters are served in
//     arrival order across every process.
//     Every permit expires after a TTL unless renewed, so a process that dies
//     gives its permits back by itself within one TTL; a Permit renews itself
//     while held and reports through Lost the moment it can no longer be sure
//     that it still holds its permit.
//
// # Choosing between a semaphore, a rate limit and leases
//
// A semaphore bounds concurrency: it suits a downstream service whose limit
// is "at most N requests in flight" (connections, worker slots, licences).
// A shared rate counter (package ratelimit on a store) bounds starts per
// unit of time at the cost of one store round trip per request. Capacity
// leases (package lease) hand each process a share of a rate for a while, so
// that most requests need no round trip at all. The README compares them in
// numbers.
package concurrency
