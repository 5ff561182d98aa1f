package coord

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/lease"
)

// Defaults of Limits.
const (
	DefaultMaxNameBytes = 256
	DefaultTTL          = 10 * time.Second
	DefaultMinTTL       = 100 * time.Millisecond
	DefaultMaxTTL       = 5 * time.Minute
	DefaultMaxWait      = 10 * time.Second
	DefaultMaxWaiters   = 1000
	DefaultMaxSeen      = 64
)

// MaxLimit is the largest limit a semaphore may have: weights are summed
// in Redis's Lua numbers, exact to 2^53.
const MaxLimit = 1 << 40

// Limits bound what a request may ask. The zero value of a field selects
// its default.
type Limits struct {
	// MaxNameBytes bounds a semaphore's name. Default DefaultMaxNameBytes.
	MaxNameBytes int
	// DefaultTTL is a permit's TTL when a request gives none. Default
	// DefaultTTL.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound a requested TTL: MaxTTL is the longest a
	// crashed holder keeps its permits. Defaults DefaultMinTTL and
	// DefaultMaxTTL.
	MinTTL, MaxTTL time.Duration
	// MaxWait bounds how long an acquire may wait for room; serve keeps
	// it below the HTTP write timeout. Default DefaultMaxWait.
	MaxWait time.Duration
	// MaxWaiters bounds the acquires waiting at once on one semaphore
	// name in this process; one more is refused at once. Default
	// DefaultMaxWaiters.
	MaxWaiters int
	// MaxSeen bounds the names Status shows: the most recently acquired
	// through this process. Default DefaultMaxSeen.
	MaxSeen int

	// The bounds of leases (leases.go). MinTTL and MaxTTL bound a
	// holder's TTL, MaxWait a Watch's wait, MaxNameBytes a service's
	// name.
	//
	// LeaseTTL is a holder's TTL when Join gives none. Default
	// DefaultLeaseTTL, within MinTTL and MaxTTL.
	LeaseTTL time.Duration
	// MaxPartitions and MaxCapacity bound a leased service's partitions
	// and capacity (units a second). Defaults DefaultMaxPartitions and
	// DefaultMaxCapacity.
	MaxPartitions int
	MaxCapacity   float64
	// MaxHolders bounds the holders of one service in this process.
	// Default DefaultMaxHolders.
	MaxHolders int
	// MaxServices bounds the leased services this process keeps (a
	// service's store is kept for the process's life once a holder has
	// joined it). Default DefaultMaxServices.
	MaxServices int
	// MaxWindow bounds the downstream window a holder paces to. Default
	// DefaultMaxWindow.
	MaxWindow time.Duration
}

// Validate returns the error New would return for l: a bound negative or
// out of order.
func (l Limits) Validate() error {
	_, err := l.withDefaults()
	return err
}

