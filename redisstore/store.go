// Package redisstore keeps Sluice's shared state in Redis, Redis Sentinel or
// Redis Cluster, so that every replica of a service, and every process
// sharing a downstream, sees the same state. It is the one home of
// Sluice's Redis code: every Lua script (embedded), every key encoding and
// hash tag.
//
//   - Store is a ratelimit.Store: exact rate-limit decisions, shared by
//     every replica. Most of this documentation is about it.
//   - SemaphoreStore is a concurrency.Store: distributed semaphores with
//     expiring permits.
//   - LeaseStore is a lease.Store: capacity leases on partitions of a
//     downstream's limit.
//   - ExpiringHash is a small table of entries with their own TTLs, for
//     settings every replica must see (the service's runtime overrides).
//
// All of them are built on a redis.UniversalClient that the caller owns and
// closes; NewClient makes one with the settings they expect (every call
// bounded, no retries), for a standalone server, Sentinel or Cluster. All of
// them time what they store by the Redis server's clock (TIME inside their
// scripts), never by a client's. LogTo routes go-redis's own log lines
// through log/slog.
//
// # Model
//
// Every algorithm of package ratelimit is ported to one Lua script
// (decide.lua), called with EVALSHA (EVAL when the server does not know it
// yet). The script decides all the items of one request atomically, all or
// nothing, exactly as the Go functions do: in order, each against the state
// left by the ones before it (so a key named twice is charged twice), and
// writes nothing unless every item is admitted. Every key it writes gets a
// TTL that ends when its state has become equivalent to a fresh one, so
// nothing outlives its use, not even state of a deleted rule.
//
// # Decision paths
//
// Decide first checks the items (build, which validates each rule once, on
// first use). Then a request is decided by the first of these paths that
// takes it (Stats.Exact counts the exact path):
//
//   - Cross-slot (decideAcross): on a Cluster only, a request whose keys
//     have different hash tags, which no single script may touch. Each
//     tag's items are decided as a request of their own by the paths
//     below, in order; a denial refunds the groups already taken.
//   - Exact path (exact.go): a rule whose durations reach 2^52 ns
//     (needsExact), beyond what the script's doubles hold exactly, or a
//     request the script answered with replyFar because a stored state is
//     that far from now. Go reads the states, decides with ratelimit's
//     integer code and writes them back by compare-and-set: two round
//     trips, exact whatever the rule.
//   - Script, fast path (fastGCRA and fastFixed at the top of decide.lua):
//     a request of one GCRA item, or of one fixed-window item whose period
//     divides a second or is whole seconds and has no calendar, in the usual
//     case: cost within capacity (not negative for a fixed window), no
//     stored state of another algorithm (or, in debt, another GCRA
//     interval), no clock behind the state's. It runs before the rest of
//     the script is even defined, since defining the general path's
//     closures costs more than such a decision; in a coalesced batch the
//     leading requests it takes share one MGET. It exists for speed only,
//     for the common request (GCRA is the default algorithm, fixed windows
//     the default of envoy-format rules); bench/RESULTS.md section 3 has
//     its figures. What it does not take it leaves, untouched, to:
//   - Script, general path (request in decide.lua): every other request:
//     several items decided all or nothing, every algorithm, refunds, costs
//     beyond capacity, rule changes, a caller whose clock lags the state,
//     calendar windows (computed in Go by run, after a TIME round trip when
//     the server's clock is used).
//
// Both script paths go through the coalescer (batch.go) unless
// Options.NoCoalesce is set: a caller alone sends its own EVALSHA, others
// are sent by a worker in a pipeline, and on a standalone server or
// Sentinel the requests of one pipeline at the same instant are one
// EVALSHA (decide.lua's batch form). The exact path's calls and the
// calendar's TIME read are sent directly. When Redis cannot answer, or the
// breaker is open, failure.go decides by each rule's Failure mode instead.
//
// # Clock
//
// By default the clock is the Redis server's (TIME, read inside the script),
// so replicas with skewed clocks never disagree. Calendar windows
// (Rule.Calendar) are computed in Go in the rule's time zone: for a request
// that has one, the store first reads TIME from the node that owns the
// request's slot in a separate tiny round trip, then decides at that
// instant. Options.Now replaces the server clock by a client one (tests
// step time with it); keys then live one minute longer than they need, as
// allowance for the client clock's distance from the server's. The script
// still reads TIME then, for its cutoff (see Deadlines), which is always in
// the server's clock.
//
// # Precision
//
// Lua numbers are doubles. The script keeps instants as (seconds,
// nanoseconds) pairs and computes relative to now, so its decisions are
// exact to the nanosecond, as in Go, while the durations involved (periods,
// capacity × interval, debts) stay below 2^52 ns, about 52 days. A request
// with a rule beyond that (one unit a year, a yearly calendar window, Quota
// 0), or a key whose stored state is that far from now, is decided on the
// exact path instead (exact.go): Go reads the states, decides with
// ratelimit's own integer code and writes them back with a compare-and-set
// script, retrying on a conflict. Every decision is therefore exact; the
// rare long rules cost two round trips.
//
// # Keys and Cluster slots
//
// A key's counter lives at a Redis key derived from the key alone (see
// appendKey), so it is the same whatever request it is decided in. Its
// Cluster slot is chosen by a hash tag: Options.HashTag(key), by default
// HashTag, the part of the key between "{" and "}" as Redis reads tags, or
// the whole key when it has none. The items of one request are decided in
// script when they can be: always on a standalone server or Sentinel, and on
// a Cluster when they share a tag — name the keys of a request
// "{tenant:acme}user:42", "{tenant:acme}endpoint:/x", or set Options.HashTag
// to a function that extracts the common part. A Cluster request whose keys
// have different tags is decided one tag at a time, each group atomically;
// if a later group denies, what the earlier groups took is refunded, so the
// outcome is still all or nothing, though for a moment other requests may
// see the capacity taken (they can only be denied by it, never admitted).
// Tags and keys are encoded, so no byte a caller sends can move a key to
// another slot or reach another key's counter.
//
// # Throughput
//
// Concurrent Decide calls are coalesced: a few worker goroutines, owned by
// the Store and stopped by Close, each take every request waiting (up to
// Options.BatchSize, waiting at most Options.BatchWindow for more) and send
// them in one pipeline; on a Cluster, one pipeline per node, each sent by a
// goroutine of its own that the worker does not wait for, so that a node
// that does not answer holds neither the other nodes' calls nor the
// workers. A caller with no other request pending sends its own at once,
// so a lone caller pays no hand-off. Options.NoCoalesce turns coalescing
// off.
//
// # Failures
//
// Every Redis call is bounded by Options.Timeout (default 50 ms). A circuit
// breaker opens after Options.BreakerThreshold consecutive failures and then
// answers without calling Redis for Options.BreakerCooldown, after which one
// call probes Redis; success closes it, so decisions go back to Redis by
// themselves. While Redis cannot decide, each item is decided by its rule's
// Failure mode: FailOpen admits (ReasonFailOpen), FailClosed denies
// (ReasonFailClosed) and FailLocal decides in process, at this replica's
// share of the limit, Quota/Options.Replicas (ReasonLocal). Stats counts them.
//
// # Where the counter lives
//
// A rule's Counting (ratelimit.Counting) says how often a replica asks
// Redis. Options.Replicas must say how many replicas share the limits.
//
// Strict, the default, decides every request in Redis, as described
// above: exact, all or nothing, one round trip per request.
//
// Batched (GCRA, LeakyBucket, FixedWindow) takes blocks of capacity from
// the shared counter, each in one decide.lua call with the block as its
// cost, and spends them in process. A caller whose cost the blocks cannot
// cover leases a new block and waits for it; when what is held falls below
// half the next block, a lease is started in the background. A block is
// Options.BlockSpan (50 ms; for a bucket, at most its hold, below) of this
// replica's recent admitted demand, rounded down (a unit the demand would
// not spend in time strands), at least the cost asked, at most a quarter
// of this replica's share of the capacity. It never admits more than the
// limit, globally: what it spends
// was taken from the shared counter first. A fixed window's block ends
// with the window it was taken in (its ResetAfter, timed from when the
// lease was sent). A bucket's block is held at most hold = k × interval,
// k = min(capacity/8, Options.BlockHold/interval), and is leased under
// the rule with its capacity lowered by k: a unit taken at t and spent by
// t + hold then puts at most (capacity − k) + (L + hold)/interval ≤
// capacity + L/interval units in any window of length L, as the rule
// allows. The price is k units of the burst after an idle time (none of
// the rate). Stranded capacity: a replica holds at most two blocks (the
// one it spends and one leased ahead), at most capacity/(2 × Replicas) in
// all, so all replicas together at most half the capacity; a replica
// whose key has had no decision for two spans gives what it holds back
// (a refund, Stats.GivenBack), and a block that ends unspent is lost
// (Stats.Stranded). A lease Redis refuses is remembered until its
// RetryAfter, so a saturated key asks Redis about once per refill, not
// once per request.
//
// Approximate (GCRA, LeakyBucket) decides each key in process on a view of
// the shared state (the instant the key is full again, as Redis last gave
// it) and charges each hit Replicas intervals on it, so that between two
// reconciliations a replica admits at most its share, 1/Replicas, of what
// remains and of what refills. Every Options.ReconcileInterval (25 ms) a
// goroutine of the Store sends, for every key touched since the last
// time, the hits counted here (a look for a key with none: one denied
// here) in one pipeline, under the rule with its capacity doubled so that
// hits already admitted are counted, never refused; each reply sets the
// key's view, which goes on charging the hits not yet sent Replicas-fold.
// A key far below its limit keeps its hits back: while its view is at
// most half used, a reconciliation only looks (a read, no write), and
// the hits wait, for at most 40 intervals (then, or when the key's view
// passes half, or when the Store closes, they are sent). Near the limit,
// where the other replicas must see them, they are sent every interval;
// far below it, a key costs Redis a read after each use and a write every
// second or two instead of a write after each use. The keys of one GCRA
// rule share script calls, up to 256 keys to a call (decide.lua's
// reconciliation form: the rule's fields once, then one count per key,
// and one integer back per key); on a Cluster, whose scripts touch one
// slot, the keys of one slot. A key of
// a LeakyBucket rule, or one whose stored state that form does not take
// (written under another rule), is sent as a request of its own. A key
// that was not touched since the last reconciliation is not sent: its
// view is refreshed by the reconciliation after its next use. A key new
// to a replica starts from a fresh view (full), and a view that missed
// the others' hits for a while (its key was idle here) is used as it is:
// either admits at most the replica's share before the reconciliation
// that follows its use, which the bound below counts. The bound: with N
// replicas, interval I, d the longest reconciliation round trip, rate R
// and capacity B, a replica does not see the hits the others have not
// sent, each at most (B + R(I + d))/N (a replica's view, refreshed after
// each use, charges its unsent hits N-fold, sent or kept back, so it
// admits beyond them only its share of what remains), and so the keys
// admit, in any window, at most
//
//	limit + (N − 1)/N × (B + R(I + d))
//
// beyond which a hit is never admitted. The excess does not accumulate:
// near the limit every hit reaches Redis at the next reconciliation, the shared state
// goes into debt by what was admitted beyond, and every replica denies
// the key, within one interval (plus d), until it is paid. (This is a
// derivation, not a proof; the accuracy tests assert it with d = 50 ms on
// 4 replicas, as Stores in one process and as OS processes, on one key and
// on 10,000.) A cost above B/N cannot be charged on a view and is
// decided in Redis. No request of an approximate rule waits for Redis.
//
// In either mode, checks and refunds are decided in Redis as in strict
// mode, and a request that mixes modes is all or nothing: its local items
// are taken first and given back if the rest is denied.
//
// When Redis does not answer, a batched replica spends the blocks it
// holds and an approximate one decides on its views (once the breaker is
// open, for up to 40 intervals after each view's last reconciliation);
// then each item follows its rule's Failure mode. Hits that a
// reconciliation could not send are sent with the next one; a
// reconciliation answered as failed never took effect (see Deadlines),
// so nothing is counted twice, except when Redis ran a call whose reply
// was lost, which only counts too much.
//
// Every mode has a denial cache (denials.go, off with
// Options.NoDenialCache): a GCRA or fixed-window key that Redis denied a
// cost until an instant is denied that cost here until then, with the
// same answer, without a round trip. Refunds, Reset and decisions under
// another rule of the key through this Store forget it; a refund through
// another replica is not seen, so this replica may deny until the
// remembered instant (never admit too much).
//
// # Deadlines
//
// A call answered as timed out never takes effect later. A command the
// client gave up on may still be in a socket buffer, or in a server that
// was paused (SIGSTOP, a frozen VM or container, a stalled disk) and reads
// it when it resumes; if it ran then, a request answered by the failure
// mode (denied, under FailClosed) would consume capacity after all. So
// every script call that consumes (a positive cost: decide.lua on every
// path, batch or not, the exact path's compare-and-set, SemaphoreStore's
// and LeaseStore's acquire) carries a cutoff in the Redis server's own
// clock, and the script, having read TIME, does nothing past it and
// answers "expired", which the caller takes as a timeout. Checks and refunds carry none: they
// take nothing, and a late refund only gives back.
//
// The cutoff is the instant the client gives up on the call (the earlier
// of the call's deadline, from Options.Timeout or the context, and now
// plus the client's read timeout), mapped to the server's clock by a lower
// bound, so that it is never later than the server's clock at that
// instant: the server's TIME from a round trip, plus the client's
// monotonic time elapsed since its reply arrived (TIME was read before
// that), less 1000 ppm of that time for drift and 100 µs. Each node's
// clock has its own estimate (each master of a Cluster); a caller takes a
// new sample (one TIME round trip before its call) when the node has none
// or it is a second old, or when the node answered "expired" before the
// deadline. A sample replaces the kept one when it bounds the clock more
// tightly, or contradicts it (the server's clock stepped back). The cost is
// that a call reaching Redis within a round trip of its deadline may be
// answered "expired" although the client would still have waited for it.
// What the estimate does not cover: a Sentinel failover to a master whose
// clock is behind the old one's, for up to a second, and on a Cluster a
// call redirected (MOVED) to a node whose clock is behind its slot's old
// owner's; keep the servers' clocks synchronised (NTP).
//
// A caller that cancels its context (rather than reaching its deadline)
// gets the context's error, not a decision: that call may still take
// effect.
//
// Every type of the package is safe for concurrent use; none has a usable
// zero value: call its constructor.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

