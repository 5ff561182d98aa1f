package redisdrain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/redisstore"
)

// Defaults and bounds of Options.
const (
	DefaultWindow  = 512
	DefaultAckWait = 30 * time.Second
	// MaxWindow bounds Options.Window.
	MaxWindow = 1 << 14
	// MinAckWait bounds Options.AckWait below: Redis counts idle time in
	// milliseconds, and a shorter wait would hand records on while their
	// holder still works on them.
	MinAckWait = 10 * time.Millisecond
	// MaxClaimEvery is the default ClaimEvery's ceiling.
	MaxClaimEvery = time.Second
	// DefaultDedupe is the default PublishOptions.Dedupe, JetStream's
	// default duplicate window.
	DefaultDedupe = 2 * time.Minute
)

// maxBlock bounds each XREADGROUP's wait on the server: it is also how
// long Next may outlast its context's cancellation (go-redis does not
// interrupt a blocked read), so how long a Drainer's shutdown may wait for
// it.
const maxBlock = time.Second

// gatherWait bounds how long Next waits for a whole read (half the
// window) to be free before it reads fewer records.
const gatherWait = 2 * time.Millisecond

// pruneIdle is how long a consumer of the group that holds nothing must
// have been idle for New to remove it (redisstore.Stream.Prune).
const pruneIdle = time.Hour

// readMargin is kept between a read's BLOCK and its context's deadline,
// so that the read ends on the server, with its records, before the
// client gives up on it (a read cut short by the client loses the
// records it was sent until their ack wait ends).
const readMargin = 100 * time.Millisecond

// Options configure a Source.
type Options struct {
	// Stream is the name of the stream to drain; required. Its Redis keys
	// are redisstore.Stream's, under Prefix.
	Stream string
	// Prefix starts the stream's Redis keys; redisstore.DefaultStreamPrefix
	// when "".
	Prefix string
	// Group is the consumer group; required. It is created, at the
	// stream's first record, if missing.
	Group string
	// Consumer is this Source's name in the group; required, and unique
	// among the group's live consumers (a process's host name and pid,
	// say). A process that restarts under the same name finds the records
	// it held still its own, and claims them back after AckWait.
	Consumer string
	// Window is the most records the Source holds delivered and not
	// settled (acknowledged, put back or dead-lettered): the bound on a
	// drainer's memory. Each read's COUNT is half of it (at least 1), so
	// that one read's records are worked on while the next is read.
	// DefaultWindow when 0; at most MaxWindow.
	Window int
	// AckWait is how long a record delivered and not settled, nor
	// extended by InProgress, stays its consumer's before any consumer of
	// the group may claim it: how long a dead drainer's records wait.
	// Every consumer of a group should use the same. DefaultAckWait when
	// 0; at least MinAckWait.
	AckWait time.Duration
	// ClaimEvery is how often the Source looks for records to claim:
	// those of dead consumers, and those put back whose delay has ended.
	// A record comes back at most ClaimEvery after it may. When 0, a
	// quarter of AckWait, at most MaxClaimEvery; at most AckWait.
	ClaimEvery time.Duration
}

// check fills o's defaults and validates it; it is the one place that
// does.
func (o Options) check() (Options, error) {
	for _, f := range []struct{ v, name string }{{o.Stream, "Stream"}, {o.Group, "Group"}, {o.Consumer, "Consumer"}} {
		if f.v == "" {
			return o, fmt.Errorf("redisdrain: Options.%s is empty", f.name)
		}
	}
	switch {
	case o.Window < 0 || o.Window > MaxWindow:
		return o, fmt.Errorf("redisdrain: Options.Window %d out of [0, %d]", o.Window, MaxWindow)
	case o.Window == 0:
		o.Window = DefaultWindow
	}
	switch {
	case o.AckWait < 0 || (o.AckWait > 0 && o.AckWait < MinAckWait):
		return o, fmt.Errorf("redisdrain: Options.AckWait %v is below %v", o.AckWait, MinAckWait)
	case o.AckWait == 0:
		o.AckWait = DefaultAckWait
	}
	switch {
	case o.ClaimEvery < 0 || o.ClaimEvery > o.AckWait:
		return o, fmt.Errorf("redisdrain: Options.ClaimEvery %v out of [0, AckWait %v]", o.ClaimEvery, o.AckWait)
	case o.ClaimEvery == 0:
		o.ClaimEvery = min(o.AckWait/4, MaxClaimEvery)
	}
	return o, nil
}