// withDefaults returns l with its zero fields set to the defaults, or an
// error naming the first field out of range.
func (l Limits) withDefaults() (Limits, error) {
	if l.MaxNameBytes < 0 || l.DefaultTTL < 0 || l.MinTTL < 0 || l.MaxTTL < 0 || l.MaxWait < 0 || l.MaxWaiters < 0 ||
		l.LeaseTTL < 0 || l.MaxPartitions < 0 || !(l.MaxCapacity >= 0) || math.IsInf(l.MaxCapacity, 0) ||
		l.MaxHolders < 0 || l.MaxServices < 0 || l.MaxWindow < 0 || l.MaxSeen < 0 {
		return l, fmt.Errorf("coord: negative bound in %+v", l)
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if l.MaxNameBytes == 0 {
		l.MaxNameBytes = DefaultMaxNameBytes
	}
	def(&l.MinTTL, DefaultMinTTL)
	def(&l.MaxTTL, DefaultMaxTTL)
	def(&l.DefaultTTL, min(max(DefaultTTL, l.MinTTL), l.MaxTTL))
	def(&l.MaxWait, DefaultMaxWait)
	if l.MaxWaiters == 0 {
		l.MaxWaiters = DefaultMaxWaiters
	}
	if l.MaxSeen == 0 {
		l.MaxSeen = DefaultMaxSeen
	}
	l.leaseDefaults()
	switch {
	case l.MinTTL < time.Millisecond:
		return l, fmt.Errorf("coord: MinTTL %v below 1ms", l.MinTTL)
	case l.MaxTTL < l.MinTTL:
		return l, fmt.Errorf("coord: MaxTTL %v below MinTTL %v", l.MaxTTL, l.MinTTL)
	case l.DefaultTTL < l.MinTTL || l.DefaultTTL > l.MaxTTL:
		return l, fmt.Errorf("coord: DefaultTTL %v outside [%v, %v]", l.DefaultTTL, l.MinTTL, l.MaxTTL)
	case l.LeaseTTL < l.MinTTL || l.LeaseTTL > l.MaxTTL:
		return l, fmt.Errorf("coord: LeaseTTL %v outside [%v, %v]", l.LeaseTTL, l.MinTTL, l.MaxTTL)
	case l.MaxPartitions > MaxPartitions:
		return l, fmt.Errorf("coord: MaxPartitions %d above %d", l.MaxPartitions, MaxPartitions)
	case l.MaxWindow < time.Millisecond:
		return l, fmt.Errorf("coord: MaxWindow %v below 1ms", l.MaxWindow)
	}
	return l, nil
}

// Options configure a Service.
type Options struct {
	// Store holds the permits: serve's concurrency.MemoryStore, or a
	// redisstore.SemaphoreStore when serve runs on Redis. It must be a
	// concurrency.FairStore (weights and fair order). Required.
	Store concurrency.Store
	// Limits bound the requests.
	Limits Limits
	// Leases, if set, opens the lease.Store of a leased service (a
	// lease.MemoryStore, or a redisstore.LeaseStore on serve's Redis):
	// the Service then holds capacity leases for remote holders
	// (leases.go). It is called once per service name, whose store the
	// Service keeps for its life; without it, the lease calls are
	// Unavailable.
	Leases func(service string) (lease.Store, error)
	// Token, when not empty, is the bearer token every call must present
	// (Authorized); empty lets every call through.
	Token string
	// Registerer, if set, registers the Service's metrics:
	// sluice_semaphore_calls_total{method,outcome},
	// sluice_semaphore_waiting, sluice_semaphore_store_errors_waited_total,
	// sluice_lease_calls_total{method,outcome}, sluice_lease_holders and
	// sluice_lease_watches.
	Registerer prometheus.Registerer
}

// A Service hands out permits of distributed semaphores to remote
// callers, on a concurrency.Store: the transports (Register's gRPC
// service; internal/httpapi's routes) decode a request, check
// Authorized, call Acquire, Renew or Release, and translate an *Error.
//
// A permit is acquired through a concurrency.Distributed (one shared by
// the acquires in flight that agree on name, limit, TTL and fairness, so
// that they share one watch of a Notifier store), so the waiting
// (backoff, the store's notifications, the fair queue, leaving it when
// the caller goes) is that package's, and then detached
// (concurrency.Permit.Detach): the Service keeps no state of
// its own about permits, and its caller renews and releases the permit
// by its id, which is the permit's token in the store (crypto/rand.Text:
// 26 base32 characters, 130 random bits). Any replica of serve on the
// same store can therefore renew or release what another granted. The
// only state is that of the acquires in flight: the Distributeds they use
// and the count of those waiting per name (MaxWaiters), which is this
// process's.
//
// A Service is safe for concurrent use. Make one with New; the zero
// value is not usable.
type Service struct {
	store  concurrency.FairStore
	limits Limits
	token  []byte

	closing context.Context // cancelled by Shutdown: the waits end
	shut    context.CancelFunc
	metrics *metrics

	mu      sync.Mutex
	waiting map[string]int        // acquires waiting, per name
	sems    map[semKey]*semaphore // the semaphores acquires use now
	seen    map[string]seenName   // the names acquired lately, at most MaxSeen
	seq     uint64                // counts the acquires, to order seen

	leases *leases // nil without Options.Leases
}

// seenName is a name acquired through the Service: the limit last asked
// for and when (the Service's count of acquires then).
type seenName struct {
	limit int64
	seq   uint64
}

// semKey is what a concurrency.Distributed is made of: acquires that
// agree on it share one, and so one watch of a Notifier store (a Redis
// subscription) between all of them.
type semKey struct {
	name  string
	limit int64
	ttl   time.Duration
	fair  bool
}

// semaphore is a Distributed shared by the acquires of one semKey, with
// how many use it.
type semaphore struct {
	d     *concurrency.Distributed
	users int
}

// New returns a Service, or an error if opts are invalid.
func New(opts Options) (*Service, error) {
	fs, ok := opts.Store.(concurrency.FairStore)
	if !ok {
		return nil, errors.New("coord: a concurrency.FairStore is required")
	}
	l, err := opts.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	closing, shut := context.WithCancel(context.Background())
	s := &Service{store: fs, limits: l, token: []byte(opts.Token), closing: closing, shut: shut,
		waiting: make(map[string]int), sems: make(map[semKey]*semaphore), seen: make(map[string]seenName)}
	if opts.Leases != nil {
		s.leases = &leases{open: opts.Leases, services: make(map[string]*leaseService), holders: make(map[string]*remote)}
	}
	if s.metrics, err = newMetrics(s, opts.Registerer); err != nil {
		shut()
		return nil, err
	}
	return s, nil
}

// Shutdown ends every wait at once and refuses those to come, as
// Unavailable, so that a server draining for shutdown is not held up by
// acquires waiting for room (their callers may ask another replica);
// acquires that do not wait, renewals and releases go on being answered.
// It ends every lease holder, without releasing its leases (their clients
// may use them until the validity they were told; see follow), ends the
// watches, refuses the lease calls to come as Unavailable, and returns
// once the holders' goroutines have (each within a store call's timeout).
func (s *Service) Shutdown() {
	s.shut()
	s.shutdownLeases()
}

// Authorized reports whether a call presenting bearer token may proceed:
// always when the Service has no token, else when token is it (compared
// in constant time).
func (s *Service) Authorized(token string) bool {
	return len(s.token) == 0 || subtle.ConstantTimeCompare([]byte(token), s.token) == 1
}

// A Code classifies an Error; each transport has one answer per Code.
type Code int

// The Codes of Error.
const (
	// Invalid: the request is outside the bounds or malformed.
	Invalid Code = iota
	// NoPermit: no permit was granted within the wait.
	NoPermit
	// TooManyWaiters: MaxWaiters acquires already wait on the name.
	TooManyWaiters
	// NotFound: the permit id holds no permit of the name (expired,
	// released, or never granted).
	NotFound
	// Unavailable: the store failed (for an acquire that waits: failed
	// still when the wait ended; it waits through the failures before),
	// or (for an acquire that would wait) the Service is shutting down.
	Unavailable
	// Gone: the caller's context ended (it went away, or its deadline
	// passed) before an answer.
	Gone
	// TooMany: a lease service has MaxHolders holders already, or this
	// process keeps MaxServices services.
	TooMany
)

// An Error is a refused or failed call: its Code and a message meant for
// the caller.
type Error struct {
	Code Code
	Msg  string
	Err  error // the cause, if any
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// An AcquireRequest asks for a permit.
type AcquireRequest struct {
	Name   string
	Limit  int64
	Weight int64         // 0 means 1
	TTL    time.Duration // 0 means Limits.DefaultTTL
	Wait   time.Duration // 0: one attempt
	Fair   bool
}

// A Grant is a permit acquired.
type Grant struct {
	// PermitID names the permit to Renew and Release.
	PermitID string
	// Fence is the grant's fencing token (concurrency.Permit.Fence).
	Fence uint64
	// ValidFor is how long the permit is valid from when its caller
	// sent the request: counted from when the Service received it (which
	// the caller sent before), to the end of the validity that a
	// concurrency.Permit counts (TTL, less a margin of TTL/50 for clock
	// rates, from the store call that granted it). An acquire that waited
	// W for room is therefore valid for about W + TTL − TTL/50: a caller
	// that adds ValidFor to the instant it sent the request keeps the
	// whole TTL, not what the wait left of it.
	ValidFor time.Duration
}

// validate checks req against the bounds and fills its defaults.
func (s *Service) validate(req *AcquireRequest) error {
	if err := s.checkName(req.Name); err != nil {
		return err
	}
	if req.Limit < 1 || req.Limit > MaxLimit {
		return errorf(Invalid, "limit %d: want 1 to %d", req.Limit, int64(MaxLimit))
	}
	if req.Weight == 0 {
		req.Weight = 1
	}
	if req.Weight < 1 || req.Weight > req.Limit {
		return errorf(Invalid, "weight %d: want 1 to the limit, %d", req.Weight, req.Limit)
	}
	var err error
	if req.TTL, err = s.ttl(req.TTL); err != nil {
		return err
	}
	if req.Wait < 0 || req.Wait > s.limits.MaxWait {
		return errorf(Invalid, "wait %v: want 0 to %v", req.Wait, s.limits.MaxWait)
	}
	return nil
}

// checkName refuses a name that is empty, too long or not UTF-8.
func (s *Service) checkName(name string) error {
	switch {
	case name == "":
		return errorf(Invalid, "name is empty")
	case len(name) > s.limits.MaxNameBytes:
		return errorf(Invalid, "name is %d bytes: at most %d", len(name), s.limits.MaxNameBytes)
	case !utf8.ValidString(name):
		return errorf(Invalid, "name is not valid UTF-8")
	}
	return nil
}

// ttl returns a requested TTL, the default for 0, or the error of one
// out of bounds.
func (s *Service) ttl(ttl time.Duration) (time.Duration, error) {
	if ttl == 0 {
		return s.limits.DefaultTTL, nil
	}
	if ttl < s.limits.MinTTL || ttl > s.limits.MaxTTL {
		return 0, errorf(Invalid, "ttl %v: want %v to %v", ttl, s.limits.MinTTL, s.limits.MaxTTL)
	}
	return ttl, nil
}

// permitIDLen is the length of a permit id: crypto/rand.Text's.
const permitIDLen = 26

// checkID refuses what cannot be a permit id or a holder id (field names
// which): anything but 26 characters of crypto/rand.Text's base32
// alphabet.
func checkID(field, id string) error {
	if len(id) != permitIDLen {
		return errorf(Invalid, "%s is %d bytes: want the %d characters the server returned", field, len(id), permitIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < 'A' || c > 'Z') && (c < '2' || c > '7') {
			return errorf(Invalid, "%s has a byte %q outside its alphabet (A-Z, 2-7)", field, c)
		}
	}
	return nil
}

// Acquire grants a permit of req.Weight units of req.Name, waiting up to
// req.Wait for room (and no longer than ctx). A caller whose ctx ends
// while it waits, or before the grant is handed over, holds nothing: its
// place in the queue is left and a permit granted meanwhile is released.
// (An answer lost on its way back is not seen here: that permit lapses
// within its TTL.)
func (s *Service) Acquire(ctx context.Context, req AcquireRequest) (g Grant, err error) {
	received := time.Now()
	defer func() { s.metrics.count("acquire", err) }()
	if err := s.validate(&req); err != nil {
		return Grant{}, err
	}
	key := semKey{name: req.Name, limit: req.Limit, ttl: req.TTL, fair: req.Fair}
	d, err := s.use(key, req.Wait > 0)
	if err != nil {
		return Grant{}, err
	}
	defer s.done(key, req.Wait > 0)
	var p *concurrency.Permit
	// The store's error may be the wait's end: a Redis call cut off near
	// its deadline (a context.DeadlineExceeded, which may come a little
	// before the deadline itself, or a network timeout at the deadline,
	// before the context says it is done).
	waitOver := false
	if req.Wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, req.Wait)
		stop := context.AfterFunc(s.closing, cancel)
		p, err = d.AcquireN(wctx, req.Weight)
		stop()
		dl, _ := wctx.Deadline()
		waitOver = !time.Now().Before(dl) || errors.Is(err, context.DeadlineExceeded)
		cancel()
	} else {
		p, err = d.TryAcquireN(ctx, req.Weight)
	}
	switch {
	case ctx.Err() != nil:
		if p != nil {
			s.releaseLate(ctx, p)
		}
		return Grant{}, &Error{Code: Gone, Msg: "the caller went away before the permit was granted", Err: ctx.Err()}
	case err == nil:
	case req.Wait > 0 && s.closing.Err() != nil:
		return Grant{}, errorf(Unavailable, "semaphore %q: this server is shutting down: ask another", req.Name)
	case errors.Is(err, concurrency.ErrStoreFailing):
		// The store failed at the wait's last attempt (it waited through
		// those before): no answer on the permits, rather than none free.
		return Grant{}, &Error{Code: Unavailable, Msg: fmt.Sprintf("semaphore %q: the semaphore store was failing when the wait (%v) ended", req.Name, req.Wait), Err: err}
	case errors.Is(err, concurrency.ErrNoPermit), waitOver:
		return Grant{}, errorf(NoPermit, "semaphore %q: no permit of weight %d within the wait (%v) under limit %d", req.Name, req.Weight, req.Wait, req.Limit)
	case errors.Is(err, context.DeadlineExceeded): // the caller's deadline, about to pass
		return Grant{}, &Error{Code: Gone, Msg: "the caller's deadline passed before the permit was granted", Err: err}
	default:
		return Grant{}, &Error{Code: Unavailable, Msg: "the semaphore store failed", Err: err}
	}
	until := p.Detach()
	if time.Until(until) > 0 {
		return Grant{PermitID: p.Token(), Fence: p.Fence(), ValidFor: until.Sub(received)}, nil
	}
	// Its validity ended between the grant and now (a process paused):
	// give it back rather than hand over a permit already lost.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = s.store.Release(rctx, req.Name, p.Token()) // best effort: it lapses anyway
	return Grant{}, errorf(Unavailable, "semaphore %q: the permit's validity ended before it could be handed over", req.Name)
}

