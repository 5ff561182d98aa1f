package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

//go:embed stream_add.lua
var streamAddLua string

//go:embed stream_claim.lua
var streamClaimLua string

//go:embed stream_release.lua
var streamReleaseLua string

//go:embed stream_extend.lua
var streamExtendLua string

//go:embed stream_ack.lua
var streamAckLua string

//go:embed stream_dead.lua
var streamDeadLua string

//go:embed stream_prune.lua
var streamPruneLua string

// Client is the client every type of this package is built on: the one
// NewClient returns, or any go-redis UniversalClient. Packages that build
// on this one (drain/redisdrain) name it here, so that they depend on
// go-redis only through redisstore.
type Client = redis.UniversalClient

// DefaultStreamPrefix is the default StreamOptions.Prefix.
const DefaultStreamPrefix = "sluice:stream:"

// The fields of a Stream's records. Add writes FieldKey, FieldTenant and
// FieldPartition when they are not empty, and FieldData always; a
// dead-lettered copy has the record's fields with FieldKey set to the
// record's key, and FieldError, FieldID and FieldDeliveries besides.
const (
	FieldKey        = "key"
	FieldTenant     = "tenant"
	FieldPartition  = "partition"
	FieldData       = "data"
	FieldError      = "error"      // on a dead letter: the reason
	FieldID         = "id"         // on a dead letter: the record's id in its stream
	FieldDeliveries = "deliveries" // on a dead letter: its delivery count then
)

// Bounds of a Stream's arguments.
const (
	// MaxStreamCount bounds the records one Read or Claim returns.
	MaxStreamCount = 1 << 14
	// MaxStreamKey bounds the length of a record's key, in bytes.
	MaxStreamKey = 1024
	// MaxStreamReason is the most bytes of a dead letter's reason kept;
	// a longer one is cut at a UTF-8 boundary.
	MaxStreamReason = 1024
	// maxStreamName bounds a stream's, group's or consumer's name.
	maxStreamName = 256
)

// ErrNotHeld is the error of an operation on a record that is no longer
// pending for the consumer that asked: acknowledged, or claimed by another
// consumer after its ack wait (Extend, Release and, for the latter,
// DeadLetter).
var ErrNotHeld = errors.New("redisstore: the record is not pending for this consumer")

// ErrNotPending is the error of DeadLetter on a record that is no longer
// pending in its group: acknowledged, or dead-lettered already.
var ErrNotPending = errors.New("redisstore: the record is not pending in the group")

// StreamOptions configure a Stream.
type StreamOptions struct {
	// Prefix starts every key the Stream uses; it must not contain "{"
	// or "}". Default DefaultStreamPrefix.
	Prefix string
}

// A Stream is a work queue on a Redis stream, consumed by consumer groups:
// each record is delivered to one consumer of a group, stays in the
// group's pending list until acknowledged, and is claimed by another
// consumer when it has been idle for the ack wait (its consumer died, or
// put it back). It is the Redis side of drain/redisdrain.
//
// Every key of one stream shares one hash tag, so a Stream lives in one
// Cluster slot and each of its operations is one atomic command or
// script:
//
//	Prefix + "{" + enc(name) + "}"                the stream (Key)
//	  … + ":dead"                                 its dead-letter stream (DeadLetterKey)
//	  … + ":delays"                               a hash: group "\0" record id -> instant before which the group's copy is not delivered
//	  … + ":dup:" + enc(key)                      a record key's dedupe marker, expiring with the window
//
// where enc is the encoding of every caller-chosen string in this
// package's keys (see keys.go). A producer outside Go may XADD to Key
// directly, with the fields FieldKey, FieldTenant, FieldPartition and
// FieldData; only Add deduplicates.
//
// Delays are measured by the Redis server's clock. The ack wait is each
// consumer's (Consumer); the consumers of one group should share it.
//
// A Stream is safe for concurrent use. Use NewStream.
type Stream struct {
	c                        Client
	name                     string
	key, dead, delays, dupKp string
	add, claim, release      *redis.Script
	extend, ack, deadLetter  *redis.Script
	prune                    *redis.Script
}

