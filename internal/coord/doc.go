// Package coord is sluice serve's coordination API: distributed
// semaphores and capacity leases held for programs in any language, as
// the gRPC services sluice.v1.SemaphoreService and sluice.v1.LeaseService
// (proto/sluice/v1/semaphore.proto and lease.proto; their Go messages
// generated into sluicev1, their service descriptors written by hand in
// grpc.go and grpc_leases.go) and as JSON over HTTP (internal/httpapi's
// /v1/semaphores/ and /v1/leases/ routes, docs/openapi.yaml). Both
// transports call one Service.
//
// # Semaphores
//
// A semaphore is a name and a limit; the permits held under a name never
// weigh more than the limit. Acquire grants a permit for a TTL, waiting
// for room up to the request's wait (a long poll: one call, no stream)
// and no longer than its caller's context; a caller that goes away while
// it waits holds nothing. The answer carries the permit id, the fencing
// token (concurrency.Permit.Fence) and how long the permit is valid.
// The caller renews the permit by its id before that (Renew) and gives it
// back when done (Release); a caller that crashes stops renewing, and the
// permit lapses within its TTL, so that the next acquirer gets it, with a
// larger fencing token.
//
// The Service is one more user of a concurrency.Store (serve's
// MemoryStore, or redisstore.SemaphoreStore on Redis): it acquires
// through a concurrency.Distributed and detaches the permit, so the
// store holds every permit and the Service none. A permit id is the
// permit's token in the store, 130 random bits: knowing it is holding
// the permit, and ids are never logged. Renew and Release name the
// semaphore too, and any replica of serve on the same store answers them.
//
// A slow store makes an acquire that waits wait longer, not fail: a
// store call past its timeout (serve's --redis-timeout) or a connection
// lost is one more refused attempt of the Distributed's wait (see
// concurrency.Distributed, Store failures), counted by
// sluice_semaphore_store_errors_waited_total; only when the wait ends
// with the store still failing is the acquire Unavailable. An acquire
// that does not wait, Renew and Release answer a store error as
// Unavailable at once.
//
// # Holders and views
//
// Holders lists a name's permits held now, in one atomic read of the
// store by its clock (concurrency.Store.Holders): each one's fence,
// weight, how long it has been held (a renewal keeps the instant of the
// grant) and how long it has left, by fence, never its id; and this
// process's acquires waiting on the name. Its purpose is the sequencer
// check: a protected service that receives a call with a fencing token
// asks whether that fence is still held (fence.Checker), and refuses a
// holder whose permit expired while it was paused, whether or not anyone
// was granted after it. The answer is true of the instant the store was
// read: one round trip per check, and not atomic with what the service
// then does.
//
// Status is the same view for the admin API's status, the dashboard and
// `sluice top` (dashboard.CoordinationStatus): the names acquired through
// this process since it started, at most Limits.MaxSeen, the most
// recently acquired first, each with the limit last asked for, its
// holders (of every replica on the store) and waiters (of this process).
// It reads the store once per name when asked, within a bound, and keeps
// nothing else. Beside them (LeaseStatus) are the leased services this
// process runs remote holders for, at most MaxSeen, the most recently
// joined first, each with its capacity, partitions and number of holders,
// and at most MaxSeen of its holders, the latest joined first: each by its
// member id in the store (never its holder id, which is a capability),
// with its weight, time since it joined, the rate it may use now, the
// demand it stated last (rate and backlog), its leases and how long what
// it was told stays valid, and time since its last heartbeat. That is
// what the Service keeps for the holders' answers: no store call.
//
// # Capacity leases
//
// A leased service is a name, a capacity C (units a second) and P
// partitions of C/P, shared by its holders as package lease shares them
// among processes: the Service is one more user of lease, running for
// each remote holder a lease.Holder on the service's lease.Store
// (Options.Leases: serve's lease.MemoryStore per service, or a
// redisstore.LeaseStore on its Redis, where holders joined through
// several replicas, and Go processes running their own Holders, share
// one pool). So the lease logic decides, as for the library's holders:
// water-filling, weights, fair share at once, renewals, epochs.
//
// Join makes a holder: a holder id (crypto/rand.Text, 130 random bits:
// knowing it is being the holder; never logged, and not the member id the
// store and its views show, which is another random name), the Holder,
// and two goroutines the Service owns: the Holder's Run, and a follower
// that keeps the holder's answer. Demand is the holder's heartbeat: it
// states the demand (lease.Holder.SetDemand: a rate, and a backlog of
// units held back for want of rate, which asks for the whole fair share)
// and renews the holder's liveness. Watch (a long poll) and Stream (the
// gRPC Watch) hand out the answer as it changes: the rate of the valid
// leases, the token bucket that paces it to the downstream's window
// (lease.Allowance), the leases with their epochs, how long it may be
// used, and a version that grows with every change. Leave releases the
// leases and ends the holder. A holder lives in the process that
// answered its Join: another replica answers NotFound, and the client
// joins again.
//
// Validity. An answer's validity is what is left of the leases' (the
// Holder's deadline, on this process's monotonic clock) and of the
// holder's liveness (its last heartbeat plus its TTL), less TTL/50 for
// the answer's transit: the client counts it from when it sent its
// request (Join, Demand) or received the answer (Watch, whose answer may
// have waited), and sends nothing past it without a newer answer. The
// store keeps every lease longer than any validity told (lease's margins:
// the drift and half of Options.Margin past the deadline).
//
// Releases wait for the client. The Holder stops using a partition it
// gives up at once, but its client learns of it only from the next
// answer, a transit later; released at once, the partition could be
// leased to another holder while the client still sends at the old rate.
// So the Service's Holder sees the service's store through a wrapper that
// holds such a release back until the client acknowledges a version at
// least as new as the answer without the partition (Demand's or Watch's
// version; an HTTP client's next long poll does so at once, a gRPC
// stream's client at its next heartbeat), and otherwise lets the lease
// expire in the store.
//
// Silence. A holder whose client states no demand for longer than its
// TTL is ended without releasing its leases and without leaving: its
// client may be cut off from this server rather than dead, and still
// sending at the rate it was told until the validity it was told, which
// only the leases' expiry in the store is sure to outlast. A release
// would hand the partitions to another holder at once. So they expire by
// themselves within a TTL of their last renewal, and the other holders
// take them then: within two TTLs of the last heartbeat. Shutdown ends
// every holder the same way.
//
// # Bounds and errors
//
// Limits bound names, limits, weights, TTLs, waits and the acquires
// waiting at once per name; a leased service's name (no braces, as Redis
// hash tags would read them), capacity, partitions, a holder's TTL,
// weight, window and stated demand, the holders per service and the
// services this process keeps (a service's store is kept while the
// process runs, so that epochs only grow and a silent holder's leases are
// honoured until they expire). A request outside them is refused with an
// Error whose Code is Invalid (or TooMany for holders and services) and
// whose message names the bound; holders that disagree on a service's
// capacity or partitions are refused too. The transports answer each
// Code alike:
//
//	Code            gRPC                 HTTP
//	Invalid         INVALID_ARGUMENT     400
//	NoPermit        RESOURCE_EXHAUSTED   409 (every permit is held)
//	TooManyWaiters  RESOURCE_EXHAUSTED   429
//	TooMany         RESOURCE_EXHAUSTED   429
//	NotFound        NOT_FOUND            404
//	Unavailable     UNAVAILABLE          503
//	Gone            CANCELLED or         499 (never read: the caller left)
//	                DEADLINE_EXCEEDED
//
// and a call without the bearer token, when Options.Token is set,
// UNAUTHENTICATED or 401. Shutdown ends the waiting acquires and watches
// at once, as Unavailable, so that a server draining is not held up by
// them, and ends the lease holders without releasing.
package coord