// releaseLate releases p, granted to a caller that has gone, in a
// bounded call that outlives ctx.
func (s *Service) releaseLate(ctx context.Context, p *concurrency.Permit) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = p.Release(rctx) // best effort: the permit lapses within its TTL anyway
}

// use returns the Distributed of key for an acquire, made if none is in
// use, and counts the acquire among key.name's waiters when it waits,
// unless MaxWaiters already do. Each use is ended by done.
func (s *Service) use(key semKey, waits bool) (*concurrency.Distributed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if waits && s.waiting[key.name] >= s.limits.MaxWaiters {
		return nil, errorf(TooManyWaiters, "semaphore %q: too many acquires wait on it already (at most %d at once)", key.name, s.limits.MaxWaiters)
	}
	s.see(key.name, key.limit)
	sem := s.sems[key]
	if sem == nil {
		d, err := concurrency.NewDistributed(s.store, key.name, key.limit, concurrency.DistributedOptions{TTL: key.ttl, Fair: key.fair, OnStoreError: s.metrics.storeError})
		if err != nil { // the bounds keep the options valid
			return nil, &Error{Code: Invalid, Msg: "semaphore options", Err: err}
		}
		sem = &semaphore{d: d}
		s.sems[key] = sem
	}
	sem.users++
	if waits {
		s.waiting[key.name]++
	}
	return sem.d, nil
}

