package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// Defaults of Options.
const (
	DefaultPrefix           = "sluice:"
	DefaultTimeout          = 50 * time.Millisecond
	DefaultBatchSize        = 128
	DefaultPipelines        = 4
	DefaultBreakerThreshold = 3
	DefaultBreakerCooldown  = time.Second
	DefaultLivenessTimeout  = time.Second
)

// clientClockSlack is how much longer keys live when Options.Now is set.
const clientClockSlack = time.Minute

// Options configure a Store. The zero value selects every default.
type Options struct {
	// Timeout bounds each call to Redis, including time queued for a
	// pipeline; default DefaultTimeout.
	Timeout time.Duration
	// Prefix starts every key; default DefaultPrefix. It must not contain
	// "{" or "}".
	Prefix string
	// Now, when set, is the clock, sent with each request instead of
	// reading the Redis server's TIME.
	Now func() time.Time
	// LocalNow, when set (and Now is not), is this process's own clock:
	// what the local failure mode, the denial cache and the counters of
	// batched and approximate rules time themselves by, where time.Now
	// is the default. Unlike Now, it never reaches Redis: the server's
	// TIME still decides every call. It exists to test a replica whose
	// clock is off (serve's --clock-offset).
	LocalNow func() time.Time

	// HashTag returns the Cluster hash tag of a key; default HashTag. The
	// keys of one request must share a tag in Cluster mode.
	HashTag func(key string) string

	// NoCoalesce sends each Decide as its own call instead of coalescing
	// concurrent ones into pipelines.
	NoCoalesce bool
	// BatchSize bounds the requests of one pipeline; default
	// DefaultBatchSize.
	BatchSize int
	// BatchWindow is how long a worker waits for more requests to fill a
	// pipeline; default 0: it sends what is waiting at once.
	BatchWindow time.Duration
	// Pipelines is the number of pipelines in flight at once (worker
	// goroutines); default DefaultPipelines.
	Pipelines int

	// Replicas is the number of replicas sharing the limits; a FailLocal
	// rule decides in process at Quota/Replicas. Default 1.
	Replicas int
	// Failure is the failure mode of rules that state none
	// (ratelimit.FailDefault); default, and for FailDefault,
	// ratelimit.FailLocal: this replica's share of the limit, so that a
	// rule's limit holds within a stated bound while Redis cannot decide
	// (see Failures in the package doc).
	Failure ratelimit.FailureMode
	// BreakerThreshold is the number of consecutive failed calls that opens
	// the circuit breaker (or, when the last of them got no answer in
	// time, asks whether Redis answers at all); default
	// DefaultBreakerThreshold.
	BreakerThreshold int
	// BreakerCooldown is how long an open breaker answers without Redis
	// before probing it; default DefaultBreakerCooldown.
	BreakerCooldown time.Duration
	// LivenessTimeout bounds the check that tells a slow Redis from a
	// dead one (a PING on a connection of its own, sent in the background
	// when calls time out):
	// a Redis that answers it within LivenessTimeout is slow, and the
	// breaker stays closed; default DefaultLivenessTimeout.
	LivenessTimeout time.Duration

	// ReconcileInterval is how often approximate rules send the hits
	// counted here and read the shared state back, all keys in one
	// pipeline; default DefaultReconcileInterval.
	ReconcileInterval time.Duration
	// BlockSpan is how much of a batched key's recent demand one block
	// covers; default DefaultBlockSpan.
	BlockSpan time.Duration
	// BlockHold bounds how long a block of a batched GCRA or LeakyBucket
	// rule is held before it expires (its lease allows for it; see "Where
	// the counter lives"); default DefaultBlockHold.
	BlockHold time.Duration
	// NoDenialCache turns off the denial cache: every request asks Redis,
	// even for a key Redis said is denied until a later instant.
	NoDenialCache bool

	// Logger logs an outage once when it starts (the breaker opens) and
	// once when it ends, with its duration; nil discards.
	Logger *slog.Logger
}

