// Package retry holds what Sluice's clients share for coming back to a
// service that throttles them, whatever the transport:
//
//   - Pauses, the pause a refusal asks for, per scope, shared by every
//     call of that scope instead of each retrying on its own;
//   - Wait, which waits out a pause or a backoff — or fails at once, with
//     a *DeadlineError, when the caller's deadline comes first, rather
//     than sleeping only to fail later; and Sleep, the plain wait until a
//     duration passes or the context is done (drain's and lease's loops);
//   - Budget, which keeps retries to a fraction of the calls, so that
//     retrying never multiplies the load on a service already refusing it;
//   - Ceiling, the throttle controller of a client that paces itself:
//     a retry hint pauses and cuts nothing, only repeated refusals cut
//     the rate, in proportion to the overshoot, and the rate climbs back
//     (lease.Holder and httplimit.Client share it);
//   - Caller, the one retry-and-pacing sequence built of them: a local
//     rejection (a Rejecter), shared pause (with jitter), Limiter within
//     the deadline, send, read the refusal's hint, pause, retry within the
//     Budget, give up at the deadline.
//
// httplimit.Client (HTTP 429 and 503) and grpclimit.Client
// (RESOURCE_EXHAUSTED and UNAVAILABLE with RetryInfo) are adapters on a
// Caller: each says only how to send an attempt and how to read its
// answer (an Answer); so can a client of any other transport. Every type but Ceiling (which
// lives under its owner's lock) is safe for concurrent use. It imports the standard library and ratelimit only.
package retry
