// Package redisstore keeps Sluice's shared state in Redis, Redis Sentinel or
// Redis Cluster, so that every replica of a service, and every process
// sharing a downstream, sees the same state. It is the one home of
// Sluice's Redis code: every Lua script (embedded), every key encoding and
// hash tag.
//
//   - Store is a ratelimit.Store: exact rate-limit decisions, shared by
//     every replica. Most of this documentation is about it.
//   - SemaphoreStore is a concurrency.Store: distributed semaphores with
//     expiring permits, each with its fencing token.
//   - LeaseStore is a lease.Store: capacity leases on partitions of a
//     downstream's limit.
//   - Replicated (replicated.go), an option of both, counts their grants
//     only once N replicas acknowledged them (WAIT), so that a failover
//     to one of those replicas keeps them; not a consensus guarantee.
//   - ExpiringHash is a small table of entries with their own TTLs, for
//     settings every replica must see (the service's runtime overrides).
//   - Stream is a work queue on a Redis stream and its consumer groups
//     (StreamConsumer: read, claim, extend, release with a delay,
//     acknowledge, dead-letter), with deduplicated adds and a dead-letter
//     stream, every key of one stream under one hash tag: the Redis side
//     of drain/redisdrain. Its type doc has its model; streams.go and the
//     stream_*.lua scripts (one per step) hold it, streamconn.go the
//     connection of a consumer's own on which ReadNow reads a backlog
//     (dialled with the client's options; the one place this package
//     speaks RESP itself, for its cost per record: go-redis's hooks do
//     not see it), and stream_reply.go the parser of that raw
//     XREADGROUP reply.
//
// All of them are built on a redis.UniversalClient (Client, the name other
// packages use for it) that the caller owns and closes; NewClient makes one with the settings they expect (every call
// bounded, no retries; a Cluster's slot owners asked again every second), for a standalone server, Sentinel or Cluster. All of
// them time what they store by the Redis server's clock (TIME inside their
// scripts), never by a client's. LogTo routes go-redis's own log lines
// through log/slog.
//
// The derivations behind what follows (the script's arithmetic in doubles,
// the bounds of the batched and approximate modes, the cutoff's estimate
// of a server's clock) are in docs/redisstore.md, in this repository.
//
// # Model
//
// Every algorithm of package ratelimit is ported to one Lua script
// (decide.lua), called with EVALSHA (EVAL when the server does not know it
// yet). The script decides all the items of one request atomically, all or
// nothing, exactly as the Go functions do: in order, each against the state
// left by the ones before it (so a key named twice is charged twice), and
// writes nothing unless every item is admitted. Every key it writes gets a
// TTL that ends when its state has become equivalent to a fresh one, so
// nothing outlives its use, not even state of a deleted rule.
//
// # Decision paths
//
// Decide first checks the items (build, which validates each rule once, on
// first use). A request with an item of a batched or approximate rule
// first takes those items from what this replica holds (see "Where the
// counter lives"); the rest, and every strict request, is answered by the
// denial cache when it can be, and otherwise decided by the first of these
// paths that takes it (Stats.Exact counts the exact path):
//
//   - Cross-slot (decideAcross, cross.go): on a Cluster only, a request
//     whose keys have different hash tags, which no single script may
//     touch. Each tag's items are decided as a request of their own by the
//     paths below, in order; a denial refunds the groups already taken.
//   - Exact path (exact.go): a rule whose durations reach 2^52 ns
//     (needsExact), beyond what the script's doubles hold exactly, or a
//     request the script answered with replyFar because a stored state is
//     that far from now. Go reads the states, decides with ratelimit's
//     integer code and writes them back by compare-and-set: two round
//     trips, exact whatever the rule.
//   - Script, fast path (fastGCRA and fastFixed at the top of decide.lua):
//     a request of one GCRA item, or of one fixed-window item whose period
//     divides a second or is whole seconds and has no calendar, in the
//     usual case: cost within capacity (not negative for a fixed window),
//     no stored state of another algorithm (or, in debt, another GCRA
//     interval), no clock behind the state's. It exists for speed only;
//     what it does not take it leaves, untouched, to:
//   - Script, general path (request in decide.lua): every other request:
//     several items decided all or nothing, every algorithm, refunds, costs
//     beyond capacity, rule changes, a caller whose clock lags the state,
//     calendar windows (computed in Go by run, after a TIME round trip when
//     the server's clock is used).
//
// Both script paths go through the coalescer (batch.go) unless
// Options.NoCoalesce is set: a caller alone sends its own EVALSHA, others
// are sent by a worker in a pipeline, and on a standalone server or
// Sentinel the requests of one pipeline at the same instant are one
// EVALSHA (decide.lua's batch form). The exact path's calls and the
// calendar's TIME read are sent directly. When Redis cannot answer, or the
// breaker is open, failure.go decides by each rule's Failure mode instead.
//
// Where each step lives:
//
//   - store.go: Options, Stats, the Store, Decide and the call to Redis
//     with its breaker (decideRedis); State and Reset.
//   - request.go: a request as decide.lua reads it (build), sent (run) and
//     its reply read (parse); script.go: decide.lua and its layout.
//   - cross.go, exact.go, batch.go, failure.go, denials.go: the cross-slot
//     path, the exact path, the coalescer, the failure modes and the
//     breaker, the denial cache.
//   - clock.go: the cutoffs of Deadlines; keys.go: Keys and Cluster slots.
//   - counting.go: a request of batched or approximate items
//     (decideCounted) and what both modes share; batched.go and
//     approximate.go: each mode; reconcile.go: an approximate replica's
//     hits sent to Redis.
//   - ledger.go, ledger_take.lua: the Store as a ratelimit.Ledger, the
//     records of reservations with settlement (one key each, its own
//     hash tag: reservationKey in keys.go).
//
// # Clock
//
// By default the clock is the Redis server's (TIME, read inside the script),
// so replicas with skewed clocks never disagree. Calendar windows
// (Rule.Calendar) are computed in Go in the rule's time zone: for a request
// that has one, the store first reads TIME from the node that owns the
// request's slot in a separate tiny round trip, then decides at that
// instant. Options.Now replaces the server clock by a client one (tests
// step time with it); keys then live one minute longer than they need, as
// allowance for the client clock's distance from the server's. The script
// still reads TIME then, for its cutoff (see Deadlines), which is always in
// the server's clock.
// Options.LocalNow moves only this process's own clock (the failure
// mode's local counts, the denial cache, the counters of batched and
// approximate rules), never what Redis decides by: serve's
// --clock-offset, for fault tests.
//
// # Precision
//
// Lua numbers are doubles. The script's decisions are exact to the
// nanosecond, as in Go, while the durations involved (periods, capacity ×
// interval, debts) stay below 2^52 ns, about 52 days. A request with a
// rule beyond that (one unit a year, a yearly calendar window, Quota 0), or
// a key whose stored state is that far from now, is decided on the exact
// path instead. Every decision is therefore exact; the rare long rules cost
// two round trips.
//
// # Keys and Cluster slots
//
// A key's counter lives at a Redis key derived from the key alone (see
// appendKey), so it is the same whatever request it is decided in. Its
// Cluster slot is chosen by a hash tag: Options.HashTag(key), by default
// HashTag, the part of the key between "{" and "}" as Redis reads tags, or
// the whole key when it has none. The items of one request are decided in
// one script when they can be: always on a standalone server or Sentinel,
// and on a Cluster when they share a tag — name the keys of a request
// "{tenant:acme}user:42", "{tenant:acme}endpoint:/x", or set Options.HashTag
// to a function that extracts the common part. A Cluster request whose keys
// have different tags is decided one tag at a time, each group atomically;
// if a later group denies, what the earlier groups took is refunded, so the
// outcome is still all or nothing, though for a moment other requests may
// see the capacity taken (they can only be denied by it, never admitted).
// Tags and keys are encoded, so no byte a caller sends can move a key to
// another slot or reach another key's counter.
//
// # Throughput
//
// Concurrent Decide calls are coalesced: a few worker goroutines, owned by
// the Store and stopped by Close, each take every request waiting (up to
// Options.BatchSize, waiting at most Options.BatchWindow for more) and send
// them in one pipeline; on a Cluster, one pipeline per node, each sent by a
// goroutine of its own that the worker does not wait for, so that a node
// that does not answer holds neither the other nodes' calls nor the
// workers. A caller with no other request pending sends its own at once,
// so a lone caller pays no hand-off. Options.NoCoalesce turns coalescing
// off.
//
// # Failures
//
// Every Redis call is bounded by Options.Timeout (default 50 ms). A call
// that fails is decided by its items' failure modes; a circuit breaker
// opens after Options.BreakerThreshold consecutive failures and then
// answers without calling Redis for Options.BreakerCooldown, after which
// one call probes Redis; success closes it, so decisions go back to Redis
// by themselves.
//
// A breaker is one per server the Store calls: the one of a standalone
// server or of Sentinel's master (or of a client of another type), and on
// a Cluster one per master, by its address, found from a key's slot
// (go-redis's slot table, no call to Redis; failure.go's breakers). So a
// master that hangs sends the keys of its own slots to the failure mode,
// and the other masters' keys stay on Redis. A request whose keys span
// masters is decided group by group (cross.go), each group by its own
// master's breaker: a group on a master whose breaker is open is decided
// by the failure modes at once, the others by Redis, and all or nothing
// still holds (a group denied, by Redis or by local, gives back what the
// groups before it took). Until the failing master's breaker opens, a
// group on it waits the timeout, and so does giving back what that group
// took when a later group is denied: such a request may take two
// timeouts for each of its groups on a hanging master. An approximate
// replica's reconciliation sends the keys of masters whose breakers let
// it and keeps back the others'. The breakers are bounded (256 masters'
// worth: past that, the breakers of masters that answer are dropped), and
// an outage's log lines name the master.
//
// A slow Redis is told from a dead one. A reset connection (or an error
// reply saying Redis cannot serve) at the threshold opens the breaker at
// once; timeouts do not: the breaker first asks, in the background,
// whether Redis answers a PING on a connection of its own within
// Options.LivenessTimeout (1 s; the decisions' client could not even dial
// a server that slow). The check dials once, without go-redis's retries,
// so a refused connection fails it at once (the decisions' client retries
// its dials past the call's timeout, so to it a refused connection looks
// like a timeout). If it does, Redis is slow, not dead: the
// breaker stays closed (Stats.Slow), every call still goes to Redis, and
// only those that time out are decided by the failure mode, so that a
// Redis slowed by a saturated CPU keeps deciding what it answers in time
// instead of handing a whole cooldown to the failure mode (issue 31: three
// slow calls opened the breaker, and fail_open admitted a key's limit
// plus 201 in that second). If it does not (a frozen or partitioned
// Redis), the breaker opens. The price: until the check gives up, calls
// to a Redis that does not answer still wait their timeout before they
// are decided by the failure mode, and a Redis that stays slower than the
// timeout keeps the breaker closed, each decision taking the timeout.
//
// Each item is decided by its rule's Failure mode, or by Options.Failure
// for a rule that states none (ratelimit.FailDefault): FailLocal unless
// set. FailOpen admits (ReasonFailOpen), FailClosed denies
// (ReasonFailClosed) and FailLocal decides in process at this replica's
// share of the limit, Quota/Options.Replicas and Burst/Replicas, each at
// least 1 (ReasonLocal). Stats counts them.
//
// FailLocal's bound, for N replicas that all set Replicas to N: in a
// window of the rule (for GCRA and leaky buckets, any span: capacity plus
// rate times its length) that Redis decides nothing of, at most N shares,
// the limit; in a window that Redis decides part of, at most the limit
// at Redis plus N shares, twice the limit, because neither side sees what
// the other admitted (nothing decided locally is carried back to Redis).
// Past that assumption: Replicas below the true count admits true/Replicas
// shares (above it, fewer); a limit below N still gives each replica 1; a
// Redis restarted without its data (or a failover to a replica that missed
// writes) starts its counts again: in the window of the restart, up to
// twice the limit at Redis and the local shares on top, three times the
// limit; a replica whose clock is off decides a fixed window's or sliding
// window counter's share in windows of its clock, which straddle Redis's,
// so a window of Redis's may hold twice its share from it. For batched and approximate rules the local share comes
// on top of what their mode admits (a batched replica's held blocks were
// counted at Redis; an approximate one's views keep their own bound).
// FailOpen has no bound: a saturated key admits its whole demand while
// Redis cannot decide. bench/RESULTS.md §20 measures both
// (TestFailureBound).
//
// # Where the counter lives
//
// A rule's Counting (ratelimit.Counting) says how often a replica asks
// Redis. Options.Replicas must say how many replicas share the limits.
//
// Strict, the default, decides every request in Redis, as described
// above: exact, all or nothing, one round trip per request.
//
// Batched (GCRA, LeakyBucket, FixedWindow; batched.go) takes blocks of
// capacity from the shared counter, each in one decide.lua call with the
// block as its cost, and spends them in process. A caller whose cost the
// blocks cannot cover leases a new block and waits for it; when what is
// held falls below half the next block, a lease is started in the
// background. A block is Options.BlockSpan (50 ms) of this replica's
// recent admitted demand, at least the cost asked, at most a quarter of
// this replica's share of the capacity; a bucket's block is held at most
// Options.BlockHold and leased under the rule with its capacity lowered by
// what a held block could add, a fixed window's ends with its window; a
// bucket too small to hold a block (a capacity under 8, or an interval
// longer than BlockHold) is decided at Redis, as strict. It
// never admits more than the limit, globally: what it spends was taken
// from the shared counter first. All replicas together strand at most half
// the capacity; a replica whose key has had no decision for two spans
// gives what it holds back (Stats.GivenBack), and a block that ends
// unspent is lost (Stats.Stranded). A lease Redis refuses is remembered
// until its RetryAfter, so a saturated key asks Redis about once per
// refill, not once per request. A key is short when Redis refused its last
// lease or gave less than a block (a bucket's for a span past the refusal,
// a fixed window's until its window ends): while a lease of a short key is
// in flight, a cost the blocks cannot cover is denied at once, in process,
// instead of waiting behind the lease — Redis would most likely refuse it,
// the lease taking what it holds — so a saturated key's callers wait for
// at most the one lease each starts (bench/RESULTS.md §22). Denying more
// is on the safe side of the limit; what is not admitted stays in Redis
// for the next lease.
//
// Approximate (GCRA, LeakyBucket; approximate.go) decides each key in
// process on a view of the shared state (the instant the key is full
// again, as Redis last gave it) and charges each hit Replicas intervals on
// it, so that between two reconciliations a replica admits at most its
// share, 1/Replicas, of what remains and of what refills. Every
// Options.ReconcileInterval (25 ms) a goroutine of the Store sends, for
// every key touched since the last time, the hits counted here in one
// pipeline (reconcile.go), and each reply sets the key's view. A key far
// below its limit (its view at most half used) keeps its hits back for up
// to 40 intervals and is only read meanwhile; near the limit its hits are
// sent every interval. The keys of one GCRA rule share script calls, up to
// 256 keys to a call (decide.lua's reconciliation form); on a Cluster, the
// keys of one slot. With N replicas, interval I, d the longest
// reconciliation round trip, rate R and capacity B, the keys admit, in any
// window, at most
//
//	limit + (N − 1)/N × (B + R(I + d))
//
// and the excess does not accumulate: the shared state goes into debt by
// it, and every replica denies the key within one interval (plus d) until
// it is paid. A cost above B/N cannot be charged on a view and is decided
// in Redis. No request of an approximate rule waits for Redis.
//
// In either mode, checks and refunds are decided in Redis as in strict
// mode, and a request that mixes modes is all or nothing: its local items
// are taken first and given back if the rest is denied.
//
// A reservation (ratelimit.Rule.Reserving) of a batched or approximate
// rule is an item of a Strict copy of the rule, with a larger burst, on
// the same key: it is decided at the shared counter, which counts a
// batched replica's blocks as taken when leased; an approximate rule's
// hits not yet reconciled are not in it, so a reservation's wait is
// short by at most what the mode's bound allows.
//
// A settlement (ratelimit.Reservations.Settle) decides its refunds and
// charges under ratelimit.Rule.Settling, also a Strict copy on the same
// key: they reach the shared counter at once. The reservation itself was
// decided as any request of its rule (a batched replica's block, an
// approximate replica's view). The other replicas see a settlement when
// they next ask Redis: a batched replica when it next leases (a block it
// holds is not shortened by a charge, so a charge binds it once that
// block is spent, within BlockHold for a bucket, by its window's end for
// a fixed window); an approximate replica with the key's next
// reconciliation (every ReconcileInterval near the limit, within 40
// intervals far below it), which carries the shared state back into its
// view. Until then a charge can be over-admitted by at most the mode's
// own bound, and a refund is unused capacity, never excess.
//
// When Redis does not answer, a batched replica spends the blocks it
// holds and an approximate one decides on its views (once the breaker is
// open, for up to 40 intervals after each view's last reconciliation);
// then each item follows its rule's Failure mode. Hits that a
// reconciliation could not send are sent with the next one; a
// reconciliation answered as failed never took effect (see Deadlines),
// so nothing is counted twice, except when Redis ran a call whose reply
// was lost, which only counts too much.
//
// Every mode has a denial cache (denials.go, off with
// Options.NoDenialCache): a GCRA or fixed-window key that Redis denied a
// cost until an instant is denied that cost here until then, with the
// same answer, without a round trip, in a request of that one item (a
// request of several items is decided by Redis, which alone can say what
// each other item would get). A consumption of the key through this
// Store refreshes it (its remaining count and reset; a GCRA denial's
// instant moves on by what was consumed); refunds, Reset and decisions
// under another rule of the key forget it; a refund through
// another replica is not seen, so this replica may deny until the
// remembered instant (never admit too much). A denial on a GCRA state
// written at another rate (the rule's changed since) is not kept: until
// an admission rewrites that state, its debt runs down at the old rate.
//
// # Deadlines
//
// A call answered as timed out never takes effect later. A command the
// client gave up on may still be in a socket buffer, or in a server that
// was paused (SIGSTOP, a frozen VM or container, a stalled disk) and reads
// it when it resumes; if it ran then, a request answered by the failure
// mode (denied, under FailClosed) would consume capacity after all. So
// every script call that consumes (a positive cost: decide.lua on every
// path, batch or not, the exact path's compare-and-set, SemaphoreStore's
// and LeaseStore's acquire) carries a cutoff in the Redis server's own
// clock, and the script, having read TIME, does nothing past it and
// answers "expired", which the caller takes as a timeout. Checks and
// refunds carry none: they take nothing, and a late refund only gives
// back.
//
// The cutoff is the instant the client gives up on the call, mapped to
// the server's clock by a lower bound estimated per node from TIME round
// trips (clock.go), so that it is never later than the server's clock at
// that instant. The cost is that a call reaching Redis within a round trip
// of its deadline may be answered "expired" although the client would
// still have waited for it. Keep the servers' clocks synchronised (NTP):
// the estimate does not cover a failover to a master whose clock is
// behind the old one's.
//
// A caller that cancels its context (rather than reaching its deadline)
// gets the context's error, not a decision: that call may still take
// effect.
//
// Every type of the package is safe for concurrent use; none has a usable
// zero value: call its constructor.
package redisstore
