package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Reservations with settlement: costs known only after the answer.
//
// A caller whose cost is known only once the work is done (a database
// that reports the request units a call cost, an LLM API that reports
// the tokens it produced) reserves an estimate now and settles later with
// the actual cost. Reserve decides the estimate as any request is decided
// (all or nothing; denied, nothing is taken) and, admitted, records what
// it took in a Ledger under a new id. Settle takes that record, once, and
// decides the difference on every item of the reservation:
//
//   - actual below the estimate: the difference is refunded (a negative
//     cost, never above the capacity). A window algorithm refunds only
//     while the reservation's own window lasts (fixed_window,
//     sliding_window: the same window; sliding_log: within Period of the
//     reservation): a refund in a later window would give back units that
//     window never counted. A bucket (gcra, leaky_bucket) refunds at any
//     time, and what has drained meanwhile is not refunded twice (the
//     bucket never goes below empty).
//   - actual above the estimate: the excess is charged even past the
//     limit, a debt. It is decided under Rule.Settling, a copy of the
//     rule whose capacity is raised to the most a valid rule may hold, so
//     the charge is admitted where the rule would deny it, and the next
//     requests wait the debt out: on a bucket, the next request waits
//     exactly the excess's refill time longer; a window carries the excess
//     until the window ends and then forgets it (fixed_window), weighs it
//     into the next window as its previous count (sliding_window), or
//     keeps it for Period (sliding_log, whose log holds at most
//     MaxSlidingLogQuota units: a charge beyond that is cut to what fits,
//     as is a bucket's beyond MaxSettleDebt).
//   - equal: nothing is decided.
//
// Settlement is idempotent by id: the Ledger hands a record out once,
// and a second Settle of the same id is told ErrAlreadySettled. A
// reservation never settled expires with its record (its TTL) and stays
// charged at its estimate. An unknown or expired id is
// ErrUnknownReservation.
//
// The adjustment is applied at most once: the record is taken first, then
// the adjustment decided, so a process that stops (or a store that fails)
// between the two loses the adjustment (the reservation stays at its
// estimate, as if it had expired), never applies it twice. Settle reports
// such a loss as an error wrapping ErrSettlementLost.
//
// The adjustment of all the items of a reservation is one Store.Decide,
// all or nothing as any request: on a Redis Cluster, items in different
// hash slots are decided slot by slot, and a slot that fails has the
// slots before it given back (as far as the store can), so the
// settlement is reported lost rather than half applied.
//
// Where the counter lives: the adjustment is decided Strict, at the
// shared counter, whatever the rule's Counting (Rule.Settling). A rule
// counted batched or approximate reserves on the replica's share as any
// of its decisions, and its settlement reaches the other replicas' shares
// when they next lease or reconcile (redisstore's package doc states when).

// Errors of settlement.
var (
	// ErrUnknownReservation: no reservation has this id, or it expired.
	ErrUnknownReservation = errors.New("ratelimit: unknown or expired reservation")
	// ErrAlreadySettled: the reservation was settled before.
	ErrAlreadySettled = errors.New("ratelimit: reservation already settled")
	// ErrReservationExists: a record with this id is already kept.
	ErrReservationExists = errors.New("ratelimit: reservation id already in use")
	// ErrSettlementLost wraps the error of a settlement whose record was
	// taken but whose adjustment could not be applied.
	ErrSettlementLost = errors.New("ratelimit: settlement taken but not applied")
	// ErrBadReservation wraps the errors of malformed ids, records and
	// actual costs.
	ErrBadReservation = errors.New("ratelimit: bad reservation")
)

// A Ledger keeps the records of reservations until they are settled or
// expire. Records are opaque bytes (at most MaxReservationRecord), which
// package ratelimit encodes and decodes; a Ledger only keeps them. Stores
// shared by several processes keep them where every process finds them
// (redisstore), so that any replica may settle what another reserved.
type Ledger interface {
	// Record keeps rec under id for ttl. It fails with ErrReservationExists
	// when id is kept already (settled or not), and keeps nothing then.
	Record(ctx context.Context, id string, rec []byte, ttl time.Duration) error
	// Take returns the record of id and marks it settled, keeping it
	// until its TTL ends so that a repeat is told ErrAlreadySettled. An
	// id never recorded, or expired, is ErrUnknownReservation.
	Take(ctx context.Context, id string) ([]byte, error)
}