// NewStream returns the stream named name on c, which the caller owns and
// closes. It does not contact Redis.
func NewStream(c Client, name string, o StreamOptions) (*Stream, error) {
	if c == nil {
		return nil, errors.New("redisstore: nil Redis client")
	}
	if err := checkName("stream", name); err != nil {
		return nil, err
	}
	if o.Prefix == "" {
		o.Prefix = DefaultStreamPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: stream prefix %q contains a hash tag brace", o.Prefix)
	}
	b := make([]byte, 0, len(o.Prefix)+2+encodedLen(len(name)))
	b = append(b, o.Prefix...)
	b = append(b, '{')
	b = appendEncoded(b, name)
	key := string(append(b, '}'))
	return &Stream{
		c: c, name: name,
		key: key, dead: key + ":dead", delays: key + ":delays", dupKp: key + ":dup:",
		add:        redis.NewScript(streamAddLua),
		claim:      redis.NewScript(streamClaimLua),
		release:    redis.NewScript(streamReleaseLua),
		extend:     redis.NewScript(streamExtendLua),
		ack:        redis.NewScript(streamAckLua),
		deadLetter: redis.NewScript(streamDeadLua),
		prune:      redis.NewScript(streamPruneLua),
	}, nil
}

// checkName validates a stream's, group's or consumer's name.
func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("redisstore: empty %s name", what)
	}
	if len(name) > maxStreamName {
		return fmt.Errorf("redisstore: %s name of %d bytes (at most %d)", what, len(name), maxStreamName)
	}
	return nil
}

// Name is the stream's name, as given to NewStream.
func (s *Stream) Name() string { return s.name }

// Key is the Redis key of the stream.
func (s *Stream) Key() string { return s.key }

// DeadLetterKey is the Redis key of the stream's dead-letter stream.
func (s *Stream) DeadLetterKey() string { return s.dead }

// dupKey is the Redis key of record key k's dedupe marker.
func (s *Stream) dupKey(k string) string {
	return string(appendEncoded([]byte(s.dupKp), k))
}

// A StreamRecord is one record of a Stream.
type StreamRecord struct {
	// ID is the record's id in its stream ("1700000000000-0").
	ID string
	// Key, Tenant, Partition and Data are the record's fields (FieldKey,
	// …); Key is "" for a record added without one.
	Key, Tenant, Partition string
	Data                   []byte
	// Deliveries is how many times the record has been delivered to the
	// group, this time included (the group's delivery counter); 0 for a
	// record read otherwise.
	Deliveries int
}

// A DeadRecord is a dead-lettered copy of a record.
type DeadRecord struct {
	// StreamRecord is the copy, with its own ID in the dead-letter stream
	// and the original's fields, Key the original's key, and Deliveries
	// the original's delivery count when it was dead-lettered.
	StreamRecord
	// Origin is the original's id in the stream; Error the reason.
	Origin, Error string
}

// Add appends r to the stream (its ID and Deliveries are ignored) and
// returns its id. A record with a key is added at most once within dedupe
// of the first: Add of the same key within that window adds nothing and
// returns the first one's id with added false. dedupe is rounded up to a
// millisecond and must be positive when r has a key.
func (s *Stream) Add(ctx context.Context, r StreamRecord, dedupe time.Duration) (id string, added bool, err error) {
	if len(r.Key) > MaxStreamKey {
		return "", false, fmt.Errorf("redisstore: record key of %d bytes (at most %d)", len(r.Key), MaxStreamKey)
	}
	if r.Key != "" && dedupe <= 0 {
		return "", false, fmt.Errorf("redisstore: dedupe window %v is not positive", dedupe)
	}
	keys := []string{s.key}
	args := make([]any, 0, 10)
	args = append(args, r.Key, ttlMillis(dedupe))
	if r.Key != "" {
		keys = append(keys, s.dupKey(r.Key))
		args = append(args, FieldKey, r.Key)
	}
	if r.Tenant != "" {
		args = append(args, FieldTenant, r.Tenant)
	}
	if r.Partition != "" {
		args = append(args, FieldPartition, r.Partition)
	}
	args = append(args, FieldData, r.Data)
	res, err := s.add.Run(ctx, s.c, keys, args...).Slice()
	if err != nil {
		return "", false, fmt.Errorf("redisstore: adding to stream %q: %w", s.name, err)
	}
	if len(res) != 2 {
		return "", false, fmt.Errorf("redisstore: adding to stream %q: reply of %d values", s.name, len(res))
	}
	n, _ := res[0].(int64)
	id, _ = res[1].(string)
	return id, n == 1, nil
}

