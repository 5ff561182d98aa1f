package concurrency

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// A Store stores the holders of distributed semaphores. Each semaphore is
// identified by its name; its holders are tokens, each with an expiry and a
// fence. Every method must be atomic with respect to the others on the same
// name, and must never touch a token other than the one it is given.
//
// A fence is the fencing token of a grant: a number that the store takes,
// in the same atomic step as the grant, from a counter of the name that
// only grows: each grant of a name gets the counter's next value, 1 for
// the first. Renewing a permit (Renew, or an acquire by a token that
// holds one) keeps its fence; a token whose permit has expired, or was
// released, gets a new, larger fence when it is granted again. The
// counter outlives the holders (a name whose every permit expired goes on
// from where it was) and is the name's alone. A store that loses its data
// (a Redis restart without persistence) may start a name's fences again:
// see Permit.Fence.
//
// Implementations: MemoryStore (one process) and redisstore.SemaphoreStore
// (many processes, on Redis).
type Store interface {
	// Acquire first forgets the holders of name whose expiry has passed,
	// then adds token, of weight 1, with an expiry ttl from now if the
	// weights held (1 a holder, unless a FairStore granted more) leave
	// room for one more under limit (on a Notifier, room held for
	// another token counts as used: see Notifier) and, on a FairStore,
	// no waiter's place in its queue holds (see FairStore), and returns its new
	// fence; it returns 0 when there is no room or others queue. If token
	// already holds a permit, its expiry is extended and Acquire returns
	// the fence it has. When
	// there is no room and wait > 0, a Notifier records token as a waiter
	// for wait from now (each refused attempt moves that on), so that a
	// release names it (see Notifier); a Store that is no Notifier may
	// ignore wait.
	Acquire(ctx context.Context, name, token string, limit int64, ttl, wait time.Duration) (fence uint64, err error)
	// Renew moves token's expiry to ttl from now if token still holds an
	// unexpired permit of name, and reports whether it did. It never
	// creates a permit.
	Renew(ctx context.Context, name, token string, ttl time.Duration) (bool, error)
	// Release removes token's permit of name, if any, and reports whether
	// there was one.
	Release(ctx context.Context, name, token string) (bool, error)
	// Holders lists the unexpired permits of name, in one atomic step,
	// by the store's clock: each one's fence, weight, how long it has
	// been held and how long it has left, ordered by fence; and the
	// waiters in a FairStore's queue whose place has not lapsed. It never
	// reveals a token (the capability to renew or release a permit) and
	// changes nothing a holder or waiter could notice.
	Holders(ctx context.Context, name string) (Listing, error)
}

// A Listing is what Store.Holders answers: a semaphore's holders at one
// instant of the store's clock.
type Listing struct {
	// Holders are the unexpired permits, ordered by fence (the order of
	// their grants). An expired permit that the store has not forgotten
	// yet is not among them.
	Holders []Holder
	// Queued is the number of waiters in a FairStore's queue whose place
	// has not lapsed; -1 when the store keeps no queue it can count.
	Queued int
}

// A Holder describes one permit of a Listing, without its token.
type Holder struct {
	// Fence is the permit's fencing token (Permit.Fence).
	Fence uint64
	// Weight is the units it holds (1 unless granted by AcquireFair).
	Weight int64
	// HeldFor is how long ago it was granted (a renewal keeps the
	// instant of the grant), by the store's clock; HeldForUnknown when
	// the store did not record it (a permit granted by an older Sluice
	// on Redis).
	HeldFor time.Duration
	// ExpiresIn is how long the store keeps it without a renewal: always
	// above 0 (an expired permit is not listed).
	ExpiresIn time.Duration
}

// HeldForUnknown is Holder.HeldFor when the store does not know when the
// permit was granted.
const HeldForUnknown time.Duration = -1

// Used returns the weight held by the listed permits.
func (l Listing) Used() int64 {
	var n int64
	for _, h := range l.Holders {
		n += h.Weight
	}
	return n
}

// A FairStore is a Store that also serves waiters in arrival order and
// grants weighted permits: the holders' weights add up to at most the
// limit. Distributed uses it when its Store is one.
//
// Implementations: MemoryStore and redisstore.SemaphoreStore.
type FairStore interface {
	Store
	// AcquireFair first forgets the expired holders and the waiters of
	// name whose place has lapsed, then grants token a permit of weight
	// units, for ttl, if token is first among the waiters (or none
	// waits) and the weights held leave room. Otherwise, when wait > 0,
	// it queues token (keeping its place if it is already queued) and
	// keeps its place for wait from now; with wait 0 it queues nothing.
	// It reports Granted, Queued (waiting behind others) or First (first
	// in line, waiting for room). A token that already holds a permit
	// has its expiry extended and is Granted. The fence is the permit's
	// (as Acquire's) when Granted, 0 otherwise.
	AcquireFair(ctx context.Context, name, token string, weight, limit int64, ttl, wait time.Duration) (res FairResult, fence uint64, err error)
	// Dequeue removes token from name's waiters, if it waits (in the
	// queue, or recorded by Acquire).
	Dequeue(ctx context.Context, name, token string) error
}