// Bounds on reservations.
const (
	// MaxReservationRecord bounds a record's encoding, in bytes.
	MaxReservationRecord = 64 << 10
	// MaxReservedItems bounds the items of one reservation.
	MaxReservedItems = 256
	// MaxReservationTag bounds an item's Tag, in bytes.
	MaxReservationTag = 64
	// MaxReservationTTL bounds how long a reservation is kept.
	MaxReservationTTL = 24 * time.Hour
	// DefaultReservationTTL is the TTL of Reservations whose TTL is 0.
	DefaultReservationTTL = 5 * time.Minute
	// maxReservationID bounds an id's length.
	maxReservationID = 64
)

// NewReservationID returns a new reservation id: 128 random bits, in
// unpadded URL-safe base64 (22 characters).
func NewReservationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// CheckReservationID reports whether id is well formed: 1 to 64
// characters of unpadded URL-safe base64 (A–Z, a–z, 0–9, '-', '_').
func CheckReservationID(id string) error {
	if id == "" || len(id) > maxReservationID {
		return fmt.Errorf("%w: id of %d bytes, want 1 to %d", ErrBadReservation, len(id), maxReservationID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%w: id has byte %q at %d; want A-Z, a-z, 0-9, '-' or '_'", ErrBadReservation, c, i)
		}
	}
	return nil
}

// MaxSettleDebt is the debt a bucket (gcra, leaky_bucket) may be charged
// into by settlements, as refill time past its capacity: a charge beyond
// it is cut to what fits. It keeps a settlement's arithmetic within what
// a store computes exactly in doubles (redisstore's script). A rule whose
// own capacity takes longer to refill may owe as much again.
const MaxSettleDebt = time.Duration(1 << 51) // about 26 days

// Settling returns the rule under which a settlement's adjustment is
// decided: r with its capacity raised so that a charge past r's limit is
// admitted (Burst for gcra and leaky_bucket, up to MaxSettleDebt of
// refill or twice r's capacity, whichever is more, and as Validate bounds
// capacity × interval; Quota for the windows, MaxQuota, or
// MaxSlidingLogQuota for sliding_log), Counting Strict and Failure
// FailClosed (an adjustment no store decided is reported lost, never
// decided on a replica's share). Its interval and windows are r's, so a
// refund under it is r's refund, and a charge is r's charge admitted past
// r's limit. A rule that admits nothing (Quota 0) is returned as it is:
// nothing was ever charged under it.
func (r *Rule) Settling() *Rule {
	if r.Quota <= 0 {
		return r
	}
	rr := *r
	rr.Counting, rr.Failure = Strict, FailClosed
	switch r.Algorithm {
	case GCRA, LeakyBucket:
		iv := r.interval()
		most := min(int64(MaxQuota), (math.MaxInt64/2)/iv)
		rr.Burst = max(r.Capacity(), min(most, max(2*r.Capacity(), int64(MaxSettleDebt)/iv)))
	case SlidingLog:
		rr.Quota = MaxSlidingLogQuota
	default:
		rr.Quota = MaxQuota
	}
	return &rr
}

// A Reserved is one item of a reservation as its record keeps it.
type Reserved struct {
	Key  string
	Rule *Rule
	// Estimate is the cost taken when the reservation was admitted.
	Estimate int64
	// Tag is the caller's label of the item (at most MaxReservationTag
	// bytes), which it reads back to tell the item's actual cost; the
	// service keeps the item's descriptor there.
	Tag string
}

// A Settled is one item of a settlement.
type Settled struct {
	Reserved
	// Actual is the item's actual cost, as the caller told it.
	Actual int64
	// Refunded and Charged are what the settlement gave back and took:
	// Estimate − Actual and Actual − Estimate when applied, less when a
	// window's refund came after its window (nothing) or a sliding log's
	// charge was cut to what it can hold.
	Refunded, Charged int64
}

