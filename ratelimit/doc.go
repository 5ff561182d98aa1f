// Package ratelimit holds Sluice's rate-limiting algorithms, the Rule and
// Decision types, and the Store interface that the rest of Sluice decides
// through. It imports the standard library only.
//
// # Model
//
// A Rule admits Quota units of cost per Period, counted by one Algorithm:
// GCRA (the default; a token bucket kept as one timestamp), FixedWindow
// (optionally aligned to calendar units in a time zone), SlidingLog (exact:
// never more than Quota in any window of Period), SlidingWindow (a weighted
// estimate from two fixed windows) and LeakyBucket (a meter). Every
// algorithm is a pure function of (State, now, cost): Rule.Decide reads no
// clock, so tests step time by hand and a Store chooses the clock (its own
// monotonic one in memory, the Redis server's on Redis).
//
// # Semantics
//
//   - A denied request consumes nothing: its state is left untouched.
//   - Cost is an integer. Cost 0 checks without consuming; a negative cost
//     refunds, never above the rule's capacity.
//   - A cost larger than the rule's capacity can never succeed: it is denied
//     with ReasonExceedsCapacity and RetryAfter Never, not told to retry.
//   - A Store decides the items of one request all or nothing: if any item
//     is denied, none is consumed.
//   - Several dimensions in one decision: each item has its own key, rule
//     and cost, so one Decide can limit requests, input tokens and output
//     tokens (or any units) at once, each against its own limit, all or
//     nothing (the Store example). A dimension whose cost is not known yet
//     takes cost 0, a check that denies only a key already over its limit,
//     and is charged later with another Decide.
//   - A rule changed between two decisions applies at once, against the cost
//     already consumed under the old rule.
//   - Time that goes backwards (a caller with an older clock reading) never
//     creates capacity: an instant older than the state is treated as the
//     state's own.
//   - Arithmetic is in integer nanoseconds with 128-bit intermediates where
//     products could overflow; the emission interval Period/Quota is rounded
//     up, so rounding never admits more than the rule says.
//
// # Reservations with settlement
//
// For a cost known only after the work, Reservations reserves an estimate
// now and settles the actual cost later (settle.go has the whole model):
//
//   - A reservation is decided as any request: denied, it takes nothing;
//     admitted, its record (each item's key, rule and estimate) is kept in
//     a Ledger under an id for a TTL.
//   - Settle takes the record once (a repeat is ErrAlreadySettled) and
//     decides the difference on every item: a lower actual cost is
//     refunded; a higher one is charged even past the limit, a debt. On
//     gcra and leaky_bucket the next request waits exactly the excess's
//     refill time longer; fixed_window carries the excess until its window
//     ends and then forgets it; sliding_window weighs it into the next
//     window; sliding_log keeps it for Period. A window's refund counts
//     only within the reservation's window.
//   - A reservation never settled expires with its record and stays
//     charged at its estimate; settling it then is ErrUnknownReservation.
//   - The record is taken before the difference is applied: a crash in
//     between loses the difference (at most once, never twice).
//
// # Concurrency
//
// Rule values are immutable once in use and may be shared. A State is not
// safe for concurrent use; Stores guard each one. Limiter and Shaper are
// safe for concurrent use.
package ratelimit