// A Notifier is a Store that tells a semaphore's waiters, in every
// process, when room may have opened: a permit released, an expired one
// reclaimed, the first waiter gone or granted with room left. It names
// the waiters to wake, as many as there is room for: the first in line of
// a FairStore's queue, or the waiters that Acquire recorded (with
// wait > 0). A blocked Acquire on a Notifier watches while it waits and
// tries again at once when told; it keeps polling besides, so a
// notification lost costs at most one poll interval (MaxBackoff), and a
// notification is never a grant by itself: the waiter still asks the
// store.
//
// A Notifier may hold the room it names a recorded waiter for, for a
// short while (redisstore.SemaphoreOptions.Hold): until the hold lapses,
// Acquire and AcquireFair by any other token count that room as used
// (they are refused, and recorded, as when the semaphore is full), and
// the named token's own attempt takes it. Otherwise the holder that
// released, asking again at once, would take the room before the waiter
// woke, and the waiter's attempt would be wasted. A hold is room, never a
// permit: the permits held and the holds together stay within the limit,
// and the named token's grant consumes its hold. A hold that lapses unused
// (its waiter slow, dead or gone) is room again, which the store passes
// on as a release's; a Release or Dequeue of the token gives its hold up
// the same way. A FairStore's queue needs none: nobody overtakes the
// first in line.
//
// redisstore.SemaphoreStore (Redis pub/sub) implements it.
type Notifier interface {
	// Watch returns a channel on which the store sends, for as long as
	// ctx lasts, a message each time room may have opened in semaphore
	// name: the token of a waiter to wake (the first in line of
	// FairStore.AcquireFair's queue, or one that Acquire recorded), or ""
	// when it names none (one waiter of each process should then ask).
	// It returns once the watch is in
	// place, so that a change after it returns is not missed. A slow
	// receiver loses messages rather than blocking the store. The channel
	// is closed when ctx is done or the watch fails.
	Watch(ctx context.Context, name string) (<-chan string, error)
}

// A FairResult is the answer of FairStore.AcquireFair.
type FairResult int

// The answers of FairStore.AcquireFair.
const (
	Queued  FairResult = iota // others wait before it
	First                     // first in line; the limit leaves no room yet
	Granted                   // it holds the permit
)

// Errors of Distributed and Permit.
var (
	// ErrNoPermit is returned by TryAcquire when every permit is held.
	ErrNoPermit = errors.New("concurrency: no permit available")
	// ErrLost is the cause of a Permit's loss: a renewal found the permit
	// gone, or its validity ran out without a successful renewal.
	ErrLost = errors.New("concurrency: permit lost")
	// ErrReleased is returned by Permit.Err after Release.
	ErrReleased = errors.New("concurrency: permit released")
	// ErrDetached is returned by Permit.Err after Detach.
	ErrDetached = errors.New("concurrency: permit detached")
	// ErrStoreFailing is wrapped by the error of a blocked acquire whose
	// wait ended (its context done) while the store was failing: its last
	// attempt met a Transient error of the store. That error wraps the
	// context's error and the store's last error too (see Distributed,
	// Store failures).
	ErrStoreFailing = errors.New("the store was failing")
)

// Defaults of DistributedOptions.
const (
	DefaultTTL        = 10 * time.Second
	DefaultMinBackoff = 5 * time.Millisecond
	DefaultMaxBackoff = 250 * time.Millisecond
	DefaultFairAfter  = time.Second
)

// DistributedOptions configure a Distributed semaphore. The zero value
// selects every default.
type DistributedOptions struct {
	// TTL is how long a permit lives without renewal: the longest a dead
	// process can keep its permits. Default DefaultTTL.
	TTL time.Duration
	// RenewEvery is the interval between renewals of a held permit, each
	// jittered by ±10%. Default TTL/3; at most TTL/2.
	RenewEvery time.Duration
	// Margin is deducted from every validity period, as allowance for the
	// rate difference between this machine's clock and the store's.
	// Default TTL/50 (2%).
	Margin time.Duration
	// MinBackoff and MaxBackoff bound the waits between attempts of a
	// blocked Acquire: MaxBackoff is the poll interval, the longest a
	// freed permit waits to be noticed when no notification comes (see
	// Notifier). The wait doubles from MinBackoff up to MaxBackoff;
	// each is drawn at random between half of it and all of it, so that
	// waiters do not retry in step. On a FairStore the first waiter in
	// line asks every MinBackoff. Once a Notifier store's watch is live,
	// a waiter (first in line or not) asks at MaxBackoff: the store names
	// it when room opens. Defaults DefaultMinBackoff and
	// DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Fair serves the waiters of a FairStore in arrival order, across
	// processes: each joins the store's queue and is granted only when
	// it is first in line and its weight fits. Every Distributed of a
	// semaphore should agree: an unfair attempt is refused while fair
	// waiters queue. Without Fair (the default), whichever waiter asks
	// first after a release wins, as on any Store (but see FairAfter).
	Fair bool
	// FairAfter bounds how long a waiter without Fair goes on losing to
	// those who ask at the right moment: an Acquire (or AcquireN) on a
	// FairStore that has waited that long joins the store's queue, as
	// with Fair, and from then on the unfair attempts of others are
	// refused until it is served. Without it a waiter may lose every
	// race for a freed permit to a holder that releases and acquires
	// again at once, and wait without end; with it, barging keeps the
	// short waits short and the longest wait is FairAfter plus a place
	// in line. Default DefaultFairAfter; negative: never (pure barging).
	FairAfter time.Duration
	// OnStoreError, if set, is called with each Transient error of the
	// store that a blocked acquire waits through (it asks again after its
	// backoff, see Distributed, Store failures), from the acquiring
	// goroutine: to count or log them. It is not called for the errors
	// an acquire returns.
	OnStoreError func(err error)
	// QueueTTL is how long a waiter keeps its place in a FairStore's
	// queue without asking again: the longest a waiter that died holds up
	// those behind it; and how long a Notifier keeps a blocked Acquire
	// recorded as a waiter to name, after each attempt. Default
	// max(1 s, 4 × MaxBackoff); at least 2 × MaxBackoff.
	QueueTTL time.Duration
}

