package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Algorithm names how a Rule counts. The zero value is GCRA.
type Algorithm uint8

const (
	// GCRA is the generic cell rate algorithm: a token bucket whose whole
	// state is one timestamp. Capacity is Burst (or Quota), refilled
	// continuously at Quota per Period.
	GCRA Algorithm = iota
	// FixedWindow counts cost in windows of Period aligned to the Unix epoch,
	// or to calendar units when Rule.Calendar is set. It admits up to Quota
	// per window, so up to 2×Quota across a window boundary.
	FixedWindow
	// SlidingLog remembers every admitted request of the last Period and
	// admits at most Quota in any window of length Period. Exact; memory grows
	// with Quota (bounded by MaxSlidingLogQuota).
	SlidingLog
	// SlidingWindow estimates the sliding count from two fixed windows: the
	// previous window's count weighted by how much of it still overlaps, plus
	// the current count (the Cloudflare estimate).
	SlidingWindow
	// LeakyBucket is a meter: a bucket of capacity Burst (or Quota) that
	// drains one unit every Period/Quota; a request that would overflow it is
	// rejected. It decides exactly as GCRA does for the same Rule; it keeps
	// its state as a level rather than a timestamp.
	LeakyBucket

	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{"gcra", "fixed_window", "sliding_log", "sliding_window", "leaky_bucket"}

func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the Algorithm named s (as printed by String).
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("ratelimit: unknown algorithm %q (want one of gcra, fixed_window, sliding_log, sliding_window, leaky_bucket)", s)
}

// Calendar aligns fixed windows to calendar units in a time zone. The zero
// value, NoCalendar, means windows of Rule.Period aligned to the Unix epoch.
type Calendar uint8

const (
	NoCalendar Calendar = iota
	Minute
	Hour
	Day
	Week // starts on Monday, as ISO 8601
	Month
	Year

	numCalendars
)

var calendarNames = [numCalendars]string{"", "minute", "hour", "day", "week", "month", "year"}

func (c Calendar) String() string {
	if c < numCalendars {
		return calendarNames[c]
	}
	return fmt.Sprintf("Calendar(%d)", uint8(c))
}

// ParseCalendar returns the Calendar unit named s ("minute" … "year").
func ParseCalendar(s string) (Calendar, error) {
	for i, n := range calendarNames {
		if i > 0 && n == s {
			return Calendar(i), nil
		}
	}
	return 0, fmt.Errorf("ratelimit: unknown calendar unit %q (want minute, hour, day, week, month or year)", s)
}

// FailureMode says how a Store that cannot reach its backend decides.
// The zero value is FailDefault: the store's default, which for
// redisstore is FailLocal unless its Options.Failure says otherwise.
type FailureMode uint8

const (
	// FailDefault is a rule that states no mode: the store decides as its
	// own default says (redisstore: Options.Failure, FailLocal unless set).
	FailDefault FailureMode = iota
	// FailOpen admits the request and reports ReasonFailOpen.
	FailOpen
	// FailClosed denies the request and reports ReasonFailClosed.
	FailClosed
	// FailLocal decides with an in-process limiter at this replica's share
	// of the limit and reports ReasonLocal.
	FailLocal

	numFailureModes
)

var failureModeNames = [numFailureModes]string{"default", "fail_open", "fail_closed", "local"}

func (m FailureMode) String() string {
	if m < numFailureModes {
		return failureModeNames[m]
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m))
}

// ParseFailureMode returns the FailureMode named s: fail_open, fail_closed
// or local (FailDefault is the absence of a mode, not a name one states).
func ParseFailureMode(s string) (FailureMode, error) {
	for i, n := range failureModeNames {
		if i > 0 && n == s {
			return FailureMode(i), nil
		}
	}
	return 0, fmt.Errorf("ratelimit: unknown failure mode %q (want fail_open, fail_closed or local)", s)
}

// Counting says where a shared store keeps a rule's counter and how often
// a replica asks it, trading round trips for a stated error. The zero value
// is Strict. A store that keeps its state in one process (memstore) is
// exact whatever the mode and ignores it.
type Counting uint8

const (
	// Strict decides every request at the shared counter, all or nothing:
	// exact, one round trip per decision (less what the denial cache
	// answers).
	Strict Counting = iota
	// Batched takes blocks of capacity from the shared counter and spends
	// them locally. It never admits more than the limit, globally; the
	// capacity held in blocks by replicas that do not use it is stranded
	// until they give it back or it expires. GCRA, LeakyBucket and
	// FixedWindow.
	Batched
	// Approximate decides each key locally on a share of the shared state
	// and reconciles the hits counted with the shared counter at intervals.
	// It may over-admit, by at most a stated bound; see the store's
	// documentation. GCRA and LeakyBucket.
	Approximate

	numCountings
)

