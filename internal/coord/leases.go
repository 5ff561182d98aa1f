package coord

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/lease"
)

// Defaults of the lease bounds of Limits.
const (
	DefaultLeaseTTL      = lease.DefaultTTL
	DefaultMaxPartitions = 1024
	DefaultMaxCapacity   = 1e9
	DefaultMaxHolders    = 1000
	DefaultMaxServices   = 1000
	DefaultMaxWindow     = time.Hour
	// MaxPartitions bounds Limits.MaxPartitions (the wire's partitions
	// are 32-bit).
	MaxPartitions = 1 << 20
	// MaxWeight bounds a holder's weight.
	MaxWeight = 1000
	// MaxBacklog bounds a stated backlog: exact in a float64.
	MaxBacklog = 1 << 53
)

// leaseLimits are the lease bounds of l with their defaults; l's fields
// are already checked not negative.
func (l *Limits) leaseDefaults() {
	if l.LeaseTTL == 0 {
		l.LeaseTTL = min(max(DefaultLeaseTTL, l.MinTTL), l.MaxTTL)
	}
	if l.MaxPartitions == 0 {
		l.MaxPartitions = DefaultMaxPartitions
	}
	if l.MaxCapacity == 0 {
		l.MaxCapacity = DefaultMaxCapacity
	}
	if l.MaxHolders == 0 {
		l.MaxHolders = DefaultMaxHolders
	}
	if l.MaxServices == 0 {
		l.MaxServices = DefaultMaxServices
	}
	if l.MaxWindow == 0 {
		l.MaxWindow = DefaultMaxWindow
	}
}

// A JoinRequest makes a holder of a leased service.
type JoinRequest struct {
	// Service names the downstream whose capacity is shared; its holders
	// share the partitions of one lease.Store.
	Service string
	// Capacity is the downstream's limit C in units a second, cut into
	// Partitions; every holder of Service must give the same.
	Capacity   float64
	Partitions int
	// TTL is the holder's: it must state its demand (Demand) at least
	// this often, and a lease it no longer renews is free for the others
	// within it. 0 means Limits.LeaseTTL.
	TTL time.Duration
	// Weight is the holder's relative share; 0 means 1.
	Weight float64
	// Window is the downstream's counting window, which the holder paces
	// to; 0 means one second.
	Window time.Duration
	// Rate and Backlog are the holder's first stated demand (see
	// DemandRequest).
	Rate    float64
	Backlog int64
}

// A DemandRequest is a holder's heartbeat: it states its demand, renews
// its liveness and acknowledges the version of the last answer it saw.
type DemandRequest struct {
	Service  string
	HolderID string
	// Rate is the units a second arriving at the holder; Backlog the
	// units it holds back for want of rate (lease.Holder.SetDemand).
	Rate    float64
	Backlog int64
	// Version is that of the last answer the holder saw (0: none): what
	// it gave up by then may be released to the others at once.
	Version uint64
}

// A LeaseGrant is what a holder may use now: the Service's answer to
// every call but Leave.
type LeaseGrant struct {
	// HolderID names the holder in Demand, Watch and Leave. It is the
	// holder: keep it secret.
	HolderID string
	// Version grows with every change of what follows but ValidFor,
	// which is counted at the answer.
	Version uint64
	// Rate is the capacity of the holder's valid leases, in units a
	// second.
	Rate float64
	// PaceRate and Burst are the token bucket to pace with (rate and burst;
	// new capacity starts empty), so that no window of Window receives
	// more than Rate's share: lease.Allowance.
	PaceRate float64
	Burst    int
	Window   time.Duration
	// ValidFor is how long the holder may use Rate: from when it sent
	// the request (Join, Demand) or received the answer (Watch). Past it,
	// without a newer answer, it sends nothing.
	ValidFor time.Duration
	// Leases are the partitions held and their epochs (fencing tokens
	// per partition).
	Leases []lease.Grant
}

