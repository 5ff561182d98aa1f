package httplimit

import (
	"context"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
)

// Budgets paces calls to the budgets a service announces in its responses
// (limitheader.ParseAnnouncement reads them: OpenAI's and Anthropic's
// fields, the IETF RateLimit fields and their older forms), every
// dimension at once: requests, tokens, input tokens, output tokens or any
// unit a policy names. A Client with Budgets reserves each call's estimate
// (WithEstimate) before sending it and settles it from the response; it
// can also be used directly, with Reserve and a Reservation's Learn and
// Settle.
//
// The budgets are kept per key (a model or a deployment: Estimate.Key),
// and per dimension (limitheader.Budget.Name). For each it holds what the
// service last announced and the estimates of the calls in flight. The
// model of a dimension is:
//
//   - OpenAI's and Anthropic's budgets are token buckets (their resets are
//     the time until the budget is full again): the level is the
//     announced Remaining, and it refills linearly at Limit per Window
//     (Budgets.Window: a minute, the unit of both vendors' limits), up
//     to Limit — or slower, when a budget at least half spent announces
//     a reset more than 10 % longer than that rate implies (a budget per
//     hour or per day): then at the announced pace.
//   - The IETF fields and the older forms (RateLimit-*, X-RateLimit-*)
//     count in fixed windows (their reset is the window's end): the level
//     is Remaining until the reset, and Limit from then on (a window of w
//     later ends w after, when w is known). A window's budget without a
//     reset is not paced.
//   - A call may be sent when, in every dimension it costs something, the
//     level minus the estimates of the calls in flight covers its
//     estimate (an estimate above Limit needs only Limit); otherwise it
//     waits for the refill that covers it, or for a call in flight to be
//     settled, whichever comes first. The estimates of the calls in flight
//     are subtracted even when the service has already counted some of
//     them: the pacing errs on the side of waiting, by at most what is in
//     flight, which shifts the level once and costs no throughput in the
//     long run.
//   - A response's announcement replaces what is known of each dimension
//     it names, unless a response to a call reserved later was taken
//     already (responses may come back out of order: an older one must
//     not roll the state back). Then the call is settled: its estimate
//     stops counting as in flight, and its actual usage is charged to the
//     level, which may go below zero (a debt that the next calls wait
//     out) — even when the announcement already counts it: the next
//     announcement corrects that. A token bucket announced with 0 left
//     keeps the debt charged here, since a service in debt announces 0,
//     not how deep.
//   - A dimension of which the service announced no Limit (a sentinel, a
//     field missing or malformed) does not pace; neither does a dimension
//     never announced: the calls made before a key's first answer are
//     sent at once.
//   - A reservation never settled stops counting as in flight after
//     Hold, charged at its estimate.
//   - A dimension may also have a pace of the caller's (SetPace): a token
//     bucket of its own, which a call's estimate must fit too, from
//     which the estimate is taken when the call is reserved (down to a
//     debt, when it is above the bucket's burst), and which gets the
//     difference back, or is charged it, when the call is settled. A pace
//     is what paces a capacity the service never announces (SetCapacity:
//     Azure Cosmos DB's throughput, whose answers say only what a call
//     cost, x-ms-request-charge, which a Client settles as RequestUnits)
//     and a process's share of an account that several spend (SetShare,
//     and Share, which follows a lease.Holder's share).
//
// An estimate counts in each dimension the cost Estimate.Cost gives it by
// name; a dimension it does not name costs 1 if it counts requests (its
// Unit is "requests"), else 0.
//
// The zero value is ready to use; a Budgets is safe for concurrent use and
// is shared by every Client calling the same service account. Its keys
// are never forgotten: use a bounded set (models, deployments).
type Budgets struct {
	// Window is the time in which an empty token bucket (OpenAI's and
	// Anthropic's budgets) refills when the response does not say; 0
	// means a minute.
	Window time.Duration
	// Hold is the longest a reservation counts as in flight: one older
	// (its response's body never closed, its Reservation never settled)
	// is settled at its estimate; 0 means 10 minutes.
	Hold time.Duration

	mu   sync.Mutex
	keys map[string]*budgetKey
}

