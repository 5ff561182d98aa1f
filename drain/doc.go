// Package drain drains durable queues only as fast as the downstream's
// capacity allows.
//
// A Drainer takes messages from one or more Sources (durable queues; those
// provided, a JetStream pull consumer, a Redis stream's consumer group and
// a Kafka consumer group, are in packages drain/jsdrain, drain/redisdrain
// and drain/kafkadrain, so that drain itself links no queue's client;
// every one passes drain/draintest) and hands each to a Sink
// (an HTTP call, say: HTTPSink), releasing them no faster than a Limiter
// grants — a ratelimit.Limiter, a lease Holder's limiter whose rate
// follows the capacity this process holds among many, or a
// ratelimit.StoreLimiter on a counter in Redis.
//
// # The model
//
// Work lives in the queue, not in the drainer's memory. A message is
// acknowledged only after its Sink call succeeded; until then the queue
// keeps it, and if the process dies (kill -9 included) the queue delivers
// it again once its ack wait has passed. Every message carries a key
// (Message.Key) that stays the same on every delivery — for JetStream the
// publisher's Nats-Msg-Id, else the stream and sequence; for Redis the
// record's key field, else the stream and the record's id — and the Sink
// passes it on (HTTPSink sends it as Idempotency-Key), so a sink that
// honours it applies each message once even when the message is delivered
// twice. The drainer gives at-least-once delivery; effects are exactly
// once only at such a sink.
//
// Memory is bounded whatever the backlog: each Source holds at most its
// window of messages delivered and not yet acknowledged (JetStream's
// MaxAckPending; for Redis, what its Source holds pending), and the
// drainer never asks for more.
//
// # What a drainer holds
//
// A message taken from a Source is the drainer's until it is settled
// (acknowledged, put back or dead-lettered), wherever it waits: for the
// Limiter, behind a pause, for a worker, or in a Sink call. One goroutine
// of Run tells every message held InProgress at least every
// Options.ProgressEvery (by default a third of the shortest ack wait the
// Sources report, AckWaiter, and at most DefaultProgressEvery), so the
// queue never delivers a second copy of a message a live drainer holds.
// It serialises that with the settlement, message by message: a message
// handed to the Sink just as its heartbeat is due is told InProgress
// before it is acknowledged, never after. The cost is one pass over the
// messages held (at most the windows) every half ProgressEvery.
//
// A drainer also holds no more than it can send soon: when a Source
// reports its ack wait and the Limiter its rate (a Limit method, as
// *ratelimit.Limiter and *lease.Limiter have), no more of that Source's
// messages wait in the drainer than the rate sends in half the ack wait
// (at least one; messages in a Sink call do not count); a BatchSource is
// asked for no more than that room, so none waits unseen in its batch. A
// MultiSource hands over the messages it has at hand, up to that room, in
// one call, which the drainer queues in one step (kafkadrain's records
// fetched, jsdrain's messages of a pull that have come, redisdrain's
// records of a read).
//
// A message held longer than its Source's ack wait since the queue was
// last told InProgress (or since it was taken), by the drainer's
// monotonic clock, has lapsed: the process was stopped (SIGSTOP, a frozen
// VM, a starved heartbeat) and the queue may have handed the message to
// another drainer meanwhile. The heartbeat no longer tells it
// InProgress, and a worker that comes to it drops it unsent, without a
// word to the queue, which delivers it again (Stats.Lapsed). So a
// drainer resumed after a pause past the ack wait repeats only the Sink
// calls its workers had begun before it stopped, not what it held.
// Should the drainer die, the queue hands on no more than that, and
// drainers sharing a consumer share its messages rather than one taking
// them all.
//
// So a record reaches the Sink more than once only when
//
//   - a drainer died (or was stopped past the ack wait) after the Sink's
//     call for it began and before the acknowledgement reached the queue:
//     the messages in flight then, Options.Workers and those whose
//     acknowledgement awaited the queue's answer (AsyncAcker), are sent
//     again by another drainer once the ack wait has passed (what it held
//     and had not sent is not sent twice);
//   - a drainer lost the queue for longer than the ack wait (cut from it,
//     or its consumer's leader in a NATS cluster cut off or killed until
//     another was elected) while it went on: it sends what it holds, and
//     their acknowledgements reach the queue, if at all, after it has
//     handed some of them out again; at most what it holds, the
//     Limiter's rate for half the ack wait, Options.Workers and the
//     acknowledgements awaiting the queue's answer, never more than the
//     Source's window (see docs/faults.md);
//   - a Sink call ran out of Options.Timeout, or was answered throttled,
//     or failed, after the downstream had applied it: the message is put
//     back and sent again;
//   - the queue lost an acknowledgement it had confirmed: an embedded
//     NATS server (the one `sluice drain` starts by default) writes its
//     consumers' acknowledgements to disk at most ten times a second, so
//     a SIGKILL of its process loses those of the last 100 ms or so (see
//     docs/draining.md), and drain/kafkadrain commits the offsets of
//     what was acknowledged once a second (CommitEvery), so a drainer
//     killed sends again up to a second of acknowledged records;
//   - the record was queued twice.
//
// Stats count the records acknowledged once (Done) apart from those
// whose key was acknowledged before (Duplicates) and from the deliveries
// that came again (Redelivered).
//
// # Outcomes of a Sink call
//
//   - nil: the message is acknowledged.
//   - a throttling error (Throttle, or any error that wraps a
//     *ThrottledError; HTTPSink returns one for 429 and 503, and a gRPC
//     sink returns one for RESOURCE_EXHAUSTED with RetryInfo, from
//     grpclimit.RetryDelay): the drainer pauses the message's scope
//     (Options.PauseScope) for the time asked (capped by
//     Options.MaxPause; Options.DefaultPause when the answer says
//     nothing) and puts the message back with that delay;
//     Options.OnThrottle is told. The Drainer is the one that acts on the
//     answer: a Sink only classifies it. This is not a failure: it does
//     not count towards Options.MaxFailures and never dead-letters a
//     message.
//   - any other error: a failure. The message is put back with a
//     full-jitter exponential backoff; after Options.MaxFailures failures
//     it goes to the Source's dead-letter destination with the last error
//     (Message.DeadLetter) and is terminated. If dead-lettering fails, the
//     message is put back instead: nothing is dropped.
//
// # Pause scopes
//
// What one throttled answer pauses is Options.PauseScope: every message
// (PauseAll, the default: the downstream has one quota for all), the
// messages of the throttled one's partition (PausePartition, by
// Message.Partition: the downstream limits each partition on its own) or
// of its tenant (PauseTenant). While a scope is paused the drainer goes
// on releasing the messages of the others; those of the paused scope it
// holds are set aside (still told InProgress) and go back in turn when
// the pause ends, so a paused scope neither spins the drainer nor
// starves. A grant of the Limiter is spent only on a message that may be
// sent: one taken as its message's scope was paused goes to the next
// message. At most MaxPauseScopes scopes are paused at once; a throttled
// answer beyond that pauses every message. Since a drainer holds a
// bounded number of messages, many scopes paused at once can fill it with
// messages set aside: a scope's messages then wait for its pause.
//
// Failures are counted in the drainer's memory, per message key. A
// drainer that restarts forgets them, so a message may get more attempts
// than MaxFailures across restarts, never fewer.
//
// # Priorities and tenants
//
// Each Source has a priority (priority.Priority; one JetStream consumer
// per priority, on its own subject). The drainer releases the highest
// priority that has messages waiting, with one anti-starvation rule: a
// priority that has messages waiting is passed over at most
// Options.StarvationLimit times in a row; the next release then goes to
// it (to the highest such priority when several are due). So a low
// priority under a high-priority backlog still gets at least one message
// in every StarvationLimit+1 releases (in every StarvationLimit+k with k
// priorities waiting), and finishes no later than that share allows.
// Within a priority, messages are grouped by tenant (Message.Tenant) and
// the tenants that have messages waiting take turns, one message each.
//
// # Progress
//
// Stats reports what has been done, what remains (the Sources' backlog:
// messages not yet delivered plus those delivered and not acknowledged),
// the records known in all (Total: those settled by the last backlog poll
// plus that backlog, which never decreases), the recent completion rate
// and the estimated time to finish at it. Done counts records, each key
// once; Duplicates, Redelivered, Throttled and Failed count the rest
// apart.
//
// # Shutdown
//
// Run returns when its context ends, after every Sink call in flight has
// finished (each is bounded by Options.Timeout) and been acknowledged or
// put back, and after every message taken but not yet released has been
// put back at once. Nothing is acknowledged before its Sink call
// succeeded.
//
// A Drainer is used by one Run at a time; Stats may be called
// concurrently with it. It logs to the *slog.Logger of its Options and
// reports its counters through Stats.
package drain
