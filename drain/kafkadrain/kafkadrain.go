package kafkadrain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Header fields of the records a Source dead-letters, besides those of the
// original record (its drain.IdempotencyKeyHeader, drain.HeaderTenant and
// drain.HeaderPartition, which Publish sets).
const (
	// HeaderError, on a dead-lettered record, is the last error (its
	// first 1024 bytes).
	HeaderError = "Sluice-Error"
	// HeaderKey, on a dead-lettered record, is the original's
	// drain.Message.Key; HeaderOrigin its "topic/partition/offset".
	HeaderKey    = "Sluice-Key"
	HeaderOrigin = "Sluice-Origin"
)

// Defaults of Options.
const (
	DefaultWindow         = 256
	DefaultSessionTimeout = 45 * time.Second
	DefaultRevokeWait     = 10 * time.Second
	DefaultCommitEvery    = time.Second
	// DefaultUncommittedPerWindow is how many Windows of records
	// Options.MaxUncommitted is when 0.
	DefaultUncommittedPerWindow = 16
)

// Options configure a Source. Brokers, Topic and Group are required; a
// zero field takes its default.
type Options struct {
	// Brokers are the seed brokers, "host:port".
	Brokers []string
	// Topic is the topic to drain.
	Topic string
	// Group is the consumer group; the Sources of one group share the
	// topic's partitions.
	Group string
	// DeadLetterTopic is the topic dead-lettered records are produced to
	// (the broker's acknowledgement is awaited before the record counts as
	// settled). "" means none: DeadLetter fails, and the Drainer puts the
	// record back instead, so nothing is dropped.
	DeadLetterTopic string
	// Window is the most records delivered and not yet settled (acked,
	// put back or dead-lettered); DefaultWindow when 0.
	Window int
	// MaxUncommitted bounds the records the Source tracks past the
	// committed offsets, settled or not: those delivered, those fetched
	// and waiting, those put back and the settled ones behind a record
	// that is not. When it is reached the Source fetches no more until
	// the commit point moves on. At least Window;
	// DefaultUncommittedPerWindow·Window when 0.
	MaxUncommitted int
	// Ordered keeps the order of each Kafka partition: at most one record
	// of a partition is delivered and not settled at a time, and a record
	// put back holds its partition until it is delivered again.
	Ordered bool
	// SessionTimeout is the group session's timeout: how long the group
	// waits for a member that went silent (a crashed process) before its
	// partitions go to another, so the Kafka counterpart of an ack wait.
	// It must lie within the brokers' group.min.session.timeout.ms and
	// group.max.session.timeout.ms. DefaultSessionTimeout when 0.
	SessionTimeout time.Duration
	// RevokeWait bounds how long a rebalance that takes partitions away
	// waits for their delivered records to be settled before it commits
	// what is settled and lets them go; DefaultRevokeWait when 0. The
	// group's rebalance timeout is set to leave room for it.
	RevokeWait time.Duration
	// CommitEvery is how often settled offsets are committed, besides
	// when partitions are revoked and at Close; DefaultCommitEvery when 0.
	CommitEvery time.Duration
	// ClientOptions are added to the franz-go client's (TLS, SASL, a
	// dialer); those that the Source sets (group, topic, commits,
	// callbacks) must not be overridden.
	ClientOptions []kgo.Opt
	// Logger receives the Source's logs; nil means slog.Default().
	Logger *slog.Logger
}