// A Distributed semaphore admits at most Limit holders of one named
// semaphore at once, across every process that uses the same Store and
// name.
//
// # Permits
//
// Acquire returns a Permit, which holds one unit until Release. Each permit
// is stored with a random token and an expiry TTL ahead; a goroutine owned by
// the Permit renews it about every TTL/3 while it is held, so a process that
// dies, or stops renewing, loses its permits within one TTL and others can
// take them. Release and renewal name the permit by its token, so they
// never remove or extend another holder's permit, even one that took over
// an expired slot.
//
// # Validity and loss
//
// The holder is entitled to its permit only until its validity ends: the
// moment the last successful acquire or renewal request was sent, plus TTL,
// minus Margin, on this process's monotonic clock. The store measures the
// TTL from when it received the request, so it never expires a permit
// before the holder stops believing in it (clock rates aside, which Margin
// covers). When a renewal finds the permit gone, or validity ends without a
// successful renewal (the store is unreachable or slow, the process was
// paused), the Permit is lost and renewals stop. Err decides at the moment
// it is called, from the monotonic clock: once validity has ended it
// reports the loss, even if no goroutine of the Permit has run since (a
// process resumed after SIGSTOP, a goroutine descheduled for long). Lost
// is closed by the first of: a timer set for the end of validity (which
// fires even while a renewal is still in flight, but only when the
// runtime gets to run it), a renewal that finds the permit gone, and a
// call of Err or Lost that finds validity ended. So check Err (or call
// Lost anew) right before each use of what the permit protects, rather
// than trusting a Lost channel received earlier. A lost permit is never
// re-acquired silently; the holder should abandon its work (or finish it
// if the protected service tolerates it) and Acquire again.
//
// # Fencing
//
// No check made by the holder can be exact: a process may pause between
// Err and its use of the protected resource, longer than a TTL. Each
// Permit therefore carries a fencing token, Fence, taken by the store in
// the same atomic step as the grant: it increases with every permit
// granted of the semaphore's name (a renewal keeps it), so a permit
// granted after another's expiry always has a larger one. A holder sends
// it with each request to the protected service, and a service that
// remembers the highest fence it has accepted per semaphore refuses a
// request carrying a lower one: the request of a holder that paused past
// its permit, sent after its successor's. Package fence is such a check
// for HTTP (fence.Guard), and fence.Set is how a client sends the fence
// and the name. The protection holds only where the protected side
// checks; the fences are per name, so the resource a service checks must
// be the semaphore's name.
//
// # Waiting
//
// A blocked Acquire polls the Store with exponential backoff and jitter
// between MinBackoff and MaxBackoff, so a permit freed by another process
// is noticed within about MaxBackoff. A permit released through the same
// Distributed wakes one of its waiters at once. On a Notifier
// (redisstore.SemaphoreStore), a Distributed watches the store while any
// of its Acquires waits, in a goroutine it owns that ends a second after
// the last one stops waiting (unless another begins to wait meanwhile),
// and a permit freed in another process wakes a waiter
// at once too: the one the store names, in whichever process it waits
// (a blocked Acquire is recorded by the store as a waiter, for QueueTTL
// from each attempt, under the one token it keeps for all its attempts),
// as many as the permits freed, each with the room held for it a moment
// (see Notifier); or, when waiters queue with Fair, the one first in
// line. A waiter woken asks the store again, so
// the message grants nothing by itself; if it is lost, or the watch
// fails (it is tried again at most every max(1 s, MaxBackoff)), the
// waiters still poll, and a freed permit waits at most a poll interval.
// Once the watch is live, the waiters poll only at MaxBackoff (drawn in
// [½, 1] of it), not from MinBackoff up: they are named when room opens,
// and polling sooner would only add refused attempts (about 4 a grant
// with 20 processes sharing a semaphore of 50; bench/RESULTS.md, section
// 19).
//
// On a FairStore (MemoryStore, redisstore.SemaphoreStore) permits may
// weigh more than one unit (AcquireN), and with Fair waiters are served in
// arrival order across every process: a waiter joins the store's queue on
// its first attempt, keeps its place by asking again within QueueTTL, and
// is granted only when it is first in line and its weight fits, so a
// large request is never starved by small ones. The first in line asks
// every MinBackoff (at MaxBackoff once a Notifier's watch is live: the
// store names it when room opens); the others at their backoff, so under heavy
// contention a freed permit waits for the next in line to ask (Fair
// trades throughput for order: a release through the same Distributed
// wakes one local waiter, which may not be first). A waiter whose context
// ends leaves the queue; one that dies holds up those behind it for
// QueueTTL at most. Without Fair waiters are not served in arrival
// order: whichever asks first after a release wins, which keeps most
// waits short and leaves a long tail (a holder that releases and acquires
// again at once wins nearly every race). On a FairStore a waiter that has
// waited FairAfter joins the queue, which bounds that tail; on another
// Store it is not bounded.
//
// # Store failures
//
// A slow store is a longer wait, not an error: a blocked acquire
// (Acquire, AcquireN) whose attempt fails with a Transient error of the
// store (a call past its timeout, a connection refused or lost) counts it
// as one more refused attempt: it calls OnStoreError, if set, waits its
// backoff and asks again, under the same token, until it is granted or
// its context ends. An attempt whose answer was lost may have been
// granted in the store; the next attempt under the same token then finds
// that permit and takes it, with its fence (a token that holds a permit
// is granted again, its expiry extended: see Store), so a lost answer
// never leaks a permit, and one given up is released. When the context
// ends while the store is failing (the last attempt failed), the error
// wraps ErrStoreFailing, the context's error and the store's last
// error, so that errors.Is finds each of them; when the last attempt was
// answered, it wraps only the context's error. An attempt that times
// out less than 10 ms before the context's deadline was cut off by it (a
// store may give up a little early) and ends the wait as the deadline
// does. Other errors of the store end the wait at once, and TryAcquire, TryAcquireN, Release and
// the renewals return or act on every error as it comes. Without a
// deadline, a blocked acquire waits through a store that stays down:
// give its context a deadline, or watch OnStoreError, to bound that.
//
// A Distributed is safe for concurrent use. Use NewDistributed; the zero
// value is not usable.
type Distributed struct {
	backend Store
	name    string
	limit   int64
	o       DistributedOptions
	// freed gets a value when a permit of this Distributed is released
	// (or the store says one was, without naming a waiter), so that one
	// of its waiters retries at once instead of after its backoff.
	freed chan struct{}
	// notes is the store as a Notifier, or nil.
	notes Notifier

	mu      sync.Mutex
	waiters map[*waiter]struct{} // the blocked acquires
	// The watch: a goroutine of the Distributed's runs while waiters is
	// not empty (watching), started by the first waiter and stopped
	// (stopWatch) watchLinger after the last left, unless another came
	// meanwhile: idle counts the departures of a last waiter, so that a
	// stop scheduled by one that a new waiter followed does nothing; gen
	// tells its successive runs apart. live is set once the store has
	// confirmed it, retryAt delays a new attempt after a failure.
	watching  bool
	live      bool
	gen       uint64
	idle      uint64
	stopWatch context.CancelFunc
	retryAt   time.Time
}