// budgetKey is the budgets of one key.
type budgetKey struct {
	seq   uint64  // reservations granted so far
	share float64 // the fraction of every announced budget this process paces to (SetShare); 0 when none
	dims  []*budgetDim
	wake  chan struct{} // closed when a call is settled; nil when none waits
	// The reservations in flight, oldest first, linked through their
	// prev and next.
	head, tail *Reservation
}

// budgetDim is one dimension of a key: what the service last announced,
// aged by the model, the pace set for it, and the estimates in flight.
type budgetDim struct {
	name, unit string
	known      bool      // an announcement paces it
	window     bool      // a fixed window, else a token bucket
	bucket               // the announced level and, for a bucket, its refill
	resetAt    time.Time // window: when the level is back to limit
	period     time.Duration
	pace       *bucket // set by SetPace; nil when none is
	reserved   int64   // estimates of the calls in flight
	seq        uint64  // the reservation whose answer was last learned
}

// A bucket is a token bucket: level at at, refilled at rate per
// nanosecond up to limit. A fixed window's level is a bucket's level too,
// without its refill.
type bucket struct {
	limit int64
	level float64
	at    time.Time
	rate  float64
}

// advance ages b's level to now (never back: the clocks of concurrent
// callers are read in any order).
func (b *bucket) advance(now time.Time) {
	if !now.After(b.at) {
		return
	}
	if b.level < float64(b.limit) {
		b.level = min(float64(b.limit), b.level+b.rate*float64(now.Sub(b.at)))
	}
	b.at = now
}

// wait is the time, from now, until b's level less reserved covers n
// (capped at b's limit): 0 when it does now.
func (b *bucket) wait(n, reserved int64, now time.Time) time.Duration {
	b.advance(now)
	short := float64(min(n, b.limit)) - (b.level - float64(reserved))
	if short <= 0 {
		return 0
	}
	w := short / b.rate
	if w >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(1, time.Duration(math.Ceil(w)))
}

// charge takes n from b's level at now; it may go below zero (a debt). A
// negative n gives back, up to the limit.
func (b *bucket) charge(n int64, now time.Time) {
	b.advance(now)
	b.level = min(float64(b.limit), b.level-float64(n))
}

// An Estimate is what a call is expected to cost, in each dimension a
// service announces, and the key of the budgets it draws on.
type Estimate struct {
	// Key selects the budgets: a model, a deployment; "" means the
	// Client's pause scope (the host).
	Key string
	// Cost is the estimate per dimension, by its name ("requests",
	// "tokens", "input-tokens", "output-tokens", an IETF policy's name,
	// RequestUnits).
	// For an LLM call: input tokens the prompt's count, output tokens
	// max_tokens, tokens both. A dimension not named costs 1 if it counts
	// requests, else 0.
	Cost map[string]int64
}

type estimateKey struct{}

// WithEstimate returns a context whose requests, sent through a Client
// with Budgets, reserve e before they are sent.
func WithEstimate(ctx context.Context, e Estimate) context.Context {
	return context.WithValue(ctx, estimateKey{}, e)
}

// EstimateFrom returns the estimate WithEstimate put in ctx, for a client
// of another transport that reserves it (grpclimit.Client).
func EstimateFrom(ctx context.Context) (Estimate, bool) {
	e, ok := ctx.Value(estimateKey{}).(Estimate)
	return e, ok
}

func estimateOf(ctx context.Context, scope string) Estimate {
	e, _ := ctx.Value(estimateKey{}).(Estimate)
	if e.Key == "" {
		e.Key = scope
	}
	return e
}