// check fills c's defaults and validates it; it is the one place that
// does.
func (c Options) check() (Options, error) {
	if len(c.Brokers) == 0 || c.Topic == "" || c.Group == "" {
		return c, errors.New("kafkadrain: Options needs Brokers, Topic and Group")
	}
	if c.DeadLetterTopic == c.Topic {
		return c, fmt.Errorf("kafkadrain: Options.DeadLetterTopic is the drained topic %q", c.Topic)
	}
	if c.Window < 0 || c.MaxUncommitted < 0 {
		return c, fmt.Errorf("kafkadrain: Options: negative Window (%d) or MaxUncommitted (%d)", c.Window, c.MaxUncommitted)
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MaxUncommitted == 0 {
		c.MaxUncommitted = DefaultUncommittedPerWindow * c.Window
	}
	if c.MaxUncommitted < c.Window {
		return c, fmt.Errorf("kafkadrain: Options.MaxUncommitted %d is below Window %d", c.MaxUncommitted, c.Window)
	}
	for _, f := range []struct {
		v    *time.Duration
		d    time.Duration
		name string
	}{
		{&c.SessionTimeout, DefaultSessionTimeout, "SessionTimeout"},
		{&c.RevokeWait, DefaultRevokeWait, "RevokeWait"},
		{&c.CommitEvery, DefaultCommitEvery, "CommitEvery"},
	} {
		if *f.v < 0 {
			return c, fmt.Errorf("kafkadrain: Options.%s is negative (%v)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.d
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// ErrClosed is what a Source's methods return once it is closed.
var ErrClosed = errors.New("kafkadrain: source closed")

// errRevoked is what settling a record of a partition taken away returns.
var errRevoked = errors.New("kafkadrain: the record's partition was revoked; its new owner gets it again")

var _ drain.MultiSource = (*Source)(nil)

// Source is a drain.Source on a Kafka consumer group member that commits
// only past records that were settled; see the package doc. Make one
// with New; stop it with Close.
type Source struct {
	cfg    Options
	cl     *kgo.Client
	adm    *kadm.Client
	ctx    context.Context // the poll and commit loops'
	born   time.Time       // when made: put-back records are due at a time since
	cancel context.CancelFunc
	loops  sync.WaitGroup

	mu        sync.Mutex
	wake      chan struct{} // closed and replaced on a change, if watched
	watched   bool          // wake was taken by one who waits on it
	parts     map[int32]*part
	order     []*part // parts, for turns
	turn      int
	tracked   int   // records in the parts' recs
	inflight  int   // delivered and not settled, revoked ones included
	fetchErr  error // the last fetch error, for Next to report once
	closed    bool
	abandoned bool // closed without committing, as a crash
}

// part is the Source's state of one partition it owns.
type part struct {
	src       *Source
	id        int32
	recs      []*rec // fetched past the commit point, by offset; settled ones leave from the front
	array     []*rec // recs' array, from its start: the space of those that left is used again
	fresh     int    // the last records of recs, fetched and never delivered
	naked     []*rec // put back, by offset
	inflight  int
	settled   int   // settled records in recs
	next      int64 // the offset after the last record fetched; -1 before one
	lastEpoch int32
	committed int64 // the last commit point the broker took; -1 before one
	gone      bool  // revoked or lost: its records settle nothing
}

// point returns the offset to commit: that of the first record not
// settled, else the one after the last fetched (-1 before any).
func (p *part) point() kgo.EpochOffset {
	if len(p.recs) > 0 {
		r := p.recs[0].first.r
		return kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
	}
	return kgo.EpochOffset{Epoch: p.lastEpoch, Offset: p.next}
}

// rec is one record fetched: 80 bytes with its first delivery, in an
// array with the others of its fetch (see add).
type rec struct {
	p          *part
	due        time.Duration // when put back: not before, since the Source's birth
	deliveries int32
	out        bool // delivered and not settled
	settled    bool
	// first is the message of its first delivery, allocated with it
	// (no allocation per record for the records delivered once). Its r
	// is the record's from the start.
	first message
}

// New starts a member of cfg's group and returns a Source on it. The
// member joins the group and fetches in the background; Next waits for
// its first records.
func New(cfg Options) (*Source, error) {
	cfg, err := cfg.check()
	if err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg, born: time.Now(), wake: make(chan struct{}), parts: make(map[int32]*part)}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}
	opts = append(opts, cfg.ClientOptions...)
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, cfg.SessionTimeout/3)),
		kgo.RebalanceTimeout(max(60*time.Second, 2*cfg.RevokeWait)),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafkadrain: %w", err)
	}
	s.cl = cl
	s.adm = kadm.NewClient(cl)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.loops.Go(s.poll)
	s.loops.Go(s.commitLoop)
	return s, nil
}

