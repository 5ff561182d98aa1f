// Package kafkadrain is package drain's queue on Kafka, through franz-go:
// Source, a drain.Source on a member of a consumer group, and Publish,
// which produces a record with its idempotency key, tenant and partition
// and waits for every in-sync replica to have it.
//
// It is the one library package that links franz-go: a program that
// drains another queue, or none, imports drain without it.
//
// # The model
//
// Kafka has no acknowledgement per record: a group commits, per
// partition, an offset below which everything is done. A Source is a
// group member with automatic commits off that keeps, for each partition
// it owns, the records fetched past its commit point, and commits only
// the prefix of them that is settled — acknowledged or dead-lettered.
// A record put back (Nak) stays in the Source and is delivered again
// after its delay, with Deliveries one more; meanwhile it holds its
// partition's commit point, and the records settled after it wait,
// settled, to be committed with it. Commits go out every
// Options.CommitEvery, when a rebalance takes partitions away, and at
// Close.
//
// So delivery is at least once. The drainer acknowledges a record only
// after its Sink succeeded, and the group commits nothing past a record
// that was not settled; a record can be delivered twice (after a crash,
// a rebalance, a fenced member), never skipped. Each record's key
// (drain.Message.Key) is the same on every delivery — its
// drain.IdempotencyKeyHeader ("Idempotency-Key") header, which Publish
// sets, else "topic/partition/offset" — and drain.HTTPSink sends it on,
// so a sink that honours it applies each record once.
//
// # What a crash repeats
//
// A member that dies without a word (SIGKILL, a machine lost) commits
// nothing more. The group gives its partitions to the others once its
// session has timed out (Options.SessionTimeout: the Kafka counterpart of
// an ack wait), and they start at the committed offsets: every record
// past the last commit is delivered again — those that were out, those
// put back, and those already acknowledged but not yet committed (at most
// a CommitEvery's worth, and those behind a record put back). A member
// that closes (Close) commits what is settled and leaves the group, whose
// others take its partitions at once.
//
// # Rebalances
//
// When a rebalance takes a partition away (the group uses the
// cooperative-sticky balancer, so only the partitions that move are
// revoked), the Source waits up to Options.RevokeWait for that
// partition's delivered records to be settled, then commits its commit
// point and forgets the partition: the records it held, fetched or put
// back, go to the new owner from the committed offset. A record settled
// after that commits nothing: Ack fails, saying the record will be
// delivered again, and Nak succeeds (the record is indeed put back).
// InProgress does nothing: a group has no deadline per record; the
// member's session, kept alive by the client's heartbeats, is the
// deadline, and RevokeWait is how long a rebalance waits for work in
// flight.
//
// # Bounds and order
//
// At most Options.Window records are delivered and not settled, and at
// most Options.MaxUncommitted records are tracked past the commit points
// (delivered, waiting, put back, or settled behind one that is not);
// when that many are, the Source polls no more until a commit point moves
// on. A settled record's body and tracking stay in memory with those of
// its batch (franz-go's records of a batch share its buffer, and the
// Source tracks a fetch's records in one array) while one of them is
// tracked or held: MaxUncommitted records and the batches they came in,
// since a partition's tracked records are a run of offsets. Besides
// these, franz-go buffers what its last fetches returned
// (kgo.FetchMaxBytes and kgo.FetchMaxPartitionBytes, through
// Options.ClientOptions, bound it).
//
// Records of different partitions are delivered in turn. Options.Ordered
// keeps each partition's order: at most one record of a partition is out
// at a time, and one put back holds its partition until it is delivered
// again. Without it, records of a partition may be worked on
// concurrently and one put back is passed by those after it.
//
// # Tenants and partitions
//
// A record's tenant (drain.Message.Tenant) is its drain.HeaderTenant
// header. Its partition (drain.Message.Partition, the part of the
// downstream that a throttled answer can pause alone) is its
// drain.HeaderPartition header, else its Kafka key, else
// "topic/partition": a pause scoped to the partition pauses one
// downstream partition, one key, or one Kafka partition. Publish puts the
// partition in the header and as the Kafka key, so the records of one
// downstream partition share a Kafka partition and its order.
//
// # Dead letters and backlog
//
// DeadLetter produces a copy of the record (its key, value and headers,
// with HeaderKey, HeaderOrigin and HeaderError) to
// Options.DeadLetterTopic and waits for every in-sync replica to have it
// before the record counts as settled; without a dead-letter topic it
// fails and the Drainer puts the record back, so nothing is dropped.
// Backlog is the group's lag (end offsets less committed offsets) less
// the records this Source has settled and not yet committed.
//
// The tests run against kfake, franz-go's in-process cluster, since no
// Kafka broker installs from Debian's packages; with SLUICE_KAFKA_BROKERS
// set to "host:port,…" they run against those brokers instead (see
// docs/draining.md).
package kafkadrain