// A Reservation is a call's estimate, reserved in its key's budgets until
// it is settled (Settle or Release; only the first counts). A
// reservation never settled counts as in flight until Budgets.Hold has
// passed, holding back the calls after it, and is then settled at its
// estimate: settle every one.
type Reservation struct {
	b    *Budgets
	k    *budgetKey
	seq  uint64
	cost map[string]int64
	held []held
	buf  [4]held // held's first elements: one allocation a call
	// Guarded by b.mu:
	at         time.Time // when it was granted
	prev, next *Reservation
	done       bool
}

// held is what a reservation holds of a dimension: n counts in flight
// against the announced budget, paced was taken from the pace.
type held struct {
	d        *budgetDim
	n, paced int64
}

// Reserve waits until cost fits every budget of key (see Budgets) and
// reserves it. It fails at once, with an error matching
// ErrWouldExceedDeadline, when the wait is longer than the time left
// before ctx's deadline, and with ctx's error if ctx is done meanwhile.
func (b *Budgets) Reserve(ctx context.Context, key string, cost map[string]int64) (*Reservation, error) {
	return b.reserve(ctx, key, cost, time.Now)
}

// reserve is Reserve on the clock now.
func (b *Budgets) reserve(ctx context.Context, key string, cost map[string]int64, now func() time.Time) (*Reservation, error) {
	for {
		t := now()
		r, wait, wake := b.tryReserve(key, cost, t, true)
		if r != nil {
			// Booked ahead on its paces: sent when they would have
			// admitted it.
			if err := retry.WaitOrWake(ctx, t, wait, nil); err != nil {
				r.Release(now())
				return nil, err
			}
			return r, nil
		}
		if err := retry.WaitOrWake(ctx, t, wait, wake); err != nil {
			return nil, err
		}
	}
}

// TryReserve reserves cost in key's budgets at now if it fits every one
// of them; otherwise it reserves nothing and returns how long the refill
// takes to cover it, and a channel closed when a call of key is settled
// meanwhile (which may cover it sooner).
func (b *Budgets) TryReserve(key string, cost map[string]int64, now time.Time) (r *Reservation, wait time.Duration, settled <-chan struct{}) {
	return b.tryReserve(key, cost, now, false)
}

// maxBooking is the furthest ahead a call is booked on a pace: what the
// pace or the announced budgets learn meanwhile (a share that shrinks, a
// 429) holds back only the calls booked later.
const maxBooking = time.Second

// tryReserve is TryReserve; with ahead, a cost that fits every announced
// budget now and waits only for a pace is reserved at once, booked ahead
// on the pace (its level goes below zero, so that the next calls are
// booked after it), and wait is how long the caller must still wait
// before sending it: the time the pace takes to cover it, at most
// maxBooking. A caller that is late (a busy machine's scheduler) then
// loses none of the pace's refill, as a ratelimit.Limiter's reservation
// does not, and callers queue in order instead of all waking at each
// settlement.
func (b *Budgets) tryReserve(key string, cost map[string]int64, now time.Time, ahead bool) (r *Reservation, wait time.Duration, settled <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.key(key)
	for hold := b.hold(); k.head != nil && now.Sub(k.head.at) > hold; {
		k.head.settleLocked(nil, false, now) // expired: its estimate stands
	}
	var announced time.Duration
	for _, d := range k.dims {
		a, p := d.wait(d.cost(cost), now)
		announced, wait = max(announced, a), max(wait, a, p)
		if p > maxBooking || (p > 0 && d.pace.rate <= 0) {
			ahead = false
		}
	}
	if announced > 0 || (wait > 0 && !ahead) {
		if k.wake == nil {
			k.wake = make(chan struct{})
		}
		return nil, wait, k.wake
	}
	k.seq++
	r = &Reservation{b: b, k: k, seq: k.seq, cost: cost, at: now, prev: k.tail}
	r.held = r.buf[:0]
	if k.tail != nil {
		k.tail.next = r
	} else {
		k.head = r
	}
	k.tail = r
	for _, d := range k.dims {
		if n := d.cost(cost); n > 0 {
			h := held{d: d, n: d.cap(n)} // as much as it waited for
			d.reserved += h.n
			if d.pace != nil {
				h.paced = n
				d.pace.charge(n, now)
			}
			r.held = append(r.held, h)
		}
	}
	return r, wait, nil
}