// CreateGroup creates the consumer group group, which starts at the
// stream's first record, and the stream if it does not exist (XGROUP
// CREATE … 0 MKSTREAM). A group that exists already is left as it is.
func (s *Stream) CreateGroup(ctx context.Context, group string) error {
	if err := checkName("group", group); err != nil {
		return err
	}
	err := s.c.XGroupCreateMkStream(ctx, s.key, group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("redisstore: creating group %q of stream %q: %w", group, s.name, err)
	}
	return nil
}

// Backlog returns the group's backlog: the records not yet delivered to it
// (XINFO GROUPS's lag) plus those delivered and not acknowledged (its
// pending count, which includes records put back with a delay). It needs
// Redis 7.0 or later, and fails while Redis cannot tell the lag (after
// records were deleted from the middle of the stream).
func (s *Stream) Backlog(ctx context.Context, group string) (int64, error) {
	groups, err := s.c.Do(ctx, "XINFO", "GROUPS", s.key).Slice()
	if err != nil {
		return 0, fmt.Errorf("redisstore: the groups of stream %q: %w", s.name, err)
	}
	for _, g := range groups {
		// A flat list of names and values (RESP2), or a map (RESP3).
		var kv []any
		switch g := g.(type) {
		case []any:
			kv = g
		case map[any]any:
			for k, v := range g {
				kv = append(kv, k, v)
			}
		}
		var name string
		var pending int64
		lag, hasLag, lagKnown := int64(0), false, false
		for i := 0; i+1 < len(kv); i += 2 {
			k, _ := kv[i].(string)
			switch k {
			case "name":
				name, _ = kv[i+1].(string)
			case "pending":
				pending, _ = kv[i+1].(int64)
			case "lag":
				hasLag = true
				lag, lagKnown = kv[i+1].(int64)
			}
		}
		if name != group {
			continue
		}
		if !hasLag {
			return 0, fmt.Errorf("redisstore: stream %q: the server reports no lag for group %q (Redis 7.0 or later needed)", s.name, group)
		}
		if !lagKnown {
			return 0, fmt.Errorf("redisstore: stream %q: the server cannot tell the lag of group %q now", s.name, group)
		}
		return lag + pending, nil
	}
	return 0, fmt.Errorf("redisstore: stream %q has no group %q", s.name, group)
}

// MaxPrune bounds the consumers one Prune removes.
const MaxPrune = 1000

// Prune removes from group up to MaxPrune consumers that hold no pending
// record and have been idle (no read or claim) for at least idle, and
// returns how many it removed. A group's consumers are never removed by
// Redis itself, so without Prune every name a crashed process used stays
// in the group. The check and the removal are one step, so no pending
// record is dropped; a live consumer removed is made again by its next
// read.
func (s *Stream) Prune(ctx context.Context, group string, idle time.Duration) (int, error) {
	return s.pruneRun(ctx, group, idle, "")
}

func (s *Stream) pruneRun(ctx context.Context, group string, idle time.Duration, name string) (int, error) {
	n, err := s.prune.Run(ctx, s.c, []string{s.key}, group, max(idle.Milliseconds(), 0), MaxPrune, name).Int()
	if err != nil {
		return 0, fmt.Errorf("redisstore: pruning the consumers of group %q of stream %q: %w", group, s.name, err)
	}
	return n, nil
}

// DeadLetters returns up to count of the oldest records of the
// dead-letter stream, oldest first. It reads and removes nothing.
func (s *Stream) DeadLetters(ctx context.Context, count int) ([]DeadRecord, error) {
	if count < 1 || count > MaxStreamCount {
		return nil, fmt.Errorf("redisstore: dead-letter count %d out of [1, %d]", count, MaxStreamCount)
	}
	msgs, err := s.c.XRangeN(ctx, s.dead, "-", "+", int64(count)).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstore: reading the dead letters of stream %q: %w", s.name, err)
	}
	out := make([]DeadRecord, 0, len(msgs))
	for _, m := range msgs {
		d := DeadRecord{StreamRecord: fromMap(m.ID, m.Values, nil)}
		d.Origin, _ = m.Values[FieldID].(string)
		d.Error, _ = m.Values[FieldError].(string)
		if n, ok := m.Values[FieldDeliveries].(string); ok {
			d.Deliveries, _ = strconv.Atoi(n)
		}
		out = append(out, d)
	}
	return out, nil
}

