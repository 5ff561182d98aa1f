package adaptive

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults of RejecterOptions, and of the zero Rejecter.
const (
	// DefaultRejecterK is the multiplier K: a Rejecter lets through about
	// K requests per request the dependency accepts.
	DefaultRejecterK = 2
	// DefaultRejecterWindow is the span over which requests and accepts
	// are counted.
	DefaultRejecterWindow = 2 * time.Minute
	// DefaultRejecterMaxProbability caps the rejection probability: at
	// least one request in ten still reaches the dependency, so that its
	// recovery is seen within about a window.
	DefaultRejecterMaxProbability = 0.9
)

// rejecterBuckets is the number of buckets of a Rejecter's window.
const rejecterBuckets = 20

// ErrRejectedLocally is the error of a call that a Rejecter rejected
// locally, without sending it, because the dependency has lately been refusing
// calls (overloaded, or failing). Sluice's clients return it wrapped
// (httplimit.Client) or inside an UNAVAILABLE status (grpclimit.Client), so
// errors.Is(err, ErrRejectedLocally) tells a local rejection from a
// refusal the dependency sent and from a wait that would outlast a deadline.
var ErrRejectedLocally = errors.New("rejected locally: the dependency is overloaded")

// RejecterOptions configure a Rejecter made by NewRejecter. The zero value
// of each field means its default.
type RejecterOptions struct {
	// K is the number of requests let through per request the dependency
	// accepts, at least 1: 0 means DefaultRejecterK (2). A K near 1 rejects
	// as soon as anything fails, wasting little of the dependency's work on
	// requests it refuses but reacting to a few failures; a larger K
	// tolerates more refusals before rejecting locally.
	K float64
	// Window is the span over which requests and accepts are counted: 0
	// means DefaultRejecterWindow (2 minutes). It is kept in 20 buckets of
	// Window/20 each (rounded down to the nanosecond; Window must be at
	// least 20 ns), so a count is forgotten between Window−Window/20 and
	// Window after it was made.
	Window time.Duration
	// MaxProbability caps the rejection probability, in (0, 1]: 0 means
	// DefaultRejecterMaxProbability (0.9). Uncapped (1), the book's
	// formula approaches 1 during an outage, the window fills with the
	// Rejecter's own rejections, and after the dependency recovers the
	// few requests still sent take several windows to bring it back to 0
	// (see the type's doc); capped, the requests that still probe the
	// dependency during an outage are what brings it back within about a
	// window once the dependency answers again. (Envoy's admission control
	// caps it at 0.8 by default, for the same reason.)
	MaxProbability float64
	// Rand returns a random number in [0, 1); nil means
	// math/rand/v2.Float64. It is called with the Rejecter's lock held, so
	// a source that is not safe for concurrent use (rand.New of a seeded
	// PCG, for a test) may be given. It is called only when the rejection
	// probability is above zero.
	Rand func() float64
	// Now is the clock of Allow and Accept; nil means time.Now. AllowAt,
	// AcceptAt and StatsAt take the time instead.
	Now func() time.Time
}