// SetPace paces dimension name of key's budgets with a token bucket of
// limit units a second and burst units, besides what the service
// announces of it: a call is sent when both cover its estimate. It is the
// way to pace what the service does not announce, or only part of it:
//
//   - a capacity the caller knows, of a service that announces only what
//     a call cost (Azure Cosmos DB's throughput, of which every answer
//     says only x-ms-request-charge; see SetCapacity and RequestUnits);
//   - this process's share of a budget that several processes spend (an
//     LLM account): each process's Budgets learns the whole budget from
//     the answers, and paces to its share of it, which a lease.Holder
//     grants (see Share).
//
// The bucket starts full when first set (or set again after a rate of
// 0); a later call changes its rate and burst at now, keeping the level
// (capped at the new burst): tokens of a larger burst are earned. It is
// charged what each call used, when settled, so that a call that cost
// more than its estimate leaves a debt that the next calls wait out. A
// burst of 0 or less removes the pace.
func (b *Budgets) SetPace(key, name string, limit float64, burst int64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.key(key)
	d := k.dim(name)
	if d == nil {
		d = &budgetDim{name: name}
		k.dims = append(k.dims, d)
	}
	if burst <= 0 {
		d.pace = nil
	} else {
		d.setPace(max(0, limit), burst, now)
	}
	k.wakeLocked()
}

// setPace sets d's pace to limit units a second and burst: a bucket
// starts full when new or when it had no rate (a share granted nothing
// yet), and keeps its level otherwise (see SetPace).
func (d *budgetDim) setPace(limit float64, burst int64, now time.Time) {
	rate := limit / float64(time.Second)
	if d.pace == nil || d.pace.rate == 0 {
		d.pace = &bucket{limit: burst, level: float64(burst), at: now, rate: rate}
		return
	}
	d.pace.advance(now)
	d.pace.limit, d.pace.rate = burst, rate
	d.pace.level = min(d.pace.level, float64(burst))
}

// wakeLocked wakes the callers waiting on k: a change may let them
// through. b.mu is held.
func (k *budgetKey) wakeLocked() {
	if k.wake != nil {
		close(k.wake)
		k.wake = nil
	}
}

// SetShare paces every dimension of key's budgets that the service
// announces to fraction of it (0 < fraction ≤ 1), besides the announced
// budget itself: the share of one process among several that spend one
// account (see Share, which takes the fraction from a lease.Holder). A
// dimension's share is a pace (SetPace): for a token bucket (OpenAI's,
// Anthropic's), fraction of its Limit as the burst, refilled at fraction
// of its rate less 1 % (ratelimit.WindowSlack), so that the processes'
// buckets together are the service's; for a fixed window of known length
// (the IETF fields), ratelimit.WindowPacing's bucket for fraction of
// Limit per window. Dimensions announced later take the share when they
// are. A fraction of 0 or less stops every call until a later SetShare;
// above 1 counts as 1. SetShare replaces what SetPace set on the
// announced dimensions.
func (b *Budgets) SetShare(key string, fraction float64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.key(key)
	k.share = min(1, max(fraction, 1e-12)) // 0 would mean unshared
	for _, d := range k.dims {
		d.shareLocked(k.share, now)
	}
	k.wakeLocked()
}

// shareLocked paces d at share of what the service announced of it, when
// it announced a rate (see SetShare).
func (d *budgetDim) shareLocked(share float64, now time.Time) {
	if share <= 0 || !d.known {
		return
	}
	var limit float64
	var burst int64
	switch {
	case !d.window && d.rate > 0:
		limit = (1 - ratelimit.WindowSlack) * share * d.rate * float64(time.Second)
		burst = int64(share * float64(d.limit))
	case d.window && d.period > 0:
		l, b := ratelimit.WindowPacing(share*float64(d.limit)/d.period.Seconds(), d.period)
		limit, burst = float64(l), int64(b)
	default:
		return
	}
	if share < 1e-9 {
		// Nothing granted: no call fits until the share grows (then the
		// pace starts full, as a pace without a rate does).
		d.pace = &bucket{limit: 1, level: -1, at: now}
		return
	}
	d.setPace(limit, max(1, burst), now)
}

