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
//     arrival order across every process; without it, a waiter joins that
//     order once it has waited FairAfter, so that none waits without end.
//     Every permit expires after a TTL unless renewed, so a process that dies
//     gives its permits back by itself within one TTL; a Permit renews itself
//     while held, and its Err reports the loss as soon as it can no longer
//     be sure that it still holds its permit, judged by the monotonic clock
//     at the moment of the call. Each permit carries a fencing token
//     (Permit.Fence) that grows with every grant of the semaphore's name,
//     for the protected service to refuse the requests of a holder that
//     lost its permit (see package fence).
//
// # Waiting across processes
//
// A blocked Acquire polls its Store, with backoff between MinBackoff and
// MaxBackoff. On a store that is also a Notifier (redisstore.SemaphoreStore,
// over Redis pub/sub) it is told besides: the store publishes, in the same
// round trip as the change, whenever room may have opened (a release, an
// expired permit reclaimed when the store notices it, the first waiter
// leaving or granted with room to spare), naming the waiters to wake, as
// many as the room opened (the first in line when waiters queue with
// Fair; otherwise those that its refusals recorded, in whichever process
// they wait), and a waiter that is told asks again at once, so a permit
// freed in another process is taken in about a round trip instead of a
// poll interval, by one waiter rather than one in every process. A notification is only a wake-up: the waiter is granted only
// by asking the store, so a message lost, delayed or duplicated never
// breaks the limit or the order, and a lost one costs at most one poll
// interval, since the polling goes on. Once its watch is live, a waiter
// polls only at MaxBackoff: it will be named, and sooner polls would
// only be refused.
//
// A store that fails for a while (a Redis call past its timeout on a
// busy machine, a connection lost) only lengthens a blocked acquire's
// wait: it asks again after its backoff, until its context ends, and
// only then reports the store's error (ErrStoreFailing; see
// Distributed, Store failures).
//
// # Choosing between a semaphore, a rate limit and leases
//
// A semaphore bounds concurrency: it suits a downstream service whose limit
// is "at most N requests in flight" (connections, worker slots, licences).
// A shared rate counter (package ratelimit on a store) bounds starts per
// unit of time at the cost of one store round trip per request. Capacity
// leases (package lease) hand each process a share of a rate for a while, so
// that most requests need no round trip at all. docs/library.md compares them in
// numbers.
package concurrency