//go:embed decide.lua
var decideSource string

// decideLua is the script as it is loaded: decide.lua with its layout names
// replaced by their values (see inlineLayout).
var decideLua = inlineLayout(decideSource)

// timeLua reads the clock of the node that owns KEYS[1]'s slot.
const timeLua = "return redis.call('TIME')"

// Defaults of Options.
const (
	DefaultPrefix           = "sluice:"
	DefaultTimeout          = 50 * time.Millisecond
	DefaultBatchSize        = 128
	DefaultPipelines        = 4
	DefaultBreakerThreshold = 3
	DefaultBreakerCooldown  = time.Second
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
	// BreakerThreshold is the number of consecutive failed calls that opens
	// the circuit breaker; default DefaultBreakerThreshold.
	BreakerThreshold int
	// BreakerCooldown is how long an open breaker answers without Redis
	// before probing it; default DefaultBreakerCooldown.
	BreakerCooldown time.Duration

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
	Pipelines  uint64 // pipelines sent by the coalescer
	Batched    uint64 // requests sent in those pipelines
	// CachedDenials counts requests answered by the denial cache.
	CachedDenials uint64
	// Counted counts items of batched and approximate rules decided in
	// this process, Leases the Redis calls that took blocks, GivenBack
	// the units idle replicas returned, Stranded the units of blocks that
	// expired unspent, Reconciles the reconciliation round trips.
	Counted, Leases, GivenBack, Stranded, Reconciles uint64
	Open                                             bool // whether the breaker is open now
}

