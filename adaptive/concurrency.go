package adaptive

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/priority"
)

// The bounds of every RetryAfter a refusal carries.
const (
	MinRetryAfter = 10 * time.Millisecond
	MaxRetryAfter = time.Minute
)

// DefaultShares are the fractions of the limit each priority may fill,
// Sheddable first: see ConcurrencyOptions.Shares.
var DefaultShares = [priority.Levels]float64{0.8, 0.85, 0.9, 0.95, 1}

// ConcurrencyOptions configure a Concurrency. Only Max is required.
type ConcurrencyOptions struct {
	// Max is the fixed maximum of the limit, which it never exceeds
	// (required, >= 1).
	Max int
	// Min is the least the limit falls to (default 1, at most Max).
	Min int
	// Initial is the limit at the start, in [Min, Max]. 0 (the default)
	// means a warm-up instead: the limit starts at Max, so that healthy
	// traffic is never refused while the Controller has measured nothing;
	// after warmUpWindows windows (about a second) in which the Concurrency
	// refused nothing, the limit falls to twice the most held in one of
	// them (at least Min + (Max-Min)/10: the limit above which it would
	// not grow while it is not the bottleneck) and the Controller moves
	// it from there; a
	// warm-up window with refusals or drops (demand above Max, or
	// deadlines passed: overloaded from the start) ends it at once with
	// the limit at Min + (Max-Min)/10, and the Controller is fed from
	// the first window within the limit in which no permit granted
	// during the warm-up ended, so that its latency baseline is not
	// measured on that queue (a window within the limit may still see
	// the last of it complete).
	Initial int
	// Controller moves the limit once per window (default a zero
	// Gradient, with a latency baseline). NewConcurrency fills in its
	// defaults; a Controller belongs to one Concurrency.
	Controller Controller
	// Window is the shortest time over which a Sample is measured
	// (default 100ms). A window closes at the first event after it has
	// lasted Window and seen MinSamples completions, or at the first
	// event after 10·Window whatever it has seen.
	Window time.Duration
	// MinSamples is the number of Done and Dropped a window waits for
	// (default 10).
	MinSamples int
	// Quantile is the latency quantile a Sample reports, in (0, 1]
	// (default 0.9).
	Quantile float64
	// Shares are the fractions of the limit (in (0, 1], Sheddable first,
	// Critical last, not decreasing) that requests of each priority may
	// fill: a Sheddable request is refused once 80% of the limit is held
	// with the defaults, so the last fifth stays for higher priorities.
	// All zero means DefaultShares.
	Shares [priority.Levels]float64
	// QueueSize bounds the callers that Acquire keeps waiting for a slot
	// when the limit is reached (default 0: Acquire fails at once).
	// Waiters are served highest priority first, in arrival order within a
	// priority; when the queue is full, a newcomer of higher priority than
	// some waiter takes the place of the lowest-priority waiter that came
	// last, which is refused with ReasonQueueFull. TryAcquireAt never
	// waits.
	QueueSize int
	// MaxWait bounds a wait in the queue (required when QueueSize > 0);
	// a caller still waiting then is refused with ReasonQueueTimeout.
	MaxWait time.Duration
}

// A Reason says why a request was refused; the zero Reason is not a
// refusal.
type Reason uint8

const (
	// ReasonLimit: the concurrency limit (or the request priority's share
	// of it) was reached, and the request could not or would not wait.
	ReasonLimit Reason = iota + 1
	// ReasonQueueFull: the limit was reached and the queue was full (of
	// requests of the same or higher priority), or a waiter was pushed
	// out of it by one of higher priority.
	ReasonQueueFull
	// ReasonQueueTimeout: the request waited MaxWait without a slot.
	ReasonQueueTimeout
	// ReasonShed: the SLO shedder refused the request's share of the
	// load.
	ReasonShed
)