// SetCapacity paces dimension name of key's budgets to a capacity of
// perSecond units a second that the service counts in fixed windows of
// length window whose start the caller does not know (Azure Cosmos DB's
// provisioned throughput: 20,000 RU/s, counted per second): SetPace with
// ratelimit.WindowPacing's bucket, which lets no window of that length,
// wherever it starts, receive more than 99 % of perSecond × window, plus
// what calls in flight cost beyond their estimates.
func (b *Budgets) SetCapacity(key, name string, perSecond float64, window time.Duration, now time.Time) {
	limit, burst := ratelimit.WindowPacing(perSecond, window)
	b.SetPace(key, name, float64(limit), int64(burst), now)
}

// RequestUnits is the dimension that a response's x-ms-request-charge
// (Azure Cosmos DB's charge, limitheader.Announcement.Charge) settles: a
// Client charges a call's reservation what its answer says the call cost,
// rounded up, unless its Usage hook names the dimension. Pace it with
// SetCapacity, and reserve an estimate of it (WithEstimate).
const RequestUnits = "request-units"

// key returns key's budgets, made on first use. b.mu is held.
func (b *Budgets) key(key string) *budgetKey {
	if k, ok := b.keys[key]; ok {
		return k
	}
	if b.keys == nil {
		b.keys = make(map[string]*budgetKey)
	}
	k := &budgetKey{}
	b.keys[key] = k
	return k
}

// Learn takes what a response to r's call announced at now as the truth
// of each dimension it names, unless the answer to a call reserved after
// r's was learned already (see Budgets). It may be called before the call
// is settled, when the response's header arrives.
func (r *Reservation) Learn(a limitheader.Announcement, now time.Time) {
	if r == nil || len(a.Budgets) == 0 {
		return
	}
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bu := range a.Budgets {
		if bu.Limit <= 0 {
			continue // not announced: unknown
		}
		d := r.k.dim(bu.Name)
		if d == nil {
			d = &budgetDim{name: bu.Name}
			r.k.dims = append(r.k.dims, d)
		}
		if d.seq > r.seq {
			continue // stale: a later call's answer was learned
		}
		d.learn(bu, now, b.window())
		d.seq = r.seq
		d.shareLocked(r.k.share, now)
	}
}

// Settle ends r: its estimate stops counting as in flight, and what the
// call used is charged at now, by dimension name; a dimension used does
// not name is charged r's estimate of it (so Settle(nil, now) keeps the
// estimate as the cost).
func (r *Reservation) Settle(used map[string]int64, now time.Time) { r.settle(used, false, now) }

// SettleCharge is Settle with the charge an answer announced
// (limitheader.Announcement.Charge, Unknown when none) as RequestUnits,
// rounded up, unless used names them: what a Client does.
func (r *Reservation) SettleCharge(used map[string]int64, charge float64, now time.Time) {
	r.Settle(withCharge(used, charge), now)
}

// Release ends r without charging anything: the call was not made, or the
// service refused it at no cost (a 429).
func (r *Reservation) Release(now time.Time) { r.settle(nil, true, now) }

func (r *Reservation) settle(used map[string]int64, free bool, now time.Time) {
	if r == nil {
		return
	}
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	r.settleLocked(used, free, now)
}