// A remote is a holder that the Service runs for a remote client: its
// lease.Holder, whose Run is the Service's goroutine, and what its
// answers were.
type remote struct {
	id, service string
	ttl         time.Duration
	h           *lease.Holder
	stop        context.CancelFunc
	done        chan struct{} // closed when Run and follow have returned
	store       lease.Store   // the service's, unwrapped

	mu       sync.Mutex
	beat     time.Time // when the last heartbeat (Join, Demand) arrived
	ver      uint64
	al       lease.Allowance // the allowance of ver
	leases   []lease.Grant
	changed  chan struct{} // closed when ver grows or the holder ends
	ended    bool
	keep     bool // stop without releasing (silent, shutdown)
	leaving  bool // Leave: releases pass through
	seen     uint64
	pending  []pending // releases held until the client has seen them
	callTime time.Duration
	// The demand stated last: its rate, its backlog and whether one was
	// held back.
	rate       float64
	backlog    int64
	backlogged bool
	// joined is when the holder joined, seq its join's number among this
	// process's (the status lists the latest first); weight its share.
	joined time.Time
	seq    uint64
	weight float64
}

// pending is a release the Holder made that its client may not have seen
// yet: sent to the store once the client acknowledges ver, else left to
// expire in the store by itself (at the latest at until).
type pending struct {
	leases []lease.Grant
	ver    uint64
	until  time.Time
}

// A leaseService is a leased service as this process sees it: its store,
// kept for the process's life (epochs only grow; a silent holder's leases
// stay in it until they expire), the capacity its holders share, and how
// many there are now.
type leaseService struct {
	store      lease.Store
	capacity   float64
	partitions int
	holders    int
	// seq is the number of the last join of the service (the status lists
	// the latest first); remotes its holders now, by holder id.
	seq     uint64
	remotes map[string]*remote
}

// leases is the Service's lease state.
type leases struct {
	open     func(service string) (lease.Store, error)
	mu       sync.Mutex
	services map[string]*leaseService
	holders  map[string]*remote
	seq      uint64         // counts the joins, to order the status
	wg       sync.WaitGroup // the holders' goroutines
	watches  atomic.Int64   // Watch and Stream calls waiting on a holder
}

// checkService refuses a service name that is empty, too long, not UTF-8
// or holds a brace (Redis's hash tag, refused on every store alike).
func (s *Service) checkService(name string) error {
	if err := s.checkName(name); err != nil {
		return errorf(Invalid, "service %s", strings.TrimPrefix(err.Error(), "name "))
	}
	if strings.ContainsAny(name, "{}") {
		return errorf(Invalid, "service name has a brace ('{' or '}')")
	}
	return nil
}

// checkDemand refuses a rate or backlog out of bounds.
func (s *Service) checkDemand(rate float64, backlog int64) error {
	if !(rate >= 0) || rate > s.limits.MaxCapacity*1000 {
		return errorf(Invalid, "rate %v: want 0 to %v units a second", rate, s.limits.MaxCapacity*1000)
	}
	if backlog < 0 || backlog > MaxBacklog {
		return errorf(Invalid, "backlog %d: want 0 to %d", backlog, int64(MaxBacklog))
	}
	return nil
}

// validateJoin checks req against the bounds and fills its defaults.
func (s *Service) validateJoin(req *JoinRequest) error {
	if s.leases == nil {
		return errorf(Unavailable, "this server holds no leases")
	}
	if err := s.checkService(req.Service); err != nil {
		return err
	}
	if !(req.Capacity > 0) || req.Capacity > s.limits.MaxCapacity {
		return errorf(Invalid, "capacity %v: want above 0 and at most %v units a second", req.Capacity, s.limits.MaxCapacity)
	}
	if req.Partitions < 1 || req.Partitions > s.limits.MaxPartitions {
		return errorf(Invalid, "partitions %d: want 1 to %d", req.Partitions, s.limits.MaxPartitions)
	}
	if req.TTL == 0 {
		req.TTL = s.limits.LeaseTTL
	} else if req.TTL < s.limits.MinTTL || req.TTL > s.limits.MaxTTL {
		return errorf(Invalid, "ttl %v: want %v to %v", req.TTL, s.limits.MinTTL, s.limits.MaxTTL)
	}
	if req.Weight == 0 {
		req.Weight = 1
	}
	if !(req.Weight > 0) || req.Weight > MaxWeight {
		return errorf(Invalid, "weight %v: want above 0 and at most %d", req.Weight, MaxWeight)
	}
	if req.Window == 0 {
		req.Window = lease.DefaultWindow
	}
	if req.Window < time.Millisecond || req.Window > s.limits.MaxWindow {
		return errorf(Invalid, "window %v: want 1ms to %v", req.Window, s.limits.MaxWindow)
	}
	return s.checkDemand(req.Rate, req.Backlog)
}

