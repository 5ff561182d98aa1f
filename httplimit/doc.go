// Package httplimit applies Sluice's limits to HTTP, in both directions.
//
// # Inbound: the middleware
//
// New builds a Middleware from Options: a ratelimit.Store (memstore for
// one process, redisstore for many) and Policies, each a ratelimit.Rule, the
// Keys that pick its bucket (ByIP, ByHeader, ByRoute, ByMethod, KeyFunc)
// and a CostFunc (CostByMethod, CostByRoute: reads cheap, writes dear). The
// policies that apply to a request are decided all or nothing. A refused
// request is answered at once, before its body is read: 429 with
// Retry-After, the RateLimit and RateLimit-Policy fields of the IETF draft
// "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-
// headers-11) and RFC 9457 problem details; 503 when the server sheds load
// or the Store cannot decide. Shadow mode decides and reports without
// refusing. ClientIP finds the client behind trusted proxies only.
//
// # Inbound: overload protection
//
// Protect guards a handler with an adaptive.Guard: a request whose priority
// (the Sluice-Priority header, trusted up to ProtectOptions.MaxPriority,
// Normal by default; or ProtectOptions.Priority) the Guard sheds is answered
// 503 with a Retry-After computed from the Guard's state and a problem of
// type temporary-reduced-capacity — overload, never a 429. Put it inside
// the rate limits (m.Handler(Protect(g, opt)(h))): a request over its
// quota then takes no overload capacity. The priority goes into the
// request's context, and from there, through Client, to the next service.
//
// # Outbound: the client
//
// Client wraps an *http.Client for calling a service that throttles: it
// paces requests with a Limiter (any Sluice limiter; WithCost sets a
// request's cost), pauses every goroutine sharing it when the service asks
// for a pause (limitheader.RetryDelay reads every form of the request),
// retries only what may be retried within a retry budget, lowers and
// raises its rate (cut only by repeated 429s, in proportion; retry.Ceiling), and fails at once when a wait would outlast the
// deadline. With a Rejecter (adaptive.Rejecter), it also rejects requests
// locally, at once and with ErrRejectedLocally, while the service refuses
// many of those it is sent — what Google's SRE book calls adaptive
// throttling — and lets them through again as the service recovers; the
// service's own 429s and 503s are still returned to the caller.
// It sends the priority of the request's context (other than
// Normal) as Sluice-Priority when the request has none of its own.
//
// With Budgets, the Client paces every dimension of the budgets the
// service announces in its responses (OpenAI's, Anthropic's, the IETF
// RateLimit fields; limitheader.ParseAnnouncement reads them), per model
// or deployment: each call reserves its estimate (WithEstimate: for an LLM,
// the prompt's tokens and max_tokens) before it is sent, waiting for the
// refill that covers it beside the calls in flight, and is settled with
// what it used, which the Usage hook reads from the body as the caller
// reads it. Budgets' doc states the model: token buckets for the vendors,
// fixed windows for the IETF fields, newer announcements only, debt
// carried.
//
// # Costs known after the answer
//
// A service that says what a call cost only in its answer is paced the
// same way: the call reserves an estimate, and is settled with the cost.
// Azure Cosmos DB announces no budget, only each call's charge
// (x-ms-request-charge), and its throughput is the caller's to know:
// Budgets.SetCapacity paces the RequestUnits dimension to it (so that no
// one-second window, wherever it starts, receives more than the capacity),
// and the Client settles each call with the charge its answer announces:
// a call that cost more than its estimate leaves a debt that the next
// calls wait out, one that cost less gives the difference back.
//
// # One account, several processes
//
// Processes that spend one account (an LLM API key used by several
// workers) each learn the whole budget from their answers; each paces to
// its part of it. Budgets.Share follows a lease.Holder of the account (a
// Capacity of the whole account in any unit, the holders of every process
// on one lease.Store, the demand stated by the caller with SetDemand): as
// the leases move, every announced dimension of the process's Budgets is
// paced to the holder's fraction of it (Budgets.SetShare), so that the
// processes' shares add up to the account, and a process that finishes
// leaves its share to the others. The announced budgets are the capacity
// the leases divide; no capacity is configured twice.
//
// # The fields
//
// Package limitheader writes the RateLimit, RateLimit-Policy and
// Retry-After fields the middleware sends and reads those the Client
// receives; use it directly to format or parse them elsewhere.
//
// Package rudb simulates a database that charges request units and
// answers 429 over its budget, for demonstrations, benchmarks and tests;
// package grpclimit does for gRPC what this package does for HTTP.
package httplimit
