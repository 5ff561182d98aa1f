// Package redisdrain is package drain's queue on Redis Streams: Source, a
// drain.Source on one consumer of a stream's consumer group, and
// Publisher (and Publish), which adds a message with its idempotency key,
// tenant and partition, once within a dedupe window.
//
// Its Redis commands and scripts are redisstore.Stream's; this package
// adapts them to drain and, like every package but redisstore, reaches
// go-redis only through it (the client is a redisstore.Client, such as
// redisstore.NewClient returns). A program that drains no Redis stream
// links none of it.
//
// # The model
//
// Delivery is at least once. A record read by a consumer (XREADGROUP)
// enters the group's pending list under that consumer's name and stays
// there until it is acknowledged (XACK) or dead-lettered; a consumer that
// dies keeps nothing in its memory that Redis does not also hold. Every
// record is delivered with the same key (its key field, else the stream's
// name and the record's id), so a sink that honours the key applies it
// once even when it is delivered twice.
//
// The ack wait (Options.AckWait) is how long a pending record may stay
// idle — neither settled nor extended by InProgress — before any consumer
// of the group may claim it (XAUTOCLAIM): what a dead drainer's records
// wait before another takes them. Each Source looks for records to claim
// every Options.ClaimEvery, so a record comes back between AckWait and
// AckWait plus ClaimEvery after its last sign of life. InProgress resets a
// record's idle time, if its consumer still holds it. Deliveries is the
// group's delivery counter, which a claim increments.
//
// Redis keeps a group's consumers until they are removed, so a Source
// removes its own on Close when it holds nothing, and New removes the
// group's consumers that hold nothing and have been idle for an hour
// (the names of processes that died), each check and removal one atomic
// step that never drops a pending record.
//
// A Source holds at most Options.Window records delivered and not
// settled: each read's and claim's COUNT is the free part of the window,
// at most half of it (so that one read's records are worked on while the
// next is read), and while it is full Next waits. Every wait on the
// server (BLOCK) is bounded (a second at most), so a Next outlives its
// context's cancellation by at most that. While reads come back full (a
// backlog), the next read does not wait on the server (redisstore's
// ReadNow, on a connection of the Source's own that Close closes, whose
// reply is read from the socket into one buffer and parsed straight into
// the records); once one comes back short, the next waits (BLOCK). A
// Drainer takes a read's records together (NextMany), and acknowledges
// through AckAsync: the acknowledgements go together in one script call
// (one XACK of many ids), sent once every record handed out and not
// settled has asked for its own, or a millisecond after the first asked,
// whichever is sooner, so that a read's records worked on together take
// one round trip; the Drainer is told of the group's outcome in one step
// (drain.ConfirmAll).
//
// # Delays
//
// Nak(delay) leaves the record pending, idle as if delivered AckWait less
// delay ago, so that a claim takes it once delay has passed by the Redis
// server's clock, and records the instant beside the stream, under the
// group and the record's id: another group reading the same stream keeps
// its own delays, and its acks forget none of this group's. A claim that
// meets the record before that instant (a delay longer than AckWait, or a
// consumer whose AckWait is longer than the one that put the record back)
// puts it back unseen for the time left, with its delivery counter as it
// was. So a record never comes back sooner than asked; a delay longer
// than AckWait costs one extra script step per AckWait while it runs.
// Throttling is the Drainer's: a put-back record is not a failure.
//
// # Dead letters
//
// DeadLetter adds a copy of the record — its fields, its key, the reason
// (cut to redisstore.MaxStreamReason bytes), its id and delivery count —
// to the stream's dead-letter stream (redisstore.Stream.DeadLetterKey)
// and acknowledges the record, in one script, so a record is
// dead-lettered once or not at all, and only by the consumer that holds
// it: a drainer whose record was claimed by another since (after its
// AckWait) gets redisstore.ErrNotHeld, as from Nak and InProgress, and
// the new holder keeps the record. Nothing trims either stream: an
// operator reads, replays and trims the dead letters.
//
// # Deduplication
//
// Publish adds a record with a key at most once within the dedupe window
// (PublishOptions.Dedupe, two minutes by default, as JetStream's
// duplicate window): the check, the XADD and the key's marker, which
// expires with the window, are one script.
//
// # Cluster
//
// Every key of one stream — the stream, its dead letters, its delays and
// its dedupe markers — shares the stream's hash tag, so a stream lives in
// one slot of a Redis Cluster and every step above is atomic there too.
// To spread load over a Cluster's masters, drain several streams (one per
// priority, say), each a Source.
//
// Backlog is the group's lag plus its pending count (XINFO GROUPS), which
// needs Redis 7.0 or later.
package redisdrain