// Store is the Redis ratelimit.Store.
type Store struct {
	c       redis.UniversalClient
	prefix  string
	now     func() time.Time
	slackMS string
	timeout time.Duration
	script  *redis.Script
	clock   *redis.Script
	read    *redis.Script
	cas     *redis.Script
	sclock  *serverClock // the nodes' clocks, for cutoffs
	tagOf   func(string) string
	cluster bool // keys of one script must share a slot (not a single server)

	rules  sync.Map // *ratelimit.Rule → *ruleArgs
	nrules atomic.Int64
	smalls [256]any // "0" … "255", boxed

	batch   *batcher
	count   *counters
	denials *denialCache
	brk     breaker
	fb      fallback

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
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q contains a hash tag brace", opts.Prefix)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.Pipelines <= 0 {
		opts.Pipelines = DefaultPipelines
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.BreakerThreshold <= 0 {
		opts.BreakerThreshold = DefaultBreakerThreshold
	}
	if opts.BreakerCooldown <= 0 {
		opts.BreakerCooldown = DefaultBreakerCooldown
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
		closed:  make(chan struct{}),
	}
	for i := range s.smalls {
		s.smalls[i] = strconv.Itoa(i)
	}
	s.sclock = newServerClock(c, s.clock)
	s.tagOf = opts.HashTag
	if s.tagOf == nil {
		s.tagOf = HashTag
	}
	if s.now != nil {
		s.slackMS = strconv.FormatInt(clientClockSlack.Milliseconds(), 10)
	}
	// Only a client of one server (standalone, or Sentinel's failover
	// client) can take any keys in one script; anything else (Cluster, a
	// Ring, a wrapper) gets requests whose keys share a tag, one per call.
	_, single := s.c.(*redis.Client)
	s.cluster = !single
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s.brk = breaker{threshold: int64(opts.BreakerThreshold), cooldown: opts.BreakerCooldown, now: time.Now, log: opts.Logger}
	s.fb = fallback{
		replicas:   int64(opts.Replicas),
		retryAfter: opts.BreakerCooldown,
		local:      memstore.New(memstore.Options{Now: opts.Now, MaxKeys: 1 << 16}),
	}
	if !opts.NoCoalesce {
		s.batch = newBatcher(s, opts.BatchSize, opts.BatchWindow, opts.Pipelines)
	}
	if !opts.NoDenialCache {
		s.denials = newDenialCache()
	}
	if opts.ReconcileInterval <= 0 {
		opts.ReconcileInterval = DefaultReconcileInterval
	}
	if opts.BlockSpan <= 0 {
		opts.BlockSpan = DefaultBlockSpan
	}
	if opts.BlockHold <= 0 {
		opts.BlockHold = DefaultBlockHold
	}
	s.count = newCounters(s, &opts)
	return s, nil
}