var countingNames = [numCountings]string{"strict", "batched", "approximate"}

func (c Counting) String() string {
	if c < numCountings {
		return countingNames[c]
	}
	return fmt.Sprintf("Counting(%d)", uint8(c))
}

// ParseCounting returns the Counting named s (as printed by String).
func ParseCounting(s string) (Counting, error) {
	for i, n := range countingNames {
		if n == s {
			return Counting(i), nil
		}
	}
	return 0, fmt.Errorf("ratelimit: unknown counting %q (want strict, batched or approximate)", s)
}

// Supports reports whether a rule of algorithm a can be counted in mode c.
// Strict supports every algorithm. Batched supports GCRA, LeakyBucket and
// FixedWindow, whose capacity can be handed out in blocks that stay exact
// (a bucket's block is spent within a short hold that its lease allows
// for, a window's before the window ends); not SlidingLog, whose log of
// single requests cannot be handed out in blocks, nor SlidingWindow, whose
// block would have to end with a window the store cannot see from the
// reply. Approximate supports GCRA and LeakyBucket, whose state is one
// instant that hits move.
func (c Counting) Supports(a Algorithm) bool {
	switch c {
	case Strict:
		return a < numAlgorithms
	case Batched:
		return a == GCRA || a == LeakyBucket || a == FixedWindow
	case Approximate:
		return a == GCRA || a == LeakyBucket
	}
	return false
}

// Bounds on a Rule. They keep every computation inside int64 nanoseconds.
const (
	// MaxQuota bounds Quota and Burst.
	MaxQuota = 1 << 40
	// MaxPeriod bounds Period: 100 years.
	MaxPeriod = 100 * 365 * 24 * time.Hour
	// MaxSlidingLogQuota bounds Quota for SlidingLog, whose memory per key
	// grows with it. Use SlidingWindow above it.
	MaxSlidingLogQuota = 1 << 16
)

// ErrInvalidRule is wrapped by every error Rule.Validate returns.
var ErrInvalidRule = errors.New("ratelimit: invalid rule")

// A Rule is one limit: Quota units of cost per Period, counted with
// Algorithm. A Rule is a value; a Store never keeps or changes it, so a rule
// changed between two calls applies from the second call on, against the
// cost already consumed under the old one.
//
// Quota 0 admits nothing but cost-0 checks. There is no "infinite" rule:
// callers that want none simply ask for no decision.
type Rule struct {
	// Name identifies the rule in decisions, headers and metrics.
	Name string
	// Algorithm counts cost; the zero value is GCRA.
	Algorithm Algorithm
	// Quota is the cost admitted per Period (the refill rate for GCRA and
	// LeakyBucket, the quota of one window for the window algorithms).
	// Validate refuses 0 unless Block is set: a forgotten Quota would
	// otherwise deny every request in silence.
	Quota int64
	// Block marks a rule that admits nothing on purpose (Envoy's
	// requests_per_unit: 0, a limit overridden to 0): Quota must be 0. Such
	// a rule denies every request with ReasonExceedsCapacity.
	Block bool
	// Period is the window length or the refill period. It must be zero
	// when Calendar is set.
	Period time.Duration
	// Burst is the capacity of GCRA and LeakyBucket: how much cost can be
	// admitted at once after a long idle time. Zero means Quota. The window
	// algorithms have no burst; it must be zero for them.
	Burst int64
	// Calendar aligns FixedWindow windows to calendar units in Location
	// (nil means UTC); real months and days, through DST changes.
	Calendar Calendar
	// Location is the time zone of calendar windows.
	Location *time.Location
	// Failure says how a Store decides when its backend is unreachable;
	// the zero value, FailDefault, leaves it to the store.
	Failure FailureMode
	// Counting says how a shared store counts the rule across replicas;
	// the zero value is Strict. Validate rejects an algorithm the mode
	// does not support (Counting.Supports).
	Counting Counting
}

// Capacity is the largest cost a single request can have and still succeed:
// Burst (or Quota when Burst is 0) for GCRA and LeakyBucket, Quota otherwise;
// 0 when Quota is 0.
func (r *Rule) Capacity() int64 {
	if r.Quota <= 0 {
		return 0 // nothing is ever admitted, whatever the burst
	}
	if r.Burst > 0 && (r.Algorithm == GCRA || r.Algorithm == LeakyBucket) {
		return r.Burst
	}
	return r.Quota
}