// A Rejecter rejects a client's requests locally, before sending them,
// while its dependency refuses them: what the chapter "Handling Overload"
// of Google's Site Reliability Engineering book calls client-side adaptive
// throttling. A client that sees its dependency refuse requests rejects
// some of its own, so that an overloaded dependency spends less work on
// requests it would refuse anyway. (In Sluice, "throttled" means that a
// dependency asked the caller to slow down: a 429, or a 503 or
// RESOURCE_EXHAUSTED with a retry hint; a Rejecter's rejection is local.)
//
// The model. Over a sliding window (2 minutes by default) a Rejecter
// counts requests, the calls the application attempted, and accepts, those
// the dependency accepted. Before each request it computes
//
//	p = max(0, (requests − K·accepts) / (requests + 1))
//
// from the counts of the window (without the request itself) and rejects
// the request with probability p, capped at MaxProbability (0.9 by
// default; 1 is the book's formula, see the recovery below). Every request is counted, those it
// rejects included, as the book has it: while the dependency accepts
// nothing, p approaches 1 (but never reaches it, so some requests still
// probe it); while it accepts at least one request in K, p is 0. Under a
// steady demand D and a dependency that accepts C < D/K of it, p settles
// near 1 − K·C/D and about K·C requests reach the dependency. When it
// recovers, every request sent is accepted again and the accepts of the
// window grow as e^(K·t/W): p falls to zero after about
// W/K · ln((1 − q) / (q·(K − 1))), q being the accepts per request of the
// window when the dependency recovered. That is within one window after a
// moderate overload (for K 2, one that rejected up to about 3 requests in
// 4), and longer after a deeper one, since the window still holds the
// Rejecter's own rejections of the first moments of the recovery: after
// an outage in which nothing was accepted, the book's p is near
// 1 − 1/requests and recovering takes several windows (4 after an outage
// of two windows in TestRejecterCap). Hence MaxProbability, 0.9 by
// default: the one request in ten still sent during the outage is what
// brings p back to zero within about two windows once the dependency
// answers (1.8 in the same test).
//
// What counts as an accept is the caller's decision, recorded with
// Accept or AcceptAt after the answer. Sluice's clients count an answer as
// an accept when the dependency did its work, even if it refused the
// request for its content (HTTP 400 or 404, gRPC INVALID_ARGUMENT), and not
// when it was overloaded (HTTP 429 or 503, gRPC RESOURCE_EXHAUSTED or
// UNAVAILABLE), timed out, or could not be reached; a call whose caller
// cancelled it counts as an accept, since it says nothing against the
// dependency.
//
// Time. AllowAt, AcceptAt and StatsAt take the instant, in the style of
// golang.org/x/time/rate, so tests step time by hand; Allow, Accept and
// Stats are one-line wrappers reading RejecterOptions.Now. An instant older
// than the last one seen is counted in the newest bucket: time going
// backwards neither loses counts nor brings back old ones. The window is
// a ring of 20 buckets with running totals, so every call costs O(1),
// and the decision path allocates nothing.
//
// The zero value is a Rejecter with every default: K 2, a window of 2
// minutes, math/rand/v2 and time.Now. NewRejecter makes one with other
// options, refusing invalid ones. A Rejecter is safe for concurrent use
// and must not be copied after first use; one Rejecter is meant to be
// shared by every call to one dependency (several clients of the same
// dependency may share it).
type Rejecter struct {
	k      float64          // 0 means DefaultRejecterK
	maxP   float64          // 0 means DefaultRejecterMaxProbability
	bucket int64            // the length of a bucket in ns; 0 means the default
	rand   func() float64   // nil means rand.Float64
	now    func() time.Time // nil means time.Now

	mu      sync.Mutex
	started bool
	cur     int64 // the index (time / bucket) of the newest bucket
	ring    [rejecterBuckets]rejecterBucket
	// The sums of the ring.
	requests, accepts int64
	// Since the Rejecter was made.
	totalRequests, totalAccepts, totalRejected int64
}

// A rejecterBucket counts the requests and accepts of one bucket of time.
type rejecterBucket struct{ requests, accepts int64 }

// RejecterStats are a Rejecter's counts, for metrics.
type RejecterStats struct {
	// Requests and Accepts are the counts of the window.
	Requests, Accepts int64
	// Probability is the probability with which a request made now would
	// be rejected.
	Probability float64
	// TotalRequests, TotalAccepts and TotalRejected count the requests
	// (those rejected included), the accepts and the local rejections
	// since the Rejecter was made; they only grow.
	TotalRequests, TotalAccepts, TotalRejected int64
}

// NewRejecter returns a Rejecter with the options o, or an error naming
// the first invalid one: a K below 1 or not finite, a negative Window or
// one shorter than 20 ns.
func NewRejecter(o RejecterOptions) (*Rejecter, error) {
	switch {
	case math.IsNaN(o.K) || math.IsInf(o.K, 0):
		return nil, fmt.Errorf("adaptive: RejecterOptions.K is %v; it must be a number, at least 1 (0 means %d)", o.K, DefaultRejecterK)
	case o.K != 0 && o.K < 1:
		return nil, fmt.Errorf("adaptive: RejecterOptions.K is %v; it must be at least 1 (0 means %d)", o.K, DefaultRejecterK)
	case o.Window < 0:
		return nil, fmt.Errorf("adaptive: RejecterOptions.Window is %v; it must be positive (0 means %v)", o.Window, DefaultRejecterWindow)
	case o.Window > 0 && o.Window < rejecterBuckets:
		return nil, fmt.Errorf("adaptive: RejecterOptions.Window is %v; it must be at least %d ns, one per bucket", o.Window, rejecterBuckets)
	case !(o.MaxProbability >= 0 && o.MaxProbability <= 1):
		return nil, fmt.Errorf("adaptive: RejecterOptions.MaxProbability is %v; it must be in (0, 1] (0 means %v)", o.MaxProbability, DefaultRejecterMaxProbability)
	}
	return &Rejecter{k: o.K, maxP: o.MaxProbability, bucket: int64(o.Window / rejecterBuckets), rand: o.Rand, now: o.Now}, nil
}