// Close stops the Store's goroutines; it does not close the client.
// Decide returns ErrClosed after Close.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.count.stop()
		if s.batch != nil {
			s.batch.stop()
		}
		s.fb.local.Close()
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
		Trips:      s.brk.trips.Load(),
		Open:       s.brk.isOpen(),
	}
	if s.batch != nil {
		st.Pipelines, st.Batched = s.batch.pipelines.Load(), s.batch.batched.Load()
	}
	if s.denials != nil {
		st.CachedDenials = s.denials.hits.Load()
	}
	c := s.count
	st.Counted, st.Leases, st.GivenBack = c.counted.Load(), c.leases.Load(), c.givebacks.Load()
	st.Stranded, st.Reconciles = c.stranded.Load(), c.reconciles.Load()
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
		if out, ok, err := s.denials.answer(ctx, s, dst, items); ok {
			req.release()
			return out, err
		}
	}
	if !s.brk.allow() {
		req.release()
		return dst, errUnavailable
	}
	n := len(dst)
	sent := s.localNow()
	dst, err = s.run(ctx, dst, req, items)
	req.release()
	if err != nil {
		dst = dst[:n]
		if cerr := ctx.Err(); cerr != nil {
			s.brk.abandon() // the caller gave up: says nothing about Redis
			return dst, cerr
		}
		select {
		case <-s.closed: // Close ended the call: says nothing about Redis
			s.brk.abandon()
			return dst, ErrClosed
		default:
		}
		if isScriptError(err) {
			s.brk.done(nil) // Redis answered: it is up
			return dst, fmt.Errorf("redisstore: %w", err)
		}
		s.errors.Add(1)
		s.brk.done(err)
		return dst, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	s.brk.done(nil)
	s.requests.Add(1)
	if s.denials != nil {
		s.denials.record(items, dst[n:], sent)
	}
	return dst, nil
}