// Join makes a holder of req.Service for a remote client and starts its
// lease.Holder; it returns the holder's id and its first answer (no
// leases yet: they come within a round trip to the store, through Watch).
func (s *Service) Join(ctx context.Context, req JoinRequest) (g LeaseGrant, err error) {
	defer func() { s.metrics.countLease("join", err) }()
	if err := s.validateJoin(&req); err != nil {
		return LeaseGrant{}, err
	}
	if s.closing.Err() != nil {
		return LeaseGrant{}, errorf(Unavailable, "this server is shutting down: join another")
	}
	ls := s.leases
	ls.mu.Lock()
	defer ls.mu.Unlock()
	svc := ls.services[req.Service]
	switch {
	case s.closing.Err() != nil: // again under ls.mu: shutdownLeases ends every holder made before it looks
		return LeaseGrant{}, errorf(Unavailable, "this server is shutting down: join another")
	case svc == nil && len(ls.services) >= s.limits.MaxServices:
		return LeaseGrant{}, errorf(TooMany, "service %q: this server already keeps %d leased services (at most %d)", req.Service, len(ls.services), s.limits.MaxServices)
	case svc == nil:
		st, err := ls.open(req.Service)
		if err != nil {
			return LeaseGrant{}, &Error{Code: Unavailable, Msg: "opening the lease store", Err: err}
		}
		svc = &leaseService{store: st, remotes: map[string]*remote{}}
		ls.services[req.Service] = svc
	case svc.holders > 0 && (svc.capacity != req.Capacity || svc.partitions != req.Partitions):
		return LeaseGrant{}, errorf(Invalid, "service %q is shared as capacity %v in %d partitions by its holders: join with the same", req.Service, svc.capacity, svc.partitions)
	case svc.holders >= s.limits.MaxHolders:
		return LeaseGrant{}, errorf(TooMany, "service %q: %d holders already (at most %d per service)", req.Service, svc.holders, s.limits.MaxHolders)
	}
	member := make([]byte, 8)
	_, _ = rand.Read(member)
	now := time.Now()
	ls.seq++
	r := &remote{id: rand.Text(), service: req.Service, ttl: req.TTL, store: svc.store,
		done: make(chan struct{}), changed: make(chan struct{}), beat: now, rate: req.Rate, backlog: req.Backlog, backlogged: req.Backlog > 0,
		joined: now, seq: ls.seq, weight: req.Weight}
	var st lease.Store = &remoteStore{Store: svc.store, r: r}
	if n, ok := svc.store.(lease.Notifier); ok {
		st = &remoteNotifier{remoteStore: st.(*remoteStore), n: n}
	}
	// The member's id in the store is not the holder id: the store's
	// views (and the dashboard) show member ids, and the holder id is a
	// capability.
	h, err := lease.NewHolder(st, lease.Options{ID: "remote-" + hex.EncodeToString(member),
		Capacity: req.Capacity, Partitions: req.Partitions, Weight: req.Weight, TTL: req.TTL, Window: req.Window})
	if err != nil {
		return LeaseGrant{}, &Error{Code: Invalid, Msg: "lease options", Err: err}
	}
	h.SetDemand(req.Rate, int(req.Backlog))
	r.h, r.callTime = h, h.Options().CallTimeout
	svc.capacity, svc.partitions = req.Capacity, req.Partitions
	svc.holders++
	svc.seq = r.seq
	svc.remotes[r.id] = r
	ls.holders[r.id] = r
	r.refresh(time.Now()) // version 1
	first := r.answer(time.Now())
	run, stop := context.WithCancel(context.Background())
	r.stop = stop
	ls.wg.Add(1)
	go func() {
		defer ls.wg.Done()
		var wg sync.WaitGroup
		wg.Go(func() { _ = h.Run(run) })
		s.follow(run, r)
		stop()
		wg.Wait()
		close(r.done)
	}()
	return first, nil
}

