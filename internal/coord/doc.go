// Package coord is sluice serve's coordination API: distributed
// semaphores held for programs in any language, as the gRPC service
// sluice.v1.SemaphoreService (proto/sluice/v1/semaphore.proto; its Go
// messages generated into sluicev1, its service descriptor written by
// hand in grpc.go) and as JSON over HTTP (internal/httpapi's
// /v1/semaphores/ routes, docs/openapi.yaml). Both transports call one
// Service.
//
// # Model
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
// nothing else.
//
// # Bounds and errors
//
// Limits bound names, limits, weights, TTLs, waits and the acquires
// waiting at once per name; a request outside them is refused with an
// Error whose Code is Invalid and whose message names the bound. The
// transports answer each Code alike:
//
//	Code            gRPC                 HTTP
//	Invalid         INVALID_ARGUMENT     400
//	NoPermit        RESOURCE_EXHAUSTED   409 (every permit is held)
//	TooManyWaiters  RESOURCE_EXHAUSTED   429
//	NotFound        NOT_FOUND            404
//	Unavailable     UNAVAILABLE          503
//	Gone            CANCELLED or         499 (never read: the caller left)
//	                DEADLINE_EXCEEDED
//
// and a call without the bearer token, when Options.Token is set,
// UNAUTHENTICATED or 401. Shutdown ends the waiting acquires at once, as
// Unavailable, so that a server draining is not held up by them.
package coord
