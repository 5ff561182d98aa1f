package drain

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
)

// A Source is a durable queue the Drainer takes messages from.
type Source interface {
	// Next returns the next message, blocking until there is one or ctx
	// is done. Its error, other than ctx's, is logged and Next is called
	// again after a short wait.
	Next(ctx context.Context) (Message, error)
	// Backlog returns the number of messages not yet acknowledged: those
	// waiting to be delivered and those delivered and not acknowledged.
	Backlog(ctx context.Context) (int64, error)
	// Window is the most messages the Source delivers without their
	// being acknowledged (or put back); the Drainer holds no more than
	// that many of this Source's at once.
	Window() int
}

// An AsyncAcker is a Message whose acknowledgement is confirmed later
// than it is sent (a queue that confirms acknowledgements in groups).
// AckAsync acknowledges the message as Ack does, without waiting for the
// confirmation: it tells done, once, what Ack would have returned, when
// the queue has confirmed the acknowledgement or failed to (done may be
// told on another goroutine, or before AckAsync returns). The Drainer uses
// it instead of Ack, so that a worker goes on to its next message
// meanwhile rather than wait, and be woken, for each confirmation; the
// message is still the Drainer's (held, counted in flight, settled as
// Ack's would be) until done is told. A Source that confirms many
// acknowledgements at once tells their Confirms together, with
// ConfirmAll.
type AsyncAcker interface {
	AckAsync(ctx context.Context, done Confirm)
}

// A Confirm is told the outcome of one asynchronous acknowledgement
// (AsyncAcker), once.
type Confirm interface {
	Confirmed(err error)
}

// A ConfirmFunc is a function as a Confirm.
type ConfirmFunc func(err error)

// Confirmed calls f(err).
func (f ConfirmFunc) Confirmed(err error) { f(err) }

// ConfirmAll tells each of cs err, as cs[i].Confirmed(err) does: those of
// one Drainer in one step (one lock for the group, not one a message).
func ConfirmAll(cs []Confirm, err error) {
	var group []*hold
	var d *Drainer
	flush := func() {
		if len(group) > 0 {
			d.confirmedAll(group, err)
		}
		group, d = group[:0], nil
	}
	for _, c := range cs {
		h, ok := c.(*hold)
		if !ok {
			c.Confirmed(err)
			continue
		}
		if d != h.d {
			flush()
			d = h.d
		}
		if group == nil {
			group = make([]*hold, 0, len(cs))
		}
		group = append(group, h)
	}
	flush()
}

// An AckWaiter is a Source that reports its queue's ack wait: how long a
// message delivered and neither acknowledged nor told InProgress is kept
// before the queue delivers it again. The Drainer then tells every
// message it holds InProgress well within that time (see
// Options.ProgressEvery), and holds no more of the Source's messages than
// its Limiter lets it send in half of it (see the package doc, "What a
// drainer holds").
type AckWaiter interface {
	AckWait() time.Duration
}

// A BatchSource is a Source that takes messages from its queue in
// batches, so that it may hold messages already delivered by the queue
// (their ack wait running) that Next has not yet returned. NextUpTo is
// Next, told that the Drainer has room for n messages now (n >= 1): a
// batch it takes from the queue is of n messages at most, so none waits
// in the Source for room in the Drainer.
type BatchSource interface {
	Source
	NextUpTo(ctx context.Context, n int) (Message, error)
}

// A MultiSource is a Source that may have several messages at hand at
// once (a queue read in bulk). NextMany is Next for up to len(ms)
// messages (len(ms) >= 1, the Drainer's room): it waits for the first as
// Next does, puts it and those at hand then in ms, without waiting for
// more, and returns how many it put there. The Drainer then takes them
// in one step (one lock, one wake-up) rather than one by one. One that is
// also a BatchSource takes len(ms) messages at most from its queue in
// the call, as NextUpTo does n.
type MultiSource interface {
	Source
	NextMany(ctx context.Context, ms []Message) (int, error)
}

// A Message is one delivery of a queued message. Its methods other than
// the accessors talk to the queue and may fail; they are called by the
// Drainer, never by a Sink.
type Message interface {
	// Key is the message's idempotency key, the same on every delivery.
	Key() string
	// Data is the message's body.
	Data() []byte
	// Tenant is whose work the message is ("" for nobody's in
	// particular); tenants of one priority take turns.
	Tenant() string
	// Partition is the part of the downstream the message goes to (a
	// database's partition key, a queue's partition; "" for none), the
	// same on every delivery: a throttled answer can pause that part
	// alone.
	Partition() string
	// Deliveries is how many times the message has been delivered,
	// this time included.
	Deliveries() int
	// Ack acknowledges the message: done, never delivered again.
	Ack(ctx context.Context) error
	// Nak puts the message back, to be delivered again after delay.
	Nak(ctx context.Context, delay time.Duration) error
	// InProgress tells the queue that the message is still held (waiting
	// in the Drainer or in a Sink call), so that it is not delivered
	// again meanwhile. The Drainer never calls it after, or during, the
	// message's Ack, Nak or DeadLetter.
	InProgress(ctx context.Context) error
	// DeadLetter sends the message, with reason, to the Source's
	// dead-letter destination and then removes it from the queue.
	DeadLetter(ctx context.Context, reason error) error
}

// A Sink does the work of one message: it returns nil on success, a
// throttling error (see Throttle) when the downstream asked it to slow
// down, or any other error on failure. It is called concurrently, with a
// context bounded by Options.Timeout that Run's cancellation does not
// cancel (work in flight finishes), and must not call m's queue methods.
type Sink func(ctx context.Context, m Message) error

// A Limiter paces the Drainer: WaitN blocks until n messages may be
// released. *ratelimit.Limiter, *lease.Limiter and *ratelimit.StoreLimiter
// satisfy it.
type Limiter interface {
	WaitN(ctx context.Context, n int) error
}

// A ThrottledError is what a Sink returns when the downstream refused
// the work for now and asked to be called again later; it is not a
// failure of the message.
type ThrottledError struct {
	// After is the wait the downstream asked for; 0 when it did not say.
	After time.Duration
	// Err is the downstream's answer.
	Err error
}

func (e *ThrottledError) Error() string {
	if e.After > 0 {
		return fmt.Sprintf("drain: throttled, retry after %v: %v", e.After, e.Err)
	}
	return fmt.Sprintf("drain: throttled: %v", e.Err)
}

func (e *ThrottledError) Unwrap() error { return e.Err }

// Throttle returns the *ThrottledError of an answer err that asked for a
// pause of after (0 when it did not say).
func Throttle(after time.Duration, err error) error {
	return &ThrottledError{After: max(0, after), Err: err}
}

// An Input is a Source with the priority of its messages.
type Input struct {
	Source   Source
	Priority priority.Priority
}

// Defaults of Options.
const (
	DefaultWorkers         = 64
	DefaultMaxFailures     = 5
	DefaultBaseBackoff     = time.Second
	DefaultMaxBackoff      = time.Minute
	DefaultMaxPause        = time.Minute
	DefaultPause           = time.Second
	DefaultTimeout         = 30 * time.Second
	DefaultProgressEvery   = 10 * time.Second
	DefaultStarvationLimit = 16
	DefaultStatsEvery      = time.Second
)

// A PauseScope is what one throttled answer of the Sink pauses.
type PauseScope int

const (
	// PauseAll pauses every message: the Sink's limit is one for all
	// (a database's quota, a service's rate limit per client).
	PauseAll PauseScope = iota
	// PausePartition pauses the messages of the throttled message's
	// partition (Message.Partition; those with none are one partition):
	// the downstream limits each partition on its own.
	PausePartition
	// PauseTenant pauses the messages of the throttled message's tenant
	// (Message.Tenant; those with none are one tenant).
	PauseTenant
)