// fromMap is the record id with the fields of a go-redis reply; its Data
// is appended to *data, when data is not nil and has room for it, and
// is the part appended (capped, so that appending to it copies), else
// a copy of its own.
func fromMap(id string, v map[string]any, data *[]byte) StreamRecord {
	r := StreamRecord{ID: id}
	r.Key, _ = v[FieldKey].(string)
	r.Tenant, _ = v[FieldTenant].(string)
	r.Partition, _ = v[FieldPartition].(string)
	if d, ok := v[FieldData].(string); ok {
		if data != nil && cap(*data)-len(*data) >= len(d) {
			at := len(*data)
			*data = append(*data, d...)
			r.Data = (*data)[at:len(*data):len(*data)]
		} else {
			r.Data = []byte(d)
		}
	}
	return r
}

// fromList is the record id with fields as a flat list of names and
// values, as a script returns them.
func fromList(id string, kv []any) StreamRecord {
	r := StreamRecord{ID: id}
	for i := 0; i+1 < len(kv); i += 2 {
		k, _ := kv[i].(string)
		v, _ := kv[i+1].(string)
		switch k {
		case FieldKey:
			r.Key = v
		case FieldTenant:
			r.Tenant = v
		case FieldPartition:
			r.Partition = v
		case FieldData:
			r.Data = []byte(v)
		}
	}
	return r
}

// A StreamConsumer is one consumer of a group of a Stream: it reads new
// records, claims those idle past its ack wait, and settles what it holds.
// Make one with Stream.Consumer; create its group with CreateGroup first.
// It holds no state of its own in the process: everything it holds is in
// the group's pending list, under its name.
//
// A StreamConsumer is safe for concurrent use.
type StreamConsumer struct {
	s           *Stream
	group, name string
	waitMs      int64
	// perRecord is the size of ReadNow's last reply for each of its
	// records, in bytes: the next reply's buffer is made that large.
	perRecord atomic.Int64
	// conn is ReadNow's connection.
	conn streamConn
}

// Consumer returns the consumer name of group, whose ack wait is ackWait
// (rounded up to a millisecond): a record it holds that has been idle that
// long (not extended) may be claimed by any consumer of the group.
func (s *Stream) Consumer(group, name string, ackWait time.Duration) (*StreamConsumer, error) {
	if err := checkName("group", group); err != nil {
		return nil, err
	}
	if err := checkName("consumer", name); err != nil {
		return nil, err
	}
	if ackWait <= 0 {
		return nil, fmt.Errorf("redisstore: ack wait %v is not positive", ackWait)
	}
	return &StreamConsumer{s: s, group: group, name: name, waitMs: ttlMillis(ackWait)}, nil
}

// Close closes the connection ReadNow opened, if any; a later ReadNow
// opens another. The consumer's records and place in the group stay (see
// Remove).
func (c *StreamConsumer) Close() error { return c.conn.close() }

// Name is the consumer's name; Group its group's.
func (c *StreamConsumer) Name() string  { return c.name }
func (c *StreamConsumer) Group() string { return c.group }

// checkCount validates a Read's or Claim's count.
func checkCount(count int) error {
	if count < 1 || count > MaxStreamCount {
		return fmt.Errorf("redisstore: count %d out of [1, %d]", count, MaxStreamCount)
	}
	return nil
}

// Read returns up to count records never delivered to the group, now
// this consumer's, waiting up to block (rounded up to a millisecond, at
// least one: never the unbounded wait of BLOCK 0) when there are none
// (XREADGROUP … COUNT count BLOCK block … >). It returns no records and no
// error when block passed with none.
func (c *StreamConsumer) Read(ctx context.Context, count int, block time.Duration) ([]StreamRecord, error) {
	if err := checkCount(count); err != nil {
		return nil, err
	}
	if block <= 0 {
		return nil, fmt.Errorf("redisstore: block %v is not positive", block)
	}
	return c.read(ctx, count, time.Duration(ttlMillis(block))*time.Millisecond)
}

// read is Read through go-redis's reply, without BLOCK when block < 0.
func (c *StreamConsumer) read(ctx context.Context, count int, block time.Duration) ([]StreamRecord, error) {
	res, err := c.s.c.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.group, Consumer: c.name, Streams: []string{c.s.key, ">"}, Count: int64(count), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("redisstore: reading stream %q as %q of group %q: %w", c.s.name, c.name, c.group, err)
	}
	n, size := 0, 0
	for _, st := range res {
		n += len(st.Messages)
		for _, m := range st.Messages {
			d, _ := m.Values[FieldData].(string)
			size += len(d)
		}
	}
	// The records' data share one array: one allocation a read, not one
	// a record.
	out, data := make([]StreamRecord, 0, n), make([]byte, 0, size)
	for _, st := range res {
		for _, m := range st.Messages {
			r := fromMap(m.ID, m.Values, &data)
			r.Deliveries = 1
			out = append(out, r)
		}
	}
	return out, nil
}