// holder returns the holder of id in service, or the error to answer.
func (s *Service) holder(service, id string) (*remote, error) {
	if s.leases == nil {
		return nil, errorf(Unavailable, "this server holds no leases")
	}
	if err := s.checkService(service); err != nil {
		return nil, err
	}
	if err := checkID("holder_id", id); err != nil {
		return nil, err
	}
	if s.closing.Err() != nil {
		return nil, errorf(Unavailable, "this server is shutting down: join another")
	}
	s.leases.mu.Lock()
	r := s.leases.holders[id]
	s.leases.mu.Unlock()
	if r == nil || r.service != service {
		return nil, errorf(NotFound, "service %q has no holder with this id here: it left, went silent for longer than its TTL, or joined another server", service)
	}
	return r, nil
}

// Demand states a holder's demand, renews its liveness and acknowledges
// the version it saw; it returns the holder's current answer.
func (s *Service) Demand(ctx context.Context, req DemandRequest) (g LeaseGrant, err error) {
	defer func() { s.metrics.countLease("demand", err) }()
	r, err := s.holder(req.Service, req.HolderID)
	if err != nil {
		return LeaseGrant{}, err
	}
	if err := s.checkDemand(req.Rate, req.Backlog); err != nil {
		return LeaseGrant{}, err
	}
	now := time.Now()
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return LeaseGrant{}, errorf(NotFound, "service %q has no holder with this id here: it ended", req.Service)
	}
	r.beat = now
	// A round at once only when the demand changed in what decides the
	// need: its rate, or whether a backlog is held back (any backlog asks
	// for every partition). A backlog that only shrinks waits for the
	// period's round, so that heartbeats do not double the store's calls.
	wake := req.Rate != r.rate || (req.Backlog > 0) != r.backlogged
	r.rate, r.backlog, r.backlogged = req.Rate, req.Backlog, req.Backlog > 0
	r.mu.Unlock()
	r.h.SetDemand(req.Rate, int(req.Backlog))
	if wake {
		r.h.Wake()
	}
	r.ack(ctx, req.Version)
	return r.answer(now), nil
}

// Watch answers once the holder's version differs from version (at once
// when it already does), or after wait with the answer as it is then; a
// long poll, with version acknowledged as Demand's. wait is bounded by
// Limits.MaxWait, and the call ends with ctx and with the holder.
func (s *Service) Watch(ctx context.Context, service, id string, version uint64, wait time.Duration) (g LeaseGrant, err error) {
	defer func() { s.metrics.countLease("watch", err) }()
	if wait < 0 || wait > s.limits.MaxWait {
		return LeaseGrant{}, errorf(Invalid, "wait %v: want 0 to %v", wait, s.limits.MaxWait)
	}
	r, err := s.holder(service, id)
	if err != nil {
		return LeaseGrant{}, err
	}
	r.ack(ctx, version)
	s.leases.watches.Add(1)
	defer s.leases.watches.Add(-1)
	tm := time.NewTimer(wait)
	defer tm.Stop()
	for {
		r.mu.Lock()
		ver, ended, changed := r.ver, r.ended, r.changed
		r.mu.Unlock()
		switch {
		case ended:
			return LeaseGrant{}, s.endedError(service)
		case ver != version:
			return r.answer(time.Now()), nil
		}
		select {
		case <-changed:
		case <-tm.C:
			return r.answer(time.Now()), nil
		case <-ctx.Done():
			return LeaseGrant{}, &Error{Code: Gone, Msg: "the caller went away", Err: ctx.Err()}
		case <-s.closing.Done():
			return LeaseGrant{}, errorf(Unavailable, "this server is shutting down: join another")
		}
	}
}

