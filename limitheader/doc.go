// Package limitheader writes and reads the header fields in which a
// rate-limited service tells its clients where they stand: RateLimit-Policy
// and RateLimit (the IETF draft "RateLimit header fields for HTTP",
// draft-ietf-httpapi-ratelimit-headers-11, whose values are RFC 9651
// Structured Field lists) and Retry-After, with the older and vendor forms
// a client meets in practice (Retry-After-Ms, X-Ms-Retry-After-Ms,
// X-RateLimit-Reset), and the budgets that LLM APIs (OpenAI, Anthropic)
// and databases (Azure Cosmos DB) announce in their own fields.
//
// It is a codec and nothing more: it knows no transport and no rule, and
// imports only the standard library (not even net/http), so that every
// edge of Sluice — the HTTP middleware and client in httplimit, the gRPC
// interceptors in grpclimit, the rate-limit service — formats the fields
// the same way. The window a rule announces is the rule's own business
// (ratelimit.Rule.QuotaWindow).
//
// # Writing
//
// AppendPolicyItem and AppendLimitItem append one member of a
// RateLimit-Policy or RateLimit list; PolicyWindow, ResetSeconds and
// RetryAfterSeconds give the whole seconds those fields carry. The Append functions follow strconv's: they append to
// a caller's buffer and allocate only when it must grow.
//
// # Reading
//
// ParseRateLimitPolicy and ParseRateLimit parse the two fields into
// PolicyItems and LimitItems, strictly (a malformed field is rejected as a
// whole, as the draft asks) and within the bounds of RFC 9651. RetryDelay
// finds, among all the forms servers use, how long a response asks its
// client to wait.
//
// # Announced budgets
//
// ParseAnnouncement reads everything a response says of its client's
// budgets into an Announcement: a Budget per dimension (requests, tokens,
// input and output tokens, an IETF policy) with its limit, what remains
// and the time until it is whole again, from OpenAI's and Anthropic's
// fields, RateLimit-Policy and RateLimit joined by policy name, and the
// older RateLimit-* and X-RateLimit-* forms (see Dialect); the wait a
// response asks for; and what the call cost, as Azure Cosmos DB says in
// x-ms-request-charge. A value the service does not know (-1, a missing
// reset) or sends malformed is Unknown, never 0 nor a huge number, so that
// a client never paces on a guess; a malformed one also gives an error,
// beside an Announcement that keeps all that was well formed.
//
// Every function is safe for concurrent use; none keeps its arguments.
package limitheader