// Stats are counters of a Store's life.
type Stats struct {
	Requests   uint64 // Decide calls decided by Redis
	Exact      uint64 // of which decided on the exact path (see exact.go)
	Errors     uint64 // Redis calls that failed (timeouts included)
	FailOpen   uint64 // items admitted by FailOpen
	FailClosed uint64 // items denied by FailClosed
	Local      uint64 // items decided in process by FailLocal
	Trips      uint64 // times the circuit breaker opened
	Slow       uint64 // times calls timed out but Redis answered a liveness check: slow, not dead; the breaker stayed closed
	Pipelines  uint64 // pipelines sent by the coalescer
	Batched    uint64 // requests sent in those pipelines
	// CachedDenials counts requests answered by the denial cache.
	CachedDenials uint64
	// Counted counts items of batched and approximate rules decided in
	// this process, Leases the Redis calls that took blocks, GivenBack
	// the units returned to Redis (by idle replicas, and those a bucket
	// that holds no block leased for a request another item denied),
	// Stranded the units of blocks that expired unspent or could not be
	// returned, Reconciles the reconciliation round trips.
	Counted, Leases, GivenBack, Stranded, Reconciles uint64
	// Open is whether a circuit breaker is open now: the one breaker of a
	// standalone server or Sentinel's master, or on a Cluster any master's
	// (Trips and Slow count every master's).
	Open bool
}

// Store is the Redis ratelimit.Store.
type Store struct {
	c       redis.UniversalClient
	prefix  string
	now     func() time.Time // Options.Now: sent to Redis
	lnow    func() time.Time // Options.Now or LocalNow: localNow's; nil: time.Now
	slackMS string
	timeout time.Duration
	script  *redis.Script
	clock   *redis.Script
	read    *redis.Script
	cas     *redis.Script
	sclock  *serverClock          // the nodes' clocks, for cutoffs
	checker redis.UniversalClient // for the breaker's liveness check (alive); nil: s.c
	tagOf   func(string) string
	cluster bool // keys of one script must share a slot (not a single server)

	rules  sync.Map // *ratelimit.Rule → *ruleArgs
	nrules atomic.Int64
	smalls [256]any // "0" … "255", boxed

	batch    *batcher
	counting *counting
	denials  *denialCache
	brks     breakers
	fb       fallback

	requests, errors, exacts atomic.Uint64

	closeOnce sync.Once
	closed    chan struct{}
}

var _ ratelimit.Store = (*Store)(nil)

// ErrClosed is returned by Decide after Close.
var ErrClosed = errors.New("redisstore: store closed")

// errExpired is a call that reached Redis after its cutoff, so that the
// script did nothing (see clock.go): the caller had given up on it, or was
// about to. It is a context.DeadlineExceeded; Decide answers it by the
// failure mode, as a timeout.
var errExpired error = expiredError{}

type expiredError struct{}

func (expiredError) Error() string {
	return "redisstore: the call reached Redis after its deadline: nothing was done"
}

func (expiredError) Is(target error) bool { return target == context.DeadlineExceeded }

// errCrossSlot is returned by build, on a Cluster, for a request whose keys
// do not share a hash tag; Decide then decides it group by group.
var errCrossSlot = errors.New("redisstore: keys of one request have different hash tags")