// Stream sends the holder's answer at once, then each time its version
// changes, until ctx ends, send fails or the holder ends (then the error
// says why). Unlike Watch it acknowledges nothing: a stream's client
// acknowledges with Demand's version.
func (s *Service) Stream(ctx context.Context, service, id string, send func(LeaseGrant) error) (err error) {
	defer func() { s.metrics.countLease("stream", err) }()
	r, err := s.holder(service, id)
	if err != nil {
		return err
	}
	s.leases.watches.Add(1)
	defer s.leases.watches.Add(-1)
	var sent uint64
	first := true
	for {
		r.mu.Lock()
		ver, ended, changed := r.ver, r.ended, r.changed
		r.mu.Unlock()
		if ended {
			return s.endedError(service)
		}
		if first || ver != sent {
			first, sent = false, ver
			if err := send(r.answer(time.Now())); err != nil {
				return &Error{Code: Gone, Msg: "sending to the caller", Err: err}
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return &Error{Code: Gone, Msg: "the caller went away", Err: ctx.Err()}
		case <-s.closing.Done():
			return errorf(Unavailable, "this server is shutting down: join another")
		}
	}
}

// endedError is the error of a call on a holder that ended meanwhile.
func (s *Service) endedError(service string) *Error {
	if s.closing.Err() != nil {
		return errorf(Unavailable, "this server is shutting down: join another")
	}
	return errorf(NotFound, "service %q: the holder ended (it left, or went silent for longer than its TTL)", service)
}

// Leave ends a holder: its leases are released and its presence removed,
// for the others to take at once. The client must have stopped using
// them.
func (s *Service) Leave(ctx context.Context, service, id string) (err error) {
	defer func() { s.metrics.countLease("leave", err) }()
	r, err := s.holder(service, id)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return s.endedError(service)
	}
	r.leaving = true
	held := r.pending
	r.pending = nil
	r.mu.Unlock()
	// What was held back for the client to see goes back now too.
	for _, p := range held {
		r.release(ctx, p.leases)
	}
	s.end(r, false)
	select {
	case <-r.done: // Run has released and left, within a call's timeout
	case <-ctx.Done():
		return &Error{Code: Gone, Msg: "the caller went away", Err: ctx.Err()}
	}
	return nil
}

// end ends r's holder, keeping its leases in the store (to expire there)
// when keep, and forgets it.
func (s *Service) end(r *remote, keep bool) {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return
	}
	r.ended, r.keep = true, keep
	close(r.changed)
	r.mu.Unlock()
	r.stop()
	ls := s.leases
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.holders[r.id] == r {
		delete(ls.holders, r.id)
		svc := ls.services[r.service]
		svc.holders--
		delete(svc.remotes, r.id)
	}
}

// follow keeps r's answer equal to its Holder's allowance, growing the
// version with every change, and ends the holder when its client has been
// silent for longer than its TTL, until ctx is done.
//
// A silent holder is stopped without releasing its leases, nor leaving:
// its client may be cut off from this server rather than dead, and still
// sending at the rate it was told until the validity it was told, which
// the leases' expiry in the store outlasts (by the drift and half the
// margin, lease.Options.Margin: the time for a unit admitted at the
// deadline to be used). A release would hand the partitions to another
// holder at once, while the silent one may still use them. So they expire
// in the store by themselves, within the TTL of their last renewal, and
// the others take them then.
func (s *Service) follow(ctx context.Context, r *remote) {
	horizon := time.NewTimer(time.Hour)
	defer horizon.Stop()
	silence := time.NewTimer(r.ttl)
	defer silence.Stop()
	for {
		now := time.Now()
		al := r.refresh(now)
		if !al.Deadline.IsZero() {
			horizon.Reset(max(time.Millisecond, al.Deadline.Sub(now)))
		}
		select {
		case <-ctx.Done():
			return
		case <-al.Changed:
		case <-horizon.C:
		case <-silence.C:
			r.mu.Lock()
			left := time.Until(r.beat.Add(r.ttl))
			r.mu.Unlock()
			if left <= 0 {
				s.end(r, true)
				return
			}
			silence.Reset(left)
		}
	}
}