// settleLocked is settle with r.b.mu held.
func (r *Reservation) settleLocked(used map[string]int64, free bool, now time.Time) {
	if r.done {
		return
	}
	r.done = true
	k := r.k
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		k.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		k.tail = r.prev
	}
	r.prev, r.next = nil, nil
	for _, d := range r.k.dims {
		var h held
		for _, x := range r.held {
			if x.d == d {
				h = x
				d.reserved -= h.n
				break
			}
		}
		if h.d == nil {
			h.n = d.cost(r.cost) // a dimension learned since r was granted
		}
		n, ok := used[d.name]
		switch {
		case free:
			n = 0
		case !ok:
			n = h.n
		}
		if d.pace != nil {
			d.pace.charge(max(0, n)-h.paced, now) // what the estimate missed, or a refund
		}
		if d.known && n > 0 {
			d.advance(now)
			d.level -= float64(n)
		}
	}
	r.k.wakeLocked()
}

func (b *Budgets) hold() time.Duration {
	if b.Hold > 0 {
		return b.Hold
	}
	return 10 * time.Minute
}

func (b *Budgets) window() time.Duration {
	if b.Window > 0 {
		return b.Window
	}
	return time.Minute
}

func (k *budgetKey) dim(name string) *budgetDim {
	for _, d := range k.dims {
		if d.name == name {
			return d
		}
	}
	return nil
}

// cost is d's share of an estimate.
func (d *budgetDim) cost(cost map[string]int64) int64 {
	if n, ok := cost[d.name]; ok {
		return max(0, n)
	}
	if d.unit == "requests" {
		return 1
	}
	return 0
}

// learn takes bu, announced at now, as d's state; window is the default
// refill time of a token bucket.
func (d *budgetDim) learn(bu limitheader.Budget, now time.Time, window time.Duration) {
	d.unit = bu.Unit
	switch bu.Dialect {
	case limitheader.DialectOpenAI, limitheader.DialectAnthropic:
		if bu.Window > 0 {
			window = bu.Window
		}
		if bu.Remaining >= 0 && bu.Remaining <= bu.Limit/2 && bu.Reset > 0 {
			// A budget at least half spent says how long a full refill
			// takes; one clearly slower than assumed (an hourly or daily
			// budget) is taken, a little slower is the rounding of a
			// reset to the second, and ignored.
			full := time.Duration(float64(bu.Reset) * float64(bu.Limit) / float64(bu.Limit-bu.Remaining))
			if full > window+window/10 {
				window = full
			}
		}
		rate := float64(bu.Limit) / float64(window)
		var level float64
		switch {
		case bu.Remaining >= 0:
			level = float64(min(bu.Remaining, bu.Limit))
		case bu.Reset >= 0:
			level = float64(bu.Limit) - rate*float64(bu.Reset)
		default:
			d.known = false
			return
		}
		if level == 0 && d.known && !d.window {
			// A bucket in debt is announced with 0 left, not how deep:
			// keep the debt charged here.
			d.advance(now)
			level = min(0, d.level)
		}
		*d = budgetDim{name: d.name, unit: d.unit, known: true,
			bucket: bucket{limit: bu.Limit, level: level, at: now, rate: rate},
			pace:   d.pace, reserved: d.reserved, seq: d.seq}
	default:
		if bu.Remaining < 0 || bu.Reset < 0 {
			d.known = false
			return
		}
		*d = budgetDim{name: d.name, unit: d.unit, known: true, window: true,
			bucket:  bucket{limit: bu.Limit, level: float64(min(bu.Remaining, bu.Limit))},
			resetAt: now.Add(bu.Reset), period: max(0, bu.Window),
			pace: d.pace, reserved: d.reserved, seq: d.seq}
	}
}

// advance ages d's announced level to now (never back).
func (d *budgetDim) advance(now time.Time) {
	if !d.window {
		d.bucket.advance(now)
		return
	}
	if d.resetAt.IsZero() || now.Before(d.resetAt) {
		return
	}
	d.level = float64(d.limit)
	if d.period > 0 {
		n := now.Sub(d.resetAt)/d.period + 1
		d.resetAt = d.resetAt.Add(n * d.period)
	} else {
		d.resetAt = time.Time{}
	}
}