// localNow is this process's clock, or Options.Now: what the denial cache
// and the counters of batched and approximate rules time themselves by.
func (s *Store) localNow() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// The layout of decide.lua's ARGV and of its reply. decide.lua declares the
// same names with the same values in a block at its top; TestScriptLayout
// fails when the two disagree, and inlineLayout puts these values in place
// of the names when the script is loaded. Indices count from 0:
// request.args[x] is ARGV[1+x].
const (
	// The header, ahead of the items.
	argNow   = 0 // the instant in Unix ns, or "" for the server's TIME
	argSlack = 1 // milliseconds added to every TTL
	argCount = 2 // the number of items; "-n" for a batch of n requests
	argMask  = 3 // the algorithms present, a bit mask
	// argDeadline is the cutoff, Unix ns of the server's clock (TIME),
	// past which the script does nothing and answers replyExpired; "" for
	// none (a request that consumes nothing). See clock.go.
	argDeadline = 4
	argHeader   = 5 // values in the header

	// An item's fields, from its first one.
	fieldKey      = 0 // index of its state key in KEYS, from 1
	fieldAlg      = 1 // ratelimit.Algorithm
	fieldCost     = 2
	fieldQuota    = 3
	fieldCapacity = 4
	fieldInterval = 5 // ns
	fieldCapT     = 6 // capacity × interval, ns; 0 when Quota is 0
	fieldPeriod   = 7 // ns
	fieldWinStart = 8 // the calendar window in Unix ns; "" without a calendar
	fieldWinEnd   = 9
	itemFields    = 10 // fields per item

	// In a batch, each request is its number of items and then their
	// fields; its reply is its number of values and then the values.
	batchReqHeader = 1

	// The reply: replyFields values per item, or the one value replyFar
	// (a state too far from now for doubles: nothing written).
	replyAllowed   = 0 // 1 or 0
	replyReason    = 1 // one of reasonOK, reasonLimited, reasonExceeds
	replyRemaining = 2
	replyReset     = 3 // ns
	replyRetry     = 4 // ns
	replyFields    = 5 // values per item
	replyFar       = -1
	// replyExpired, alone, says that the script ran past argDeadline and
	// did nothing.
	replyExpired = -2

	reasonOK      = 0
	reasonLimited = 1
	reasonExceeds = 2 // cost beyond capacity

	// maxDuration is where the script saturates durations: the largest
	// double below 2^63 (2^63 - 1024), which parse reads as "never".
	maxDuration = 1<<63 - 1024
)

// scriptLayout names the layout constants as decide.lua does.
var scriptLayout = []struct {
	name  string
	value int64
}{
	{"argNow", argNow}, {"argSlack", argSlack}, {"argCount", argCount}, {"argMask", argMask},
	{"argDeadline", argDeadline}, {"argHeader", argHeader},
	{"fieldKey", fieldKey}, {"fieldAlg", fieldAlg}, {"fieldCost", fieldCost},
	{"fieldQuota", fieldQuota}, {"fieldCapacity", fieldCapacity},
	{"fieldInterval", fieldInterval}, {"fieldCapT", fieldCapT}, {"fieldPeriod", fieldPeriod},
	{"fieldWinStart", fieldWinStart}, {"fieldWinEnd", fieldWinEnd}, {"itemFields", itemFields},
	{"batchReqHeader", batchReqHeader},
	{"replyAllowed", replyAllowed}, {"replyReason", replyReason}, {"replyRemaining", replyRemaining},
	{"replyReset", replyReset}, {"replyRetry", replyRetry}, {"replyFields", replyFields},
	{"replyFar", replyFar}, {"replyExpired", replyExpired},
	{"reasonOK", reasonOK}, {"reasonLimited", reasonLimited}, {"reasonExceeds", reasonExceeds},
	{"maxDuration", maxDuration},
}

// The lines that open and close decide.lua's layout block.
const (
	layoutStart = "\n-- Layout of ARGV"
	layoutEnd   = "\n-- End of the layout.\n"
)