// ReadNow is Read without waiting: it returns up to count records never
// delivered to the group, now this consumer's, and none when there are
// none yet (XREADGROUP … COUNT count … > without BLOCK). It costs the
// client far less per record than Read: on a connection of the
// consumer's own (opened at the first call, with the client's options;
// Close closes it) the reply is read from the socket into one buffer,
// sized by the last reply, and parsed straight into the records, which
// share it, where Read's go-redis reply has a map and a dozen
// allocations a record. go-redis's hooks do not see these reads. A
// client it cannot stand in for (a Ring, one with an OnConnect hook or
// streaming credentials), and an answer such as a Cluster's MOVED, it
// leaves to go-redis: that read costs what Read's does, and go-redis
// follows the answer. A reader with a backlog calls ReadNow first, and
// Read, which waits, once ReadNow returns fewer records than it asked
// for. (Read keeps go-redis's reply because go-redis gives a blocking
// command its own read deadline.)
func (c *StreamConsumer) ReadNow(ctx context.Context, count int) ([]StreamRecord, error) {
	if err := checkCount(count); err != nil {
		return nil, err
	}
	per := c.perRecord.Load()
	if per == 0 {
		per = defaultPerRecord
	}
	// Room for the whole reply: one allocation.
	b, err := c.conn.read(ctx, c.s.c, c.s.key, make([]byte, 0, min(per*int64(count), maxReplyHint)),
		"xreadgroup", "group", c.group, c.name, "count", strconv.Itoa(count), "streams", c.s.key, ">")
	if errors.Is(err, errNotUsable) || errors.As(err, new(redirected)) {
		return c.read(ctx, count, -1)
	}
	var recs []StreamRecord
	if err == nil {
		recs, err = parseReadReply(b, count)
	}
	if err != nil {
		return nil, fmt.Errorf("redisstore: reading stream %q as %q of group %q: %w", c.s.name, c.name, c.group, err)
	}
	if len(recs) > 0 {
		c.perRecord.Store(int64(len(b)/len(recs)) + 1)
	}
	return recs, nil
}

// defaultPerRecord is ReadNow's guess of a reply's size for each record
// before its first reply, and maxReplyHint bounds the buffer it makes
// from the last reply's (a reply larger grows it).
const (
	defaultPerRecord = 256
	maxReplyHint     = 64 << 20
)

// Claim takes for this consumer up to count records of the group that
// have been idle for the ack wait, scanning the pending list from start
// ("0-0" for its beginning), and returns them, each with its delivery
// count (which the claim increments), and where the next scan starts: "0-0"
// when this one reached the end. A record put back (Release) with a delay
// that has not ended is not returned: it stays pending, claimable when the
// delay ends, and its delivery count is unchanged.
func (c *StreamConsumer) Claim(ctx context.Context, start string, count int) ([]StreamRecord, string, error) {
	if err := checkCount(count); err != nil {
		return nil, "", err
	}
	res, err := c.s.claim.Run(ctx, c.s.c, []string{c.s.key, c.s.delays}, c.group, c.name, c.waitMs, start, count).Slice()
	if err != nil {
		return nil, "", fmt.Errorf("redisstore: claiming from stream %q as %q of group %q: %w", c.s.name, c.name, c.group, err)
	}
	if len(res) == 0 {
		return nil, "", fmt.Errorf("redisstore: claiming from stream %q: empty reply", c.s.name)
	}
	next, _ := res[0].(string)
	out := make([]StreamRecord, 0, len(res)-1)
	for _, e := range res[1:] {
		t, _ := e.([]any)
		if len(t) != 3 {
			return nil, "", fmt.Errorf("redisstore: claiming from stream %q: a record of %d values", c.s.name, len(t))
		}
		id, _ := t[0].(string)
		n, _ := t[1].(int64)
		kv, _ := t[2].([]any)
		r := fromList(id, kv)
		r.Deliveries = int(n)
		out = append(out, r)
	}
	return out, next, nil
}

// Remove removes this consumer from its group if it holds no pending
// record, and reports whether it did. A process that stops calls it so
// that its name does not stay in the group.
func (c *StreamConsumer) Remove(ctx context.Context) (bool, error) {
	n, err := c.s.pruneRun(ctx, c.group, 1<<62, c.name)
	return n > 0, err
}