// watchLinger is how long a Distributed's watch outlives its last waiter:
// a waiter that comes within it (a loop that released its permit and
// asks again, refused) finds the watch live, and neither waits for a new
// subscription, polling from MinBackoff meanwhile, nor is asked once more
// when it is in place.
const watchLinger = time.Second

// NewDistributed returns a semaphore named name, of at most limit holders,
// stored in b. A limit of 0 (or below) admits nobody: Acquire returns
// ErrExceedsLimit. It returns an error when an option is negative.
func NewDistributed(b Store, name string, limit int64, o DistributedOptions) (*Distributed, error) {
	if b == nil {
		return nil, errors.New("concurrency: nil Store")
	}
	if o.TTL < 0 || o.RenewEvery < 0 || o.Margin < 0 || o.MinBackoff < 0 || o.MaxBackoff < 0 {
		return nil, fmt.Errorf("concurrency: negative duration in options %+v", o)
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < time.Millisecond {
		return nil, fmt.Errorf("concurrency: TTL %v below 1ms", o.TTL)
	}
	if o.RenewEvery == 0 {
		o.RenewEvery = o.TTL / 3
	}
	o.RenewEvery = min(o.RenewEvery, o.TTL/2)
	if o.Margin == 0 {
		o.Margin = o.TTL / 50
	}
	if o.Margin >= o.TTL/2 {
		return nil, fmt.Errorf("concurrency: Margin %v not below TTL/2", o.Margin)
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	o.MaxBackoff = max(o.MaxBackoff, o.MinBackoff)
	if o.QueueTTL < 0 {
		return nil, fmt.Errorf("concurrency: negative QueueTTL %v", o.QueueTTL)
	}
	if o.QueueTTL == 0 {
		o.QueueTTL = max(time.Second, 4*o.MaxBackoff)
	}
	if o.FairAfter == 0 {
		o.FairAfter = DefaultFairAfter
	}
	o.QueueTTL = max(o.QueueTTL, 2*o.MaxBackoff)
	d := &Distributed{backend: b, name: name, limit: limit, o: o, freed: make(chan struct{}, 1), waiters: map[*waiter]struct{}{}}
	d.notes, _ = b.(Notifier)
	return d, nil
}

// Name returns the semaphore's name.
func (d *Distributed) Name() string { return d.name }

// Limit returns the most holders the semaphore admits.
func (d *Distributed) Limit() int64 { return d.limit }

// Acquire waits for a permit until one is granted, ctx ends or the Store
// fails with an error that is not Transient (see Store failures). The
// returned Permit must be released.
func (d *Distributed) Acquire(ctx context.Context) (*Permit, error) {
	if d.o.Fair {
		return d.AcquireN(ctx, 1)
	}
	// One token for every attempt, under which the store records the
	// waiter and names it when room opens.
	w := d.newWaiter(crand.Text())
	defer w.done()
	fs, canQueue := d.backend.(FairStore)
	since := time.Now()
	// The store's error at the last attempt, if it failed: the token may
	// hold a permit granted by an attempt whose answer was lost.
	var failed error
	for {
		if canQueue && d.waitedTooLong(since) {
			// Take the place in line; the record as a plain waiter
			// would only take a wake-up meant for another.
			if failed != nil {
				d.releaseDetached(ctx, w.token)
			}
			d.dequeue(ctx, fs, w.token)
			return d.acquireQueued(ctx, fs, 1, true)
		}
		p, serr, err := d.attempt(ctx, w.token, d.o.QueueTTL)
		switch {
		case serr != nil && cutOff(ctx, serr):
			// The wait is over. The request may have added the token
			// before failing: remove it so that it does not hold a slot
			// until it expires.
			d.releaseDetached(ctx, w.token)
			if fs, ok := d.backend.(FairStore); ok && d.notes != nil {
				d.dequeue(ctx, fs, w.token)
			}
			return nil, d.waitEnded(ctx, failed)
		case serr != nil && d.absorb(ctx, serr):
			failed = serr
		case serr != nil:
			d.releaseDetached(ctx, w.token)
			return nil, fmt.Errorf("concurrency: acquire %q: %w", d.name, serr)
		case errors.Is(err, ErrLost):
			// Granted too late to be valid, and given back: try again
			// under a new token.
			w.setToken(crand.Text())
			failed = nil
		case errors.Is(err, ErrNoPermit):
			failed = nil
		default:
			// Granted, or an error (ErrExceedsLimit among them) that
			// ends the wait.
			return p, err
		}
		pause := w.pause()
		if canQueue {
			pause = d.untilQueue(since, pause)
		}
		if w.wait(ctx, pause); ctx.Err() != nil {
			if failed != nil {
				d.releaseDetached(ctx, w.token)
			}
			if fs, ok := d.backend.(FairStore); ok && d.notes != nil {
				d.dequeue(ctx, fs, w.token) // the record would lapse; a release may name it before
			}
			return nil, d.waitEnded(ctx, failed)
		}
	}
}

// absorb reports whether a blocked acquire waits through err, its
// attempt's store error, and asks again: when err is Transient and ctx
// has not ended. It tells OnStoreError.
func (d *Distributed) absorb(ctx context.Context, err error) bool {
	if ctx.Err() != nil || !Transient(err) {
		return false
	}
	if d.o.OnStoreError != nil {
		d.o.OnStoreError(err)
	}
	return true
}

// deadlineSlack is how close to its context's deadline an attempt that
// times out is taken for cut off by that deadline: a store may give up a
// little before it (redisstore's cutoff errs early, by up to a round trip
// to the server), and the context may say so a little after.
const deadlineSlack = 10 * time.Millisecond

// cutOff reports whether err, an attempt's store error, is the end of
// ctx's wait rather than a failure of the store: ctx has ended, or err is
// a timeout that came less than deadlineSlack before ctx's deadline.
func cutOff(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) >= deadlineSlack {
		return false
	}
	var to interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &to) && to.Timeout())
}