// New returns a Store that decides through c, which the caller owns and
// closes after the Store. It does not contact Redis: a Store made while
// Redis is down decides by the failure policy until Redis answers. Use
// NewClient for a client with the settings the Store expects.
func New(c redis.UniversalClient, opts Options) (*Store, error) {
	if c == nil {
		return nil, errors.New("redisstore: nil Redis client")
	}
	opts.setDefaults()
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q contains a hash tag brace", opts.Prefix)
	}
	if opts.Failure > ratelimit.FailLocal {
		return nil, fmt.Errorf("redisstore: unknown failure mode %v", opts.Failure)
	}
	s := &Store{
		c:       c,
		prefix:  opts.Prefix,
		now:     opts.Now,
		slackMS: "0",
		timeout: opts.Timeout,
		script:  redis.NewScript(decideLua),
		clock:   redis.NewScript(timeLua),
		read:    redis.NewScript(readLua),
		cas:     redis.NewScript(casLua),
		tagOf:   opts.HashTag,
		closed:  make(chan struct{}),
	}
	for i := range s.smalls {
		s.smalls[i] = strconv.Itoa(i)
	}
	s.lnow = opts.Now
	if s.lnow == nil {
		s.lnow = opts.LocalNow
	}
	s.sclock = newServerClock(c, s.clock)
	if s.now != nil {
		s.slackMS = strconv.FormatInt(clientClockSlack.Milliseconds(), 10)
	}
	// Only a client of one server (standalone, or Sentinel's failover
	// client) can take any keys in one script; anything else (Cluster, a
	// Ring, a wrapper) gets requests whose keys share a tag, one per call.
	_, single := s.c.(*redis.Client)
	s.cluster = !single
	s.checker = newChecker(c, opts.LivenessTimeout)
	newBreaker := func(node, key string) *breaker {
		return &breaker{threshold: int64(opts.BreakerThreshold), cooldown: opts.BreakerCooldown, now: time.Now, log: opts.Logger, node: node, openNow: &s.brks.openNow,
			check: func() error { return s.alive(opts.LivenessTimeout, key) },
			spawn: func(f func()) { go f() },
		}
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		s.brks.cluster, s.brks.make = cc, newBreaker
	} else {
		s.brks.single = newBreaker("", "")
	}
	s.fb = fallback{
		def:        opts.Failure,
		replicas:   int64(opts.Replicas),
		retryAfter: opts.BreakerCooldown,
		local:      memstore.New(memstore.Options{Now: s.lnow, MaxKeys: 1 << 16}),
	}
	if !opts.NoCoalesce {
		s.batch = newBatcher(s, opts.BatchSize, opts.BatchWindow, opts.Pipelines)
	}
	if !opts.NoDenialCache {
		s.denials = newDenialCache()
	}
	s.counting = newCounting(s, &opts)
	return s, nil
}

// setDefaults puts the default in place of every option left at zero.
func (o *Options) setDefaults() {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	setDefault(&o.Timeout, DefaultTimeout)
	setDefault(&o.BatchSize, DefaultBatchSize)
	setDefault(&o.Pipelines, DefaultPipelines)
	setDefault(&o.Replicas, 1)
	setDefault(&o.BreakerThreshold, DefaultBreakerThreshold)
	setDefault(&o.BreakerCooldown, DefaultBreakerCooldown)
	setDefault(&o.LivenessTimeout, DefaultLivenessTimeout)
	if o.Failure == ratelimit.FailDefault {
		o.Failure = ratelimit.FailLocal
	}
	setDefault(&o.ReconcileInterval, DefaultReconcileInterval)
	setDefault(&o.BlockSpan, DefaultBlockSpan)
	setDefault(&o.BlockHold, DefaultBlockHold)
	if o.HashTag == nil {
		o.HashTag = HashTag
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// setDefault sets *v to def when it is not above zero.
func setDefault[T ~int | ~int64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Close stops the Store's goroutines; it does not close the client.
// Decide returns ErrClosed after Close.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.counting.stop()
		if s.batch != nil {
			s.batch.stop()
		}
		s.fb.local.Close()
		if s.checker != nil {
			s.checker.Close()
		}
	})
	return nil
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Requests:   s.requests.Load(),
		Exact:      s.exacts.Load(),
		Errors:     s.errors.Load(),
		FailOpen:   s.fb.open.Load(),
		FailClosed: s.fb.closed.Load(),
		Local:      s.fb.local_.Load(),
	}
	st.Trips, st.Slow, st.Open = s.brks.stats()
	if s.batch != nil {
		st.Pipelines, st.Batched = s.batch.pipelines.Load(), s.batch.batched.Load()
	}
	if s.denials != nil {
		st.CachedDenials = s.denials.hits.Load()
	}
	b, a := s.counting.batched, s.counting.approximate
	st.Counted = b.counted.Load() + a.counted.Load()
	st.Leases, st.GivenBack, st.Stranded = b.leases.Load(), b.givebacks.Load(), b.stranded.Load()
	st.Reconciles = a.reconciles.Load()
	return st
}

// Decide decides items all or nothing. See the package documentation.
func (s *Store) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if len(items) == 0 {
		return dst, nil
	}
	select {
	case <-s.closed:
		return dst, ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	for i := range items {
		if r := items[i].Rule; r != nil && r.Counting != ratelimit.Strict {
			return s.decideCounted(ctx, dst, items)
		}
	}
	return s.decideStrict(ctx, dst, items)
}