// String returns "all", "partition" or "tenant".
func (s PauseScope) String() string {
	switch s {
	case PauseAll:
		return "all"
	case PausePartition:
		return "partition"
	case PauseTenant:
		return "tenant"
	}
	return fmt.Sprintf("PauseScope(%d)", int(s))
}

// ParsePauseScope returns the PauseScope that String names.
func ParsePauseScope(name string) (PauseScope, error) {
	for _, s := range []PauseScope{PauseAll, PausePartition, PauseTenant} {
		if s.String() == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("drain: unknown pause scope %q: want all, partition or tenant", name)
}

// MaxPauseScopes bounds the scopes paused at once that a Drainer
// remembers: a throttled answer that would pause one more pauses every
// message instead (never fewer).
const MaxPauseScopes = 1024

// Options configure a Drainer. Inputs and Sink are required; a zero
// field takes its default.
type Options struct {
	// Inputs are the Sources to drain, each with a priority; at least
	// one, and no two with the same Source.
	Inputs []Input
	// Sink does the work.
	Sink Sink
	// Limiter paces the release of messages, one unit each; nil means no
	// pacing (as fast as the Workers go). When it reports its rate (a
	// Limit() ratelimit.Limit method, as *ratelimit.Limiter and
	// *lease.Limiter have) and a Source its ack wait (AckWaiter), the
	// Drainer holds no more of that Source's messages than the rate sends
	// in half the ack wait.
	Limiter Limiter
	// OnThrottle is told of each throttled answer of the Sink, with the
	// pause the Drainer takes for it, before the pause begins: a report,
	// for what sets the rate (a lease Holder's ThrottledAfter, say). The
	// pause and the delayed NAK are the Drainer's. Nil means nothing is
	// called.
	OnThrottle func(pause time.Duration)
	// Workers bounds the Sink calls in flight; DefaultWorkers when 0.
	// Without a Limiter, workers are woken only as the Sink needs them:
	// a Sink that returns at once is served by a few, one that takes its
	// time by as many as it keeps busy.
	Workers int
	// MaxFailures is how many failed attempts a message gets before it
	// is dead-lettered; DefaultMaxFailures when 0.
	MaxFailures int
	// BaseBackoff and MaxBackoff bound the delay with which a failed
	// message is put back: before attempt k+1 (k failures), a random
	// time in [d/2, d) with d = min(MaxBackoff, BaseBackoff·2^(k-1)).
	BaseBackoff, MaxBackoff time.Duration
	// MaxPause caps the pause a throttled answer may ask for; DefaultPause
	// is the pause when it asks for none.
	MaxPause, DefaultPause time.Duration
	// PauseScope is what a throttled answer pauses: every message
	// (PauseAll, the zero value), the messages of the throttled one's
	// partition (PausePartition) or of its tenant (PauseTenant).
	PauseScope PauseScope
	// Timeout bounds each Sink call, and each settlement (Ack, Nak,
	// DeadLetter) after it, to within an eighth more: the calls begun
	// within Timeout/16 of each other share one deadline, so that a call
	// makes no timer of its own. DefaultTimeout when 0.
	Timeout time.Duration
	// ProgressEvery is how often every message the Drainer holds (waiting
	// for the Limiter, a pause or a worker, or in a Sink call) is told
	// InProgress, so that the queue does not deliver it again meanwhile:
	// at least once every ProgressEvery after it was taken. It must be
	// below the ack wait of every Source that reports one (AckWaiter);
	// when 0, DefaultProgressEvery, or a third of the shortest such ack
	// wait if that is less.
	ProgressEvery time.Duration
	// StarvationLimit is how many times in a row a priority with messages
	// waiting may be passed over for higher ones; DefaultStarvationLimit
	// when 0.
	StarvationLimit int
	// StatsEvery is how often the Drainer polls the Sources' backlog and
	// updates the rate of Stats; DefaultStatsEvery when 0.
	StatsEvery time.Duration
	// Logger receives the Drainer's logs; nil means slog.Default().
	Logger *slog.Logger
}

// check fills c's defaults and validates it; it is the one place that
// does.
func (c Options) check() (Options, error) {
	if len(c.Inputs) == 0 {
		return c, errors.New("drain: Options.Inputs is empty")
	}
	seen := make(map[Source]bool)
	for i, in := range c.Inputs {
		if in.Source == nil {
			return c, fmt.Errorf("drain: Options.Inputs[%d] has no Source", i)
		}
		if seen[in.Source] {
			return c, fmt.Errorf("drain: Options.Inputs[%d] repeats a Source", i)
		}
		seen[in.Source] = true
		if !in.Priority.Valid() {
			return c, fmt.Errorf("drain: Options.Inputs[%d]: invalid %v", i, in.Priority)
		}
		if in.Source.Window() <= 0 {
			return c, fmt.Errorf("drain: Options.Inputs[%d]: Source window %d", i, in.Source.Window())
		}
	}
	if c.Sink == nil {
		return c, errors.New("drain: Options.Sink is nil")
	}
	def := func(v *time.Duration, d time.Duration, name string) error {
		if *v < 0 {
			return fmt.Errorf("drain: Options.%s is negative (%v)", name, *v)
		}
		if *v == 0 {
			*v = d
		}
		return nil
	}
	for _, f := range []struct {
		v    *time.Duration
		d    time.Duration
		name string
	}{
		{&c.BaseBackoff, DefaultBaseBackoff, "BaseBackoff"},
		{&c.MaxBackoff, DefaultMaxBackoff, "MaxBackoff"},
		{&c.MaxPause, DefaultMaxPause, "MaxPause"},
		{&c.DefaultPause, DefaultPause, "DefaultPause"},
		{&c.Timeout, DefaultTimeout, "Timeout"},
		{&c.StatsEvery, DefaultStatsEvery, "StatsEvery"},
	} {
		if err := def(f.v, f.d, f.name); err != nil {
			return c, err
		}
	}
	if c.PauseScope < PauseAll || c.PauseScope > PauseTenant {
		return c, fmt.Errorf("drain: Options.PauseScope is invalid (%d)", int(c.PauseScope))
	}
	if c.ProgressEvery < 0 {
		return c, fmt.Errorf("drain: Options.ProgressEvery is negative (%v)", c.ProgressEvery)
	}
	var ackWait time.Duration // the shortest reported
	for _, in := range c.Inputs {
		if aw, ok := in.Source.(AckWaiter); ok {
			if w := aw.AckWait(); w > 0 && (ackWait == 0 || w < ackWait) {
				ackWait = w
			}
		}
	}
	switch {
	case c.ProgressEvery == 0:
		c.ProgressEvery = DefaultProgressEvery
		if ackWait > 0 {
			c.ProgressEvery = min(c.ProgressEvery, ackWait/3)
		}
	case ackWait > 0 && c.ProgressEvery >= ackWait:
		return c, fmt.Errorf("drain: Options.ProgressEvery %v is not below a Source's ack wait %v", c.ProgressEvery, ackWait)
	}
	if c.ProgressEvery < time.Millisecond {
		return c, fmt.Errorf("drain: Options.ProgressEvery %v is below a millisecond (a Source's ack wait %v)", c.ProgressEvery, ackWait)
	}
	if c.MaxBackoff < c.BaseBackoff {
		return c, fmt.Errorf("drain: Options.MaxBackoff %v is below BaseBackoff %v", c.MaxBackoff, c.BaseBackoff)
	}
	for _, f := range []struct {
		v    *int
		d    int
		name string
	}{
		{&c.Workers, DefaultWorkers, "Workers"},
		{&c.MaxFailures, DefaultMaxFailures, "MaxFailures"},
		{&c.StarvationLimit, DefaultStarvationLimit, "StarvationLimit"},
	} {
		if *f.v < 0 {
			return c, fmt.Errorf("drain: Options.%s is negative (%d)", f.name, *f.v)
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

// maxFailureKeys bounds the failure counts kept: a message that failed
// here and then succeeded elsewhere leaves its count behind, so when the
// bound is reached every count is forgotten.
const maxFailureKeys = 1 << 16

// ackedKeys is how many acknowledged keys a Drainer remembers, the last
// ones, to tell Stats.Duplicates from Stats.Done: a hash of 8 bytes each,
// in a table of twice that many slots and a ring, 768 KiB in all.
const ackedKeys = 1 << 15

// recentKeys is the set of the last ackedKeys key hashes added: a table
// of twice that many slots, open addressing with linear probing (a hash
// is its own place; 0 marks an empty slot, so a hash of 0 is kept as 1),
// and a ring of the hashes in the order added, the oldest forgotten as
// each new one comes. It never grows, and a lookup is one probe or two.
// Its zero value is empty.
type recentKeys struct {
	slots   []uint64
	ring    []uint64 // in the order added, from next on once full
	next    int
	touched uint64 // what touch read, kept so that its reads are made
}

// add reports whether k is in the set, and adds it if it is not.
func (r *recentKeys) add(k uint64) (seen bool) {
	if r.slots == nil {
		r.slots = make([]uint64, 2*ackedKeys)
		r.ring = make([]uint64, 0, ackedKeys)
	}
	k = max(k, 1)
	if _, ok := r.find(k); ok {
		return true
	}
	if len(r.ring) < ackedKeys {
		r.ring = append(r.ring, k)
	} else {
		r.remove(r.ring[r.next])
		r.ring[r.next] = k
		r.next = (r.next + 1) % ackedKeys
	}
	i, _ := r.find(k) // the first empty slot of k's run, since the removal
	r.slots[i] = k
	return false
}

// addAll adds each of ks, as add does in turn, and returns how many were
// in the set.
func (r *recentKeys) addAll(ks []uint64) (seen int) {
	r.touch(ks)
	for _, k := range ks {
		if r.add(k) {
			seen++
		}
	}
	return seen
}

// touch reads the slots where ks and the keys they would push out lie,
// one read after another with nothing waiting on each: the processor
// fetches them from memory together, where add, one key at a time,
// would wait for each in turn (the table is larger than a core's cache,
// and each place in it is a random one).
func (r *recentKeys) touch(ks []uint64) {
	if r.slots == nil {
		return
	}
	mask := uint64(len(r.slots) - 1)
	x := r.touched
	for _, k := range ks {
		x += r.slots[k&mask]
	}
	if len(r.ring) == ackedKeys {
		for i := range min(len(ks), ackedKeys) {
			x += r.slots[r.ring[(r.next+i)%ackedKeys]&mask]
		}
	}
	r.touched = x
}

// find returns the slot of k, or the empty slot ending its run.
func (r *recentKeys) find(k uint64) (int, bool) {
	mask := uint64(len(r.slots) - 1)
	for i := k & mask; ; i = (i + 1) & mask {
		switch r.slots[i] {
		case k:
			return int(i), true
		case 0:
			return int(i), false
		}
	}
}

// remove empties k's slot, moving back the entries after it in its run
// that may fill it, so that no run is cut.
func (r *recentKeys) remove(k uint64) {
	j, ok := r.find(k)
	if !ok {
		return
	}
	mask := len(r.slots) - 1
	for i := (j + 1) & mask; r.slots[i] != 0; i = (i + 1) & mask {
		// The entry at i may move to j unless its place lies in (j, i],
		// cyclically.
		home := int(r.slots[i]) & mask
		if (i > j && (home <= j || home > i)) || (i < j && home <= j && home > i) {
			r.slots[j] = r.slots[i]
			j = i
		}
	}
	r.slots[j] = 0
}

// Stats are a Drainer's figures at one instant. Done, Duplicates,
// DeadLettered and Total count records (queued messages); Throttled,
// Failed and Redelivered count deliveries and Sink calls.
type Stats struct {
	// Done counts the records acknowledged after their Sink succeeded,
	// each key once: an acknowledged message whose key this Drainer had
	// already acknowledged counts in Duplicates instead.
	Done int64
	// Duplicates counts the acknowledged messages whose key this Drainer
	// had acknowledged before (a record queued twice, or delivered again
	// after an acknowledgement the queue lost). It remembers the keys of
	// the last 32,768 records acknowledged, so a repeat older than that
	// counts in Done.
	Duplicates int64
	// Throttled counts the Sink calls answered throttled (the message put
	// back, not counted as a failure); Failed the other failed calls.
	Throttled, Failed int64
	// Pauses counts the throttled answers that began or extended a pause
	// (one that ends no later than its scope's pause in force changes
	// nothing).
	Pauses int64
	// DeadLettered counts the messages sent to a dead-letter destination.
	DeadLettered int64
	// Redelivered counts the messages taken that had been delivered
	// before (put back, or left unacknowledged by a process that died).
	Redelivered int64
	// AckErrors counts acknowledgements (or Naks) the queue did not take;
	// such a message is delivered again.
	AckErrors int64
	// Lapsed counts the messages held past their Source's ack wait
	// without word to the queue (the process stopped, SIGSTOP, a frozen
	// VM) and dropped unsent when a worker came to them: the queue
	// delivers them again, perhaps to another drainer already.
	Lapsed int64
	// InFlight is the number of Sink calls running; Waiting the messages
	// taken from the Sources and not yet released to the Sink, of which
	// Parked are set aside because their scope is paused.
	InFlight, Waiting, Parked int
	// Backlog is the Sources' backlog at the last poll (see
	// Source.Backlog), and BacklogAt the time of that poll.
	Backlog   int64
	BacklogAt time.Time
	// Total is the records this Drainer has known of: those it had
	// settled (Done, Duplicates, DeadLettered) when it last polled the
	// backlog, plus that backlog. It grows as records are queued and
	// never decreases; 0 before the first poll. A message the queue
	// delivers again after losing its acknowledgement (a server that
	// restarted) is in the backlog again, so it counts twice: once in
	// Done, once in Duplicates.
	Total int64
	// Rate is the recent rate of Done, per second (smoothed over a few
	// StatsEvery).
	Rate float64
	// ETA is the estimated time to finish the Backlog at Rate; 0 when
	// either is unknown or zero.
	ETA time.Duration
	// Started is when Run began.
	Started time.Time
}

// Drainer drains the Inputs of its Options into its Sink; see the package doc.
// Make one with New.
type Drainer struct {
	cfg    Options
	rater  rater        // cfg.Limiter's rate, if it tells it
	pauses retry.Pauses // by scope (see scopeOf); allScope pauses every message
	// pausedTo is the latest end of a pause begun (Unix nanoseconds):
	// before it, pauses must be looked up; after it, none holds.
	pausedTo atomic.Int64
	// tickAt is when the heartbeat last ticked (nanoseconds since epoch,
	// Run's start, on the monotonic clock), a message's beat when it is
	// taken: earlier than the instant, so that it is told InProgress a
	// tick early rather than late, and with no reading of the clock for
	// each message.
	tickAt atomic.Int64
	epoch  time.Time // set by Run before its goroutines start
	// ackWait is each Input's ack wait (AckWaiter), 0 when its Source
	// reports none: a message of it held that long without word to the
	// queue has lapsed (see hold).
	ackWait []time.Duration
	seed    maphash.Seed

	// gate is held (a value in it), when there is a Limiter, by the one
	// worker choosing the next message to send (waiting for one, for the
	// Limiter's grant or for a pause to end); the others wait their turn
	// for it. Without a Limiter there is no gate (see nextFree). granted is its: a
	// grant of the Limiter not yet spent (one taken for a message paused
	// meanwhile goes to the next).
	gate    chan struct{}
	granted bool

	mu       sync.Mutex
	wake     chan struct{}   // signalled when a message is queued
	room     []chan struct{} // by Input: signalled when it may take want more
	want     []int           // by Input: the room its fetcher waits for; 0 when it does not
	sched    scheduler
	parked   map[string]*parking // messages set aside, by the scope that pauses them
	parkedAt time.Time           // the earliest until of parked; zero when none
	held     []*hold             // every message taken and not settled, each at its index
	spare    []*hold             // holds forgotten, for the next messages taken (no more than were ever held at once)
	heldN    []int               // of held, by Input
	sinkN    []int               // of held, those released to the Sink, by Input
	limN     []int               // by Input: its waitLimit when its fetcher last looked
	failures map[string]int      // failed attempts by key
	acked    recentKeys
	ackedQ   []uint64     // hashes of keys acknowledged and not yet counted (countAckedLocked)
	inHand   int          // picked by the gate's holder and not yet put back or in flight
	awake    int          // workers not sleeping (sleepLocked)
	sending  atomic.Int32 // workers that took a message in nextFree and are not back for the next
	waking   bool         // a wake-up was sent and not yet taken (wakeLocked)
	stats    Stats
	lastDone int64
	lastAt   time.Time

	backlogWarned time.Time // when poll last logged a failed Backlog; poll's own

	acking sync.WaitGroup // acknowledgements sent through AckAsync and not yet confirmed
}

// rater is a Limiter that tells its rate.
type rater interface{ Limit() ratelimit.Limit }

// allScope is the scope that pauses every message: no partition or tenant
// (header values) holds a NUL.
const allScope = "\x00all"

// parking holds the messages of one paused scope until its pause ends.
type parking struct {
	until time.Time
	items []taken
}

// New returns a Drainer for cfg, or an error naming what in cfg is
// invalid.
func New(cfg Options) (*Drainer, error) {
	cfg, err := cfg.check()
	if err != nil {
		return nil, err
	}
	prios := make([]priority.Priority, len(cfg.Inputs))
	for i, in := range cfg.Inputs {
		prios[i] = in.Priority
	}
	d := &Drainer{
		cfg:      cfg,
		seed:     maphash.MakeSeed(),
		gate:     make(chan struct{}, 1),
		wake:     make(chan struct{}, 1),
		room:     make([]chan struct{}, len(cfg.Inputs)),
		want:     make([]int, len(cfg.Inputs)),
		sched:    newScheduler(prios, cfg.StarvationLimit),
		parked:   make(map[string]*parking),
		heldN:    make([]int, len(cfg.Inputs)),
		sinkN:    make([]int, len(cfg.Inputs)),
		limN:     make([]int, len(cfg.Inputs)),
		failures: make(map[string]int),
		ackWait:  make([]time.Duration, len(cfg.Inputs)),
	}
	for i := range d.room {
		d.room[i] = make(chan struct{}, 1)
	}
	for i, in := range cfg.Inputs {
		if aw, ok := in.Source.(AckWaiter); ok {
			d.ackWait[i] = max(0, aw.AckWait())
		}
	}
	d.rater, _ = cfg.Limiter.(rater)
	return d, nil
}

// Stats returns the Drainer's figures now.
func (d *Drainer) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.countAckedLocked()
	s := d.stats
	s.Parked = 0
	for _, p := range d.parked {
		s.Parked += len(p.items)
	}
	s.Waiting = d.sched.len() + s.Parked + d.inHand
	if s.Rate > 0 && s.Backlog > 0 {
		s.ETA = time.Duration(float64(s.Backlog) / s.Rate * float64(time.Second))
	}
	return s
}

// hold is a message the Drainer holds, from Next until it is settled;
// then a spare, for a message taken later (see newHoldLocked).
type hold struct {
	d     *Drainer
	msg   Message
	input int
	scope string // what a throttled answer to it pauses
	// inSink is set, under the Drainer's mu, when it is released to the
	// Sink; index is its place in the Drainer's held.
	inSink bool
	index  int

	mu      sync.Mutex // serialises InProgress and the settlement
	settled bool
	beat    time.Time // when last told InProgress, or the heartbeat's tick before it was taken
	// lapsed is set when the heartbeat found the message's ack wait
	// passed since beat (the process stopped, a heartbeat starved): the
	// queue may have handed it to another drainer, so it is no longer
	// told InProgress, nor sent (see Drainer.work).
	lapsed bool
}

// lapsedLocked reports whether h's message has lapsed: its Input's ack
// wait has passed since it was last told InProgress (or taken), by the
// monotonic clock. h.mu is held.
func (d *Drainer) lapsedLocked(h *hold, now time.Time) bool {
	if !h.lapsed {
		w := d.ackWait[h.input]
		h.lapsed = w > 0 && now.Sub(h.beat) >= w
	}
	return h.lapsed
}

// taken is a message in the scheduler or set aside.
type taken struct{ *hold }

// Run drains until ctx is done, then shuts down as the package doc
// says and returns nil. A Drainer runs once: a second Run returns an
// error at once.
func (d *Drainer) Run(ctx context.Context) error {
	d.mu.Lock()
	if !d.stats.Started.IsZero() {
		d.mu.Unlock()
		return errors.New("drain: Run called twice")
	}
	d.stats.Started = time.Now()
	d.epoch = d.stats.Started
	d.tickAt.Store(0)
	d.mu.Unlock()

	var fetchers, workers, beater sync.WaitGroup
	for i := range d.cfg.Inputs {
		fetchers.Go(func() { d.fetch(ctx, i) })
	}
	fetchers.Go(func() { d.poll(ctx) })
	// Held messages are told InProgress until the last is settled, after
	// Run's ctx is done too (work in flight finishes).
	stopBeat := make(chan struct{})
	beater.Go(func() { d.heartbeat(context.WithoutCancel(ctx), stopBeat) })

	// Work in flight finishes: the calls' contexts end at their deadline,
	// or once the last is done.
	calls := newDeadlines(context.WithoutCancel(ctx), d.cfg.Timeout)
	d.mu.Lock()
	d.awake = d.cfg.Workers
	d.mu.Unlock()
	for range d.cfg.Workers {
		workers.Go(func() {
			var h, done *hold // done: acknowledged, to be forgotten with the next take
			for {
				h = d.next(ctx, done, h != nil)
				if h == nil {
					return
				}
				done = d.work(calls, h)
			}
		})
	}
	workers.Wait()
	d.acking.Wait() // acknowledgements being confirmed (AsyncAcker)
	calls.stop()
	fetchers.Wait()
	// Hand back what was taken and never released.
	d.mu.Lock()
	left := d.sched.drainAll()
	for s, p := range d.parked {
		left = append(left, p.items...)
		delete(d.parked, s)
	}
	d.parkedAt = time.Time{}
	d.mu.Unlock()
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.Timeout)
	defer cancel()
	for _, t := range left {
		m := t.msg
		if err := d.settle(t.hold, func() error { return m.Nak(hctx, 0) }); err != nil {
			d.count(func(s *Stats) { s.AckErrors++ })
			d.cfg.Logger.Warn("drain: handing back a message at shutdown", "key", m.Key(), "err", err)
		}
	}
	close(stopBeat)
	beater.Wait()
	st := d.Stats()
	d.cfg.Logger.Info("drain: stopped", "done", st.Done, "duplicates", st.Duplicates, "handed_back", len(left))
	return nil
}

func (d *Drainer) count(f func(*Stats)) {
	d.mu.Lock()
	f(&d.stats)
	d.mu.Unlock()
}

// scopeOf is the pause scope of m.
func (d *Drainer) scopeOf(m Message) string {
	switch d.cfg.PauseScope {
	case PausePartition:
		return m.Partition()
	case PauseTenant:
		return m.Tenant()
	}
	return allScope
}

// waitLimit is how many messages of Input i may wait in the Drainer (for
// the Limiter, a pause or a worker) when its ack wait and the Limiter's
// rate are known: what the rate sends in half the ack wait, at least one;
// else its window.
func (d *Drainer) waitLimit(i int) int {
	n := d.cfg.Inputs[i].Source.Window()
	aw, ok := d.cfg.Inputs[i].Source.(AckWaiter)
	if !ok || d.rater == nil {
		return n
	}
	r, w := float64(d.rater.Limit()), aw.AckWait()
	if w <= 0 || r >= float64(ratelimit.Inf) || math.IsNaN(r) {
		return n
	}
	if r <= 0 {
		return 1
	}
	return int(min(float64(n), max(1, math.Ceil(r*w.Seconds()/2))))
}

// fetch takes messages from Input i while it holds fewer than its window
// and fewer wait than its waitLimit, until ctx is done. Once it has taken
// all it may, it waits until it may take a quarter of that again (or one,
// if less), so that it takes messages in batches rather than one by one
// as each is settled. What a BatchSource may still hold of the room it
// was told of (owed) is taken whatever the room now (the Limiter's rate
// may have fallen meanwhile): a message held there is told InProgress by
// nobody.
func (d *Drainer) fetch(ctx context.Context, i int) {
	src := d.cfg.Inputs[i].Source
	bs, _ := src.(BatchSource)
	ms, _ := src.(MultiSource)
	recheck := time.NewTimer(0) // the limit follows the Limiter's rate
	defer recheck.Stop()
	owed := 0
	var got []Message   // taken by one call, at most the window
	var scopes []string // got's
	for {
		lim := d.waitLimit(i)
		d.mu.Lock()
		d.limN[i] = lim
		room := d.roomLocked(i)
		wait := room <= 0 && owed <= 0
		if wait {
			d.want[i] = max(1, min(src.Window(), lim)/4)
		}
		d.mu.Unlock()
		if wait {
			recheck.Reset(d.cfg.StatsEvery)
			select {
			case <-d.room[i]:
			case <-recheck.C:
			case <-ctx.Done():
				return
			}
			continue
		}
		var m Message
		var err error
		k := 1
		switch {
		case ms != nil:
			n := max(room, 1)
			if cap(got) < n {
				got = make([]Message, n)
			}
			k, err = ms.NextMany(ctx, got[:n])
			if err == nil && bs != nil {
				owed = max(owed, n) - k
			}
		case bs != nil:
			n := max(room, 1)
			m, err = bs.NextUpTo(ctx, n)
			if err == nil {
				owed = max(owed, n) - 1
			}
		default:
			m, err = src.Next(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.cfg.Logger.Warn("drain: taking a message", "priority", d.cfg.Inputs[i].Priority, "err", err)
			if retry.Sleep(ctx, 100*time.Millisecond) != nil {
				return
			}
			continue
		}
		if ms == nil {
			got = append(got[:0], m)
		}
		scopes = scopes[:0]
		for _, m := range got[:k] {
			scopes = append(scopes, d.scopeOf(m))
		}
		beat := d.epoch.Add(time.Duration(d.tickAt.Load()))
		d.mu.Lock()
		for j, m := range got[:k] {
			if m.Deliveries() > 1 {
				d.stats.Redelivered++
			}
			h := d.newHoldLocked(m, i, beat)
			h.scope, h.inSink = scopes[j], false
			h.index = len(d.held)
			d.held = append(d.held, h)
			d.heldN[i]++
			d.sched.push(i, m.Tenant(), taken{h})
		}
		wake := d.wakeLocked()
		d.mu.Unlock()
		clear(got[:k])
		if wake {
			signal(d.wake)
		}
	}
}

// wakeLocked reports whether a worker is to be woken for the messages
// queued, and notes the wake-up if so: not when one is on its way, nor,
// without a Limiter, while a worker awake is not sending (it takes them;
// see nextFree). d.mu is held.
func (d *Drainer) wakeLocked() bool {
	if d.waking || d.cfg.Limiter == nil && d.awake > int(d.sending.Load()) {
		return false
	}
	d.waking = true
	return true
}

// newHoldLocked returns a hold of m, of Input i, beaten at beat: a spare
// one if there is one, else a new one. d.mu is held. A spare one may
// still be in a heartbeat's sweep, which reads msg, input, beat, settled
// and lapsed under its mu: they are set under it (and the sweep may then
// tell m InProgress, which m, held, may be told at any time).
func (d *Drainer) newHoldLocked(m Message, i int, beat time.Time) *hold {
	n := len(d.spare)
	if n == 0 {
		return &hold{d: d, msg: m, input: i, beat: beat}
	}
	h := d.spare[n-1]
	d.spare[n-1] = nil
	d.spare = d.spare[:n-1]
	h.mu.Lock()
	h.msg, h.input, h.beat, h.settled, h.lapsed = m, i, beat, false, false
	h.mu.Unlock()
	return h
}

// roomLocked is how many more messages Input i may take now: fewer than
// its window held, fewer than its waitLimit waiting. d.mu is held.
func (d *Drainer) roomLocked(i int) int {
	return min(d.cfg.Inputs[i].Source.Window()-d.heldN[i], d.limN[i]-(d.heldN[i]-d.sinkN[i]))
}

// roomMadeLocked wakes Input i's fetcher if it waits and may now take
// what it waits for: a message of it was settled or released to the
// Sink. d.mu is held.
func (d *Drainer) roomMadeLocked(i int) {
	if d.want[i] > 0 && d.roomLocked(i) >= d.want[i] {
		d.want[i] = 0
		signal(d.room[i])
	}
}

// signal wakes the one waiting on c, a channel of capacity one, or the
// next to wait on it.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// settle runs f, which puts back or dead-letters h's message (see
// settleBy), and lets the Drainer forget h.
func (d *Drainer) settle(h *hold, f func() error) error {
	return d.forget(h, false, settleBy(h, f))
}

// settleBy marks h settled and runs f, which acknowledges, puts back or
// dead-letters its message, unless the heartbeat is telling it
// InProgress (then after); it returns f's error. The Drainer still holds
// h: forget lets it go.
func settleBy(h *hold, f func() error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.settled = true
	return f()
}

// settleAsync acknowledges h's message through AckAsync and returns
// without waiting for the confirmation: settle's work is done when the
// confirmation comes (h.Confirmed, or ConfirmAll), and Run waits for it
// (d.acking). h.mu is held from here until then, as settle holds it
// through Ack: the heartbeat leaves the message alone meanwhile.
func (d *Drainer) settleAsync(ctx context.Context, h *hold, m AsyncAcker) {
	h.mu.Lock()
	h.settled = true
	d.acking.Add(1)
	m.AckAsync(ctx, h)
}

// Confirmed is told the outcome of h's acknowledgement through AckAsync
// (Confirm).
func (h *hold) Confirmed(err error) { h.d.confirmedAll([]*hold{h}, err) }

// confirmedAll does settle's work for hs, acknowledged through AckAsync
// with the outcome err, in one step.
func (d *Drainer) confirmedAll(hs []*hold, err error) {
	var failed []Message // hs are spares once forgotten
	if err != nil {
		failed = make([]Message, len(hs))
	}
	for i, h := range hs {
		if err != nil {
			failed[i] = h.msg
		}
		h.mu.Unlock()
	}
	d.forgetAll(hs, true, err)
	for _, m := range failed {
		d.settleFailed(m, err)
	}
	d.acking.Add(-len(hs))
}

// settleFailed counts and logs a settlement the queue did not take.
func (d *Drainer) settleFailed(m Message, err error) {
	d.count(func(s *Stats) { s.AckErrors++ })
	d.cfg.Logger.Warn("drain: settling a message; it will be delivered again", "key", m.Key(), "err", err)
}

// forget lets the Drainer forget h, settled with err (by an
// acknowledgement when ack), and counts it: acknowledged without error,
// in Done, or in Duplicates if this Drainer acknowledged its key before,
// its failed attempts forgotten. It returns err. h is then a spare, for a
// message taken later: its caller no longer reads it.
func (d *Drainer) forget(h *hold, ack bool, err error) error {
	d.forgetAll([]*hold{h}, ack, err)
	return err
}

// forgetAll is forget for each of hs, under one lock.
func (d *Drainer) forgetAll(hs []*hold, ack bool, err error) {
	ack = ack && err == nil
	var small [1]uint64 // one message's, without an allocation
	ks := small[:0]
	if ack {
		if len(hs) > len(small) {
			ks = make([]uint64, 0, len(hs))
		}
		for _, h := range hs {
			ks = append(ks, d.keyHash(h.msg.Key()))
		}
	}
	d.mu.Lock()
	d.forgetLocked(hs, ks, ack)
	d.mu.Unlock()
}

// forgetLocked is forgetAll's step under d.mu, with ks the keys' hashes
// when ack.
func (d *Drainer) forgetLocked(hs []*hold, ks []uint64, ack bool) {
	for _, h := range hs {
		last := d.held[len(d.held)-1]
		d.held[h.index], last.index = last, h.index
		d.held[len(d.held)-1] = nil
		d.held = d.held[:len(d.held)-1]
		d.heldN[h.input]--
		if h.inSink {
			d.sinkN[h.input]--
			d.stats.InFlight--
		}
		if ack && len(d.failures) > 0 {
			delete(d.failures, h.msg.Key()) // it succeeded
		}
	}
	if ack {
		d.ackedQ = append(d.ackedQ, ks...)
		if len(d.ackedQ) >= ackedBatch {
			d.countAckedLocked()
		}
	}
	for _, h := range hs {
		d.roomMadeLocked(h.input)
	}
	d.spare = append(d.spare, hs...)
}

// ackedBatch is how many acknowledged keys are counted at once (see
// recentKeys.touch).
const ackedBatch = 64

// countAckedLocked counts the keys acknowledged since it last ran, in
// Stats.Done or Stats.Duplicates; d.mu is held. It runs once ackedBatch
// of them wait, and before the counts are read.
func (d *Drainer) countAckedLocked() {
	dups := d.acked.addAll(d.ackedQ)
	d.stats.Duplicates += int64(dups)
	d.stats.Done += int64(len(d.ackedQ) - dups)
	d.ackedQ = d.ackedQ[:0]
}

// heartbeat tells every held message InProgress at least every
// ProgressEvery, until stop is closed.
func (d *Drainer) heartbeat(ctx context.Context, stop <-chan struct{}) {
	half := d.cfg.ProgressEvery / 2
	tk := time.NewTicker(half)
	defer tk.Stop()
	type beaten struct {
		h    *hold
		beat time.Time
	}
	var hs []beaten
	for {
		select {
		case <-tk.C:
		case <-stop:
			return
		}
		d.tickAt.Store(int64(time.Since(d.epoch)))
		// A hold's beat is written by the last sweep's goroutines (done)
		// and, for a message taken, under d.mu: read here under d.mu,
		// since a hold in the list may be a spare taken again during
		// the sweep.
		d.mu.Lock()
		for _, h := range d.held {
			hs = append(hs, beaten{h, h.beat})
		}
		d.mu.Unlock()
		if len(hs) == 0 {
			continue
		}
		// The oldest word first, from a few goroutines at once, so that
		// a sweep of many messages over a slow queue keeps each within
		// its ack wait.
		slices.SortFunc(hs, func(a, b beaten) int { return a.beat.Compare(b.beat) })
		next := make(chan *hold)
		var sweep sync.WaitGroup
		for range min(len(hs), heartbeatCalls) {
			sweep.Go(func() {
				for h := range next {
					d.beat(ctx, h, half)
				}
			})
		}
		for _, b := range hs {
			next <- b.h
		}
		close(next)
		sweep.Wait()
		clear(hs) // let settled messages go
		hs = hs[:0]
	}
}

// heartbeatCalls bounds the InProgress calls a heartbeat makes at once.
const heartbeatCalls = 16

// beat tells h's message InProgress if it is due: half a period old (a
// message taken just after a tick is told at the second tick after,
// ProgressEvery later). One being settled (its lock held: a
// dead-lettering may take a while) is skipped rather than waited for, so
// that it cannot hold up the others' word.
func (d *Drainer) beat(ctx context.Context, h *hold, half time.Duration) {
	if !h.mu.TryLock() {
		return
	}
	defer h.mu.Unlock()
	if now := time.Now(); !h.settled && !d.lapsedLocked(h, now) && now.Sub(h.beat) >= half {
		h.beat = now
		pctx, cancel := context.WithTimeout(ctx, half)
		err := h.msg.InProgress(pctx)
		cancel()
		if err != nil {
			d.cfg.Logger.Warn("drain: in progress", "key", h.msg.Key(), "err", err)
		}
	}
}

// pick returns the next message that may be sent now, setting aside
// those whose scope is paused, and otherwise the earliest instant a
// pause of a message set aside ends (zero if none is). d.mu is held.
func (d *Drainer) pick() (t taken, ok bool, next time.Time) {
	if d.parkedAt.IsZero() && d.pausedTo.Load() == 0 {
		// Never paused: no clock to read.
		t, ok = d.sched.pop()
		return t, ok, time.Time{}
	}
	now := time.Now()
	if to := d.pausedTo.Load(); d.parkedAt.IsZero() && now.UnixNano() >= to {
		// Every pause is over and nothing is set aside: back to the
		// fast path (unless a pause begins meanwhile).
		d.pausedTo.CompareAndSwap(to, 0)
	}
	clock := func() time.Time { return now }
	if !d.parkedAt.IsZero() && !now.Before(d.parkedAt) {
		d.parkedAt = time.Time{}
		for s, p := range d.parked {
			if p.until.After(now) {
				d.parkedAt = earliest(d.parkedAt, p.until)
				continue
			}
			if left := d.pauses.Left(s, clock); left > 0 {
				p.until = now.Add(left) // extended meanwhile
				d.parkedAt = earliest(d.parkedAt, p.until)
				continue
			}
			// Back in turn, at the end of their tenants' queues: as many
			// as the Drainer holds at most, so none waits long.
			for _, t := range p.items {
				d.sched.push(t.input, t.msg.Tenant(), t)
			}
			delete(d.parked, s)
		}
	}
	pausing := now.UnixNano() < d.pausedTo.Load()
	for {
		t, ok = d.sched.pop()
		if !ok {
			break
		}
		if !pausing {
			return t, true, time.Time{}
		}
		block := allScope
		left := d.pauses.Left(allScope, clock)
		if left <= 0 && t.scope != allScope {
			block, left = t.scope, d.pauses.Left(t.scope, clock)
		}
		if left <= 0 {
			return t, true, time.Time{}
		}
		p := d.parked[block]
		if p == nil {
			p = &parking{until: now.Add(left)}
			d.parked[block] = p
			d.parkedAt = earliest(d.parkedAt, p.until)
		}
		p.items = append(p.items, t)
	}
	return taken{}, false, d.parkedAt
}

// earliest returns the earlier of a and b, a zero one being none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// next returns the next message a worker may send, once the Limiter
// grants it and no pause holds it back, or nil when ctx is done. One
// worker at a time chooses (it holds the gate), so that at most one
// message is in hand while the Limiter is waited for, and that one is
// the highest in the scheduler's order; the others wait for the gate. A
// grant is spent only on a message that may be sent: one taken for a
// message whose scope was paused meanwhile goes to the next.
func (d *Drainer) next(ctx context.Context, done *hold, sent bool) *hold {
	if d.cfg.Limiter == nil {
		return d.nextFree(ctx, done, sent)
	}
	if done != nil {
		d.forgetAll([]*hold{done}, true, nil)
	}
	select {
	case d.gate <- struct{}{}:
	default: // another worker chooses: wait for it
		select {
		case d.gate <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
	}
	defer func() { <-d.gate }()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for ctx.Err() == nil {
		d.mu.Lock()
		t, ok, next := d.pick()
		granted := d.granted || d.cfg.Limiter == nil
		if ok && granted {
			d.sendLocked(t)
			d.mu.Unlock()
			d.granted = false
			return t.hold
		}
		if !ok {
			d.sleepLocked(ctx, &timer, next)
			d.mu.Unlock()
			continue
		}
		d.inHand = 1 // until it is put back or sent
		d.mu.Unlock()
		if err := d.cfg.Limiter.WaitN(ctx, 1); err != nil {
			d.putBack(t)
			if ctx.Err() != nil {
				break
			}
			d.cfg.Logger.Warn("drain: limiter", "err", err)
			if retry.Sleep(ctx, 100*time.Millisecond) != nil {
				break
			}
			continue
		}
		d.granted = true
		if d.paused(t.scope) {
			// Paused while waiting for the grant: the grant goes to
			// another message, t is set aside.
			d.putBack(t)
			continue
		}
		d.mu.Lock()
		d.sendLocked(t)
		d.mu.Unlock()
		d.granted = false
		return t.hold
	}
	return nil
}

// nextFree is next without a Limiter: nothing is waited for between
// the pick and the release, so a worker takes the next message itself,
// under d.mu, without the gate (no hand-over from one worker to another
// while messages wait). sent says the worker is back from sending the
// message it took last. One that finds none waits for a message to be
// queued, or for the first pause of one set aside to end.
//
// Workers are woken as the Sink needs them: one that takes a message
// while more wait wakes another only if every worker awake is sending
// and no wake-up is on its way (wakeLocked), and one back from the Sink
// while two others are awake and not sending waits, leaving the
// messages to them (a worker counts as back once its Sink call and
// settlement are done, before it waits for d.mu). So a Sink that returns at once is
// served by the few workers that keep it busy (each worker woken is a
// hand-over between threads), and one that takes its time by as many as
// it keeps busy, up to Workers.
func (d *Drainer) nextFree(ctx context.Context, done *hold, sent bool) *hold {
	var k [1]uint64
	if done != nil {
		k[0] = d.keyHash(done.msg.Key())
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	if sent {
		// Back before the lock is had: a worker waiting for it will
		// take what waits, and is not woken for it.
		d.sending.Add(-1)
	}
	d.mu.Lock()
	for ctx.Err() == nil {
		if done != nil {
			d.forgetLocked([]*hold{done}, k[:], true)
			done = nil
		}
		if d.sched.len() > 0 && d.awake-int(d.sending.Load())-1 >= 2 {
			// Two others awake take what waits.
			d.sleepLocked(ctx, &timer, time.Time{})
			continue
		}
		t, ok, next := d.pick()
		if ok {
			d.sendLocked(t)
			d.sending.Add(1)
			wake := d.sched.len() > 0 && d.wakeLocked()
			d.mu.Unlock()
			if wake {
				signal(d.wake)
			}
			return t.hold
		}
		d.sleepLocked(ctx, &timer, next)
	}
	d.mu.Unlock()
	if done != nil {
		d.forgetAll([]*hold{done}, true, nil)
	}
	return nil
}

// sleepLocked waits, d.mu released meanwhile, for a wake-up, for next
// (none when zero) on *timer (made on first use; its caller stops it),
// or for ctx's end. The worker counts as not awake meanwhile, and a
// wake-up it takes is no longer on its way. d.mu is held.
func (d *Drainer) sleepLocked(ctx context.Context, timer **time.Timer, next time.Time) {
	var tc <-chan time.Time
	if !next.IsZero() {
		if *timer == nil {
			*timer = time.NewTimer(time.Until(next))
		} else {
			(*timer).Reset(time.Until(next))
		}
		tc = (*timer).C
	}
	d.awake--
	d.mu.Unlock()
	woken := false
	select {
	case <-d.wake:
		woken = true
	case <-tc:
	case <-ctx.Done():
	}
	d.mu.Lock()
	d.awake++
	if woken {
		d.waking = false
	}
}

// sendLocked counts t, picked, as released to the Sink. d.mu is held.
func (d *Drainer) sendLocked(t taken) {
	d.inHand = 0
	d.stats.InFlight++
	t.inSink = true
	d.sinkN[t.input]++
	d.roomMadeLocked(t.input)
}

// pausesUntil notes that a pause may hold until until.
func (d *Drainer) pausesUntil(until time.Time) {
	for {
		to := d.pausedTo.Load()
		if until.UnixNano() <= to || d.pausedTo.CompareAndSwap(to, until.UnixNano()) {
			return
		}
	}
}

// paused reports whether a message of scope may not be sent now.
func (d *Drainer) paused(scope string) bool {
	if time.Now().UnixNano() >= d.pausedTo.Load() {
		return false // no pause holds
	}
	return d.pauses.Left(allScope, time.Now) > 0 || (scope != allScope && d.pauses.Left(scope, time.Now) > 0)
}

// putBack returns t, picked and not sent, to the scheduler.
func (d *Drainer) putBack(t taken) {
	d.mu.Lock()
	d.inHand = 0
	d.sched.push(t.input, t.msg.Tenant(), t)
	d.mu.Unlock()
}

// keyHash is the hash under which an acknowledged key is remembered.
func (d *Drainer) keyHash(key string) uint64 { return maphash.String(d.seed, key) }

// deadlines hands out the contexts of Sink calls and settlements, each
// with a deadline between timeout and timeout·9/8 from when it is asked
// for: a new context every timeout/16, with its deadline timeout·9/8
// later, serves every call begun until the next (so a timer that fires up
// to timeout/16 late still keeps the bound), and no call reads the clock
// or makes a timer of its own. Each ends at its deadline, or at stop. It
// is safe for concurrent use.
type deadlines struct {
	base    context.Context
	end     context.CancelFunc // base's
	timeout time.Duration
	cur     atomic.Pointer[deadline]

	mu      sync.Mutex
	timer   *time.Timer // makes the next
	stopped bool
}

// deadline is one context of deadlines.
type deadline struct {
	ctx    context.Context
	cancel context.CancelFunc // called by its timer at its deadline, or by base's
}

// newDeadlines starts the contexts, children of parent, for timeout.
func newDeadlines(parent context.Context, timeout time.Duration) *deadlines {
	base, end := context.WithCancel(parent)
	c := &deadlines{base: base, end: end, timeout: timeout}
	c.renew()
	return c
}

// renew makes the next context, and arms the timer for the one after.
func (c *deadlines) renew() {
	ctx, cancel := context.WithTimeout(c.base, c.timeout+c.timeout/8)
	c.cur.Store(&deadline{ctx: ctx, cancel: cancel})
	c.mu.Lock()
	if !c.stopped {
		c.timer = time.AfterFunc(c.timeout/16, c.renew)
	}
	c.mu.Unlock()
}

// get returns the context of a call that begins now.
func (c *deadlines) get() context.Context { return c.cur.Load().ctx }

// stop makes no more contexts and ends them all, once no call runs.
func (c *deadlines) stop() {
	c.mu.Lock()
	c.stopped = true
	c.timer.Stop()
	c.mu.Unlock()
	c.end()
}

// work runs the Sink on h's message and settles it. Its heartbeat is the
// Drainer's, as for every message held. A message acknowledged by its
// Ack is returned, for next to forget when it takes the worker's next
// message, under the same lock; work forgets every other itself.
//
// A message that has lapsed (its ack wait passed since the queue was last
// told InProgress, as when the process was stopped: SIGSTOP, a frozen VM)
// is not sent: the queue may have handed it to another drainer already,
// and will hand it on (or back) in any case. It is forgotten without a
// word to the queue, and counted in Lapsed.
func (d *Drainer) work(calls *deadlines, h *hold) (done *hold) {
	m := h.msg
	lapsed := false
	if d.ackWait[h.input] > 0 {
		h.mu.Lock()
		lapsed = d.lapsedLocked(h, time.Now())
		h.mu.Unlock()
	}
	if lapsed {
		_ = d.settle(h, func() error { return nil })
		d.count(func(s *Stats) { s.Lapsed++ })
		d.cfg.Logger.Warn("drain: a message held past its ack wait, left to the queue", "key", m.Key())
		return nil
	}
	err := d.cfg.Sink(calls.get(), m)
	// The settlement has its own time, whatever the Sink took of its own.
	ctx := calls.get()

	var settle error
	var te *ThrottledError
	switch {
	case err == nil:
		if aa, ok := m.(AsyncAcker); ok {
			d.settleAsync(ctx, h, aa)
			return nil
		}
		if settle = settleBy(h, func() error { return m.Ack(ctx) }); settle == nil {
			return h
		}
		d.forget(h, true, settle)
	case throttled(err, &te):
		pause := te.After
		if pause <= 0 {
			pause = d.cfg.DefaultPause
		}
		pause = min(pause, d.cfg.MaxPause)
		if d.cfg.OnThrottle != nil {
			d.cfg.OnThrottle(pause)
		}
		// The one place a throttled answer is acted on: the Sink only
		// classified it, OnThrottle is told.
		scope := h.scope
		if scope != allScope && d.pauses.Len() >= MaxPauseScopes {
			scope = allScope
		}
		now := time.Now()
		until := now.Add(pause)
		d.pausesUntil(until)
		extended := d.pauses.Extend(scope, now, until)
		d.mu.Lock()
		d.stats.Throttled++
		if extended {
			d.stats.Pauses++
		}
		d.mu.Unlock()
		settle = d.settle(h, func() error { return m.Nak(ctx, pause) })
	default:
		d.mu.Lock()
		if len(d.failures) >= maxFailureKeys {
			clear(d.failures) // more attempts, never fewer
		}
		d.failures[m.Key()]++
		n := d.failures[m.Key()]
		d.stats.Failed++
		if n >= d.cfg.MaxFailures {
			delete(d.failures, m.Key())
		}
		d.mu.Unlock()
		if n < d.cfg.MaxFailures {
			settle = d.settle(h, func() error { return m.Nak(ctx, d.backoff(n)) })
			break
		}
		var derr error
		settle = d.settle(h, func() error {
			if derr = m.DeadLetter(ctx, err); derr != nil {
				return m.Nak(ctx, d.cfg.MaxBackoff)
			}
			return nil
		})
		if derr != nil {
			d.cfg.Logger.Error("drain: dead-lettering failed; the message is put back", "key", m.Key(), "err", derr, "last_error", err)
			break
		}
		if settle == nil {
			d.count(func(s *Stats) { s.DeadLettered++ })
			d.cfg.Logger.Warn("drain: dead-lettered", "key", m.Key(), "failures", n, "last_error", err)
		}
	}
	if settle != nil {
		d.settleFailed(m, settle)
	}
	return nil
}

// throttled reports whether err is a *ThrottledError, setting *te to it;
// errors.As on its own would make every call of work allocate te.
func throttled(err error, te **ThrottledError) bool {
	var t *ThrottledError
	if !errors.As(err, &t) {
		return false
	}
	*te = t
	return true
}

// backoff is the delay before the attempt after the n-th failure.
func (d *Drainer) backoff(n int) time.Duration {
	b := d.cfg.BaseBackoff
	for i := 1; i < n && b < d.cfg.MaxBackoff; i++ {
		b *= 2
	}
	b = min(b, d.cfg.MaxBackoff)
	return b/2 + time.Duration(rand.Int64N(int64(b/2)+1))
}

// backlogTimeout bounds one poll of a Source's backlog, when StatsEvery
// is shorter.
const backlogTimeout = time.Second

// rateTau is the time constant, in seconds, of the rate Stats reports.
const rateTau = 2.5

// poll updates the backlog and the rate every StatsEvery until ctx is
// done.
func (d *Drainer) poll(ctx context.Context) {
	tk := time.NewTicker(d.cfg.StatsEvery)
	defer tk.Stop()
	for {
		// What was settled before the backlog is asked for: an
		// acknowledgement the queue took meanwhile is then counted in
		// neither (the next poll has it), never in both.
		d.mu.Lock()
		d.countAckedLocked()
		settled := d.stats.Done + d.stats.Duplicates + d.stats.DeadLettered
		d.mu.Unlock()
		var backlog int64
		ok := true
		for _, in := range d.cfg.Inputs {
			// Its own time, not StatsEvery's: a queue far away takes
			// several round trips to count (Kafka's lag), and a poll
			// that never succeeds would leave the backlog unknown.
			pctx, cancel := context.WithTimeout(ctx, max(d.cfg.StatsEvery, backlogTimeout))
			n, err := in.Source.Backlog(pctx)
			cancel()
			if err != nil {
				ok = false
				if ctx.Err() == nil && time.Since(d.backlogWarned) >= time.Minute {
					d.backlogWarned = time.Now()
					d.cfg.Logger.Warn("drain: reading the backlog", "err", err)
				}
				break
			}
			backlog += n
		}
		now := time.Now()
		d.mu.Lock()
		d.countAckedLocked()
		if ok {
			d.stats.Backlog, d.stats.BacklogAt = backlog, now
			d.stats.Total = max(d.stats.Total, settled+backlog)
		}
		if !d.lastAt.IsZero() {
			if dt := now.Sub(d.lastAt).Seconds(); dt > 0 {
				r := float64(d.stats.Done-d.lastDone) / dt
				if d.stats.Rate == 0 {
					d.stats.Rate = r
				} else {
					// An average over about rateTau, whatever StatsEvery.
					d.stats.Rate += (r - d.stats.Rate) * (1 - math.Exp(-dt/rateTau))
				}
			}
		}
		d.lastDone, d.lastAt = d.stats.Done, now
		d.mu.Unlock()
		select {
		case <-tk.C:
		case <-ctx.Done():
			return
		}
	}
}