// Window is Options.Window.
func (s *Source) Window() int { return s.cfg.Window }

// notify wakes whoever waits on a change; s.mu is held.
func (s *Source) notify() {
	if s.watched {
		close(s.wake)
		s.wake, s.watched = make(chan struct{}), false
	}
}

// waitOn returns the channel that the next change closes; s.mu is held.
func (s *Source) waitOn() <-chan struct{} {
	s.watched = true
	return s.wake
}

// poll fetches records while fewer than MaxUncommitted are tracked,
// until the Source closes.
func (s *Source) poll() {
	for {
		s.mu.Lock()
		for s.tracked >= s.cfg.MaxUncommitted && !s.closed {
			wake := s.waitOn()
			s.mu.Unlock()
			select {
			case <-wake:
			case <-s.ctx.Done():
			}
			s.mu.Lock()
		}
		room := s.cfg.MaxUncommitted - s.tracked
		s.mu.Unlock()
		if s.ctx.Err() != nil {
			return
		}
		fs := s.cl.PollRecords(s.ctx, room)
		// The client holds rebalances from the poll until
		// AllowRebalance: the records are tracked before a revocation
		// of their partition can run.
		if fs.IsClientClosed() || s.ctx.Err() != nil {
			s.cl.AllowRebalance()
			return
		}
		s.mu.Lock()
		fs.EachError(func(topic string, p int32, err error) {
			s.fetchErr = fmt.Errorf("kafkadrain: fetching %s/%d: %w", topic, p, err)
		})
		fs.EachPartition(func(ft kgo.FetchTopicPartition) {
			if ft.Topic == s.cfg.Topic && len(ft.Records) > 0 {
				s.add(ft.Partition, ft.Records)
			}
		})
		s.notify()
		s.mu.Unlock()
		s.cl.AllowRebalance()
	}
}

// add tracks the records rs fetched from partition id, by offset; s.mu
// is held. Their tracking is one array (one allocation per fetch, not
// per record), kept in memory while one of them is tracked or held by
// the Drainer: since a partition's tracked records are a run of offsets,
// little more than MaxUncommitted records' worth.
func (s *Source) add(id int32, rs []*kgo.Record) {
	p := s.parts[id]
	if p == nil {
		p = &part{src: s, id: id, next: -1, committed: -1}
		s.parts[id] = p
		s.order = append(s.order, p)
	}
	xs := make([]rec, len(rs))
	for i, r := range rs {
		if p.next >= 0 && r.Offset < p.next {
			continue // fetched before: never tracked twice
		}
		x := &xs[i]
		x.p, x.first.r = p, r
		if len(p.recs) == cap(p.recs) {
			// To the front of the array, or of a new one twice as large.
			if 2*len(p.recs) > len(p.array) {
				p.array = make([]*rec, 2*len(p.recs)+16)
			}
			n := copy(p.array, p.recs)
			clear(p.array[n:])
			p.recs = p.array[:n]
		}
		p.recs = append(p.recs, x)
		p.fresh++
		p.next, p.lastEpoch = r.Offset+1, r.LeaderEpoch
		s.tracked++
	}
}

// Next returns the next record: a put-back one whose delay has passed,
// else one fetched, each partition in turn; it waits while Window records
// are delivered and not settled.
func (s *Source) Next(ctx context.Context) (drain.Message, error) {
	var ms [1]drain.Message
	if _, err := s.NextMany(ctx, ms[:]); err != nil {
		return nil, err
	}
	return ms[0], nil
}

// NextMany is Next for up to len(ms) records: it waits for the first as
// Next does, and puts in ms those it may deliver then
// (drain.MultiSource).
func (s *Source) NextMany(ctx context.Context, ms []drain.Message) (int, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, ErrClosed
		}
		if err := s.fetchErr; err != nil {
			s.fetchErr = nil
			s.mu.Unlock()
			return 0, err
		}
		var soonest time.Time
		n := 0
		for n < len(ms) && s.inflight < s.cfg.Window {
			var m *message
			m, soonest = s.pick()
			if m == nil {
				break
			}
			ms[n] = m
			n++
		}
		if n > 0 {
			s.mu.Unlock()
			copyHeaders(ms[:n])
			return n, nil
		}
		wake := s.waitOn()
		s.mu.Unlock()
		var due <-chan time.Time
		var t *time.Timer
		if !soonest.IsZero() {
			t = time.NewTimer(time.Until(soonest))
			due = t.C
		}
		select {
		case <-wake:
		case <-due:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
}