// decideStrict decides items at Redis (or from the denial cache), and by
// their failure modes when Redis cannot decide.
func (s *Store) decideStrict(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	n := len(dst)
	dst, err := s.decideRedis(ctx, dst, items)
	if errors.Is(err, errUnavailable) {
		return s.fb.decide(dst[:n], items), nil
	}
	return dst, err
}

// peek answers items as the other items of a denied request: each
// reports what it alone would get (beyond its capacity, limited with its
// own RetryAfter, or, when its cost would fit, a check at cost 0), and
// nothing is consumed. Redis decides them behind an item that it denies
// whatever the state, so that decide.lua (or the exact path) reports
// them so. When Redis cannot decide, or no such item can be made, they
// are asked as checks (by the failure modes then), Allowed when their
// cost would fit.
func (s *Store) peek(ctx context.Context, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if first := items[0]; first.Rule.Capacity() < bigNS {
		first.Cost = first.Rule.Capacity() + 1 // beyond capacity: denied, consuming nothing
		ds, err := s.decideRedis(ctx, nil, append([]ratelimit.Item{first}, items...))
		if err == nil {
			return ds[1:], nil
		}
		if !errors.Is(err, errUnavailable) {
			return nil, err
		}
	}
	checks := make([]ratelimit.Item, len(items))
	for i, it := range items {
		it.Cost = 0
		checks[i] = it
	}
	ds, err := s.decideStrict(ctx, nil, checks)
	if err != nil {
		return nil, err
	}
	for i := range ds {
		ds[i].Allowed = ds[i].Allowed && items[i].Cost <= ds[i].Remaining
	}
	return ds, nil
}

// errUnavailable is wrapped by decideRedis's error when Redis could not
// decide (failed, timed out or the breaker is open): the caller decides by
// the failure modes.
var errUnavailable = errors.New("redisstore: Redis cannot decide")

// decideRedis decides items at Redis, or from the denial cache, all or
// nothing; an error wrapping errUnavailable when Redis cannot decide.
func (s *Store) decideRedis(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	req, err := s.build(items) // checks the rules
	if errors.Is(err, errCrossSlot) {
		return s.decideAcross(ctx, dst, items)
	}
	if err != nil {
		return dst, err
	}
	if s.denials != nil {
		if out, ok := s.denials.answer(s, dst, items); ok {
			req.release()
			return out, nil
		}
	}
	brk := s.brks.forKey(ctx, req.keys[0])
	if !brk.allow() {
		req.release()
		return dst, errUnavailable
	}
	n := len(dst)
	sent := s.localNow()
	dst, err = s.run(ctx, dst, req, items)
	rescaled := req.rescaled
	req.release()
	if err != nil {
		return dst[:n], s.callFailed(ctx, brk, err)
	}
	brk.done(nil)
	s.requests.Add(1)
	if s.denials != nil {
		s.denials.record(items, dst[n:], sent, rescaled)
	}
	return dst, nil
}

// callFailed tells brk, the breaker of the node called, of a call to
// Redis that failed with err, and returns decideRedis's error: the
// context's or ErrClosed when the caller or Close ended the call, a script
// error as it is, else err wrapped in errUnavailable.
func (s *Store) callFailed(ctx context.Context, brk *breaker, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		brk.abandon() // the caller gave up: says nothing about Redis
		return cerr
	}
	select {
	case <-s.closed: // Close ended the call: says nothing about Redis
		brk.abandon()
		return ErrClosed
	default:
	}
	if isScriptError(err) {
		brk.done(nil) // Redis answered: it is up
		return fmt.Errorf("redisstore: %w", err)
	}
	s.errors.Add(1)
	brk.done(err)
	return fmt.Errorf("%w: %w", errUnavailable, err)
}