var (
	_ drain.BatchSource = (*Source)(nil)
	_ drain.MultiSource = (*Source)(nil)
	_ drain.AckWaiter   = (*Source)(nil)
	_ drain.AsyncAcker  = (*message)(nil)
)

// Source is a drain.Source on a consumer of a Redis stream's consumer
// group; see the package doc. Make one with New; Close it when done.
type Source struct {
	cfg    Options
	stream *redisstore.Stream
	cons   *redisstore.StreamConsumer

	next      sync.Mutex // one Next at a time: it reads and claims
	cursor    string     // where the claim scan goes on; "0-0" between scans
	nextClaim time.Time  // when the next scan starts
	backlog   bool       // the last read took all it asked for: read without waiting first

	acks acks

	mu     sync.Mutex
	held   int                       // records read or claimed and not settled
	buf    []redisstore.StreamRecord // of those, not yet handed out by Next
	out    message                   // of those, the handed out: a ring through out.next, out.prev
	wake   chan struct{}             // closed and replaced when need slots are free, if waited on
	waited bool                      // wake was taken by a Next that waits
	need   int                       // the free slots of the window that Next waits for
	closed bool
}

// New creates the group of o if it is missing and returns a Source on it,
// on c, which the caller owns and closes after the Source.
func New(ctx context.Context, c redisstore.Client, o Options) (*Source, error) {
	o, err := o.check()
	if err != nil {
		return nil, err
	}
	st, err := redisstore.NewStream(c, o.Stream, redisstore.StreamOptions{Prefix: o.Prefix})
	if err != nil {
		return nil, fmt.Errorf("redisdrain: %w", err)
	}
	cons, err := st.Consumer(o.Group, o.Consumer, o.AckWait)
	if err != nil {
		return nil, fmt.Errorf("redisdrain: %w", err)
	}
	if err := st.CreateGroup(ctx, o.Group); err != nil {
		return nil, fmt.Errorf("redisdrain: %w", err)
	}
	// The names of processes that died holding nothing (or whose records
	// others claimed since) would otherwise stay in the group for ever.
	if _, err := st.Prune(ctx, o.Group, pruneIdle); err != nil {
		return nil, fmt.Errorf("redisdrain: %w", err)
	}
	s := &Source{cfg: o, stream: st, cons: cons, cursor: "0-0", backlog: true, wake: make(chan struct{})}
	s.out.prev, s.out.next = &s.out, &s.out
	s.acks.src = s
	return s, nil
}

// Options returns the Source's options, defaults filled in.
func (s *Source) Options() Options { return s.cfg }

// Stream returns the Source's stream: its keys, its dead letters.
func (s *Source) Stream() *redisstore.Stream { return s.stream }

// AckWait is Options.AckWait (drain.AckWaiter): the Drainer tells what
// it holds InProgress well within it.
func (s *Source) AckWait() time.Duration { return s.cfg.AckWait }

// Window is Options.Window.
func (s *Source) Window() int { return s.cfg.Window }

// Next returns the next record: one read or claimed earlier and not yet
// handed out, else one claimed (idle past AckWait, every ClaimEvery), else
// a new one, waiting on the server up to a second at a time. While the
// Source holds Window records it waits for one to be settled. A read
// under way when ctx is cancelled finishes first (within a second); its
// records are kept for the next call (or Close).
func (s *Source) Next(ctx context.Context) (drain.Message, error) {
	return s.NextUpTo(ctx, s.cfg.Window)
}