// waitEnded is the error of a blocked acquire whose ctx ended (or is
// about to: see cutOff); failed is the store's error at its last attempt
// before, nil if that was answered.
func (d *Distributed) waitEnded(ctx context.Context, failed error) error {
	cause := ctx.Err()
	if cause == nil {
		cause = context.DeadlineExceeded
	}
	if failed == nil {
		return fmt.Errorf("concurrency: acquire %q: %w", d.name, cause)
	}
	return fmt.Errorf("concurrency: acquire %q: %w while %w: %w", d.name, cause, ErrStoreFailing, failed)
}

// Transient reports whether err, an error of a Store, may pass by
// itself, so that a blocked acquire waits through it (see Distributed,
// Store failures): a timeout (context.DeadlineExceeded, which is also
// how a call past its own deadline ends, or an error in err's chain whose
// Timeout method reports true), a connection that failed (any net.Error,
// such as a refused or reset connection; io.EOF; io.ErrUnexpectedEOF),
// or an error in err's chain whose Transient method reports true, by
// which a Store marks its own (redisstore marks the client's pool
// timeout and Redis's LOADING, BUSY, READONLY, MASTERDOWN, CLUSTERDOWN
// and TRYAGAIN answers). context.Canceled is not: it is the caller's.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var tr interface{ Transient() bool }
	if errors.As(err, &tr) && tr.Transient() {
		return true
	}
	var to interface{ Timeout() bool }
	if errors.As(err, &to) && to.Timeout() {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// waiter is a blocked acquire's wait between attempts: exponential
// backoff with jitter from MinBackoff up to MaxBackoff, cut short by a
// permit released through the same Distributed, by the store's
// notification (on a Notifier) or by the context. It is registered with
// its Distributed from newWaiter until done.
type waiter struct {
	d       *Distributed
	backoff time.Duration
	timer   *time.Timer
	wake    chan struct{} // a notification meant for this waiter
	token   string        // its place in a FairStore's queue; guarded by d.mu
}

func (d *Distributed) newWaiter(token string) *waiter {
	t := time.NewTimer(time.Hour)
	t.Stop()
	w := &waiter{d: d, backoff: d.o.MinBackoff, timer: t, wake: make(chan struct{}, 1), token: token}
	d.mu.Lock()
	d.waiters[w] = struct{}{}
	d.mu.Unlock()
	return w
}

// done unregisters the waiter; the last one stops the watch
// watchLinger later, unless another waiter comes meanwhile.
func (w *waiter) done() {
	w.timer.Stop()
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.waiters, w)
	if len(d.waiters) == 0 && d.watching {
		d.idle++
		gen, idle := d.gen, d.idle
		time.AfterFunc(watchLinger, func() { d.unwatch(gen, idle) })
	}
}

// unwatch stops the watch of generation gen if no waiter has come since
// the departure idle of the last one.
func (d *Distributed) unwatch(gen, idle uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gen == gen && d.idle == idle && d.watching && len(d.waiters) == 0 {
		d.stopWatch()
		d.watching, d.live, d.stopWatch = false, false, nil
	}
}

// setToken records the waiter's new place in the queue.
func (w *waiter) setToken(token string) {
	w.d.mu.Lock()
	w.token = token
	w.d.mu.Unlock()
}

// pause returns the pause before the waiter's next attempt: next's, or,
// once the watch is live, a pause drawn at MaxBackoff. The store then
// names the waiter when room opens (Notifier), so polling is only the
// fallback for a notification lost, which MaxBackoff bounds; polling
// faster would only add refused attempts (at 20 processes sharing a
// semaphore of 50, from 5 ms doubling, about 4 of them per grant).
func (w *waiter) pause() time.Duration {
	if w.d.watchLive() {
		w.backoff = w.d.o.MaxBackoff
	}
	return w.next()
}

// watchLive reports whether the store has confirmed d's watch.
func (d *Distributed) watchLive() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live
}

// next returns the next pause, jittered, and doubles the backoff.
func (w *waiter) next() time.Duration {
	p := w.backoff/2 + rand.N(w.backoff/2+1)
	w.backoff = min(2*w.backoff, w.d.o.MaxBackoff)
	return p
}

// wait blocks for pause, until a permit is freed here or the store says
// one may be, or until ctx ends. It first starts the watch, if the store
// is a Notifier and none runs.
func (w *waiter) wait(ctx context.Context, pause time.Duration) {
	w.d.watch()
	w.timer.Reset(pause)
	select {
	case <-ctx.Done():
	case <-w.d.freed:
	case <-w.wake:
	case <-w.timer.C:
	}
	w.timer.Stop()
}