// alive asks Redis whether it answers at all within timeout: a PING on
// s.checker, a client of the same servers whose dial, reads and writes
// may each take timeout (the store's client would cut it short at the
// decision timeout, and could not even dial a slow server: go-redis's
// connection set-up is a call too), to the master of key's slot on a
// Cluster (after a failover, the master that holds the slot now: its
// answer closes the breaker of the address that held it, whose keys
// are no longer sent there). Close cancels it.
func (s *Store) alive(timeout time.Duration, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case <-s.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	if s.checker == nil { // a client of another kind: bounded by its own timeouts
		return s.c.Ping(ctx).Err()
	}
	if cc, ok := s.checker.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		return m.Ping(ctx).Err()
	}
	return s.checker.Ping(ctx).Err()
}

// newChecker returns a client of c's servers with every timeout at
// timeout, for alive; nil for a client that is neither a *redis.Client
// (standalone, or Sentinel's failover client) nor a *redis.ClusterClient.
// It dials once per attempt (no retries: a refused connection is an
// answer enough) and keeps one idle connection. Its PoolSize is large
// only because go-redis stops dialling once a pool has failed PoolSize
// dials in a row (it fails at once, and probes in a goroutine of its
// own): a check must really try; at most one is out at a time.
func newChecker(c redis.UniversalClient, timeout time.Duration) redis.UniversalClient {
	set := func(dial, read, write, pool *time.Duration, size, minIdle, maxIdle, retries *int) {
		*dial, *read, *write, *pool = timeout, timeout, timeout, timeout
		*size, *minIdle, *maxIdle, *retries = checkerPoolSize, 0, 1, 1
	}
	switch c := c.(type) {
	case *redis.Client:
		o := *c.Options()
		set(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.PoolSize, &o.MinIdleConns, &o.MaxIdleConns, &o.DialerRetries)
		return redis.NewClient(&o)
	case *redis.ClusterClient:
		o := *c.Options()
		set(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.PoolSize, &o.MinIdleConns, &o.MaxIdleConns, &o.DialerRetries)
		return redis.NewClusterClient(&o)
	}
	return nil
}

// checkerPoolSize is the checker's PoolSize: failed checks in a row
// before go-redis would stop dialling (over an hour of checks a second).
const checkerPoolSize = 1 << 13

// redisKey is the Redis key of item key key.
func (s *Store) redisKey(key string) string {
	return string(appendKey(nil, s.prefix, s.tagOf(key), key))
}

// localNow is this process's clock, or Options.Now or LocalNow: what the
// denial cache and the counters of batched and approximate rules time
// themselves by.
func (s *Store) localNow() time.Time {
	if s.lnow != nil {
		return s.lnow()
	}
	return time.Now()
}

// isScriptError reports whether err is an error reply that says the request
// itself failed (a script error), not that Redis is unavailable.
func isScriptError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "ERR") && !strings.Contains(msg, "CLUSTERDOWN")
}

// State returns the state Redis holds for key, if any: for inspection (the
// admin API). Its times are Unix nanoseconds of the Redis server's clock.
func (s *Store) State(ctx context.Context, key string) (ratelimit.State, bool, error) {
	rk := s.redisKey(key)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	raw, err := s.c.Get(ctx, rk).Result()
	if errors.Is(err, redis.Nil) {
		return ratelimit.State{}, false, nil
	}
	if err != nil {
		return ratelimit.State{}, false, fmt.Errorf("redisstore: reading %q: %w", key, err)
	}
	st, _, err := parseState(raw)
	if err != nil {
		return ratelimit.State{}, false, err
	}
	if st.Algorithm == ratelimit.SlidingLog {
		l, err := s.c.LRange(ctx, rk+logSuffix, 0, -1).Result()
		if err != nil {
			return ratelimit.State{}, false, fmt.Errorf("redisstore: reading the log of %q: %w", key, err)
		}
		v := make([]any, len(l))
		for i := range l {
			v[i] = l[i]
		}
		if st.Log, err = parseLog(v); err != nil {
			return ratelimit.State{}, false, err
		}
	}
	return st, true, nil
}

// Reset forgets key on Redis, so its next request starts from full
// capacity (for example after a successful login).
func (s *Store) Reset(ctx context.Context, key string) error {
	rk := s.redisKey(key)
	if s.denials != nil {
		s.denials.forget(key)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.c.Del(ctx, rk, rk+logSuffix).Err(); err != nil {
		return fmt.Errorf("redisstore: resetting %q: %w", key, err)
	}
	return nil
}