// NextUpTo is Next, told that the Drainer has room for n messages: a read
// takes n records at most, so that none waits in the Source, its ack wait
// running, for room in the Drainer (drain.BatchSource).
func (s *Source) NextUpTo(ctx context.Context, n int) (drain.Message, error) {
	var ms [1]drain.Message
	if _, err := s.take(ctx, ms[:], n); err != nil {
		return nil, err
	}
	return ms[0], nil
}

// NextMany is NextUpTo for len(ms) records, all of those read and not
// yet handed out, up to len(ms), in ms (drain.MultiSource).
func (s *Source) NextMany(ctx context.Context, ms []drain.Message) (int, error) {
	return s.take(ctx, ms, len(ms))
}

// take is NextMany, reading n records at most.
func (s *Source) take(ctx context.Context, ms []drain.Message, n int) (int, error) {
	s.next.Lock()
	defer s.next.Unlock()
	var gather *time.Timer // the wait for a whole read to be free
	gathered := false      // that wait is over
	defer func() {
		if gather != nil {
			gather.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			<-ctx.Done()
			return 0, ctx.Err()
		}
		if len(s.buf) > 0 {
			k := min(len(ms), len(s.buf))
			msgs := make([]message, k) // one allocation a call, not one a record
			for i := range k {
				// The records stay where the read put them, shared with
				// their messages.
				m := &msgs[i]
				m.src, m.r = s, &s.buf[i]
				m.prev, m.next = s.out.prev, &s.out
				m.prev.next, s.out.prev = m, m
				ms[i] = m
			}
			s.buf = s.buf[k:]
			s.mu.Unlock()
			return k, nil
		}
		read := s.readSize()
		free := min(s.cfg.Window-s.held, max(1, n), read)
		var wake chan struct{}
		wait := free <= 0 || (free < read && !gathered)
		switch {
		case free <= 0:
			wake, s.waited, s.need = s.wake, true, 1
		case wait && s.cfg.Window-s.held < read:
			// Woken once a whole read is free, not at each record
			// settled.
			wake, s.waited, s.need = s.wake, true, read
		}
		s.mu.Unlock()
		if wait {
			// A full window waits for a settled record; one with less
			// than a read free waits up to gatherWait for more, so that
			// reads take many records at a time rather than one per
			// settled record.
			var expired <-chan time.Time
			if free > 0 {
				if gather == nil {
					gather = time.NewTimer(gatherWait)
				}
				expired = gather.C
			}
			select {
			case <-wake:
			case <-expired:
				gathered = true
			case <-ctx.Done():
				return 0, ctx.Err()
			}
			continue
		}
		recs, claimed, err := s.fetch(ctx, free)
		if len(recs) > 0 {
			s.mu.Lock()
			if claimed {
				recs = s.notHeld(recs)
			}
			closed := s.closed
			if !closed {
				s.held += len(recs)
				s.buf = recs // empty here: take returns what it holds before it reads
			}
			s.mu.Unlock()
			if closed {
				// Read as Close ran: handed back too (one that is not is
				// claimed after AckWait).
				_ = s.handBack(context.WithoutCancel(ctx), recs)
				continue
			}
		}
		if err != nil {
			return 0, fmt.Errorf("redisdrain: %w", err)
		}
	}
}

// readSize is the most records one read takes: half the window, so
// that the records of one read are worked on while the next is read, and
// each read takes a whole half once its records are settled together.
func (s *Source) readSize() int { return max(1, s.cfg.Window/2) }