// Reservations reserves estimated costs on a Store and settles them with
// their actual costs, keeping the records in a Ledger (see "Reservations
// with settlement" above). Store and Ledger are required; the other fields
// have defaults. It is safe for concurrent use once in use; its fields
// must not change then.
type Reservations struct {
	Store  Store
	Ledger Ledger
	// TTL is how long an unsettled reservation is kept; 0 means
	// DefaultReservationTTL, at most MaxReservationTTL.
	TTL time.Duration
	// Now is the clock that places a reservation in its window, for the
	// window algorithms' refunds; nil means time.Now. It should read what
	// the Store decides by (on Redis, the server's clock: a reservation
	// within the two clocks' skew of a window's end may have its refund
	// given or refused wrongly).
	Now func() time.Time

	rules ruleTable
}

// Reserve decides items all or nothing, as Store.Decide, and when every
// item is admitted keeps a record of what they took under a new id, which
// it returns (empty when denied). Only items the store decided (Reason
// ReasonOK) are kept: one its failure mode admitted was charged on a
// replica's local share or not at all, so a refund at the store would
// give back what it never counted; it stays at its estimate. A recording
// that fails gives back what was kept (a refund that is not atomic with
// the decision) and returns the error with the decisions.
func (rs *Reservations) Reserve(ctx context.Context, dst []Decision, items []Item) (string, []Decision, error) {
	base := len(dst)
	dst, err := rs.Store.Decide(ctx, dst, items)
	if err != nil || !Allowed(dst[base:]) {
		return "", dst, err
	}
	id := NewReservationID()
	kept := make([]Reserved, 0, len(items))
	for i, it := range items {
		if dst[base+i].Reason == ReasonOK {
			kept = append(kept, Reserved{Key: it.Key, Rule: it.Rule, Estimate: it.Cost})
		}
	}
	if err := rs.Keep(ctx, id, kept, 0); err != nil {
		back := make([]Item, 0, len(kept))
		for _, k := range kept {
			if k.Estimate > 0 {
				back = append(back, Item{Key: k.Key, Rule: k.Rule, Cost: -k.Estimate})
			}
		}
		if len(back) > 0 {
			_, _ = rs.Store.Decide(ctx, nil, back)
		}
		return "", dst, err
	}
	return id, dst, nil
}

// Keep records items, already decided and admitted by the caller, as the
// reservation id for ttl (0: the Reservations' TTL). It is Reserve's
// second half, for a caller that decides in its own way (the service's
// quota and shadow limits); items whose Estimate is not positive, and of
// rules that admit nothing, are left out, since they have nothing to
// settle.
func (rs *Reservations) Keep(ctx context.Context, id string, items []Reserved, ttl time.Duration) error {
	if err := CheckReservationID(id); err != nil {
		return err
	}
	if ttl == 0 {
		ttl = rs.TTL
	}
	if ttl == 0 {
		ttl = DefaultReservationTTL
	}
	if ttl < 0 || ttl > MaxReservationTTL {
		return fmt.Errorf("%w: TTL %v out of range (0, %v]", ErrBadReservation, ttl, MaxReservationTTL)
	}
	rec, err := appendRecord(nil, rs.now().UnixNano(), items)
	if err != nil {
		return err
	}
	return rs.Ledger.Record(ctx, id, rec, ttl)
}