// cap is what an estimate of n holds of d: at most the limit the service
// announced (a larger estimate waits for that much only, and its usage is
// charged at settlement). A pace's burst caps what a call waits for, not
// what it holds: the calls in flight hold their whole estimates.
func (d *budgetDim) cap(n int64) int64 {
	if d.known {
		n = min(n, d.limit)
	}
	return n
}

// wait is the time, from now, until d covers n beside what is in flight:
// in what the service announced, and in its pace (each 0 when it does now
// or nothing paces d).
func (d *budgetDim) wait(n int64, now time.Time) (announced, pace time.Duration) {
	if n <= 0 {
		return 0, 0
	}
	if d.pace != nil {
		pace = d.pace.wait(n, 0, now) // the calls in flight took their estimates from it
	}
	if !d.known {
		return 0, pace
	}
	if !d.window {
		return d.bucket.wait(n, d.reserved, now), pace
	}
	d.advance(now)
	if float64(min(n, d.limit)) <= d.level-float64(d.reserved) || d.resetAt.IsZero() {
		// Covered, or past the last reset known, with no window: nothing
		// to pace to until the service says more.
		return 0, pace
	}
	return max(1, d.resetAt.Sub(now)), pace
}

// maxUsageBody bounds the body a Client keeps for its Usage hook.
const maxUsageBody = 4 << 20

// settleFrom learns what resp announces for res, and settles res: at
// once for a refusal (which cost nothing) or without a Usage hook; when
// the caller is done with the body otherwise.
func (c *Client) settleFrom(res *Reservation, resp *http.Response, refused bool) {
	now := c.clock()
	a, _ := limitheader.ParseAnnouncement(resp.Header, now) // what is well formed is usable
	res.Learn(a, now)
	switch {
	case refused:
		res.Release(now)
	case c.Usage == nil || resp.Body == nil || resp.Body == http.NoBody:
		res.Settle(c.usage(resp, nil, a.Charge), now)
	default:
		resp.Body = &settlingBody{ReadCloser: resp.Body, c: c, res: res, resp: resp, charge: a.Charge}
	}
}

// usage is what the call of resp used: what the Usage hook reads from
// it and body, with charge.
func (c *Client) usage(resp *http.Response, body []byte, charge float64) map[string]int64 {
	var used map[string]int64
	if c.Usage != nil {
		used = c.Usage(resp, body)
	}
	return withCharge(used, charge)
}

// withCharge adds the charge a response announced (Unknown when none) to
// used as RequestUnits, unless used names them.
func withCharge(used map[string]int64, charge float64) map[string]int64 {
	if charge < 0 {
		return used
	}
	if _, ok := used[RequestUnits]; ok {
		return used
	}
	if used == nil {
		used = make(map[string]int64, 1)
	}
	used[RequestUnits] = int64(min(math.Ceil(charge), 1<<62))
	return used
}

// settlingBody is a response's body that keeps what its reader reads (up
// to maxUsageBody) and settles its call's reservation at the end of the
// body or when it is closed, whichever comes first.
type settlingBody struct {
	io.ReadCloser
	c      *Client
	res    *Reservation
	resp   *http.Response
	charge float64 // the announced charge, or Unknown
	once   sync.Once
	mu     sync.Mutex // guards buf and over: Close may come during a Read
	buf    []byte
	over   bool
}

func (b *settlingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	if !b.over {
		if len(b.buf)+n > maxUsageBody {
			b.over, b.buf = true, nil
		} else {
			b.buf = append(b.buf, p[:n]...)
		}
	}
	b.mu.Unlock()
	if err == io.EOF {
		b.settle()
	}
	return n, err
}

func (b *settlingBody) Close() error {
	err := b.ReadCloser.Close()
	b.settle()
	return err
}

func (b *settlingBody) settle() {
	b.once.Do(func() {
		b.mu.Lock()
		buf, over := b.buf, b.over
		b.mu.Unlock()
		used := withCharge(nil, b.charge) // a body too long to keep: no usage read
		if !over {
			used = b.c.usage(b.resp, buf, b.charge)
		}
		b.res.Settle(used, b.c.clock())
	})
}