// fetch claims or reads up to free records, and tells which; it may
// return none.
func (s *Source) fetch(ctx context.Context, free int) (recs []redisstore.StreamRecord, claimed bool, err error) {
	now := time.Now()
	if s.cursor != "0-0" || !now.Before(s.nextClaim) {
		recs, next, err := s.cons.Claim(ctx, s.cursor, free)
		if err != nil {
			return nil, true, err
		}
		s.cursor = next
		if next == "0-0" {
			s.nextClaim = now.Add(s.cfg.ClaimEvery)
		}
		if len(recs) > 0 || next != "0-0" {
			return recs, true, nil
		}
	}
	if s.backlog {
		// Records are likely at hand: read them without waiting, far
		// cheaper for this process than a waiting read's reply, and
		// wait only once the stream has run dry.
		recs, err = s.cons.ReadNow(ctx, free)
		s.backlog = err == nil && len(recs) == free
		if err != nil || len(recs) > 0 {
			return recs, false, err
		}
	}
	block := min(maxBlock, time.Until(s.nextClaim))
	if d, ok := ctx.Deadline(); ok {
		block = min(block, time.Until(d)-readMargin)
	}
	if block < time.Millisecond {
		// Too close to the claim or to the deadline for a read.
		t := time.NewTimer(max(0, time.Until(s.nextClaim)))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return nil, false, nil
	}
	recs, err = s.cons.Read(ctx, free, block)
	s.backlog = err == nil && len(recs) == free
	return recs, false, err
}

// notHeld returns the claimed records recs less those this Source still
// holds (handed out and not settled: buf is empty when take reads),
// under s.mu. A record held past AckWait — its InProgress late, its
// process starved of CPU — is claimed back by its own consumer; the
// claim only reset its idle time, and delivering it again would send it
// twice from one live drainer. (Its delivery counter has grown by one.)
// A scan of what is held, at a claim that found records: rare, and never
// per record.
func (s *Source) notHeld(recs []redisstore.StreamRecord) []redisstore.StreamRecord {
	return slices.DeleteFunc(recs, func(r redisstore.StreamRecord) bool {
		for m := s.out.next; m != &s.out; m = m.next {
			if m.r.ID == r.ID {
				return true
			}
		}
		return false
	})
}

// Backlog returns the group's records not yet delivered plus those
// delivered and not acknowledged (redisstore.Stream.Backlog; Redis 7.0 or
// later).
func (s *Source) Backlog(ctx context.Context) (int64, error) {
	n, err := s.stream.Backlog(ctx, s.cfg.Group)
	if err != nil {
		return 0, fmt.Errorf("redisdrain: %w", err)
	}
	return n, nil
}

// Close hands back the records read or claimed and not handed out by
// Next, to be claimed at once by any consumer of the group (a record
// Close cannot hand back is claimed after AckWait), and then removes the
// consumer from the group if it holds nothing. Records handed out are
// their holders' to settle (call Close after the Drainer's Run has
// returned). The Source takes nothing more after
// Close (Next waits for its context to end), and Close does not close
// the client (it closes the connection of the Source's own on which it
// reads a backlog; see redisstore.StreamConsumer.ReadNow).
func (s *Source) Close(ctx context.Context) error {
	s.mu.Lock()
	left := s.buf
	s.buf, s.closed = nil, true
	s.held -= len(left)
	s.mu.Unlock()
	err := s.handBack(ctx, left)
	if _, rerr := s.cons.Remove(ctx); rerr != nil {
		err = errors.Join(err, fmt.Errorf("redisdrain: %w", rerr))
	}
	if cerr := s.cons.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("redisdrain: %w", cerr))
	}
	return err
}