// maxAckIDs bounds the record ids of one acknowledging script call (Lua's
// unpack takes a few thousand at most).
const maxAckIDs = 1024

// Ack acknowledges the records ids: they leave the group's pending list
// and are never delivered to the group again. Acknowledging a record that
// is not pending (acknowledged already) does nothing. Many ids take one
// round trip (one per 1024).
func (c *StreamConsumer) Ack(ctx context.Context, ids ...string) error {
	for len(ids) > 0 {
		n := min(len(ids), maxAckIDs)
		args := make([]any, 0, 1+n)
		args = append(args, c.group)
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		if err := c.s.ack.Run(ctx, c.s.c, []string{c.s.key, c.s.delays}, args...).Err(); err != nil {
			what := ids[0]
			if n > 1 {
				what = fmt.Sprintf("%d records from %s", n, ids[0])
			}
			return fmt.Errorf("redisstore: acknowledging %s of stream %q: %w", what, c.s.name, err)
		}
		ids = ids[n:]
	}
	return nil
}

// Extend resets the idle time of the record id, which this consumer
// holds, so that no consumer claims it for another ack wait; its delivery
// count is unchanged. It returns ErrNotHeld when the consumer no longer
// holds the record.
func (c *StreamConsumer) Extend(ctx context.Context, id string) error {
	n, err := c.s.extend.Run(ctx, c.s.c, []string{c.s.key}, c.group, c.name, id).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: extending %s of stream %q: %w", id, c.s.name, err)
	}
	if n == 0 {
		return fmt.Errorf("redisstore: extending %s of stream %q as %q: %w", id, c.s.name, c.name, ErrNotHeld)
	}
	return nil
}

// Release puts back the record id, which this consumer holds, to be
// claimed again, by any consumer of the group, once delay (rounded up to
// a millisecond) has passed by the server's clock, never sooner: it
// stays in the pending list, idle as if delivered the ack wait less delay
// ago, so that Claim takes it when the delay ends. A delay longer than
// the ack wait is also recorded beside the stream, for this group alone:
// a Claim that meets the record before then puts it back unseen for the
// time left. Another group's copy of the record, and its Acks, Releases
// and Claims, neither see nor change the delay. It returns
// ErrNotHeld when the consumer no longer holds the record.
func (c *StreamConsumer) Release(ctx context.Context, id string, delay time.Duration) error {
	ms := int64(0)
	if delay > 0 {
		ms = ttlMillis(delay)
	}
	n, err := c.s.release.Run(ctx, c.s.c, []string{c.s.key, c.s.delays}, c.group, c.name, id, c.waitMs, ms).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: releasing %s of stream %q: %w", id, c.s.name, err)
	}
	if n == 0 {
		return fmt.Errorf("redisstore: releasing %s of stream %q as %q: %w", id, c.s.name, c.name, ErrNotHeld)
	}
	return nil
}

// DeadLetter moves the record id, which this consumer holds, to the
// dead-letter stream, in one atomic step: it adds a copy of the record's
// fields with FieldKey key, FieldError reason (cut to MaxStreamReason
// bytes), FieldID id and FieldDeliveries its delivery count, and
// acknowledges the record. It returns the copy's id; ErrNotPending when
// the record is no longer pending in the group (a record is dead-lettered
// at most once); ErrNotHeld when it is pending for another consumer
// (claimed after this one's ack wait), which keeps it.
func (c *StreamConsumer) DeadLetter(ctx context.Context, id, key, reason string) (string, error) {
	if len(reason) > MaxStreamReason {
		cut := MaxStreamReason
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut]
	}
	res, err := c.s.deadLetter.Run(ctx, c.s.c, []string{c.s.key, c.s.dead, c.s.delays}, c.group, c.name, id, key, reason).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: dead-lettering %s of stream %q: %w", id, c.s.name, err)
	}
	switch res := res.(type) {
	case string:
		return res, nil
	case int64:
		if res == 0 {
			return "", fmt.Errorf("redisstore: dead-lettering %s of stream %q as %q: %w", id, c.s.name, c.name, ErrNotHeld)
		}
		return "", fmt.Errorf("redisstore: dead-lettering %s of stream %q: %w", id, c.s.name, ErrNotPending)
	}
	return "", fmt.Errorf("redisstore: dead-lettering %s of stream %q: reply %v", id, c.s.name, res)
}
