// Package admit is the part of admitting a request that every edge of
// Sluice shares, whatever its transport: building the store key of each
// policy from the key parts the transport extracts, deciding all of a
// request's policies at once in a ratelimit.Store, and reading the
// decisions as the answer the edge must give.
//
// httplimit (HTTP middleware) and grpclimit (gRPC interceptors) are built
// on it, and keep only what is theirs: extracting keys from an
// *http.Request or from a call's metadata and peer, and writing 429 or 503
// with header fields and problem details, or a RESOURCE_EXHAUSTED or
// UNAVAILABLE status with its details.
//
// The model:
//
//   - A policy's store key is its rule name followed by '|' and each of its
//     key parts, e.g. "per_tenant|acme|/pkg.Svc/Get" (AppendKey), bounded
//     in length (MaxKeyLen). A policy one of whose keys does not apply to a
//     request does not apply at all.
//   - The items of the policies that apply are decided all or nothing
//     (Decide): either every one is admitted and consumed, or none is.
//   - A Verdict says which of three answers to give: Admitted; OverQuota,
//     when a quota refused the request (HTTP 429, RESOURCE_EXHAUSTED); or
//     Unavailable, when the store could not decide — it returned an error,
//     or it failed closed (ratelimit.ReasonFailClosed). An outage of the
//     store is never reported as the caller's quota being spent: it is the
//     server that is unavailable (HTTP 503, UNAVAILABLE).
//
// The package keeps no state: its functions are safe for concurrent use,
// and they allocate nothing on the paths of an admitted or refused request
// beyond what the caller's buffers and the Store need.
//
// It imports the standard library and ratelimit only.
package admit