// Validate reports whether r is well formed; its errors wrap ErrInvalidRule.
func (r *Rule) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidRule, r.Name, fmt.Sprintf(format, a...))
	}
	if r.Algorithm >= numAlgorithms {
		return bad("unknown algorithm %d", r.Algorithm)
	}
	if r.Failure >= numFailureModes {
		return bad("unknown failure mode %d", r.Failure)
	}
	if r.Counting >= numCountings {
		return bad("unknown counting %d", r.Counting)
	}
	if !r.Counting.Supports(r.Algorithm) {
		return bad("counting %s does not support algorithm %s", r.Counting, r.Algorithm)
	}
	if r.Quota < 0 || r.Quota > MaxQuota {
		return bad("limit %d out of range [0, %d]", r.Quota, int64(MaxQuota))
	}
	if r.Quota == 0 && !r.Block {
		return bad("Quota is 0, which admits nothing: set Quota, or set Block to refuse every request on purpose")
	}
	if r.Block && r.Quota != 0 {
		return bad("Block is set with Quota %d: a rule that blocks admits nothing; leave Quota 0", r.Quota)
	}
	if r.Burst < 0 || r.Burst > MaxQuota {
		return bad("burst %d out of range [0, %d]", r.Burst, int64(MaxQuota))
	}
	if r.Calendar >= numCalendars {
		return bad("unknown calendar unit %d", r.Calendar)
	}
	if r.Calendar != NoCalendar {
		if r.Algorithm != FixedWindow {
			return bad("calendar windows need algorithm fixed_window, not %s", r.Algorithm)
		}
		if r.Period != 0 {
			return bad("period %v given with calendar unit %s; give one of them", r.Period, r.Calendar)
		}
	} else if r.Period <= 0 || r.Period > MaxPeriod {
		return bad("period %v out of range (0, %v]", r.Period, MaxPeriod)
	}
	switch r.Algorithm {
	case FixedWindow, SlidingLog, SlidingWindow:
		if r.Burst != 0 {
			return bad("burst is not used by %s; leave it 0", r.Algorithm)
		}
	case GCRA, LeakyBucket:
		if r.Quota > 0 {
			iv := r.interval()
			if hi, lo := bits.Mul64(uint64(r.Capacity()), uint64(iv)); hi != 0 || lo > math.MaxInt64/2 {
				return bad("burst %d × interval %v overflows; lower the burst or raise the rate", r.Capacity(), time.Duration(iv))
			}
		}
	}
	if r.Algorithm == SlidingLog && r.Quota > MaxSlidingLogQuota {
		return bad("sliding_log keeps one entry per request; limit %d exceeds %d, use sliding_window", r.Quota, MaxSlidingLogQuota)
	}
	return nil
}

// QuotaWindow is the span over which the rule admits its Capacity, as a
// RateLimit-Policy header field announces it: Period for the window
// algorithms, the nominal length of a calendar unit (a month is 30 days, a
// year 365), and for GCRA and LeakyBucket the time an empty bucket takes to
// refill its whole capacity, Capacity × Period / Quota (0 when Quota is 0).
func (r *Rule) QuotaWindow() time.Duration {
	switch {
	case r.Calendar != NoCalendar:
		if r.Calendar < numCalendars {
			return calendarNominal[r.Calendar]
		}
		return 0
	case r.Algorithm == GCRA || r.Algorithm == LeakyBucket:
		if r.Quota <= 0 {
			return 0
		}
		w := float64(r.Capacity()) * float64(r.Period) / float64(r.Quota)
		if w >= math.MaxInt64 { // only for rules Validate refuses
			return math.MaxInt64
		}
		return time.Duration(w)
	}
	return r.Period
}

// calendarNominal is the nominal length of each calendar unit.
var calendarNominal = [numCalendars]time.Duration{
	Minute: time.Minute,
	Hour:   time.Hour,
	Day:    24 * time.Hour,
	Week:   7 * 24 * time.Hour,
	Month:  30 * 24 * time.Hour,
	Year:   365 * 24 * time.Hour,
}

// Interval is the emission interval of GCRA and LeakyBucket: the time one
// unit of cost takes to refill (or, for LeakyBucket, to leak), Period/Quota
// rounded up to whole nanoseconds so that rounding never admits more than
// Quota per Period; at least 1 ns. It is math.MaxInt64 (never) when Quota is
// 0. Stores that decide elsewhere, as in a script, send it with the rule.
func (r *Rule) Interval() time.Duration {
	return time.Duration(r.interval())
}

// interval is Interval in nanoseconds, as the algorithms compute with it.
func (r *Rule) interval() int64 {
	if r.Quota <= 0 {
		return math.MaxInt64
	}
	p := int64(r.Period)
	iv := p / r.Quota
	if p%r.Quota != 0 {
		iv++
	}
	return max(iv, 1)
}