// pick delivers a record that may go now, if any, else returns when the
// first put-back one may; s.mu is held. It reads the clock only when a
// record was put back.
func (s *Source) pick() (*message, time.Time) {
	var soonest, now time.Duration // since s.born; 0: not read, none
	n := len(s.order)
	for i := range n {
		p := s.order[(s.turn+i)%n]
		if s.cfg.Ordered && p.inflight > 0 {
			continue
		}
		for j, x := range p.naked {
			if now == 0 {
				now = max(1, time.Since(s.born))
			}
			if x.due <= now {
				p.naked = slices.Delete(p.naked, j, j+1)
				s.turn = (s.turn + i + 1) % n
				return s.deliver(x), time.Time{}
			}
			if soonest == 0 || x.due < soonest {
				soonest = x.due
			}
			if s.cfg.Ordered {
				break
			}
		}
		if s.cfg.Ordered && len(p.naked) > 0 {
			continue // the put-back record goes first
		}
		if p.fresh > 0 {
			x := p.recs[len(p.recs)-p.fresh]
			p.fresh--
			s.turn = (s.turn + i + 1) % n
			return s.deliver(x), time.Time{}
		}
	}
	if soonest == 0 {
		return nil, time.Time{}
	}
	return nil, s.born.Add(soonest)
}

// deliver hands x out, its key and tenant to be copied (copyHeaders);
// s.mu is held.
func (s *Source) deliver(x *rec) *message {
	x.deliveries++
	x.out = true
	x.p.inflight++
	s.inflight++
	r := x.first.r
	m := &x.first
	if x.deliveries > 1 {
		m = new(message)
	}
	*m = message{x: x, r: r, deliveries: int(x.deliveries)}
	return m
}

// settle ends x's delivery: done (acked or dead-lettered) or put back
// with delay. It returns errRevoked when x's partition was taken away,
// ErrClosed when the Source is closed.
func (s *Source) settle(x *rec, done bool, delay time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !x.out {
		return errors.New("kafkadrain: record settled twice")
	}
	x.out = false
	x.p.inflight--
	s.inflight--
	s.notify()
	switch {
	case x.p.gone:
		return errRevoked
	case s.closed:
		return ErrClosed
	case !done:
		x.due = time.Since(s.born) + delay
		i, _ := slices.BinarySearchFunc(x.p.naked, x.first.r.Offset, func(y *rec, o int64) int {
			return compare(y.first.r.Offset, o)
		})
		x.p.naked = slices.Insert(x.p.naked, i, x)
		return nil
	}
	p := x.p
	x.settled = true
	p.settled++
	for len(p.recs) > 0 && p.recs[0].settled {
		p.recs[0] = nil
		p.recs = p.recs[1:]
		p.settled--
		s.tracked--
	}
	return nil
}

