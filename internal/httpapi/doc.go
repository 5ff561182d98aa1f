// Package httpapi is the HTTP face of Sluice's decision service: the JSON
// APIs, metrics and health endpoints (API), and the admin API (Admin),
// which runs on its own listener.
//
// # POST /json
//
// envoyproxy/ratelimit's JSON endpoint: the body is a RateLimitRequest of
// Envoy's rate limit service API in proto3 JSON (either field spelling,
// "hitsAddend" or "hits_addend"; unknown fields are an error). It is
// translated and decided as over gRPC (internal/rls), so both answer alike:
// the RateLimitResponse in proto3 JSON, with status 200 when overall_code
// is OK and 429 when it is OVER_LIMIT, and the response_headers_to_add as
// HTTP headers. (A request denied because the store is down is 503, where
// gRPC can only say OVER_LIMIT; see Errors below.)
//
// # POST /v1/check
//
// Sluice's native schema:
//
//	{"domain": "edge",                  required, at most 256 bytes
//	 "descriptors": [                   1 to 64
//	   {"entries": [                    1 to 16, in order (outer level first)
//	      {"key": "tenant", "value": "acme"},
//	      {"key": "user", "value": "alice"}],
//	    "cost": 3,                      optional; this descriptor's cost
//	    "costs": {"input_tokens": 900}}],  optional; its costs per cost unit
//	 "cost": 1,                         optional; the default cost, 1 if absent
//	 "costs": {"input_tokens": 1200}}   optional; the default costs per unit
//
// Keys and values are at most 256 bytes. A cost of 0 checks without
// counting; a negative cost refunds (never above the limit's capacity);
// |cost| is at most 2^40. "costs" names 1 to 8 cost units (a-z, 0-9 and
// _, at most 32 bytes) with a cost each, as "cost": a limit whose rule has
// that cost_unit takes it, 0 when the costs name none for its unit; a
// limit without a cost_unit takes "cost"; without "costs", every limit
// takes "cost" (service.Descriptor.Costs). A descriptor's "cost" and
// "costs" each replace the request's. The costs go to the service as
// they are. The
// answer, with status 200 when every descriptor is allowed and 429 when a
// limit denies (for a store outage, see Errors):
//
//	{"allowed": true, "code": "OK",     or false and "OVER_LIMIT"
//	 "descriptors": [{                  one per request descriptor, in order
//	   "allowed": true, "code": "OK",
//	   "matched": true,                 false: no rule applies (no fields below but reason)
//	   "rule": "acme_user",             the rule that decided
//	   "limit": 5,                      its capacity (overrides applied)
//	   "cost_unit": "input_tokens",     what it counts; absent for a rule without a cost_unit
//	   "remaining": 4,                  what could still be admitted now (absent for fail_open)
//	   "reset_after_ms": 12000,         until back to full capacity (absent for fail_open)
//	   "retry_after_ms": 0,             until the same cost would pass; -1: never
//	   "reason": "ok",                  ok, limited, exceeds_capacity, fail_open, fail_closed, local
//	   "shadow": false,                 a shadow-mode rule decided: always allowed
//	   "quota_mode": false,             a quota_mode rule decided (a soft limit)
//	   "quota_exceeded": false,         it is over its quota: this descriptor is
//	                                    "OVER_LIMIT" but the request is allowed
//	                                    unless every quota_mode descriptor is
//	   "unlimited": false}]}            an unlimited rule matched
//
// With quota_mode (internal/service's package documentation), the answer's
// "allowed" and status code follow the request, not its descriptors: a
// descriptor over its quota is "allowed": false, "code": "OVER_LIMIT",
// "quota_exceeded": true in a 200 answer whose "allowed" is true. POST
// /json says the same as gRPC: the descriptor's code, and the
// dynamicMetadata internal/rls describes.
//
// A limit admitted by its fail_open failure mode (the store could not be
// asked) has no "remaining" nor "reset_after_ms", and no RateLimit item:
// nothing is known of its key. When a request has several limits, the
// status of a descriptor is the one that denied it, or the one with least
// remaining (a known remaining before an unknown one). Requests are decided all
// or nothing (unless the service counts independently): in a denied request
// nothing is consumed, so an allowed descriptor's remaining is unchanged.
// The response carries RateLimit-Policy and RateLimit (draft-ietf-httpapi-
// ratelimit-headers) for every limit that decided (a RateLimit-Policy item
// names a rule's cost_unit as the draft's quota unit, qu="input_tokens"),
// and Retry-After when the request is denied and could pass later.
//
// # POST /v1/reserve
//
// Paced waiting: "how long must I wait to send this?" instead of "may this
// go now?", so that a client in any language paces itself below a limit
// instead of retrying into 429s. It is a route of its own rather than a field
// of /v1/check: its 200 means "taken, send after wait_ms", which a caller
// of /v1/check that reads only the status would take for "send now", and
// it refuses what /v1/check answers (window limits). The body is /v1/check's with one more
// member, required:
//
//	{"domain": "edge", "descriptors": [...], "cost": 1,
//	 "max_wait_ms": 2000}               0 to the server's --max-reserve-wait (60000 by default)
//
// The request is decided as a reservation (internal/service's Reserve,
// and ratelimit.Rule.Reserving for the arithmetic): every limit it matches
// must be a gcra or leaky_bucket limit (a window limit, the default of a
// plain envoyproxy/ratelimit rule, or an inline limit, is 400 naming it).
// Admitted, the cost is taken now, and the answer, 200, says how long to
// wait before sending:
//
//	{"allowed": true, "code": "OK",
//	 "wait_ms": 350,                    wait this long, then send
//	 "descriptors": [{…as /v1/check…,   "limit" and "remaining" in the rule's own terms
//	   "wait_ms": 350}]}                this descriptor's longest limit wait
//
// A reservation whose wait would exceed max_wait_ms (counted in whole
// emission intervals of each limit, rounded down) is 429, takes nothing,
// and says in Retry-After and each limit's "retry_after_ms" when the same
// reservation would be admitted; "wait_ms" is 0. A cost above a limit's
// capacity is 429 with "retry_after_ms": -1, never. Shadow-mode limits
// are reserved too and reported, but never make the caller wait;
// quota-mode limits are decided at once, as by /v1/check. wait_ms is
// rounded up to whole milliseconds: a caller that sends when it has
// waited it conforms to every limit of the request (exactly so for a
// request of one limit; internal/service's reserve.go says what a
// request of several limits with different waits can do). Errors are
// /v1/check's.
//
// # Reservations and POST /v1/settle
//
// For a cost known only after the work (the request units a database
// reports, the tokens an LLM produced), /v1/check and /v1/reserve take
// two more members:
//
//	"settle": true,                    keep the admitted request for /v1/settle
//	"settle_within_ms": 300000}        optional; 1 to 86400000, default 300000
//
// Admitted, the answer carries "reservation": "<id>" (22 characters of
// URL-safe base64) beside "allowed"; denied, nothing is taken and no id
// is given. The estimate is taken at once like any cost; POST /v1/settle
// then tells the actual cost:
//
//	{"reservation": "<id>", "cost": 42}                    every descriptor's actual cost
//	{"reservation": "<id>", "descriptors": [{"cost": 42}, {"cost": 7}]}
//	                                                       one per descriptor, in the reserved order
//
// Each cost is 0 to 2^40. The difference is decided on every limit the
// reservation took from (internal/service's settle.go; package ratelimit
// has the arithmetic): a lower actual cost is refunded, a higher one is
// charged even past the limit, a debt the next requests wait out. The
// answer is 200:
//
//	{"settled": true, "already_settled": false,
//	 "limits": 2, "refunded": 18, "charged": 0}             units summed over the limits
//
// Settling is idempotent: a repeat of a settled id is 200 with
// "settled": false, "already_settled": true (and no amounts), so a client
// that lost the first answer may send again. An id never kept, or whose
// settle_within_ms ran out, is 404: the reservation stays charged at its
// estimate. A malformed body, or a "descriptors" list whose length is
// neither 1 nor the reserved request's, is 400 (the latter found once the
// reservation is taken: it then stays at its estimate); a ledger or store
// that failed is 503. A reservation is kept where the counters are (in
// memory, or on Redis where every replica finds it), so any replica may
// settle it.
//
// # POST /v1/semaphores/acquire, /renew, /release, /holders
//
// The coordination API's semaphores (package internal/coord, which
// serves the same over gRPC), with Options.Semaphores; docs/openapi.yaml
// describes them, and cmd/sluice's tests check serve's answers against it.
//
//	acquire  {"name": "db", "limit": 3, "weight": 1, "ttl_ms": 30000, "wait_ms": 5000, "fair": false}
//	         200 {"permit_id": "…", "fence": 17, "valid_for_ms": 29400}
//	renew    {"name": "db", "permit_id": "…", "ttl_ms": 30000}   200 {"valid_for_ms": 29400}
//	release  {"name": "db", "permit_id": "…"}                    204
//	holders  {"name": "db"}
//	         200 {"name": "db", "holders": [{"fence": 17, "weight": 1, "held_for_ms": 1234, "expires_in_ms": 8766}], "waiting": 3}
//
// holders lists the permits of the name held now, by fence, never their
// ids (coord.Service.Holders): "held_for_ms" is absent for a permit whose
// grant the store did not record (granted by an older serve on Redis),
// and "waiting" counts the acquires waiting in this replica. A protected
// service asks it whether the fence it received is still held.
//
// Bodies are bounded and decoded as strictly as /v1/check's. A refusal is
// a problem: 400 outside the bounds, 401 without the bearer token
// (coord.Options.Token), 404 for a permit id that holds nothing under the
// name, 409 when no permit came within the wait, 429 when too many
// acquires already wait on the semaphore, 503 when the store failed or
// serve is shutting down (a waiting acquire is answered at once). These
// routes are not behind Options.Protect: a waiting acquire is slow by
// design, and would read to the overload guard as a slow service.
//
// # POST /v1/leases/join, /demand, /watch, /leave
//
// The coordination API's capacity leases (package internal/coord, which
// serves the same over gRPC, where the watch is a stream), with
// Options.Leases; docs/openapi.yaml describes them, and cmd/sluice's
// tests check serve's answers against it.
//
//	join    {"service": "billing", "capacity": 500, "partitions": 20, "ttl_ms": 3000,
//	         "weight": 1, "window_ms": 1000, "rate": 0, "backlog": 10000}
//	demand  {"service": "billing", "holder_id": "…", "rate": 0, "backlog": 9500, "version": 4}
//	watch   {"service": "billing", "holder_id": "…", "version": 4, "wait_ms": 5000}
//	        200 (each) {"holder_id": "…", "version": 5, "rate": 250, "pace_rate": 245,
//	                    "burst": 2, "window_ms": 1000, "valid_for_ms": 2600,
//	                    "leases": [{"partition": 3, "epoch": 7}, …]}
//	leave   {"service": "billing", "holder_id": "…"}         204
//
// A watch is a long poll: it answers when the grant's version differs
// from the one given, or after wait_ms (at most coord.Limits.MaxWait)
// with the grant as it is. The version given to demand and watch is the
// newest grant the client paces by: what grants up to it took away goes
// to the other holders then. Bodies are bounded and decoded as strictly
// as /v1/check's. A refusal is a problem: 400 outside the bounds, 401
// without the bearer token, 404 for a holder id that names no holder of
// the service here, 429 when the service has as many holders as allowed,
// 503 when the store failed or serve is shutting down (a waiting watch
// is answered at once). Like the semaphore routes, they are not behind
// Options.Protect.
//
// # Errors and bounds
//
// Every error is an RFC 9457 application/problem+json object whose detail
// says what is wrong. Bodies are read through http.MaxBytesReader
// (Options.MaxBodyBytes, 1 MiB by default): a larger one is 413 naming
// MaxBodyBytes. They are decoded strictly, and nothing is repaired: unknown
// fields, values of the wrong type, trailing data, invalid UTF-8 (which
// encoding/json would replace by U+FFFD), an escaped lone surrogate such as
// "\ud800" (decoded as U+FFFD too), and a member given twice in one object
// (names compared as encoding/json matches them to fields, ignoring case;
// it would keep the last) are 400 naming the field, as in
// `field "descriptors[0].entries[1].value": invalid UTF-8 (byte 0xff at
// offset 97)`. Otherwise two different bodies could decode to one request
// and count on one key. POST /json is as strict (protojson refuses all of
// these), and so are the admin API's bodies. The request is then validated by the service
// (service.Request.Validate), with the message every transport gives for
// it, gRPC included: 400 for an empty domain, an empty entry key (an empty
// value is allowed), no descriptors, a descriptor without entries, or a
// value beyond a bound (MaxDescriptors, MaxEntries, MaxKeyValueBytes,
// MaxQuota).
//
// A store outage is never 429. A store that cannot decide, or a request
// denied only by limits whose failure_mode is fail_closed while the store
// cannot reach its backend, is 503 with a detail naming the cause (the
// rule that failed closed) and, when the store said when it retries,
// Retry-After. A deadline that passed is 504.
//
// # Concurrency and cost
//
// API and Admin are safe for concurrent use. A /v1/check call reuses
// pooled buffers and encodes its answer without reflection. The plain body
// almost every caller sends (the schema's member names, each once; strings
// of printable ASCII without escapes; integer costs; at most 8 costs per
// object) is decoded in one pass without reflection, allocating only its
// strings (a unit the reused call named last time, at the same place, is
// not allocated again); any other body goes
// through encoding/json and the strict checks, one more pass that
// allocates nothing, and is decoded the same (a fuzz target holds the two
// to it). Nothing is logged per request.
package httpapi
