package jsdrain

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluicehq/sluice/drain"
)

// Header fields of the messages a Source dead-letters (besides those of
// the original message: its Nats-Msg-Id and drain.HeaderTenant, which
// Publish sets).
const (
	// HeaderError, on a dead-lettered message, is the last error.
	HeaderError = "Sluice-Error"
	// HeaderKey, on a dead-lettered message, is the original's key;
	// HeaderSubject its subject and HeaderSequence its stream sequence.
	HeaderKey      = "Sluice-Key"
	HeaderSubject  = "Sluice-Subject"
	HeaderSequence = "Sluice-Sequence"
)

// Defaults of Options.
const (
	DefaultWindow  = 256
	DefaultAckWait = 30 * time.Second
)

// Options configure a Source.
type Options struct {
	// Stream is the stream to drain; required.
	Stream string
	// Consumer is the durable pull consumer's name; required. It is
	// created if missing, and updated to this configuration otherwise.
	Consumer string
	// Subject filters the stream's subjects (one priority's, say); ""
	// means all of them.
	Subject string
	// Window is the consumer's MaxAckPending: the most messages delivered
	// and not yet acknowledged, so the bound on what a drainer holds;
	// DefaultWindow when 0.
	Window int
	// AckWait is how long the server waits for an acknowledgement (or
	// InProgress) before delivering a message again; a drainer that
	// died hands its messages on after it. DefaultAckWait when 0.
	AckWait time.Duration
	// DeadLetter is the subject dead-lettered messages are published to
	// (a stream must capture it; the publication is confirmed before the
	// message is terminated). "" means none: a message that has failed
	// too often is put back again and again, never dropped.
	DeadLetter string
}

var (
	_ drain.BatchSource = (*Source)(nil)
	_ drain.MultiSource = (*Source)(nil)
	_ drain.AckWaiter   = (*Source)(nil)
	_ drain.AsyncAcker  = (*jsMessage)(nil)
)

// Source is a drain.Source on a JetStream durable pull consumer with
// explicit acks and unlimited deliveries (the Drainer, not the server,
// decides when a message has failed too often, since throttling is not
// failure). Make one with New; close it with Stop.
type Source struct {
	js     jetstream.JetStream
	nc     *nats.Conn
	cfg    Options
	cons   jetstream.Consumer
	window int
	next   string // the subject of the consumer's pull requests

	// reading is held (a value in it) by the one take that reads; the
	// pull's state below is its, and Stop's under mu.
	reading chan struct{}
	later   error // met by a take that returned messages, for the next one
	mu      sync.Mutex
	sub     *nats.Subscription // on inbox.*, once subscribed
	msgs    chan *nats.Msg     // sub's
	inbox   string
	pulls   uint64
	cur     string      // the reply subject of the pull in progress; "" when none
	owed    int         // what it may still deliver
	expiry  *time.Timer // fires when the pull in progress should have ended

	acks acks
}

// New creates or updates cfg's consumer on js and returns a Source on it.
func New(ctx context.Context, js jetstream.JetStream, cfg Options) (*Source, error) {
	if cfg.Stream == "" || cfg.Consumer == "" {
		return nil, errors.New("jsdrain: Options needs Stream and Consumer")
	}
	if cfg.Window < 0 || cfg.AckWait < 0 {
		return nil, fmt.Errorf("jsdrain: Options: negative Window (%d) or AckWait (%v)", cfg.Window, cfg.AckWait)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = DefaultAckWait
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		FilterSubject: cfg.Subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: cfg.Window,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("jsdrain: consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	return &Source{js: js, nc: js.Conn(), cfg: cfg, cons: cons, window: cfg.Window,
		next:    apiPrefix(js.Options()) + "CONSUMER.MSG.NEXT." + cfg.Stream + "." + cfg.Consumer,
		reading: make(chan struct{}, 1), expiry: expiry, acks: acks{wait: cfg.AckWait}}, nil
}

// apiPrefix is the prefix of o's JetStream API subjects, as
// jetstream.New, NewWithAPIPrefix and NewWithDomain set it.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "" && !strings.HasSuffix(o.APIPrefix, "."):
		return o.APIPrefix + "."
	case o.APIPrefix != "":
		return o.APIPrefix
	}
	return "$JS.API."
}

// Window is the consumer's MaxAckPending.
func (s *Source) Window() int { return s.window }

// AckWait is the consumer's ack wait: a Drainer tells the messages it
// holds InProgress well within it.
func (s *Source) AckWait() time.Duration { return s.cfg.AckWait }

// Held returns the consumer's messages delivered and not yet
// acknowledged (NumAckPending): before this Source has taken any, those
// a previous drainer holds, or held when it stopped — the server
// delivers these again once the ack wait (AckWait) has passed since
// each was last delivered or told InProgress.
func (s *Source) Held(ctx context.Context) (int64, error) {
	info, err := s.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.NumAckPending), nil
}

// fetchWait bounds each pull on the server. A pull that fills up ends
// before it expires, so a long bound makes expiries rare while there is
// work. A pull the server forgot (a connection lost and made again) is
// given up a second after it should have expired.
const fetchWait = 5 * time.Second