// handBack releases records with no delay.
func (s *Source) handBack(ctx context.Context, recs []redisstore.StreamRecord) error {
	var errs []error
	for _, r := range recs {
		if err := s.cons.Release(ctx, r.ID, 0); err != nil && !errors.Is(err, redisstore.ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redisdrain: handing back: %w", err)
	}
	return nil
}

// settled frees the window slot of one record and wakes a waiting Next.
func (s *Source) settled(m *message) {
	s.mu.Lock()
	s.settledLocked(m)
	s.mu.Unlock()
}

// settledAll is settled for the records of group, acknowledged together
// (none settled before: an acknowledgement asked for is its settlement).
func (s *Source) settledAll(group []ackAsked) {
	s.mu.Lock()
	for _, g := range group {
		g.m.once.Do(func() { s.settledLocked(g.m) })
	}
	s.mu.Unlock()
}

// settledLocked is settled, s.mu held.
func (s *Source) settledLocked(m *message) {
	m.prev.next, m.next.prev = m.next, m.prev // every message is in the ring, settled once
	m.prev, m.next = nil, nil
	s.held--
	if s.waited && s.cfg.Window-s.held >= s.need {
		close(s.wake)
		s.wake, s.waited = make(chan struct{}), false
	}
}

// message is one delivery of a record.
type message struct {
	src        *Source
	r          *redisstore.StreamRecord // in its read's array, never changed
	once       sync.Once
	prev, next *message // in src.out while handed out and not settled, under src.mu
}

// Key is the record's key field, else the stream's name and the record's id.
func (m *message) Key() string {
	if m.r.Key != "" {
		return m.r.Key
	}
	return m.src.cfg.Stream + "/" + m.r.ID
}

func (m *message) Data() []byte      { return m.r.Data }
func (m *message) Tenant() string    { return m.r.Tenant }
func (m *message) Partition() string { return m.r.Partition }
func (m *message) Deliveries() int   { return m.r.Deliveries }

// done frees the record's window slot, once, whatever the outcome of the
// settlement: a record whose acknowledgement failed is still pending in
// Redis and is claimed again after AckWait.
func (m *message) done() { m.once.Do(func() { m.src.settled(m) }) }

// Ack acknowledges the record (XACK).
func (m *message) Ack(ctx context.Context) error {
	defer m.done()
	return m.src.cons.Ack(ctx, m.r.ID)
}

// AckAsync is Ack, with the acknowledgements of the records handed out
// sent together in one script call (see acks; drain.AsyncAcker): done is
// told, with the others of the group (drain.ConfirmAll), once theirs has
// returned.
func (m *message) AckAsync(ctx context.Context, done drain.Confirm) {
	m.src.acks.ack(ctx, m, done)
}

// ackGather bounds how long an acknowledgement waits for those of the
// other records handed out before it is sent.
const ackGather = time.Millisecond

// acks groups acknowledgements: those asked for go together in one
// script call, sent by a goroutine of their own (one at a time) as soon
// as every record handed out and not settled has asked, or ackGather
// after the first of them was asked for, whichever comes first. So a
// read's records are acknowledged with one round trip when they are
// worked on together, and a record's acknowledgement waits at most
// ackGather for the others.
type acks struct {
	src *Source

	mu      sync.Mutex
	sending bool          // the goroutine runs
	full    chan struct{} // closed when every record out has asked, if waited on
	next    []ackAsked
	spare   []ackAsked // the last group's array, emptied, for next
}

type ackAsked struct {
	m    *message
	done drain.Confirm
}

// ack acknowledges m, frees its window slot and tells done the outcome.
func (a *acks) ack(ctx context.Context, m *message, done drain.Confirm) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next = append(a.next, ackAsked{m, done})
	switch {
	case !a.sending:
		a.sending = true
		go a.send(ctx)
	case a.full != nil && a.ready():
		close(a.full)
		a.full = nil
	}
}

// ready reports whether every record handed out and not settled has
// asked for its acknowledgement; a.mu is held.
func (a *acks) ready() bool {
	a.src.mu.Lock()
	out := a.src.held - len(a.src.buf)
	a.src.mu.Unlock()
	return len(a.next) >= out
}

// send sends the acknowledgements asked for, in groups, until none is
// left.
func (a *acks) send(ctx context.Context) {
	var ids []string
	var dones []drain.Confirm
	var gather *time.Timer
	a.mu.Lock()
	for len(a.next) > 0 {
		if !a.ready() {
			full := make(chan struct{})
			a.full = full
			a.mu.Unlock()
			if gather == nil {
				gather = time.NewTimer(ackGather)
			} else {
				gather.Reset(ackGather)
			}
			select {
			case <-full:
				gather.Stop()
			case <-gather.C:
			}
			a.mu.Lock()
			a.full = nil
		}
		group := a.next
		a.next, a.spare = a.spare, nil
		a.mu.Unlock()
		ids, dones = ids[:0], dones[:0]
		for _, g := range group {
			ids = append(ids, g.m.r.ID)
			dones = append(dones, g.done)
		}
		err := a.src.cons.Ack(ctx, ids...)
		a.src.settledAll(group)
		drain.ConfirmAll(dones, err)
		clear(group)
		clear(dones)
		a.mu.Lock()
		a.spare = group[:0]
	}
	a.sending = false
	a.mu.Unlock()
}