func compare(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// commitLoop commits every CommitEvery until the Source closes.
func (s *Source) commitLoop() {
	tk := time.NewTicker(s.cfg.CommitEvery)
	defer tk.Stop()
	for {
		select {
		case <-tk.C:
		case <-s.ctx.Done():
			return
		}
		if err := s.commit(s.ctx, nil); err != nil && s.ctx.Err() == nil {
			s.cfg.Logger.Warn("kafkadrain: committing", "group", s.cfg.Group, "err", err)
		}
	}
}

// commit commits the commit points of the partitions in ps that moved
// on, or of every partition owned when ps is nil.
func (s *Source) commit(ctx context.Context, ps []*part) error {
	s.mu.Lock()
	if ps == nil {
		ps = slices.Clone(s.order)
	}
	offsets := make(map[int32]kgo.EpochOffset)
	for _, p := range ps {
		if pt := p.point(); pt.Offset > p.committed {
			offsets[p.id] = pt
		}
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}
	var err error
	s.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{s.cfg.Topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, cerr error) {
			if cerr != nil {
				err = cerr
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, t := range resp.Topics {
				for _, rp := range t.Partitions {
					if e := kerr.ErrorForCode(rp.ErrorCode); e != nil {
						err = e
						continue
					}
					if p := s.parts[rp.Partition]; p != nil && t.Topic == s.cfg.Topic {
						p.committed = max(p.committed, offsets[rp.Partition].Offset)
					}
				}
			}
		})
	return err
}

// revoked is the group's callback for partitions taken away by a
// rebalance: it waits up to RevokeWait for their delivered records to be
// settled, forgets them (records fetched, put back or still out: the
// new owner fetches them again), and commits what was settled.
func (s *Source) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	ids := revoked[s.cfg.Topic]
	if len(ids) == 0 {
		return
	}
	s.awaitSettled(ctx, ids)
	ps := s.drop(ids)
	s.mu.Lock()
	abandoned := s.abandoned
	s.mu.Unlock()
	if abandoned {
		return
	}
	if err := s.commit(ctx, ps); err != nil {
		s.cfg.Logger.Warn("kafkadrain: committing revoked partitions", "group", s.cfg.Group, "partitions", ids, "err", err)
	}
}

// lost is the group's callback for partitions lost (the member was
// fenced): they are forgotten, and nothing is committed, since the
// group would refuse it.
func (s *Source) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.drop(lost[s.cfg.Topic])
}

// awaitSettled waits until no record of the partitions ids is delivered
// and not settled, for RevokeWait at most.
func (s *Source) awaitSettled(ctx context.Context, ids []int32) {
	deadline := time.Now().Add(s.cfg.RevokeWait)
	t := time.NewTimer(s.cfg.RevokeWait)
	defer t.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closed && ctx.Err() == nil && time.Now().Before(deadline) {
		busy := false
		for _, id := range ids {
			if p := s.parts[id]; p != nil && p.inflight > 0 {
				busy = true
			}
		}
		if !busy {
			return
		}
		wake := s.waitOn()
		s.mu.Unlock()
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
		}
		s.mu.Lock()
	}
}

// drop forgets the partitions ids and returns their states, whose commit
// points stay as they were.
func (s *Source) drop(ids []int32) []*part {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ps []*part
	for _, id := range ids {
		p := s.parts[id]
		if p == nil {
			continue
		}
		p.gone = true
		delete(s.parts, id)
		s.order = slices.DeleteFunc(s.order, func(q *part) bool { return q == p })
		s.tracked -= len(p.recs)
		p.fresh, p.naked = 0, nil
		ps = append(ps, p)
	}
	s.turn = 0
	s.notify()
	return ps
}

// Backlog returns the records not yet settled: for each partition of the
// topic, its end offset less the group's committed offset (the log start
// when none), and for the partitions this Source owns, less the records
// settled past its commit point, not yet committed. Records fetched,
// delivered or put back lie past the commit point, so they are counted.
func (s *Source) Backlog(ctx context.Context) (int64, error) {
	ends, err := s.adm.ListEndOffsets(ctx, s.cfg.Topic)
	if err != nil {
		return 0, err
	}
	starts, err := s.adm.ListStartOffsets(ctx, s.cfg.Topic)
	if err != nil {
		return 0, err
	}
	commits, err := s.adm.FetchOffsets(ctx, s.cfg.Group)
	if err != nil {
		return 0, err
	}
	var n int64
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, end := range ends[s.cfg.Topic] {
		if end.Err != nil {
			return 0, end.Err
		}
		if p := s.parts[id]; p != nil && p.next >= 0 {
			n += max(0, end.Offset-p.point().Offset-int64(p.settled))
			continue
		}
		base := int64(0)
		if st, ok := starts.Lookup(s.cfg.Topic, id); ok && st.Err == nil {
			base = st.Offset
		}
		if c, ok := commits.Lookup(s.cfg.Topic, id); ok && c.Err == nil && c.At >= 0 {
			base = max(base, c.At)
		}
		n += max(0, end.Offset-base)
	}
	return n, nil
}