// inlineLayout returns the script src with its layout block blanked out
// (its lines kept, so that Lua's line numbers still match decide.lua's) and
// every layout name after it replaced by its value in scriptLayout.
//
// The script runs its whole chunk on every call, and a function that reads
// a local of the chunk captures it as an upvalue, which each call allocates,
// links and closes again: with the names left as locals, a lone GCRA
// decision cost Redis about 5 % more instructions, a general-path one 8 %
// (callgrind). Values in place cost nothing. TestScriptLayout checks that
// the block declares the same values, so the file reads, and runs, as what
// is loaded.
func inlineLayout(src string) string {
	start := strings.Index(src, layoutStart)
	end := strings.Index(src, layoutEnd)
	if start < 0 || end < start {
		panic("redisstore: decide.lua has no layout block")
	}
	end += len(layoutEnd)
	vals := make(map[string]string, len(scriptLayout))
	names := make([]string, 0, len(scriptLayout))
	for _, l := range scriptLayout {
		v := strconv.FormatInt(l.value, 10)
		if l.value < 0 {
			v = "(" + v + ")" // so that "- name" cannot become a comment
		}
		vals[l.name] = v
		names = append(names, l.name)
	}
	re := regexp.MustCompile(`\b(` + strings.Join(names, "|") + `)\b`)
	blank := strings.Repeat("\n", strings.Count(src[start:end], "\n"))
	return src[:start] + blank + re.ReplaceAllStringFunc(src[end:], func(n string) string { return vals[n] })
}

// decideAcross decides, on a Cluster, a request whose keys have different
// hash tags: one group of items per tag, in order of first appearance, each
// group in one script. When a group is denied, the groups before it are
// refunded; the groups after it are not asked, and report a check (cost 0)
// of their keys, Allowed when their cost would fit.
func (s *Store) decideAcross(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	var tags []string
	group := make([]int, len(items)) // item → index in tags
	for i := range items {
		t := s.tagOf(items[i].Key)
		g := slices.Index(tags, t)
		if g < 0 {
			g = len(tags)
			tags = append(tags, t)
		}
		group[i] = g
	}
	out := make([]ratelimit.Decision, len(items))
	members := func(g int, cost func(int64) int64) (idx []int, sub []ratelimit.Item) {
		for i := range items {
			if group[i] == g {
				it := items[i]
				it.Cost = cost(it.Cost)
				idx, sub = append(idx, i), append(sub, it)
			}
		}
		return idx, sub
	}
	same := func(c int64) int64 { return c }
	for g := range tags {
		idx, sub := members(g, same)
		ds, err := s.Decide(ctx, nil, sub)
		if err == nil && ratelimit.Allowed(ds) {
			for j, i := range idx {
				out[i] = ds[j]
			}
			continue
		}
		// Undo the groups already taken, whatever happened to this one.
		for u := range g {
			uidx, refund := members(u, func(c int64) int64 { return -c })
			rds, rerr := s.Decide(context.WithoutCancel(ctx), nil, refund)
			for j, i := range uidx {
				if rerr == nil {
					out[i] = rds[j]
					out[i].Allowed = true // it was admitted; nothing stays taken
				}
			}
		}
		if err != nil {
			return dst, err
		}
		for j, i := range idx {
			out[i] = ds[j]
		}
		for rest := g + 1; rest < len(tags); rest++ {
			ridx, check := members(rest, func(int64) int64 { return 0 })
			cds, cerr := s.Decide(ctx, nil, check)
			if cerr != nil {
				return dst, cerr
			}
			for j, i := range ridx {
				out[i] = cds[j]
				out[i].Allowed = items[i].Cost <= cds[j].Remaining
			}
		}
		break
	}
	return append(dst, out...), nil
}

// request is one EVALSHA: keys and arguments of decide.lua. Decide takes
// one from reqPool and gives it back when it is done with it.
type request struct {
	keys []string
	args []any
	mask int   // algorithms present
	kis  []int // each item's first key, in keys (from 1)
	// exact is set when a rule without a calendar is beyond the script's
	// doubles, calendar when a rule has a calendar window.
	exact, calendar bool
	// abandoned is set when the caller stopped waiting while a pipeline
	// may still read the request: it must not be reused.
	abandoned bool
	// takes is set when an item has a positive cost: only then does the
	// request carry a cutoff (a late refund only gives back).
	takes bool
	// whole is set on a reconciliation (decide.lua's reconciliation
	// form, made by pushAll, not pooled): a pipeline sends it as it is,
	// never combined with other requests.
	whole bool
	// cut holds the cutoff's digits and cutArg them boxed once (a []byte
	// over cut's array), so that setting a cutoff allocates nothing.
	cut    [19]byte
	cutArg any
}

var reqPool = sync.Pool{New: func() any {
	r := new(request)
	r.cutArg = r.cut[:]
	return r
}}

// setCutoff sets the request's cutoff, ns in the server's clock.
func (r *request) setCutoff(ns int64) {
	if ns < 1e18 || r.cutArg == nil { // not 19 digits (before 2001): rare enough to allocate
		r.args[argDeadline] = strconv.FormatInt(max(ns, 1e9), 10)
		return
	}
	strconv.AppendInt(r.cut[:0], ns, 10)
	r.args[argDeadline] = r.cutArg
}