// Next returns the next message of the consumer. It pulls half the
// window at a time, each pull bounded by fetchWait on the server.
func (s *Source) Next(ctx context.Context) (drain.Message, error) {
	return s.NextUpTo(ctx, s.window/2)
}

// NextUpTo is Next, pulling n messages at most (and half the window at
// most): the server starts their ack wait as it delivers them, so a
// Drainer asks for no more than it has room for.
//
// The pulls are the consumer's pull requests, sent one at a time, each
// once the last has ended (all its messages came, or the server said it
// expired), on one subscription that lives as long as the Source: a pull
// costs a request, not a subscription, and a message that arrives after
// its pull was given up is handed out all the same.
func (s *Source) NextUpTo(ctx context.Context, n int) (drain.Message, error) {
	var ms [1]drain.Message
	if _, err := s.take(ctx, ms[:], n); err != nil {
		return nil, err
	}
	return ms[0], nil
}

// NextMany is NextUpTo for len(ms) messages: it pulls len(ms) at most,
// waits for the first and puts in ms those that have come by then
// (drain.MultiSource).
func (s *Source) NextMany(ctx context.Context, ms []drain.Message) (int, error) {
	return s.take(ctx, ms, len(ms))
}

// take pulls n messages at most, waits for one and returns it in ms with
// those that have come by then, len(ms) at most. It sends one pull at
// most, before the first message: the Drainer counts on no more than n
// coming of a call.
func (s *Source) take(ctx context.Context, ms []drain.Message, n int) (int, error) {
	select {
	case s.reading <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-s.reading }()
	if err := s.later; err != nil {
		s.later = nil
		return 0, err
	}
	var msgs chan *nats.Msg
	got := 0
	for got < len(ms) {
		var m *nats.Msg
		if got == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			var err error
			if msgs, err = s.pull(n); err != nil {
				return 0, fmt.Errorf("jsdrain: pulling from %q: %w", s.cfg.Consumer, err)
			}
			select {
			case m = <-msgs:
			case <-s.expiry.C:
				s.ended() // the server forgot it
				continue
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		} else {
			select {
			case m = <-msgs:
			default:
				return got, nil // those that have come
			}
		}
		// A pull's end (a status) comes on its own reply subject, a
		// message on its original subject.
		if status := m.Header.Get("Status"); len(m.Data) == 0 && status != "" {
			if m.Subject != s.current() || status == "100" {
				continue // an earlier pull's end, or a heartbeat
			}
			s.ended()
			if status == "404" || status == "408" {
				if got > 0 {
					return got, nil
				}
				continue // no messages, or expired: pull again
			}
			return s.failed(got, fmt.Errorf("jsdrain: pulling from %q: %s %s", s.cfg.Consumer, status, m.Header.Get("Description")))
		}
		s.delivered()
		md, err := m.Metadata()
		if err != nil {
			// Not a JetStream message: it cannot be acknowledged,
			// so it is not ours to deliver.
			return s.failed(got, fmt.Errorf("jsdrain: message without JetStream metadata: %w", err))
		}
		jm := &jsMessage{src: s, m: m, md: md, tenant: m.Header.Get(drain.HeaderTenant)}
		if jm.key = m.Header.Get(jetstream.MsgIDHeader); jm.key == "" {
			jm.key = md.Stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10)
		}
		ms[got] = jm
		got++
	}
	return got, nil
}

// failed returns err for take, which has got messages in hand: with
// none, at once; else the messages now, and err from the next take.
func (s *Source) failed(got int, err error) (int, error) {
	if got == 0 {
		return 0, err
	}
	s.later = err
	return got, nil
}

// pull subscribes if the Source is not, and sends a pull of n messages at
// most (half the window at most) if none is in progress; it returns the
// subscription's channel. The reader calls it.
func (s *Source) pull(n int) (chan *nats.Msg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sub == nil {
		s.inbox = s.nc.NewInbox()
		// Room for every message the consumer may deliver (its
		// MaxAckPending) and the pulls' ends: a full channel would drop
		// messages (a slow consumer).
		s.msgs = make(chan *nats.Msg, 2*s.window+64)
		sub, err := s.nc.ChanSubscribe(s.inbox+".*", s.msgs)
		if err != nil {
			return nil, err
		}
		s.sub, s.cur = sub, ""
	}
	if s.cur == "" {
		s.pulls++
		cur := s.inbox + "." + strconv.FormatUint(s.pulls, 10)
		owed := max(1, min(n, s.window/2))
		req := fmt.Appendf(nil, `{"batch":%d,"expires":%d}`, owed, fetchWait.Nanoseconds())
		if err := s.nc.PublishRequest(s.next, cur, req); err != nil {
			return nil, err
		}
		s.cur, s.owed = cur, owed
		s.expiry.Reset(fetchWait + time.Second)
	}
	return s.msgs, nil
}