// Close stops the Source: it fetches and delivers no more, commits what
// is settled, and leaves the group, whose other members get its
// partitions at once. Settling a record after Close fails with
// ErrClosed; such records are delivered again to the partitions' next
// owners. Close with a ctx already done commits nothing and does not
// wait to leave: the group sees the member as crashed and hands its
// partitions on after SessionTimeout.
func (s *Source) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.abandoned = ctx.Err() != nil
	s.notify()
	s.mu.Unlock()
	s.cancel()
	s.loops.Wait()
	var err error
	if ctx.Err() == nil {
		err = s.commit(ctx, nil)
	}
	s.cl.AllowRebalance()
	_ = s.cl.LeaveGroupContext(ctx)
	s.cl.Close()
	return err
}

// message is one delivery of a record, with its key and tenant headers
// copied out once (the Drainer asks for each more than once).
type message struct {
	x           *rec
	r           *kgo.Record
	deliveries  int
	key, tenant string // the headers; "" when absent
}

// src is the Source that delivered m.
func (m *message) src() *Source { return m.x.p.src }

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// keyTenant returns the values of r's key and tenant headers (the first
// of each); nil when absent.
func keyTenant(r *kgo.Record) (key, tenant []byte) {
	for _, h := range r.Headers {
		switch {
		case h.Key == drain.IdempotencyKeyHeader && key == nil:
			key = h.Value
		case h.Key == drain.HeaderTenant && tenant == nil:
			tenant = h.Value
		}
	}
	return key, tenant
}

// copyHeaders sets the key and tenant of ms, just delivered, to their
// records' headers, copied into one string for them all: one allocation
// per batch rather than one per message, the string kept while one of
// them is. Each record's headers are read once (a batch of DefaultWindow
// needs no allocation for it).
func copyHeaders(ms []drain.Message) {
	var small [DefaultWindow][2][]byte
	kts := small[:0]
	if len(ms) > len(small) {
		kts = make([][2][]byte, 0, len(ms))
	}
	size := 0
	for _, m := range ms {
		k, t := keyTenant(m.(*message).r)
		kts = append(kts, [2][]byte{k, t})
		size += len(k) + len(t)
	}
	var b strings.Builder
	b.Grow(size)
	for _, kt := range kts {
		b.Write(kt[0])
		b.Write(kt[1])
	}
	all := b.String()
	for i, m := range ms {
		m := m.(*message)
		m.key, all = all[:len(kts[i][0])], all[len(kts[i][0]):]
		m.tenant, all = all[:len(kts[i][1])], all[len(kts[i][1]):]
	}
}

// Key is the record's drain.IdempotencyKeyHeader header, else
// "topic/partition/offset".
func (m *message) Key() string {
	if m.key != "" {
		return m.key
	}
	return m.r.Topic + "/" + strconv.Itoa(int(m.r.Partition)) + "/" + strconv.FormatInt(m.r.Offset, 10)
}

func (m *message) Data() []byte   { return m.r.Value }
func (m *message) Tenant() string { return m.tenant }

// Partition is the record's drain.HeaderPartition header, else its
// Kafka key, else "topic/partition".
func (m *message) Partition() string {
	if p := header(m.r, drain.HeaderPartition); p != "" {
		return p
	}
	if len(m.r.Key) > 0 {
		return string(m.r.Key)
	}
	return m.r.Topic + "/" + strconv.Itoa(int(m.r.Partition))
}

// Deliveries counts the deliveries of the record by this Source; a record
// that comes to a Source after a crash or a rebalance starts again at 1.
func (m *message) Deliveries() int { return m.deliveries }

// Ack settles the record: its offset is committed once every record
// before it in its partition is settled too.
func (m *message) Ack(ctx context.Context) error { return m.src().settle(m.x, true, 0) }

