// Package jsdrain is package drain's queue on NATS JetStream: Source, a
// drain.Source on a durable pull consumer (explicit acks, MaxAckPending as
// the window, dead-lettering by a confirmed publication to a subject), and
// Publish (and NewMsg), which enqueues a message with its idempotency key,
// tenant and partition and waits for the stream to confirm it.
//
// It is the one library package that links the NATS client (nats.go): a
// program that drains another queue, or none, imports drain without it.
// Its name is not jetstream so that it never clashes with nats.go's own
// package jetstream, which every caller imports beside it to connect.
//
// A message's key (drain.Message.Key) is the publisher's Nats-Msg-Id, else
// the stream and sequence; its tenant is the drain.HeaderTenant header field.
// A drainer that dies leaves what it held to be delivered again after the
// consumer's AckWait; a live one keeps what it holds, however long it
// waits, by telling it InProgress (the Source reports its AckWait, and
// pulls no more than the drainer has room for, NextUpTo and NextMany,
// which hands over together the messages of a pull that have come). Held reports
// the messages a previous drainer holds or held when it stopped. Ack
// returns once the server has the acknowledgement (which an embedded
// server writes to disk within about 100 ms): the acknowledgements asked
// for while one group is on its way go together, all but the last as
// plain acks and the last as a double ack, whose answer confirms them all
// since the server handles them in order — one round trip for many. A
// message is also a drain.AsyncAcker, so a Drainer's worker goes on to
// its next message while its acknowledgement is confirmed. A group's
// answer is waited for the consumer's AckWait at most: past it the
// server has the acknowledgements or will deliver the messages again
// whatever the drainer waits for, and the groups behind it go on (a
// cluster's consumer leader killed or cut off loses the answer).
//
// The Source pulls with pull requests of its own, one at a time, each no
// larger than the room it was told of (and half the window), on one
// subscription for its life: a pull costs a request, not a subscription
// and a goroutine as a jetstream Fetch does, and a message that arrives
// after its pull was given up is handed out all the same.
package jsdrain
