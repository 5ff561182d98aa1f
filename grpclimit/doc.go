// Package grpclimit applies Sluice's limits to gRPC: server interceptors
// that refuse calls over a limit with RESOURCE_EXHAUSTED and a
// google.rpc.RetryInfo detail saying when to come back, and client
// interceptors that honour that detail.
//
// It is the one library package allowed to import gRPC (the module's
// import rules, which internal/deps checks); what it shares with httplimit,
// the HTTP edge, lives in admit (store keys and verdicts), retry (the retry
// budget and the deadline-aware wait) and limitheader (policy windows).
//
// # Server
//
// A Server decides each call (once per stream for streaming calls) against
// a Store, all policies of a call all or nothing, like httplimit's
// middleware:
//
//   - a call a quota refuses fails with codes.ResourceExhausted, a
//     RetryInfo detail (retry_delay: when the same call would be admitted)
//     and a QuotaFailure detail naming each violated policy and its scope;
//     a call whose cost exceeds a limit's capacity can never succeed and
//     gets no RetryInfo;
//   - when the Store fails closed or returns an error, the call fails with
//     codes.Unavailable and a RetryInfo — the server is overloaded, not the
//     caller over its quota.
//
// # Overload protection
//
// ProtectUnary and ProtectStream guard the calls with an adaptive.Guard:
// the priority comes from the sluice-priority metadata (trusted up to
// ProtectOptions.MaxPriority, Normal by default), and a call the Guard
// sheds fails with codes.Unavailable and a RetryInfo whose delay is
// computed from the Guard's state — overload, never RESOURCE_EXHAUSTED.
// Chain them after the rate-limit interceptors, so a call over its quota
// takes no overload capacity.
//
// # Client
//
// A Client's interceptors wait before each call while a pause is on: a
// RESOURCE_EXHAUSTED or UNAVAILABLE carrying RetryInfo starts a pause shared
// by every call through the Client, and the calls it held return spread
// over a first backoff step (full jitter), not at one instant. A unary call
// so refused is retried after the delay and a full-jitter backoff, at most MaxRetries times and within a retry budget (at
// most RetryRatio of the calls of the last RetryWindow, plus MinRetries);
// a wait longer than the call's deadline fails at once with an error that
// matches ratelimit.ErrWouldExceedDeadline and carries codes.DeadlineExceeded.
// Streams are not retried (their messages may already have been consumed);
// their refusals still start the pause. The sequence is retry.Caller's,
// the one httplimit.Client runs too; the Client only sends and reads the
// status.
//
// With a Rejecter (adaptive.Rejecter), the Client also rejects calls
// locally while the server is overloaded: before anything else, a call (and each
// retry) may be rejected locally, with a probability that grows as the
// server refuses more of the calls sent lately. A call so rejected fails
// at once with codes.Unavailable, a message saying it was "rejected
// locally", and an error matching ErrRejectedLocally; nothing is sent. The
// server's own refusals (RESOURCE_EXHAUSTED, UNAVAILABLE) are returned to
// the caller as they came, after the retries.
//
// With Budgets (an httplimit.Budgets: the one model of announced budgets,
// shared with httplimit.Client), the unary interceptor paces calls to the
// budgets the server announces in its response metadata, the header
// fields of limitheader.ParseAnnouncement as lower-case keys
// (x-ratelimit-remaining-tokens, anthropic-ratelimit-output-tokens-limit,
// ratelimit, x-ms-request-charge, ...): each call reserves the estimate
// of its context (httplimit.WithEstimate) before it is sent and is settled
// when it returns, with what Usage reads or the announced charge.
//
// Both interceptors send the priority of the call's context (other than
// Normal) as sluice-priority metadata, unless the call sets its own.
package grpclimit