// maxPooledArgs bounds the requests kept for reuse.
const maxPooledArgs = 256

func (r *request) release() {
	if r.abandoned || cap(r.args) > maxPooledArgs {
		return
	}
	clear(r.keys)
	clear(r.args)
	reqPool.Put(r)
}

// build encodes items as decide.lua's KEYS and ARGV; ARGV's instant and
// calendar windows are filled in by run. It is also where rules are
// checked: an item without a rule, or the first invalid rule in order, is
// the error (ruleArgs validates a rule once, when it is first seen). On a
// Cluster, a request whose keys have different hash tags is errCrossSlot,
// once every rule has been checked.
func (s *Store) build(items []ratelimit.Item) (*request, error) {
	req := reqPool.Get().(*request)
	req.keys, req.kis = req.keys[:0], req.kis[:0]
	req.exact, req.calendar, req.takes = false, false, false
	req.args = append(req.args[:0], make([]any, argHeader)...)
	req.args[argSlack] = s.slackMS
	req.args[argDeadline] = ""
	req.args[argCount] = s.small(int64(len(items)))
	mask := 0
	cross := false
	var buf [128]byte
	tag0 := s.tagOf(items[0].Key)
	for i := range items {
		it := &items[i]
		r := it.Rule
		if r == nil {
			req.release()
			return nil, fmt.Errorf("%w: item %q has no rule", ratelimit.ErrInvalidRule, it.Key)
		}
		ra, err := s.ruleArgs(r)
		if err != nil {
			req.release()
			return nil, err
		}
		if cross {
			continue // decided group by group: only the rules are checked
		}
		tag := tag0
		if i > 0 {
			if tag = s.tagOf(it.Key); tag != tag0 && s.cluster {
				cross = true
				continue
			}
		}
		key := string(appendKey(buf[:0], s.prefix, tag, it.Key))
		ki := len(req.keys) + 1
		req.kis = append(req.kis, ki)
		req.keys = append(req.keys, key)
		if r.Algorithm == ratelimit.SlidingLog {
			req.keys = append(req.keys, key+logSuffix)
		}
		mask |= 1 << r.Algorithm
		req.exact = req.exact || ra.exact
		req.calendar = req.calendar || r.Calendar != ratelimit.NoCalendar
		base := len(req.args)
		req.args = append(req.args, ra.fields[:]...)
		f := req.args[base : base+itemFields]
		f[fieldKey] = s.small(int64(ki))
		f[fieldCost] = s.small(max(it.Cost, -ra.capacity))
		req.takes = req.takes || it.Cost > 0
	}
	if cross {
		req.release()
		return nil, errCrossSlot
	}
	req.args[argMask] = s.small(int64(mask))
	req.mask = mask
	req.abandoned = false
	return req, nil
}

// ruleArgs are a rule's fields as decide.lua reads them, formatted and boxed
// once. A Rule is immutable once in use, so the Store also validates it only
// once, when it builds them.
type ruleArgs struct {
	capacity int64
	exact    bool // no calendar, and beyond the script's doubles
	// fields are an item's fields under the rule; fieldKey and fieldCost
	// are left for build, the calendar window ("" here) for run.
	fields [itemFields]any
}

// maxRuleArgs bounds the cache of ruleArgs (callers that make a Rule per
// request only refill it).
const maxRuleArgs = 4096

