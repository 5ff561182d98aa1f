// Package kafkadrain is package drain's queue on Kafka, through franz-go:
// Source, a drain.Source on a consumer group member, and Publish, which
// produces a record with its idempotency key, tenant and partition and
// waits for the brokers' acknowledgement.
//
// It is the one library package that links franz-go: a program that
// drains another queue, or none, imports drain without it.
package kafkadrain