// see records an acquire of name under limit among the names Status
// shows, forgetting the least recently acquired beyond MaxSeen. s.mu is
// held.
func (s *Service) see(name string, limit int64) {
	s.seq++
	s.seen[name] = seenName{limit: limit, seq: s.seq}
	if len(s.seen) <= s.limits.MaxSeen {
		return
	}
	oldest, at := "", s.seq
	for n, sn := range s.seen {
		if sn.seq < at {
			oldest, at = n, sn.seq
		}
	}
	delete(s.seen, oldest)
}

// done ends a use of key's Distributed: the last one forgets it.
func (s *Service) done(key semKey, waited bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sem := s.sems[key]
	if sem.users--; sem.users == 0 {
		delete(s.sems, key)
	}
	if waited {
		if s.waiting[key.name]--; s.waiting[key.name] == 0 {
			delete(s.waiting, key.name)
		}
	}
}

// waitingTotal returns the number of acquires waiting in this process.
func (s *Service) waitingTotal() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.waiting {
		n += w
	}
	return n
}

// Waiting returns the number of acquires waiting on name in this process.
func (s *Service) Waiting(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting[name]
}

// Renew moves the expiry of permit id of name to ttl from now (0: the
// default TTL) and returns how long it is valid from when the caller sent
// the request. A permit that expired, was released or never existed is
// NotFound: renewal never creates one.
func (s *Service) Renew(ctx context.Context, name, id string, ttl time.Duration) (valid time.Duration, err error) {
	defer func() { s.metrics.count("renew", err) }()
	if err := s.checkPermit(name, id); err != nil {
		return 0, err
	}
	ttl, err = s.ttl(ttl)
	if err != nil {
		return 0, err
	}
	sent := time.Now()
	ok, err := s.store.Renew(ctx, name, id, ttl)
	if err != nil {
		return 0, s.storeError(ctx, err)
	}
	if !ok {
		return 0, errorf(NotFound, "semaphore %q holds no permit with this id: it expired or was released", name)
	}
	return max(ttl-ttl/50-time.Since(sent), 0), nil
}

