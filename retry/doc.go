// Package retry holds what Sluice's clients share for coming back to a
// service that throttles them, whatever the transport: a retry Budget,
// which keeps retries to a fraction of the calls, and Wait, which waits out
// the delay a refusal asks for — or fails at once when the caller's
// deadline comes first, rather than sleeping only to fail later.
//
// httplimit.Client (HTTP 429 and 503) and grpclimit.Client
// (RESOURCE_EXHAUSTED and UNAVAILABLE with RetryInfo) are built on it; so
// can any client of another transport. It imports the standard library and
// ratelimit only.
package retry