func (r Reason) String() string {
	switch r {
	case 0:
		return "admitted"
	case ReasonLimit:
		return "concurrency limit reached"
	case ReasonQueueFull:
		return "queue full"
	case ReasonQueueTimeout:
		return "queue wait timed out"
	case ReasonShed:
		return "shed to keep the latency objective"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// ErrOverloaded matches (errors.Is) every Refusal.
var ErrOverloaded = errors.New("adaptive: overloaded")

// A Refusal is the answer to a request shed because of overload, and the
// error Acquire returns for it (errors.As(err, &r) with r a Refusal). Its
// RetryAfter is computed from the controller's state when the request was
// refused: the refused demand of the latest window plus the callers
// waiting, divided by the throughput measured — how long the excess takes
// to drain — bounded to [MinRetryAfter, MaxRetryAfter]. An edge answers
// it as overload (HTTP 503, gRPC UNAVAILABLE), never as a quota refusal.
//
// The zero Refusal (Reason 0) means admitted; TryAcquireAt returns it
// by value, so refusing allocates nothing.
type Refusal struct {
	Reason     Reason
	Priority   priority.Priority
	RetryAfter time.Duration
}

// Refused reports whether r is a refusal (its Reason is set).
func (r Refusal) Refused() bool { return r.Reason != 0 }

func (r Refusal) Error() string {
	return fmt.Sprintf("adaptive: overloaded, %s request refused (%s); retry after %v", r.Priority, r.Reason, r.RetryAfter)
}

// Is makes errors.Is(r, ErrOverloaded) true.
func (r Refusal) Is(target error) bool { return target == ErrOverloaded }

// A Concurrency is an adaptive concurrency limit: it admits a request while
// fewer than its limit are in flight, and moves the limit between
// ConcurrencyOptions.Min and the fixed ConcurrencyOptions.Max by what it measures. See the
// package documentation for the model.
//
// A Concurrency is safe for concurrent use; its methods hold a mutex for tens
// of nanoseconds (and for one pass over a 496-bucket histogram when a
// window closes). The zero value has limit 0 and admits nothing; use
// NewConcurrency. It must not be copied after first use.
type Concurrency struct {
	mu sync.Mutex
	// epoch is when the Concurrency was built, with a monotonic reading:
	// Acquire, Done and Dropped read the time as time.Since(epoch), one
	// read of the monotonic clock and none of the wall clock, and
	// monoOff is the epoch's offset on clock, set once monoReady.
	epoch     time.Time
	monoOff   int64
	monoReady bool
	opt       ConcurrencyOptions
	ctrl      Controller
	limit     float64
	caps      [priority.Levels]int // see setLimit
	clock     monoClock
	held      int
	queued    int
	queue     [priority.Levels][]*waiter

	// The open window.
	winStart     int64
	lastEvent    int64
	area         float64 // ∫ held dt over the window, in permit·ns
	hist         histogram
	done, drops  int
	maxHeld      int
	acquired     int
	refusedInWin int

	// The latest closed window.
	last   Sample
	lastRf int
	level  float64

	refused [priority.Levels]uint64

	// warming counts the windows of the warm-up left (see
	// ConcurrencyOptions.Initial); draining is set when a warm-up ended with
	// refusals, until a window whose permits fit in its limit and in
	// which none of the permits granted during the warm-up ended.
	warming  int
	warmHeld int // the most permits held in a window of the warm-up
	draining bool
	// While draining, warmEnd is when the warm-up ended: stale counts
	// the permits granted until then still held, staleEnded those of
	// them ended in the open window.
	warmEnd    int64
	stale      int
	staleEnded int
}

// warmUpWindows is the length of the warm-up at Max, in windows without
// refusals (see ConcurrencyOptions.Initial).
const warmUpWindows = 10

// waiter is a caller queued in Acquire. Its fields are guarded by the
// Concurrency's mutex; ready is closed when granted is set.
type waiter struct {
	ready   chan struct{}
	granted bool
	start   int64
	evicted Refusal // set, and ready closed, when a higher priority took its place
}

// coldLimit is where a warm-up hands over: a tenth of the way from Min to
// Max, the limit a Controller starts at when nothing is known.
func (o *ConcurrencyOptions) coldLimit() float64 { return float64(o.Min + (o.Max-o.Min)/10) }

// NewConcurrency returns a Concurrency with the given options, or an error naming
// the first invalid one.
func NewConcurrency(opt ConcurrencyOptions) (*Concurrency, error) {
	if opt.Max < 1 {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.Max %d must be at least 1", opt.Max)
	}
	if opt.Min == 0 {
		opt.Min = 1
	}
	if opt.Min < 1 || opt.Min > opt.Max {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.Min %d must be in [1, Max=%d]", opt.Min, opt.Max)
	}
	warmUp := opt.Initial == 0
	if warmUp {
		opt.Initial = opt.Max
	}
	if opt.Initial < opt.Min || opt.Initial > opt.Max {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.Initial %d must be in [Min=%d, Max=%d]", opt.Initial, opt.Min, opt.Max)
	}
	if opt.Controller == nil {
		opt.Controller = &Gradient{}
	}
	if v, ok := opt.Controller.(validator); ok {
		if err := v.validate(); err != nil {
			return nil, err
		}
	}
	if opt.Window == 0 {
		opt.Window = 100 * time.Millisecond
	}
	if opt.Window < 0 {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.Window %v is negative", opt.Window)
	}
	if opt.MinSamples == 0 {
		opt.MinSamples = 10
	}
	if opt.MinSamples < 0 {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.MinSamples %d is negative", opt.MinSamples)
	}
	if opt.Quantile == 0 {
		opt.Quantile = 0.9
	}
	if !(opt.Quantile > 0 && opt.Quantile <= 1) {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.Quantile %v must be in (0, 1]", opt.Quantile)
	}
	if opt.Shares == ([priority.Levels]float64{}) {
		opt.Shares = DefaultShares
	}
	for i, s := range opt.Shares {
		if !(s > 0 && s <= 1) || (i > 0 && s < opt.Shares[i-1]) {
			return nil, fmt.Errorf("adaptive: ConcurrencyOptions.Shares %v must be in (0, 1] and not decrease with priority", opt.Shares)
		}
	}
	if opt.QueueSize < 0 {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.QueueSize %d is negative", opt.QueueSize)
	}
	if opt.QueueSize > 0 && opt.MaxWait <= 0 {
		return nil, fmt.Errorf("adaptive: ConcurrencyOptions.MaxWait %v must be positive when QueueSize is %d", opt.MaxWait, opt.QueueSize)
	}
	l := &Concurrency{opt: opt, ctrl: opt.Controller, epoch: time.Now()}
	if warmUp {
		l.warming = warmUpWindows
	}
	l.setLimit(float64(opt.Initial))
	return l, nil
}

// A Permit is one admitted request's slot. End it exactly once, with Done
// when the request completed (its latency then feeds the controller),
// Dropped when it failed for lack of capacity — it timed out, or the work
// below answered that it is overloaded — or Ignore when its outcome says
// nothing about capacity: the caller cancelled it, or it is not
// representative (a health check, a request that failed fast on invalid
// input, a cache hit). Ending a Permit a second time does nothing; so does
// ending the zero Permit. A Permit is a small value; it must not be copied
// and ended twice through the copies.
type Permit struct {
	l       *Concurrency
	s       *Shedder
	arrived int64        // on l's clock, when the request asked
	start   int64        // on l's clock, when it was granted
	waits   *waitAccount // nil: none (see WithWaitAccount)
}

// Done ends the permit as a completion; see DoneAt.
func (p *Permit) Done() {
	if l := p.l; l != nil {
		p.endMono(time.Since(l.epoch), endDone)
	}
}

// DoneAt ends the permit as a completion at now: its latency, from grant
// to now, is a sample of the window.
func (p *Permit) DoneAt(now time.Time) { p.end(now, endDone) }

// Dropped ends the permit as a drop; see DroppedAt.
func (p *Permit) Dropped() {
	if l := p.l; l != nil {
		p.endMono(time.Since(l.epoch), endDrop)
	}
}

// DroppedAt ends the permit as a drop at now: it counts against the
// limit, and its latency is no sample (a timeout's latency is the
// caller's deadline, not the server's).
func (p *Permit) DroppedAt(now time.Time) { p.end(now, endDrop) }

// Ignore ends the permit without a signal: the slot is given back and
// nothing is measured.
func (p *Permit) Ignore() { p.end(time.Time{}, endIgnore) }

type endKind uint8

const (
	endDone endKind = iota
	endDrop
	endIgnore
)

// end ends the permit at now (unused for endIgnore).
func (p *Permit) end(now time.Time, k endKind) {
	l, s := p.l, p.s
	if l == nil {
		return
	}
	p.l, p.s = nil, nil
	w := p.waits.excluded(math.MaxInt64) // read once, outside the lock: every wait is added before the permit ends
	l.mu.Lock()
	t := l.lastEvent
	if k != endIgnore {
		t = l.clock.advance(now)
	}
	l.finish(t, p.start, min(w, t-p.start), k)
	l.mu.Unlock()
	if s != nil && k != endIgnore {
		s.ObserveAt(now, time.Duration(t-p.arrived-min(w, t-p.arrived)))
	}
}

// endMono ends the permit at d after its Concurrency's epoch: Done and
// Dropped, which read the monotonic clock once and build no time.Time
// unless a Shedder is to be told.
func (p *Permit) endMono(d time.Duration, k endKind) {
	l, s := p.l, p.s
	p.l, p.s = nil, nil
	w := p.waits.excluded(math.MaxInt64)
	l.mu.Lock()
	t := l.advanceMono(d)
	l.finish(t, p.start, min(w, t-p.start), k)
	l.mu.Unlock()
	if s != nil {
		s.ObserveAt(l.epoch.Add(d), time.Duration(t-p.arrived-min(w, t-p.arrived)))
	}
}

// finish gives back a permit granted at start, ended at t as k after
// waiting outside the server for waited of that time. Called with l.mu
// held.
func (l *Concurrency) finish(t, start, waited int64, k endKind) {
	l.account(t)
	l.held = max(l.held-1, 0)
	if l.stale > 0 && start <= l.warmEnd {
		l.stale--
		l.staleEnded++
	}
	switch k {
	case endDone:
		l.done++
		l.hist.record(time.Duration(t - start - waited))
	case endDrop:
		l.drops++
	}
	l.maybeClose(t)
	if l.queued > 0 {
		l.grant(t)
	}
}

// advanceMono moves l's clock to the instant d after l.epoch and returns
// it on the clock. Called with l.mu held; small enough to be inlined.
func (l *Concurrency) advanceMono(d time.Duration) int64 {
	if !l.monoReady {
		l.initMono()
	}
	l.clock.last = max(l.clock.last, int64(d)+l.monoOff)
	return l.clock.last
}

// initMono starts the clock at the epoch unless an *At call started it,
// and sets the epoch's offset on it. Called with l.mu held.
func (l *Concurrency) initMono() {
	if !l.clock.started {
		l.clock.base, l.clock.started = l.epoch, true
	}
	l.monoOff, l.monoReady = int64(l.epoch.Sub(l.clock.base)), true
}

// account adds the permits held since the latest event to the window's
// area and moves the latest event to t. Called with l.mu held.
func (l *Concurrency) account(t int64) {
	if t > l.lastEvent {
		l.area += float64(l.held) * float64(t-l.lastEvent)
		l.lastEvent = t
	}
}

// maybeClose closes the window if it is due at t. Called with l.mu held;
// small enough to be inlined, since it is on every path.
func (l *Concurrency) maybeClose(t int64) {
	if t-l.winStart >= int64(l.opt.Window) {
		l.closeWindow(t)
	}
}

// closeWindow closes the window if it has lasted Window and seen
// MinSamples, or lasted 10·Window. Called with l.mu held.
func (l *Concurrency) closeWindow(t int64) {
	dur := t - l.winStart
	w := int64(l.opt.Window)
	if l.ctrl == nil || (l.done+l.drops < l.opt.MinSamples && dur < 10*w) {
		return
	}
	s := Sample{
		Window:      time.Duration(dur),
		Limit:       l.limit,
		Latency:     l.hist.quantile(l.opt.Quantile),
		Completed:   l.done,
		Dropped:     l.drops,
		InFlight:    l.area / float64(dur),
		MaxInFlight: l.maxHeld,
		Throughput:  float64(l.done) / time.Duration(dur).Seconds(),
		Refused:     l.refusedInWin,
	}
	var next float64
	switch {
	case l.warming > 0 && (s.Refused > 0 || s.Dropped > 0):
		// Overloaded from the start: the limit falls to where a
		// Controller starts without a warm-up, and the Controller waits
		// for the queue let in at Max to drain: for every permit held
		// now to end.
		l.warming, l.draining = 0, true
		l.warmEnd, l.stale = t, l.held
		next = l.opt.coldLimit()
	case l.warming > 0:
		// Healthy so far: the limit stays at Max, and at the end of the
		// warm-up falls to twice the most held in a window, the limit
		// above which it does not grow while it is not the bottleneck.
		l.warmHeld = max(l.warmHeld, s.MaxInFlight)
		next = l.limit
		if l.warming--; l.warming == 0 {
			next = max(float64(2*l.warmHeld), l.opt.coldLimit())
		}
	case l.draining && (s.MaxInFlight > int(s.Limit) || l.staleEnded > 0):
		next = l.limit
	default:
		l.draining = false
		next = l.ctrl.Update(s)
		switch {
		case math.IsNaN(next):
			next = l.limit
		case next > l.limit && 2*s.MaxInFlight < int(l.limit):
			next = l.limit // not the bottleneck: do not grow on flat latency
		}
	}
	l.setLimit(min(max(next, float64(l.opt.Min)), float64(l.opt.Max)))
	l.last, l.lastRf = s, l.refusedInWin
	l.level = min(s.InFlight/s.Limit, 1)
	if n := l.acquired + l.refusedInWin; l.refusedInWin > 0 {
		l.level += float64(l.refusedInWin) / float64(n)
	}
	l.winStart = t
	l.hist.reset()
	l.done, l.drops, l.area, l.acquired, l.refusedInWin = 0, 0, 0, 0, 0
	l.staleEnded = 0
	l.maxHeld = l.held
}

// capFor returns how many permits a request of priority p may find held
// and still be admitted. Called with l.mu held.
func (l *Concurrency) capFor(p priority.Priority) int {
	if !p.Valid() {
		p = priority.Normal
	}
	return l.caps[p.Index()] // all 0 in the zero Concurrency, which admits nothing
}

// setLimit sets the limit and the priorities' caps on it: each its share
// of the limit, at least 1; Critical the whole limit. Called with l.mu
// held.
func (l *Concurrency) setLimit(limit float64) {
	l.limit = limit
	for i, sh := range l.opt.Shares {
		l.caps[i] = max(int(limit*sh), 1)
	}
	l.caps[priority.Critical.Index()] = max(int(limit), 1)
}

// take admits one permit at t. Called with l.mu held.
func (l *Concurrency) take(t int64) {
	l.held++
	l.acquired++
	l.maxHeld = max(l.maxHeld, l.held)
}

// refuse counts a refusal of p and returns it with its retry hint. Called
// with l.mu held.
func (l *Concurrency) refuse(r Reason, p priority.Priority) Refusal {
	if !p.Valid() {
		p = priority.Normal
	}
	l.refused[p.Index()]++
	l.refusedInWin++
	return Refusal{Reason: r, Priority: p, RetryAfter: l.retryAfter()}
}

// retryAfter returns the time the latest excess takes to drain at the
// throughput measured. Called with l.mu held.
func (l *Concurrency) retryAfter() time.Duration {
	x := l.last.Throughput
	if !(x > 0) {
		// Nothing measured yet: Little's law on the limit.
		lat := l.last.Latency
		if lat <= 0 {
			lat = l.opt.Window
		}
		x = max(l.limit, 1) / lat.Seconds()
	}
	excess := float64(max(l.lastRf, l.refusedInWin) + l.queued + 1)
	return boundRetry(excess / x)
}

// boundRetry returns sec seconds bounded to [MinRetryAfter, MaxRetryAfter].
func boundRetry(sec float64) time.Duration {
	if !(sec < MaxRetryAfter.Seconds()) {
		return MaxRetryAfter
	}
	return max(time.Duration(sec*float64(time.Second)), MinRetryAfter)
}

// TryAcquireAt admits a request of priority p at now if fewer permits are
// held than p's share of the limit (and nobody of p's priority or higher
// is queued), and never waits. It returns the Permit and the zero Refusal,
// or the zero Permit and a Refusal with ReasonLimit. It does not allocate.
func (l *Concurrency) TryAcquireAt(now time.Time, p priority.Priority) (Permit, Refusal) {
	l.mu.Lock()
	t := l.clock.advance(now)
	l.account(t)
	l.maybeClose(t)
	if l.held >= l.capFor(p) || l.queuedAtOrAbove(p) {
		r := l.refuse(ReasonLimit, p)
		l.mu.Unlock()
		return Permit{}, r
	}
	l.take(t)
	l.mu.Unlock()
	return Permit{l: l, arrived: t, start: t}, Refusal{}
}

// queuedAtOrAbove reports whether a waiter of priority p or higher is
// queued. Called with l.mu held.
func (l *Concurrency) queuedAtOrAbove(p priority.Priority) bool {
	if l.queued == 0 {
		return false
	}
	if !p.Valid() {
		p = priority.Normal
	}
	for i := p.Index(); i < priority.Levels; i++ {
		if len(l.queue[i]) > 0 {
			return true
		}
	}
	return false
}

// Acquire admits a request of the priority ctx carries (priority.FromContext). When
// the limit is reached it waits in the queue, if ConcurrencyOptions.QueueSize allows,
// at most ConcurrencyOptions.MaxWait and until ctx ends; otherwise it fails at once.
// It returns a Permit, or an error: a Refusal (ReasonLimit, ReasonQueueFull
// or ReasonQueueTimeout), or ctx's error wrapped when ctx ended first
// (nothing is then counted as refused: the caller went away). Admitted at
// once it does not allocate; waiting allocates the waiter and a timer.
// When ctx has a wait account (WithWaitAccount), the permit's latency
// sample excludes the waits added to it.
func (l *Concurrency) Acquire(ctx context.Context) (Permit, error) {
	return l.acquire(ctx, priority.FromContext(ctx), time.Since(l.epoch))
}

// acquire is Acquire for priority p at d after l.epoch. It reads the
// monotonic clock once (time.Since of the epoch, which reads no wall
// clock), which is most of its cost.
func (l *Concurrency) acquire(ctx context.Context, p priority.Priority, d time.Duration) (Permit, error) {
	wa := waitsOf(ctx)
	l.mu.Lock()
	t := l.advanceMono(d)
	l.account(t)
	l.maybeClose(t)
	if l.held < l.capFor(p) && !l.queuedAtOrAbove(p) {
		l.take(t)
		l.mu.Unlock()
		return Permit{l: l, arrived: t, start: t, waits: wa}, nil
	}
	if l.opt.QueueSize == 0 {
		r := l.refuse(ReasonLimit, p)
		l.mu.Unlock()
		return Permit{}, r
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return Permit{}, fmt.Errorf("adaptive: acquire: %w", err)
	}
	if l.queued >= l.opt.QueueSize && !l.evictBelow(p) {
		r := l.refuse(ReasonQueueFull, p)
		l.mu.Unlock()
		return Permit{}, r
	}
	w := &waiter{ready: make(chan struct{})}
	i := p.Index()
	if !p.Valid() {
		i = priority.Normal.Index()
	}
	l.queue[i] = append(l.queue[i], w)
	l.queued++
	l.mu.Unlock()

	timer := time.NewTimer(l.opt.MaxWait)
	defer timer.Stop()
	var cause error
	select {
	case <-w.ready:
		if w.evicted.Refused() {
			return Permit{}, w.evicted
		}
		return Permit{l: l, arrived: t, start: w.start, waits: wa}, nil
	case <-ctx.Done():
		cause = ctx.Err()
	case <-timer.C:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case w.granted:
		// Granted while we were leaving: the slot is ours.
		return Permit{l: l, arrived: t, start: w.start, waits: wa}, nil
	case w.evicted.Refused():
		// Evicted while we were leaving: already out of the queue.
		return Permit{}, w.evicted
	}
	q := l.queue[i]
	for j, x := range q {
		if x == w {
			l.queue[i] = append(q[:j], q[j+1:]...)
			break
		}
	}
	l.queued--
	// Leaving may unblock lower priorities waiting behind us.
	l.grant(l.lastEvent)
	if cause != nil {
		return Permit{}, fmt.Errorf("adaptive: acquire: %w", cause)
	}
	return Permit{}, l.refuse(ReasonQueueTimeout, p)
}

// evictBelow makes room in the full queue for a request of priority p by
// refusing (ReasonQueueFull) the waiter of the lowest priority below p
// that arrived last, and reports whether it did: a full queue of
// sheddable work does not keep out a critical request. Called with l.mu
// held.
func (l *Concurrency) evictBelow(p priority.Priority) bool {
	if !p.Valid() {
		p = priority.Normal
	}
	for i := 0; i < p.Index(); i++ {
		q := l.queue[i]
		if len(q) == 0 {
			continue
		}
		w := q[len(q)-1]
		q[len(q)-1] = nil
		l.queue[i] = q[:len(q)-1]
		l.queued--
		w.evicted = l.refuse(ReasonQueueFull, priority.Priority(i)+priority.Sheddable)
		close(w.ready)
		return true
	}
	return false
}

// grant serves queued waiters, highest priority first, while their
// priority's share has room. Called with l.mu held.
func (l *Concurrency) grant(t int64) {
	for l.queued > 0 {
		i := priority.Levels - 1
		for len(l.queue[i]) == 0 {
			i--
		}
		if l.held >= l.capFor(priority.Priority(i)+priority.Sheddable) {
			return
		}
		w := l.queue[i][0]
		l.queue[i][0] = nil
		l.queue[i] = l.queue[i][1:]
		l.queued--
		l.take(t)
		w.granted, w.start = true, t
		close(w.ready)
	}
}

// ConcurrencyStats is a snapshot of a Concurrency.
type ConcurrencyStats struct {
	// Limit is the current limit, Max the fixed maximum.
	Limit float64
	Max   int
	// InFlight is the permits held, Queued the callers waiting.
	InFlight, Queued int
	// Latency and Throughput are the latest window's quantile and
	// completions per second.
	Latency    time.Duration
	Throughput float64
	// Level is the load level of the latest window: the mean share of
	// the limit in use (0 to 1), plus the fraction of requests refused.
	Level float64
	// Refused counts the requests refused since the start, by priority,
	// Sheddable first.
	Refused [priority.Levels]uint64
}

// Stats returns a snapshot of l. It does not allocate.
func (l *Concurrency) Stats() ConcurrencyStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ConcurrencyStats{
		Limit: l.limit, Max: l.opt.Max,
		InFlight: l.held, Queued: l.queued,
		Latency: l.last.Latency, Throughput: l.last.Throughput,
		Level:   l.level,
		Refused: l.refused,
	}
}

// Limit returns the current limit.
func (l *Concurrency) Limit() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// A monoClock turns instants into offsets in nanoseconds from the first
// instant it is given, and never goes back: an instant earlier than the
// latest one it has seen is taken as that one. The zero value is ready for
// use; the owner's mutex guards it.
//
// ratelimit/limiter.go has the same type (with peek): the import rules
// (ARCHITECTURE.md, rule 1) leave ratelimit and adaptive no common package
// but the standard library, and exporting it would make a clock part of
// the API.
type monoClock struct {
	base    time.Time
	started bool
	last    int64
}

func (c *monoClock) advance(now time.Time) int64 {
	if !c.started {
		c.base, c.started = now, true
		return c.last
	}
	c.last = max(c.last, int64(now.Sub(c.base)))
	return c.last
}