// Nak keeps the record in the Source, to be delivered again after delay;
// it holds the commit point of its partition meanwhile.
func (m *message) Nak(ctx context.Context, delay time.Duration) error {
	err := m.src().settle(m.x, false, max(0, delay))
	if errors.Is(err, errRevoked) {
		return nil // put back indeed: the partition's new owner has it
	}
	return err
}

// InProgress does nothing: a Kafka group has no deadline per record. The
// member's session (kept alive by its heartbeats) is the deadline, and a
// rebalance waits up to RevokeWait for the record to be settled.
func (m *message) InProgress(ctx context.Context) error { return nil }

// DeadLetter produces a copy of the record, with its Kafka key, value and
// headers and the headers HeaderKey, HeaderOrigin and HeaderError, to the
// dead-letter topic, waits for the brokers' acknowledgement (acks=all),
// and then settles the record. A crash between the two produces the copy
// again when the record is dead-lettered again.
func (m *message) DeadLetter(ctx context.Context, reason error) error {
	topic := m.src().cfg.DeadLetterTopic
	if topic == "" {
		return errors.New("kafkadrain: no dead-letter topic configured")
	}
	m.src().mu.Lock()
	out, gone := m.x.out, m.x.p.gone
	m.src().mu.Unlock()
	if !out {
		return errors.New("kafkadrain: record settled twice")
	}
	if gone {
		// Not dead-lettered here: the new owner gets it, and the
		// Drainer's Nak that follows this error settles it.
		return errRevoked
	}
	why := reason.Error()
	if len(why) > 1024 {
		why = why[:1024]
	}
	dead := &kgo.Record{
		Topic:   topic,
		Key:     m.r.Key,
		Value:   m.r.Value,
		Headers: slices.Clone(m.r.Headers),
	}
	dead.Headers = append(dead.Headers,
		kgo.RecordHeader{Key: HeaderKey, Value: []byte(m.Key())},
		kgo.RecordHeader{Key: HeaderOrigin, Value: []byte(m.r.Topic + "/" + strconv.Itoa(int(m.r.Partition)) + "/" + strconv.FormatInt(m.r.Offset, 10))},
		kgo.RecordHeader{Key: HeaderError, Value: []byte(why)},
	)
	if err := m.src().cl.ProduceSync(ctx, dead).FirstErr(); err != nil {
		return fmt.Errorf("kafkadrain: dead-lettering to %q: %w", topic, err)
	}
	// Dead-lettered: done, even when the partition was taken away
	// meanwhile (its new owner gets the record again; a put-back here
	// would fail as well, and count an error for a record that is safe).
	if err := m.src().settle(m.x, true, 0); err != nil && !errors.Is(err, errRevoked) {
		return err
	}
	return nil
}

// NewProducer returns a franz-go client for Publish: brokers as seeds,
// acks from all in-sync replicas (and idempotent production, franz-go's
// default), with opts added.
func NewProducer(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks())}, opts...)...)
}

// Publish produces data to topic as NewRecord makes it and waits for the
// brokers' acknowledgement: once Publish returns nil, with cl made by
// NewProducer (acks=all), the record is durable.
func Publish(ctx context.Context, cl *kgo.Client, topic, key, tenant, partition string, data []byte) error {
	return cl.ProduceSync(ctx, NewRecord(topic, key, tenant, partition, data)).FirstErr()
}

// NewRecord returns the record Publish produces, for a producer that
// sends many at once (kgo.Client.ProduceSync takes several): data to
// topic with key in the drain.IdempotencyKeyHeader header (so the
// Drainer's Message.Key is key), tenant in drain.HeaderTenant and
// partition in drain.HeaderPartition and as the record's Kafka key (so
// the records of one downstream partition share a Kafka partition, and
// their order). Empty strings are left out.
func NewRecord(topic, key, tenant, partition string, data []byte) *kgo.Record {
	r := &kgo.Record{Topic: topic, Value: data}
	if key != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: drain.IdempotencyKeyHeader, Value: []byte(key)})
	}
	if tenant != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: drain.HeaderTenant, Value: []byte(tenant)})
	}
	if partition != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: drain.HeaderPartition, Value: []byte(partition)})
		r.Key = []byte(partition)
	}
	return r
}