// ruleArgs returns r's cached arguments, building them on first use after
// r.Validate; an invalid rule is not cached, and reports Validate's error
// on every call.
func (s *Store) ruleArgs(r *ratelimit.Rule) (*ruleArgs, error) {
	if ra, ok := s.rules.Load(r); ok {
		return ra.(*ruleArgs), nil
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	c := r.Capacity()
	iv := int64(r.Interval())
	capT := int64(0)
	if r.Quota > 0 {
		capT = c * iv
	}
	ra := &ruleArgs{
		capacity: c,
		exact:    r.Calendar == ratelimit.NoCalendar && needsExact(r, 0),
	}
	f := &ra.fields
	f[fieldAlg] = strconv.Itoa(int(r.Algorithm))
	f[fieldQuota] = strconv.FormatInt(r.Quota, 10)
	f[fieldCapacity] = strconv.FormatInt(c, 10)
	f[fieldInterval] = strconv.FormatInt(iv, 10)
	f[fieldCapT] = strconv.FormatInt(capT, 10)
	f[fieldPeriod] = strconv.FormatInt(int64(r.Period), 10)
	f[fieldWinStart], f[fieldWinEnd] = "", ""
	if s.nrules.Add(1) > maxRuleArgs {
		s.rules.Clear()
		s.nrules.Store(1)
	}
	s.rules.Store(r, ra)
	return ra, nil
}

// small returns n formatted and boxed, without allocating for small n.
func (s *Store) small(n int64) any {
	if n >= 0 && n < int64(len(s.smalls)) {
		return s.smalls[n]
	}
	return strconv.FormatInt(n, 10)
}

// run sends req, after filling in the instant and calendar windows, within
// the Store's timeout. A coalesced request carries its deadline to the
// pipeline instead of a context of its own.
func (s *Store) run(ctx context.Context, dst []ratelimit.Decision, req *request, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	start := time.Now()
	deadline := start.Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if req.exact || req.calendar || s.batch == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if req.exact {
		return s.exact(ctx, dst, items, req.keys)
	}
	var now time.Time
	switch {
	case s.now != nil:
		now = s.now()
	case req.calendar:
		// One round trip to the clock of the node that owns the slot.
		v, err := s.clock.Run(ctx, s.c, req.keys[:1]).Slice()
		if err != nil {
			return dst, err
		}
		now, err = parseTime(v)
		if err != nil {
			return dst, err
		}
	}
	req.args[argNow] = ""
	if !now.IsZero() {
		req.args[argNow] = strconv.FormatInt(now.UnixNano(), 10)
	}
	if req.calendar {
		for i := range items {
			if r := items[i].Rule; r.Calendar != ratelimit.NoCalendar {
				ws, we := r.Window(now)
				start, end := ws.UnixNano(), we.UnixNano()
				if needsExact(r, end-start) {
					return s.exact(ctx, dst, items, req.keys)
				}
				f := req.args[argHeader+itemFields*i:][:itemFields]
				f[fieldWinStart] = strconv.FormatInt(start, 10)
				f[fieldWinEnd] = strconv.FormatInt(end, 10)
			}
		}
	}
	if req.takes {
		cut, err := s.sclock.cutoff(ctx, req.keys[0], start, deadline)
		if err != nil {
			return dst, err
		}
		req.setCutoff(cut)
	}
	var res []any
	var err error
	if s.batch != nil {
		res, err = s.batch.do(ctx, deadline, req)
	} else {
		res, err = s.script.Run(ctx, s.c, req.keys, req.args...).Slice()
	}
	if err == nil && len(res) == 1 && res[0] == int64(replyExpired) {
		err = errExpired
	}
	if errors.Is(err, errExpired) && time.Now().Before(deadline) {
		s.sclock.expired(ctx, req.keys[0]) // answered in time, yet past the cutoff: measure again
	}
	if err != nil {
		return dst, err
	}
	if len(res) == 1 && res[0] == int64(replyFar) { // a state too far from now for the script's doubles
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		return s.exact(ctx, dst, items, req.keys)
	}
	return parse(dst, items, res)
}

// exact decides on the exact path (see exact.go).
func (s *Store) exact(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item, keys []string) ([]ratelimit.Decision, error) {
	s.exacts.Add(1)
	ds, err := s.decideExact(ctx, items, keys)
	if err != nil {
		return dst, err
	}
	return append(dst, ds...), nil
}

func parseTime(v []any) (time.Time, error) {
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("redisstore: TIME returned %d values", len(v))
	}
	var f [2]int64
	for i, x := range v {
		switch x := x.(type) {
		case int64:
			f[i] = x
		case string: // TIME inside a script returns strings
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("redisstore: TIME returned %q", x)
			}
			f[i] = n
		default:
			return time.Time{}, fmt.Errorf("redisstore: TIME returned %T", x)
		}
	}
	return time.Unix(f[0], f[1]*1000), nil
}

// parse turns decide.lua's reply into decisions.
func parse(dst []ratelimit.Decision, items []ratelimit.Item, res []any) ([]ratelimit.Decision, error) {
	if len(res) != replyFields*len(items) {
		return dst, fmt.Errorf("redisstore: script returned %d values for %d items", len(res), len(items))
	}
	for i := range items {
		var f [replyFields]int64
		for j := range f {
			v, ok := res[replyFields*i+j].(int64)
			if !ok {
				return dst, fmt.Errorf("redisstore: script returned %T", res[replyFields*i+j])
			}
			f[j] = v
		}
		r := items[i].Rule
		d := ratelimit.Decision{
			Allowed:    f[replyAllowed] == 1,
			Capacity:   r.Capacity(),
			Remaining:  f[replyRemaining],
			ResetAfter: dur(f[replyReset]),
			RetryAfter: dur(f[replyRetry]),
			Rule:       r.Name,
		}
		switch f[replyReason] {
		case reasonOK:
			d.Reason = ratelimit.ReasonOK
		case reasonLimited:
			d.Reason = ratelimit.ReasonLimited
		default: // reasonExceeds
			d.Reason, d.RetryAfter = ratelimit.ReasonExceedsCapacity, ratelimit.Never
		}
		dst = append(dst, d)
	}
	return dst, nil
}

// dur maps the script's saturated durations back to MaxInt64.
func dur(ns int64) time.Duration {
	if ns >= maxDuration {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(ns)
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
	rk := string(appendKey(nil, s.prefix, s.tagOf(key), key))
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
	rk := string(appendKey(nil, s.prefix, s.tagOf(key), key))
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
