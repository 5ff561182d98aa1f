package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicehq/sluice/priority"
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
	// InProgress tells the queue that work on the message goes on, so
	// that it is not delivered again meanwhile.
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

// Options configure a Drainer. Inputs and Sink are required; a zero
// field takes its default.
type Options struct {
	// Inputs are the Sources to drain, each with a priority; at least
	// one, and no two with the same Source.
	Inputs []Input
	// Sink does the work.
	Sink Sink
	// Limiter paces the release of messages, one unit each; nil means no
	// pacing (as fast as the Workers go).
	Limiter Limiter
	// OnThrottle is told of each throttled answer of the Sink, with the
	// pause the Drainer takes for it, before the pause begins: a report,
	// for what sets the rate (a lease Holder's ThrottledAfter, say). The
	// pause and the delayed NAK are the Drainer's. Nil means nothing is
	// called.
	OnThrottle func(pause time.Duration)
	// Workers bounds the Sink calls in flight; DefaultWorkers when 0.
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
	// Timeout bounds each Sink call; DefaultTimeout when 0.
	Timeout time.Duration
	// ProgressEvery is how often a Sink call still running tells the
	// Source so (Message.InProgress); keep it well below the Source's ack
	// wait. DefaultProgressEvery when 0.
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
		{&c.ProgressEvery, DefaultProgressEvery, "ProgressEvery"},
		{&c.StatsEvery, DefaultStatsEvery, "StatsEvery"},
	} {
		if err := def(f.v, f.d, f.name); err != nil {
			return c, err
		}
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

// Stats are a Drainer's figures at one instant.
type Stats struct {
	// Done counts the messages acknowledged after their Sink succeeded.
	Done int64
	// Throttled counts the Sink calls answered throttled (the message put
	// back, not counted as a failure); Failed the other failed calls.
	Throttled, Failed int64
	// Pauses counts the throttled answers that began or extended the
	// shared pause (one that ends no later than the pause in force
	// changes nothing).
	Pauses int64
	// DeadLettered counts the messages sent to a dead-letter destination.
	DeadLettered int64
	// Redelivered counts the messages taken that had been delivered
	// before (put back, or left unacknowledged by a process that died).
	Redelivered int64
	// AckErrors counts acknowledgements (or Naks) the queue did not take;
	// such a message is delivered again.
	AckErrors int64
	// InFlight is the number of Sink calls running; Waiting the messages
	// taken from the Sources and not yet released to the Sink.
	InFlight, Waiting int
	// Backlog is the Sources' backlog at the last poll (see
	// Source.Backlog), and BacklogAt the time of that poll.
	Backlog   int64
	BacklogAt time.Time
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
	pauses retry.Pauses // one scope, "": the drainer's shared pause

	mu       sync.Mutex
	wake     chan struct{} // closed and replaced when a message is queued
	sched    scheduler
	failures map[string]int // failed attempts by key
	stats    Stats
	lastDone int64
	lastAt   time.Time
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
	return &Drainer{
		cfg:      cfg,
		wake:     make(chan struct{}),
		sched:    newScheduler(prios, cfg.StarvationLimit),
		failures: make(map[string]int),
	}, nil
}

// Stats returns the Drainer's figures now.
func (d *Drainer) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Waiting = d.sched.len()
	if s.Rate > 0 && s.Backlog > 0 {
		s.ETA = time.Duration(float64(s.Backlog) / s.Rate * float64(time.Second))
	}
	return s
}

// taken is a message the Drainer holds, with the Input it came from.
type taken struct {
	msg   Message
	input int
}

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
	d.mu.Unlock()

	// slots[i] bounds what Input i has delivered and not settled.
	slots := make([]chan struct{}, len(d.cfg.Inputs))
	var fetchers, workers sync.WaitGroup
	for i, in := range d.cfg.Inputs {
		slots[i] = make(chan struct{}, in.Source.Window())
		fetchers.Go(func() { d.fetch(ctx, i, slots[i]) })
	}
	fetchers.Go(func() { d.poll(ctx) })

	jobs := make(chan taken)
	for range d.cfg.Workers {
		workers.Go(func() {
			for t := range jobs {
				d.work(ctx, t)
				d.mu.Lock()
				d.stats.InFlight--
				d.mu.Unlock()
				<-slots[t.input]
			}
		})
	}
	d.release(ctx, jobs)
	close(jobs)

	fetchers.Wait()
	workers.Wait()
	// Hand back what was taken and never released.
	d.mu.Lock()
	left := d.sched.drainAll()
	d.mu.Unlock()
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.Timeout)
	defer cancel()
	for _, t := range left {
		if err := t.msg.Nak(hctx, 0); err != nil {
			d.count(func(s *Stats) { s.AckErrors++ })
			d.cfg.Logger.Warn("drain: handing back a message at shutdown", "key", t.msg.Key(), "err", err)
		}
	}
	d.cfg.Logger.Info("drain: stopped", "done", d.Stats().Done, "handed_back", len(left))
	return nil
}

func (d *Drainer) count(f func(*Stats)) {
	d.mu.Lock()
	f(&d.stats)
	d.mu.Unlock()
}