// Allow is AllowAt(now), now from RejecterOptions.Now.
func (t *Rejecter) Allow() bool { return t.AllowAt(t.clock()) }

// Accept is AcceptAt(now), now from RejecterOptions.Now.
func (t *Rejecter) Accept() { t.AcceptAt(t.clock()) }

// Stats is StatsAt(now), now from RejecterOptions.Now.
func (t *Rejecter) Stats() RejecterStats { return t.StatsAt(t.clock()) }

// AllowAt counts a request made at now and reports whether it may be sent:
// false means it is rejected locally, with the probability the type's doc
// gives. A request that is sent should be followed, once answered, by
// AcceptAt if the dependency accepted it.
func (t *Rejecter) AllowAt(now time.Time) bool {
	t.mu.Lock()
	b := t.advance(now)
	p := t.probability()
	b.requests++
	t.requests++
	t.totalRequests++
	allow := p <= 0 || t.random() >= p
	if !allow {
		t.totalRejected++
	}
	t.mu.Unlock()
	return allow
}

// AcceptAt records that a request sent was accepted by the dependency,
// answered at now.
func (t *Rejecter) AcceptAt(now time.Time) {
	t.mu.Lock()
	b := t.advance(now)
	b.accepts++
	t.accepts++
	t.totalAccepts++
	t.mu.Unlock()
}

// StatsAt returns the Rejecter's counts at now.
func (t *Rejecter) StatsAt(now time.Time) RejecterStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	return RejecterStats{
		Requests:      t.requests,
		Accepts:       t.accepts,
		Probability:   max(0, t.probability()),
		TotalRequests: t.totalRequests,
		TotalAccepts:  t.totalAccepts,
		TotalRejected: t.totalRejected,
	}
}

// probability returns the rejection probability of the window's counts,
// capped at MaxProbability, which is 0 or less when nothing is to be
// rejected; t.mu is held.
func (t *Rejecter) probability() float64 {
	k, maxP := t.k, t.maxP
	if k == 0 {
		k = DefaultRejecterK
	}
	if maxP == 0 {
		maxP = DefaultRejecterMaxProbability
	}
	return min(maxP, (float64(t.requests)-k*float64(t.accepts))/float64(t.requests+1))
}

// advance moves the window to now, forgetting the buckets that have slid
// out of it, and returns the bucket of now (the newest bucket if now is
// older); t.mu is held.
func (t *Rejecter) advance(now time.Time) *rejecterBucket {
	size := t.bucket
	if size == 0 {
		size = int64(DefaultRejecterWindow / rejecterBuckets)
	}
	ns := now.UnixNano()
	i := ns / size
	if ns%size < 0 {
		i-- // floor, for instants before 1970
	}
	switch {
	case !t.started:
		t.started, t.cur = true, i
	case i-t.cur >= rejecterBuckets:
		t.ring = [rejecterBuckets]rejecterBucket{}
		t.requests, t.accepts = 0, 0
		t.cur = i
	case i > t.cur:
		for j := t.cur + 1; j <= i; j++ {
			b := &t.ring[slot(j)]
			t.requests -= b.requests
			t.accepts -= b.accepts
			*b = rejecterBucket{}
		}
		t.cur = i
	}
	return &t.ring[slot(t.cur)]
}

// slot returns the place in the ring of the bucket of index i.
func slot(i int64) int64 { return (i%rejecterBuckets + rejecterBuckets) % rejecterBuckets }

func (t *Rejecter) random() float64 {
	if t.rand != nil {
		return t.rand()
	}
	return rand.Float64()
}

func (t *Rejecter) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}