// refresh takes the Holder's allowance at now and, when it differs from
// the last answer's, makes it the answer of the next version; it returns
// the allowance.
func (r *remote) refresh(now time.Time) lease.Allowance {
	al := r.h.AllowanceAt(now)
	var gs []lease.Grant
	for _, l := range r.h.LeasesAt(now) {
		gs = append(gs, l.Grant)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return al
	}
	old := r.al
	if r.ver == 0 || al.Rate != old.Rate || al.Limit != old.Limit || al.Burst != old.Burst ||
		al.Window != old.Window || !al.Deadline.Equal(old.Deadline) || !slices.Equal(gs, r.leases) {
		r.ver++
		r.al, r.leases = al, gs
		close(r.changed)
		r.changed = make(chan struct{})
	}
	return al
}

// answer returns the answer of r's current version at now: its validity
// is what is left of the leases' and of the holder's liveness (its last
// heartbeat and TTL), less TTL/50 for the answer's transit (a client of
// Watch counts it from when it receives it).
func (r *remote) answer(now time.Time) LeaseGrant {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := LeaseGrant{HolderID: r.id, Version: r.ver, Window: r.al.Window, Leases: slices.Clone(r.leases)}
	if r.al.Deadline.IsZero() {
		return g
	}
	until := r.al.Deadline
	if live := r.beat.Add(r.ttl); live.Before(until) {
		until = live
	}
	if v := until.Sub(now) - r.ttl/50; v > 0 {
		g.Rate, g.PaceRate, g.Burst, g.ValidFor = r.al.Rate, r.al.Limit, r.al.Burst, v
	}
	return g
}

// ack records that r's client has seen version ver, and sends the
// releases it has thereby seen to the store.
func (r *remote) ack(ctx context.Context, ver uint64) {
	now := time.Now()
	r.mu.Lock()
	if ver > r.ver { // a version not handed out: acknowledges nothing
		ver = 0
	}
	r.seen = max(r.seen, ver)
	var due [][]lease.Grant
	kept := r.pending[:0]
	for _, p := range r.pending {
		switch {
		case p.ver <= r.seen:
			due = append(due, p.leases)
		case now.Before(p.until):
			kept = append(kept, p)
		}
	}
	r.pending = kept
	r.mu.Unlock()
	for _, gs := range due {
		r.release(ctx, gs)
	}
}

// release sends a release to the store in a bounded call that outlives
// ctx; a failure leaves the leases to expire.
func (r *remote) release(ctx context.Context, gs []lease.Grant) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.callTime)
	defer cancel()
	_ = r.store.Release(cctx, r.h.ID(), gs)
}

// A remoteStore is the store a remote holder's Holder sees: the service's,
// except that a release is held back until the client has seen the answer
// without those leases (the Holder stops using them at once, but its
// client learns it only from the next answer, a transit later; released
// at once, they could be leased to another while the client still sends
// at the old rate), and that a holder stopped for silence or shutdown
// releases nothing and does not leave (see follow).
type remoteStore struct {
	lease.Store
	r *remote
}