// fetch takes messages from Input i while it has a free slot, until ctx
// is done.
func (d *Drainer) fetch(ctx context.Context, i int, slots chan struct{}) {
	src := d.cfg.Inputs[i].Source
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		m, err := src.Next(ctx)
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return
			}
			d.cfg.Logger.Warn("drain: taking a message", "priority", d.cfg.Inputs[i].Priority, "err", err)
			if retry.Sleep(ctx, 100*time.Millisecond) != nil {
				return
			}
			continue
		}
		d.mu.Lock()
		if m.Deliveries() > 1 {
			d.stats.Redelivered++
		}
		d.sched.push(i, m.Tenant(), taken{msg: m, input: i})
		close(d.wake)
		d.wake = make(chan struct{})
		d.mu.Unlock()
	}
}

// release hands waiting messages to workers, paced by the Limiter and the
// shared pause, until ctx is done.
func (d *Drainer) release(ctx context.Context, jobs chan<- taken) {
	for {
		// A message to release.
		for {
			d.mu.Lock()
			n, wake := d.sched.len(), d.wake
			d.mu.Unlock()
			if n > 0 {
				break
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
		// No shared pause, then the Limiter's grant, then a worker.
		if left := d.pauses.Left("", time.Now); left > 0 {
			if retry.Sleep(ctx, left) != nil {
				return
			}
			continue
		}
		if d.cfg.Limiter != nil {
			if err := d.cfg.Limiter.WaitN(ctx, 1); err != nil {
				if ctx.Err() != nil {
					return
				}
				d.cfg.Logger.Warn("drain: limiter", "err", err)
				if retry.Sleep(ctx, 100*time.Millisecond) != nil {
					return
				}
				continue
			}
			if d.pauses.Left("", time.Now) > 0 {
				// A pause began while waiting for the grant.
				continue
			}
		}
		d.mu.Lock()
		t, _ := d.sched.pop()
		d.stats.InFlight++
		d.mu.Unlock()
		select {
		case jobs <- t: // waits for an idle worker: at most Workers in flight
		case <-ctx.Done():
			// Not started: it is handed back with the other waiting ones.
			d.mu.Lock()
			d.stats.InFlight--
			d.sched.push(t.input, t.msg.Tenant(), t)
			d.mu.Unlock()
			return
		}
	}
}

// work runs the Sink on t's message and settles it.
func (d *Drainer) work(runCtx context.Context, t taken) {
	m := t.msg
	ctx, cancel := context.WithTimeout(context.WithoutCancel(runCtx), d.cfg.Timeout)
	defer cancel()
	// Long work tells the queue it goes on, every ProgressEvery, from a
	// timer's goroutine that exists only while it fires.
	var pmu sync.Mutex
	var progress *time.Timer
	stopped := false
	progress = time.AfterFunc(d.cfg.ProgressEvery, func() {
		if err := m.InProgress(ctx); err != nil {
			d.cfg.Logger.Warn("drain: in progress", "key", m.Key(), "err", err)
		}
		pmu.Lock()
		if !stopped {
			progress.Reset(d.cfg.ProgressEvery)
		}
		pmu.Unlock()
	})
	err := d.cfg.Sink(ctx, m)
	pmu.Lock()
	stopped = true
	progress.Stop()
	pmu.Unlock()

	var settle error
	var te *ThrottledError
	switch {
	case err == nil:
		settle = m.Ack(ctx)
		d.mu.Lock()
		delete(d.failures, m.Key())
		d.stats.Done++
		d.mu.Unlock()
	case errors.As(err, &te):
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
		now := time.Now()
		extended := d.pauses.Extend("", now, now.Add(pause))
		d.mu.Lock()
		d.stats.Throttled++
		if extended {
			d.stats.Pauses++
		}
		d.mu.Unlock()
		settle = m.Nak(ctx, pause)
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
			settle = m.Nak(ctx, d.backoff(n))
			break
		}
		if derr := m.DeadLetter(ctx, err); derr != nil {
			d.cfg.Logger.Error("drain: dead-lettering failed; the message is put back", "key", m.Key(), "err", derr, "last_error", err)
			settle = m.Nak(ctx, d.cfg.MaxBackoff)
			break
		}
		d.count(func(s *Stats) { s.DeadLettered++ })
		d.cfg.Logger.Warn("drain: dead-lettered", "key", m.Key(), "failures", n, "last_error", err)
	}
	if settle != nil {
		d.count(func(s *Stats) { s.AckErrors++ })
		d.cfg.Logger.Warn("drain: settling a message; it will be delivered again", "key", m.Key(), "err", settle)
	}
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

// rateTau is the time constant, in seconds, of the rate Stats reports.
const rateTau = 2.5

// poll updates the backlog and the rate every StatsEvery until ctx is
// done.
func (d *Drainer) poll(ctx context.Context) {
	tk := time.NewTicker(d.cfg.StatsEvery)
	defer tk.Stop()
	for {
		var backlog int64
		ok := true
		for _, in := range d.cfg.Inputs {
			pctx, cancel := context.WithTimeout(ctx, d.cfg.StatsEvery)
			n, err := in.Source.Backlog(pctx)
			cancel()
			if err != nil {
				ok = false
				break
			}
			backlog += n
		}
		now := time.Now()
		d.mu.Lock()
		if ok {
			d.stats.Backlog, d.stats.BacklogAt = backlog, now
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