// Settle settles the reservation id: it takes its record and decides, on
// every item, the difference between actual(i, item) and the item's
// Estimate (see "Reservations with settlement"). actual must return a
// cost in [0, MaxQuota]; it is called once per item, in order, before
// anything is decided, and an error it returns ends the settlement with
// nothing decided. It returns each item's settlement. Errors:
// ErrUnknownReservation, ErrAlreadySettled, ErrBadReservation (a bad id, a
// record that does not decode, an actual cost out of range), actual's
// error, the Ledger's own errors, and ErrSettlementLost when the
// adjustment could not be applied. Once the record is taken, every error
// leaves the reservation charged at its estimate: it cannot be settled
// again.
func (rs *Reservations) Settle(ctx context.Context, id string, actual func(i int, r *Reserved) (int64, error)) ([]Settled, error) {
	if err := CheckReservationID(id); err != nil {
		return nil, err
	}
	rec, err := rs.Ledger.Take(ctx, id)
	if err != nil {
		return nil, err
	}
	at, kept, err := rs.rules.decodeRecord(rec)
	if err != nil {
		return nil, err
	}
	now := rs.now().UnixNano()
	out := make([]Settled, len(kept))
	items := make([]Item, 0, len(kept))
	where := make([]int, 0, len(kept)) // items[j] adjusts out[where[j]]
	for i := range kept {
		k := &kept[i]
		a, err := actual(i, k)
		if err != nil {
			return nil, err
		}
		if a < 0 || a > MaxQuota {
			return nil, fmt.Errorf("%w: actual cost %d of item %d out of range [0, %d]", ErrBadReservation, a, i, int64(MaxQuota))
		}
		out[i] = Settled{Reserved: *k, Actual: a}
		diff := a - k.Estimate
		if diff == 0 || diff < 0 && !k.Rule.refundable(at, now) {
			continue
		}
		items = append(items, Item{Key: k.Key, Rule: rs.rules.settling(k.Rule), Cost: diff})
		where = append(where, i)
	}
	if len(items) == 0 {
		return out, nil
	}
	// decide decides items at the store. An answer of its failure mode is
	// an error: the call may have reached the store after its timeout and
	// been applied there, so it is never sent again (found between hosts:
	// refunds given twice under load); the adjustment is lost instead.
	decide := func(dst []Decision) ([]Decision, error) {
		ds, err := rs.Store.Decide(ctx, dst, items)
		for j := 0; err == nil && j < len(ds); j++ {
			if r := ds[j].Reason; r == ReasonFailOpen || r == ReasonFailClosed || r == ReasonLocal {
				err = fmt.Errorf("the store answered %s for item %d", r, where[j])
			}
		}
		return ds, err
	}
	ds, err := decide(nil)
	if err == nil && !Allowed(ds) {
		// Only a charge past the settling rule's capacity (MaxSettleDebt,
		// a sliding log's MaxSlidingLogQuota) is denied: cut it to what
		// fits, once.
		for j := range items {
			if !ds[j].Allowed && items[j].Cost > 0 {
				items[j].Cost = min(items[j].Cost, ds[j].Remaining)
			}
		}
		ds, err = decide(ds[:0])
	}
	for j := 0; err == nil && j < len(ds); j++ {
		if !ds[j].Allowed {
			err = fmt.Errorf("the store answered %s for item %d", ds[j].Reason, where[j])
		}
	}
	if err != nil {
		return out, fmt.Errorf("%w: %w", ErrSettlementLost, err)
	}
	for j, it := range items {
		s := &out[where[j]]
		if it.Cost < 0 {
			s.Refunded = -it.Cost
		} else {
			s.Charged = it.Cost
		}
	}
	return out, nil
}

func (rs *Reservations) now() time.Time {
	if rs.Now == nil {
		return time.Now()
	}
	return rs.Now()
}

// refundable reports whether a refund at now (Unix ns) of a reservation
// made at at still falls in the reservation's window: always for a
// bucket; the same window for fixed_window and sliding_window; within
// Period for sliding_log.
func (r *Rule) refundable(at, now int64) bool {
	switch r.Algorithm {
	case FixedWindow, SlidingWindow:
		s1, _ := r.window(at)
		s2, _ := r.window(now)
		return s1 == s2
	case SlidingLog:
		return now-at < int64(r.Period)
	}
	return true
}

// ruleTable caches the rules that records name, so that the settlements
// of one rule share one *Rule and one settling *Rule (a store caches its
// work per rule) and a calendar rule's zone is loaded once. Bounded: past
// maxSettleRules it starts afresh.
type ruleTable struct {
	mu sync.Mutex
	m  map[string]*Rule // a rule's encoding → the rule
	s  map[*Rule]*Rule  // a rule → its settling rule
}

const maxSettleRules = 4096

// settling returns r's settling rule, made once per rule.
func (t *ruleTable) settling(r *Rule) *Rule {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.s[r]; s != nil {
		return s
	}
	if t.s == nil || len(t.s) >= maxSettleRules {
		t.s = make(map[*Rule]*Rule)
	}
	s := r.Settling()
	t.s[r] = s
	return s
}

// rule returns the rule encoded as enc, decoding it on first use.
func (t *ruleTable) rule(enc []byte) (*Rule, error) {
	t.mu.Lock()
	r := t.m[string(enc)]
	t.mu.Unlock()
	if r != nil {
		return r, nil
	}
	r, err := decodeRule(enc)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	if t.m == nil || len(t.m) >= maxSettleRules {
		t.m = make(map[string]*Rule)
	}
	t.m[string(enc)] = r
	t.mu.Unlock()
	return r, nil
}