// Release gives permit id of name back. One that is not held (expired,
// released before, or never granted) is NotFound.
func (s *Service) Release(ctx context.Context, name, id string) (err error) {
	defer func() { s.metrics.count("release", err) }()
	if err := s.checkPermit(name, id); err != nil {
		return err
	}
	ok, err := s.store.Release(ctx, name, id)
	if err != nil {
		return s.storeError(ctx, err)
	}
	if !ok {
		return errorf(NotFound, "semaphore %q holds no permit with this id: it expired or was released", name)
	}
	s.notify(name)
	return nil
}

// notify wakes a waiter of name in this process, in each Distributed of
// the name in use, so that a permit released here is taken at once rather
// than at the next poll (a MemoryStore notifies nobody; a Notifier store
// tells the waiters of every process besides).
func (s *Service) notify(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, sem := range s.sems {
		if k.name == name {
			sem.d.Notify()
		}
	}
}

func (s *Service) checkPermit(name, id string) error {
	if err := s.checkName(name); err != nil {
		return err
	}
	return checkID("permit_id", id)
}

// storeError is the Error of a store call that failed under ctx.
func (s *Service) storeError(ctx context.Context, err error) *Error {
	if ctx.Err() != nil {
		return &Error{Code: Gone, Msg: "the caller went away", Err: ctx.Err()}
	}
	return &Error{Code: Unavailable, Msg: "the semaphore store failed", Err: err}
}