func (s *remoteStore) Release(ctx context.Context, id string, gs []lease.Grant) error {
	r := s.r
	r.mu.Lock()
	leaving, keep := r.leaving, r.keep
	r.mu.Unlock()
	switch {
	case keep:
		return nil
	case leaving:
		return s.Store.Release(ctx, id, gs)
	}
	// The Holder has stopped using gs: make the version that says so.
	now := time.Now()
	r.refresh(now)
	r.mu.Lock()
	if r.seen < r.ver {
		r.pending = append(r.pending, pending{leases: slices.Clone(gs), ver: r.ver, until: now.Add(r.ttl)})
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	return s.Store.Release(ctx, id, gs)
}

func (s *remoteStore) Leave(ctx context.Context, id string) error {
	s.r.mu.Lock()
	keep := s.r.keep
	s.r.mu.Unlock()
	if keep {
		return nil
	}
	return s.Store.Leave(ctx, id)
}

// remoteNotifier is a remoteStore on a lease.Notifier store.
type remoteNotifier struct {
	*remoteStore
	n lease.Notifier
}

func (s *remoteNotifier) Watch(ctx context.Context) (<-chan string, error) { return s.n.Watch(ctx) }

// LeaseHolders returns the number of remote lease holders this process runs.
func (s *Service) LeaseHolders() int {
	if s.leases == nil {
		return 0
	}
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	return len(s.leases.holders)
}

// LeaseWatches returns the long polls (Watch) and streams (Stream) in
// this process waiting on a holder's next answer.
func (s *Service) LeaseWatches() int64 {
	if s.leases == nil {
		return 0
	}
	return s.leases.watches.Load()
}

// shutdownLeases ends every holder without releasing (as a silent one:
// their clients may go on until the validity they were told), and waits
// for their goroutines.
func (s *Service) shutdownLeases() {
	ls := s.leases
	if ls == nil {
		return
	}
	ls.mu.Lock()
	all := make([]*remote, 0, len(ls.holders))
	for _, r := range ls.holders {
		all = append(all, r)
	}
	ls.mu.Unlock()
	for _, r := range all {
		s.end(r, true)
	}
	ls.wg.Wait()
}

// LeaseStatus returns the leased services this process runs remote
// holders for at now: at most Limits.MaxSeen of them, the most recently
// joined first, each with its capacity, its number of holders and at most
// MaxSeen of them, the most recently joined first. It shows a holder by
// its member id in the store, never by its holder id (a capability), and
// reads nothing from the store: what it shows is what this process keeps
// for the holders' answers.
func (s *Service) LeaseStatus(now time.Time) []dashboard.LeasedService {
	out := []dashboard.LeasedService{}
	ls := s.leases
	if ls == nil {
		return out
	}
	type service struct {
		name                string
		capacity            float64
		partitions, holders int
		seq                 uint64
		rs                  []*remote
	}
	// Under ls.mu (which every call on a holder takes briefly) only the
	// copies: the services with holders, then the holders of those shown.
	ls.mu.Lock()
	var svcs []*service
	for name, svc := range ls.services {
		if svc.holders > 0 {
			svcs = append(svcs, &service{name: name, capacity: svc.capacity, partitions: svc.partitions, holders: svc.holders, seq: svc.seq})
		}
	}
	slices.SortFunc(svcs, func(a, b *service) int { return cmp.Compare(b.seq, a.seq) })
	svcs = svcs[:min(len(svcs), s.limits.MaxSeen)]
	for _, sv := range svcs {
		for _, r := range ls.services[sv.name].remotes {
			sv.rs = append(sv.rs, r)
		}
	}
	ls.mu.Unlock()
	for _, sv := range svcs {
		slices.SortFunc(sv.rs, func(a, b *remote) int { return cmp.Compare(b.seq, a.seq) })
		v := dashboard.LeasedService{Service: sv.name, Capacity: sv.capacity, Partitions: sv.partitions,
			HolderCount: sv.holders, Holders: make([]dashboard.RemoteHolder, 0, min(len(sv.rs), s.limits.MaxSeen))}
		for _, r := range sv.rs[:min(len(sv.rs), s.limits.MaxSeen)] {
			v.Holders = append(v.Holders, r.view(now))
		}
		out = append(out, v)
	}
	return out
}

// view is r as the status shows it at now, without its holder id.
func (r *remote) view(now time.Time) dashboard.RemoteHolder {
	g := r.answer(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	return dashboard.RemoteHolder{Member: r.h.ID(), Weight: r.weight, JoinedForMS: now.Sub(r.joined).Milliseconds(),
		Rate: g.Rate, DemandRate: r.rate, Backlog: r.backlog, Leases: len(g.Leases),
		ValidForMS: g.ValidFor.Milliseconds(), HeartbeatAgoMS: max(0, now.Sub(r.beat).Milliseconds())}
}