// poke wakes w without blocking.
func (w *waiter) poke() {
	select {
	case w.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// Notify tells one of d's blocked Acquires that room may have opened, so
// that it asks the store at once instead of at its next poll: for a
// caller that released a permit of d's name through the Store directly
// (a permit detached, as sluice serve's coordination API releases them).
// A Release through a Permit of d needs none. While d's watch of a
// Notifier store is live it does nothing (nor does a Permit's Release):
// the store names the waiter the room is for, and holds the room for it
// a while, so another waiter woken here would only be refused. It never
// blocks, and grants nothing by itself.
func (d *Distributed) Notify() {
	if !d.watchLive() {
		d.wakeOne()
	}
}

// wakeOne wakes one of d's waiters without blocking.
func (d *Distributed) wakeOne() {
	select {
	case d.freed <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// watch starts the watch goroutine if the store is a Notifier, a waiter
// waits, none runs and no failure asks for a pause.
func (d *Distributed) watch() {
	if d.notes == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watching || len(d.waiters) == 0 || time.Now().Before(d.retryAt) {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.gen++
	d.watching, d.live, d.stopWatch = true, false, cancel
	go d.watchRun(ctx, d.gen)
}

// watchRun is the watch goroutine of generation gen: it watches the
// store until ctx is cancelled (the last waiter left) or the watch fails,
// and passes each message on to the waiter it names, or to one waiter.
func (d *Distributed) watchRun(ctx context.Context, gen uint64) {
	c, err := d.notes.Watch(ctx, d.name)
	if err == nil {
		d.mu.Lock()
		if d.gen == gen {
			d.live = true
		}
		// A permit freed before the watch was in place was missed: every
		// waiter asks once more.
		for w := range d.waiters {
			w.poke()
		}
		d.mu.Unlock()
		for m := range c {
			d.noted(m)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gen == gen && d.watching && ctx.Err() == nil {
		// The watch failed: the waiters poll, and one of them tries
		// again later.
		d.stopWatch()
		d.watching, d.live, d.stopWatch = false, false, nil
		d.retryAt = time.Now().Add(max(time.Second, d.o.MaxBackoff))
	}
}

// noted passes on a message of the store: to the waiter first in line
// that it names, if that waiter is here; to one waiter when it names
// none.
func (d *Distributed) noted(head string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if head == "" {
		if len(d.waiters) > 0 { // none while the watch lingers
			d.wakeOne()
		}
		return
	}
	for w := range d.waiters {
		if w.token == head {
			w.poke()
			return
		}
	}
}

// AcquireN waits for a permit of weight n (in arrival order with Fair, or
// once it has waited FairAfter)
// until it is granted, ctx ends or the Store fails; the weights of the
// permits held never add up to more than the limit. It needs a FairStore; n above the
// limit fails at once with ErrExceedsLimit. The Permit must be released.
func (d *Distributed) AcquireN(ctx context.Context, n int64) (*Permit, error) {
	if n == 1 && !d.o.Fair {
		return d.Acquire(ctx)
	}
	fs, err := d.fairStore(n)
	if err != nil {
		return nil, err
	}
	return d.acquireQueued(ctx, fs, n, d.o.Fair)
}

// waitedTooLong reports whether a waiter without Fair that began at since
// has waited FairAfter, and should queue.
func (d *Distributed) waitedTooLong(since time.Time) bool {
	return d.o.FairAfter > 0 && time.Since(since) >= d.o.FairAfter
}

// untilQueue cuts the pause of a waiter without Fair that began at since
// so that it asks again once it has waited FairAfter, and queues then.
func (d *Distributed) untilQueue(since time.Time, pause time.Duration) time.Duration {
	if d.o.FairAfter <= 0 {
		return pause
	}
	return min(pause, max(0, d.o.FairAfter-time.Since(since)))
}

// acquireQueued is AcquireN on fs: queued in arrival order when queue is
// set, or from when it has waited FairAfter.
func (d *Distributed) acquireQueued(ctx context.Context, fs FairStore, n int64, queue bool) (*Permit, error) {
	token := crand.Text()
	w := d.newWaiter(token)
	defer w.done()
	since := time.Now()
	// The store's error at the last attempt, if it failed (see Acquire).
	var failed error
	for {
		if ctx.Err() != nil {
			if failed != nil {
				d.releaseDetached(ctx, token)
			}
			d.dequeue(ctx, fs, token)
			return nil, d.waitEnded(ctx, failed)
		}
		queue = queue || d.waitedTooLong(since)
		sent := time.Now()
		var wait time.Duration
		if queue {
			wait = d.o.QueueTTL
		}
		res, fence, err := fs.AcquireFair(ctx, d.name, token, n, d.limit, d.o.TTL, wait)
		if err != nil && cutOff(ctx, err) {
			d.releaseDetached(ctx, token)
			d.dequeue(ctx, fs, token)
			return nil, d.waitEnded(ctx, failed)
		}
		if err != nil && d.absorb(ctx, err) {
			// As a refusal: keep the token, and the place in line.
			failed = err
			pause := w.pause()
			if !queue {
				pause = d.untilQueue(since, pause)
			}
			w.wait(ctx, pause)
			continue
		}
		if err != nil {
			d.releaseDetached(ctx, token)
			d.dequeue(ctx, fs, token)
			return nil, fmt.Errorf("concurrency: acquire %q: %w", d.name, err)
		}
		failed = nil
		if res == Granted {
			if p := d.newPermit(token, fence, sent); p != nil {
				return p, nil
			}
			// Granted after its validity: give it back, queue again.
			d.releaseDetached(ctx, token)
			token = crand.Text()
			w.setToken(token)
		}
		pause := w.pause()
		if !queue {
			pause = d.untilQueue(since, pause)
		}
		if res == First && queue && !d.watchLive() {
			// First in line, and no watch to be told by: ask at the
			// shortest interval.
			pause, w.backoff = d.o.MinBackoff, d.o.MinBackoff
		}
		w.wait(ctx, pause)
	}
}

// TryAcquireN makes one attempt to take a permit of weight n, granted only
// if nobody waits before it and the weights held leave room; it never
// joins the queue. It needs a FairStore, and returns ErrNoPermit when the
// permit is not granted.
func (d *Distributed) TryAcquireN(ctx context.Context, n int64) (*Permit, error) {
	if n == 1 && !d.o.Fair {
		return d.TryAcquire(ctx)
	}
	fs, err := d.fairStore(n)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("concurrency: acquire %q: %w", d.name, err)
	}
	token := crand.Text()
	sent := time.Now()
	res, fence, err := fs.AcquireFair(ctx, d.name, token, n, d.limit, d.o.TTL, 0)
	if err != nil {
		d.releaseDetached(ctx, token)
		return nil, fmt.Errorf("concurrency: acquire %q: %w", d.name, err)
	}
	if res != Granted {
		return nil, ErrNoPermit
	}
	p := d.newPermit(token, fence, sent)
	if p == nil {
		d.releaseDetached(ctx, token)
		return nil, fmt.Errorf("concurrency: acquire %q: %w: granted after its validity ended", d.name, ErrLost)
	}
	return p, nil
}

// fairStore returns the Store as a FairStore for a permit of weight n, or
// the error that AcquireN and TryAcquireN return.
func (d *Distributed) fairStore(n int64) (FairStore, error) {
	fs, ok := d.backend.(FairStore)
	switch {
	case !ok:
		return nil, fmt.Errorf("concurrency: semaphore %q: its Store serves no weighted permits (not a FairStore)", d.name)
	case n <= 0:
		return nil, fmt.Errorf("concurrency: semaphore %q: weight %d is not positive", d.name, n)
	case n > d.limit:
		return nil, fmt.Errorf("%w: semaphore %q: weight %d above limit %d", ErrExceedsLimit, d.name, n, d.limit)
	}
	return fs, nil
}

// dequeue makes a best-effort, bounded attempt to take token out of the
// queue.
func (d *Distributed) dequeue(ctx context.Context, fs FairStore, token string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.o.RenewEvery)
	defer cancel()
	fs.Dequeue(rctx, d.name, token) //nolint:errcheck // best effort; the place lapses anyway
}

// TryAcquire makes one attempt to take a permit. It returns ErrNoPermit
// when every permit is held (or, on a FairStore, when others wait).
func (d *Distributed) TryAcquire(ctx context.Context) (*Permit, error) {
	if d.o.Fair {
		return d.TryAcquireN(ctx, 1)
	}
	return d.tryAcquire(ctx, crand.Text(), 0)
}

// tryAcquire is one attempt to take a permit of weight 1 under token;
// refused, the store records token as a waiter for wait (see
// Store.Acquire).
func (d *Distributed) tryAcquire(ctx context.Context, token string, wait time.Duration) (*Permit, error) {
	p, serr, err := d.attempt(ctx, token, wait)
	if serr != nil {
		// The request may have added the token before failing: remove it
		// so that it does not hold a slot until it expires.
		d.releaseDetached(ctx, token)
		return nil, fmt.Errorf("concurrency: acquire %q: %w", d.name, serr)
	}
	return p, err
}

// attempt is tryAcquire without the clean-up of a store error, which it
// returns as serr, unwrapped: the permit granted, or serr, or err (the
// refusal ErrNoPermit, ErrLost for a grant after its validity, given
// back, ErrExceedsLimit, or ctx's error before the attempt).
func (d *Distributed) attempt(ctx context.Context, token string, wait time.Duration) (p *Permit, serr, err error) {
	if d.limit <= 0 {
		return nil, nil, fmt.Errorf("%w: semaphore %q has limit %d", ErrExceedsLimit, d.name, d.limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("concurrency: acquire %q: %w", d.name, err)
	}
	sent := time.Now()
	fence, err := d.backend.Acquire(ctx, d.name, token, d.limit, d.o.TTL, wait)
	if err != nil {
		return nil, err, nil
	}
	if fence == 0 {
		return nil, nil, ErrNoPermit
	}
	if p = d.newPermit(token, fence, sent); p == nil {
		// Granted, but the answer came after its validity: give it back.
		d.releaseDetached(ctx, token)
		return nil, nil, fmt.Errorf("concurrency: acquire %q: %w: granted after its validity ended", d.name, ErrLost)
	}
	return p, nil, nil
}

// releaseDetached makes a best-effort, bounded attempt to remove token.
func (d *Distributed) releaseDetached(ctx context.Context, token string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.o.RenewEvery)
	defer cancel()
	d.backend.Release(rctx, d.name, token) //nolint:errcheck // best effort; the permit expires anyway
}

// A Permit is one held unit of a Distributed semaphore. It renews itself in
// a goroutine it owns until Release or until it is lost. Its validity ends
// at a monotonic instant that each successful renewal moves; Err and Lost
// compare it with the clock when called, and a timer (time.AfterFunc)
// closes Lost at that instant even while that goroutine waits for a slow
// renewal.
//
// A Permit is safe for concurrent use.
type Permit struct {
	d     *Distributed
	token string
	fence uint64

	exited chan struct{}      // closed when the renewal goroutine returns
	lost   chan struct{}      // closed when the permit is lost
	cancel context.CancelFunc // called by Release: ends the renewal goroutine

	mu       sync.Mutex
	until    time.Time   // end of validity, on the monotonic clock
	expire   *time.Timer // fires lose at until
	err      error       // nil while held
	released bool
}

// errValidityEnded is the loss of a permit whose validity ended without a
// successful renewal.
var errValidityEnded = fmt.Errorf("%w: validity ended without a successful renewal", ErrLost)

// newPermit starts a permit of the given fence whose validity counts from
// sent, or returns nil if that validity has already ended.
func (d *Distributed) newPermit(token string, fence uint64, sent time.Time) *Permit {
	until := sent.Add(d.o.TTL - d.o.Margin)
	left := time.Until(until)
	if left <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Permit{
		d:      d,
		token:  token,
		fence:  fence,
		exited: make(chan struct{}),
		lost:   make(chan struct{}),
		cancel: cancel,
	}
	p.mu.Lock()
	p.until = until
	p.expire = time.AfterFunc(left, func() { p.lose(errValidityEnded) })
	p.mu.Unlock()
	go p.renew(ctx, sent)
	return p
}

// Token returns the permit's random token, as stored in the Store.
func (p *Permit) Token() string { return p.token }

// Fence returns the permit's fencing token: a number, at least 1, that
// the Store took in the same atomic step as the grant, larger than the
// fence of every permit granted before it of the same semaphore name (see
// Store). It does not change while the permit is held. A protected service
// that refuses any fence lower than the highest it has accepted for the
// name refuses the late requests of a holder that lost its permit to
// another (package fence). A store that loses its data (a Redis restart
// without persistence, a failover to a replica behind it) may grant a
// fence again; such a service then refuses the new holders until their
// fences pass the highest it remembers.
func (p *Permit) Fence() uint64 { return p.fence }

// Lost returns a channel that is closed when the permit is lost; it first
// checks the validity, as Err does, so a channel returned after the
// validity ended is already closed. It is never closed by Release.
func (p *Permit) Lost() <-chan struct{} {
	p.Err()
	return p.lost
}

// Err returns nil while the permit is held, an error wrapping ErrLost once
// it is lost, and ErrReleased after Release (unless it was lost first).
// It compares the end of the permit's validity with the monotonic clock at
// the moment of the call, so it reports the loss as soon as validity has
// ended, whether or not the Permit's timer or renewal goroutine has run.
func (p *Permit) Err() error { return p.errAt(time.Now()) }

// errAt is Err at the instant now.
func (p *Permit) errAt(now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checkLocked(now)
	return p.err
}

// checkLocked loses the permit if its validity has ended at now. p.mu is
// held.
func (p *Permit) checkLocked(now time.Time) {
	if p.err == nil && !now.Before(p.until) {
		p.loseLocked(errValidityEnded)
	}
}

// lose marks the permit lost, once, and closes Lost.
func (p *Permit) lose(cause error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.loseLocked(cause)
}

// loseLocked is lose with p.mu held.
func (p *Permit) loseLocked(cause error) {
	if p.err != nil {
		return
	}
	p.err = cause
	p.expire.Stop()
	close(p.lost)
}

// extend moves the validity to sent+TTL-Margin after a successful renewal
// sent at sent. It reports false if the permit is lost (now or before): a
// renewal answered after the validity ended revives nothing, even if the
// timer has not fired yet.
func (p *Permit) extend(sent time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.checkLocked(now); p.err != nil {
		return false
	}
	if !p.expire.Stop() {
		return false // validity ended; lose has run or is about to
	}
	until := sent.Add(p.d.o.TTL - p.d.o.Margin)
	left := until.Sub(now)
	if left <= 0 {
		p.loseLocked(fmt.Errorf("%w: renewal answered after its validity", ErrLost))
		return false
	}
	p.until = until
	p.expire.Reset(left)
	return true
}

// renew is the permit's goroutine: it renews at RenewEvery (jittered) after
// each successful renewal, retries failed ones sooner, and returns on
// Release or loss.
func (p *Permit) renew(ctx context.Context, lastSent time.Time) {
	defer close(p.exited)
	o := p.d.o
	retry := max(o.RenewEvery/4, time.Millisecond)
	timer := time.NewTimer(time.Until(lastSent.Add(jitter(o.RenewEvery))))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return // released
		case <-p.lost:
			return
		case <-timer.C:
		}
		p.mu.Lock()
		until := p.until
		p.mu.Unlock()
		// A renewal answered after the validity ends is of no use: bound it.
		rctx, cancel := context.WithDeadline(ctx, until)
		sent := time.Now()
		ok, err := p.d.backend.Renew(rctx, p.d.name, p.token, o.TTL)
		cancel()
		switch {
		case ctx.Err() != nil:
			return // released while the renewal was in flight
		case err != nil:
			// Try again soon; the validity timer decides when to give up.
			timer.Reset(jitter(retry))
		case !ok:
			p.lose(fmt.Errorf("%w: the store no longer holds it", ErrLost))
			return
		default:
			if !p.extend(sent) {
				return
			}
			timer.Reset(time.Until(sent.Add(jitter(o.RenewEvery))))
		}
	}
}

// jitter returns d scaled by a random factor in [0.9, 1.1].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d - d/10 + rand.N(d/5+1)
}

// Detach stops the renewals (waiting for one in flight to return) without
// releasing the permit, and returns the end of its validity on this
// process's monotonic clock (see Distributed): the permit stays in the
// Store under Token until it expires, unless whoever Token is handed to
// renews or releases it through the Store (Store.Renew, Store.Release).
// It is how a process acquires a permit for another, as sluice serve
// does for its remote callers, who then renew it themselves. After
// Detach, Err returns ErrDetached (or the loss that came first) and
// Release does nothing; a Permit already released or lost has nothing
// to detach, and Detach returns the zero time.
func (p *Permit) Detach() time.Time {
	p.mu.Lock()
	if p.released {
		p.mu.Unlock()
		return time.Time{}
	}
	p.released = true
	if p.checkLocked(time.Now()); p.err != nil {
		p.mu.Unlock()
		p.cancel()
		<-p.exited
		return time.Time{}
	}
	p.err = ErrDetached
	p.expire.Stop()
	p.mu.Unlock()
	p.cancel()
	<-p.exited
	// A renewal in flight may have moved until before it returned.
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.until
}

// Release stops the renewals (waiting for one in flight to return) and
// removes this permit's token from the store; it never affects another
// holder. It returns the Store's error,
// if any (the permit then expires within one TTL). Calling it again, or
// after the permit was lost, is harmless.
func (p *Permit) Release(ctx context.Context) error {
	p.mu.Lock()
	if p.released {
		p.mu.Unlock()
		return nil
	}
	p.released = true
	if p.checkLocked(time.Now()); p.err == nil {
		p.err = ErrReleased
		p.expire.Stop()
	}
	p.mu.Unlock()
	p.cancel()
	<-p.exited
	ok, err := p.d.backend.Release(ctx, p.d.name, p.token)
	if err != nil {
		return fmt.Errorf("concurrency: release %q: %w", p.d.name, err)
	}
	if ok {
		p.d.mu.Lock()
		live := p.d.live
		p.d.mu.Unlock()
		if !live {
			// Without a watch in place, nothing else wakes a local waiter.
			p.d.wakeOne()
		}
	}
	return nil
}