// current is the reply subject of the pull in progress.
func (s *Source) current() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// delivered counts a message against the pull in progress, if any (one
// that came after its own pull was given up, too: the server has one
// pull fewer to fill, and it ends the sooner).
func (s *Source) delivered() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == "" {
		return
	}
	if s.owed--; s.owed <= 0 {
		s.cur = ""
		s.expiry.Stop()
	}
}

// ended ends the pull in progress.
func (s *Source) ended() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = ""
	s.expiry.Stop()
}

// Backlog returns the consumer's pending and acknowledgement-pending
// messages.
func (s *Source) Backlog(ctx context.Context) (int64, error) {
	info, err := s.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.NumPending) + int64(info.NumAckPending), nil
}

// Stop stops consuming. Messages pulled and not handed out are delivered
// again after AckWait.
func (s *Source) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sub != nil {
		_ = s.sub.Unsubscribe()
		s.sub, s.cur = nil, ""
	}
}

// jsMessage is one delivery of a JetStream message.
type jsMessage struct {
	src         *Source
	m           *nats.Msg
	md          *nats.MsgMetadata // parsed once
	key, tenant string
}

// Key is the publisher's Nats-Msg-Id, else stream/sequence.
func (m *jsMessage) Key() string { return m.key }

func (m *jsMessage) Data() []byte   { return m.m.Data }
func (m *jsMessage) Tenant() string { return m.tenant }

func (m *jsMessage) Partition() string { return m.m.Header.Get(drain.HeaderPartition) }
func (m *jsMessage) Deliveries() int   { return int(m.md.NumDelivered) }

// Ack acknowledges the message and waits for the server to confirm it
// (a double ack, shared by the acknowledgements sent together; see
// acks): an acknowledgement lost on the way is an error (the message
// comes again), and once Ack returns the consumer's count of pending
// messages no longer has it, so a Drainer's Stats never count a record
// both done and in the backlog.
func (m *jsMessage) Ack(ctx context.Context) error { return m.src.acks.ack(ctx, m.m) }

// AckAsync is Ack without the wait: done is told once the server has
// confirmed the acknowledgement (or the group's answer failed), so that a
// Drainer's worker goes on meanwhile (drain.AsyncAcker).
func (m *jsMessage) AckAsync(ctx context.Context, done drain.Confirm) {
	m.src.acks.ackAsync(ctx, m.m, done)
}

func (m *jsMessage) Nak(ctx context.Context, delay time.Duration) error {
	if delay <= 0 {
		return m.m.Nak()
	}
	return m.m.NakWithDelay(delay)
}

func (m *jsMessage) InProgress(ctx context.Context) error { return m.m.InProgress() }

// DeadLetter publishes a copy with the reason to the dead-letter subject,
// waits for the stream to confirm it, and terminates the message. The
// copy's Nats-Msg-Id is derived from the key, so a second dead-lettering
// of the same message (after a crash between the two steps) is dropped by
// the stream's duplicate window.
func (m *jsMessage) DeadLetter(ctx context.Context, reason error) error {
	subj := m.src.cfg.DeadLetter
	if subj == "" {
		return errors.New("jsdrain: no dead-letter subject configured")
	}
	out := nats.NewMsg(subj)
	out.Data = m.m.Data
	for k, v := range m.m.Header {
		out.Header[k] = v
	}
	why := reason.Error()
	if len(why) > 1024 {
		why = why[:1024]
	}
	out.Header.Set(HeaderError, why)
	out.Header.Set(HeaderKey, m.Key())
	out.Header.Set(HeaderSubject, m.m.Subject)
	out.Header.Set(HeaderSequence, strconv.FormatUint(m.md.Sequence.Stream, 10))
	out.Header.Set(jetstream.MsgIDHeader, "dead:"+m.Key())
	if _, err := m.src.js.PublishMsg(ctx, out); err != nil {
		return fmt.Errorf("jsdrain: dead-lettering to %q: %w", subj, err)
	}
	return m.m.Respond([]byte("+TERM dead-lettered"))
}

// Publish puts the message NewMsg makes on subject and waits for the
// stream to confirm it: once Publish returns nil, the message is durable.
func Publish(ctx context.Context, js jetstream.JetStream, subject, key, tenant, partition string, data []byte) error {
	_, err := js.PublishMsg(ctx, NewMsg(subject, key, tenant, partition, data))
	return err
}

// NewMsg returns the message Publish publishes, for a publisher that
// sends many at once (jetstream.JetStream.PublishMsgAsync): data on
// subject with key as its Nats-Msg-Id (so the stream drops a second
// publication within its duplicate window, and the Drainer's Message.Key
// is key), tenant in drain.HeaderTenant and partition in
// drain.HeaderPartition. Empty strings are left out.
func NewMsg(subject, key, tenant, partition string, data []byte) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Data = data
	if key != "" {
		msg.Header.Set(jetstream.MsgIDHeader, key)
	}
	if tenant != "" {
		msg.Header.Set(drain.HeaderTenant, tenant)
	}
	if partition != "" {
		msg.Header.Set(drain.HeaderPartition, partition)
	}
	return msg
}