// Nak puts the record back to be claimed once delay has passed (see the
// package doc, "Delays").
func (m *message) Nak(ctx context.Context, delay time.Duration) error {
	defer m.done()
	return m.src.cons.Release(ctx, m.r.ID, delay)
}

// InProgress resets the record's idle time, so that no consumer claims it
// for another AckWait.
func (m *message) InProgress(ctx context.Context) error {
	return m.src.cons.Extend(ctx, m.r.ID)
}

// DeadLetter moves the record, with its key and reason, to the stream's
// dead-letter stream and acknowledges it, atomically, if this Source's
// consumer still holds it (else redisstore.ErrNotHeld).
func (m *message) DeadLetter(ctx context.Context, reason error) error {
	why := "dead-lettered"
	if reason != nil {
		why = reason.Error()
	}
	_, err := m.src.cons.DeadLetter(ctx, m.r.ID, m.Key(), why)
	if err == nil {
		m.done()
	}
	return err
}

// A Record is a message as published.
type Record struct {
	// Key is the message's idempotency key (drain.Message.Key); "" for
	// none, in which case the key is the stream and the record's id, and
	// the record is not deduplicated.
	Key string
	// Tenant and Partition are the message's (drain.Message.Tenant and
	// Partition); "" for none.
	Tenant, Partition string
	// Data is the message's body.
	Data []byte
}

// PublishOptions configure a Publisher.
type PublishOptions struct {
	// Stream and Prefix name the stream, as Options do; Stream is
	// required.
	Stream, Prefix string
	// Dedupe is the window within which a second record of the same key
	// is dropped: DefaultDedupe when 0.
	Dedupe time.Duration
}

// A Publisher adds records to a stream. Make one with NewPublisher.
type Publisher struct {
	stream *redisstore.Stream
	dedupe time.Duration
}

// NewPublisher returns a Publisher of o on c, which the caller owns and
// closes. It does not contact Redis.
func NewPublisher(c redisstore.Client, o PublishOptions) (*Publisher, error) {
	if o.Stream == "" {
		return nil, errors.New("redisdrain: PublishOptions.Stream is empty")
	}
	if o.Dedupe < 0 {
		return nil, fmt.Errorf("redisdrain: PublishOptions.Dedupe is negative (%v)", o.Dedupe)
	}
	if o.Dedupe == 0 {
		o.Dedupe = DefaultDedupe
	}
	st, err := redisstore.NewStream(c, o.Stream, redisstore.StreamOptions{Prefix: o.Prefix})
	if err != nil {
		return nil, fmt.Errorf("redisdrain: %w", err)
	}
	return &Publisher{stream: st, dedupe: o.Dedupe}, nil
}

// Publish adds r to the stream, with its key, tenant, partition and data
// as the record's fields, once: a record of the same key published within
// the dedupe window of the first is dropped, and Publish returns added
// false. Once Publish returns nil, the record is in Redis (as durable as
// the server's persistence makes it).
func (p *Publisher) Publish(ctx context.Context, r Record) (added bool, err error) {
	_, added, err = p.stream.Add(ctx, redisstore.StreamRecord{Key: r.Key, Tenant: r.Tenant, Partition: r.Partition, Data: r.Data}, p.dedupe)
	if err != nil {
		return false, fmt.Errorf("redisdrain: %w", err)
	}
	return added, nil
}

// Publish adds r to the stream named stream, under the default prefix and
// dedupe window, as a Publisher does.
func Publish(ctx context.Context, c redisstore.Client, stream string, r Record) (added bool, err error) {
	p, err := NewPublisher(c, PublishOptions{Stream: stream})
	if err != nil {
		return false, err
	}
	return p.Publish(ctx, r)
}
