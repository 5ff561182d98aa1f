package service

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
)

// A Request asks whether a request may go: the domain whose rules apply
// and the descriptors to decide.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// Reservation, if not empty, is the id (ratelimit.CheckReservationID)
	// under which the request, when admitted, is kept for Settle for
	// ReservationTTL (0: ratelimit.DefaultReservationTTL; at most
	// ratelimit.MaxReservationTTL). See "Reservations with settlement"
	// (settle.go).
	Reservation    string
	ReservationTTL time.Duration
}

// A Descriptor is one list of entries of a Request and what it costs.
type Descriptor struct {
	Entries []rules.Entry
	// Cost is what the descriptor takes from each limit it matches, as an
	// Item's Cost in package ratelimit: 0 (the zero value) checks without
	// counting, a negative cost refunds (never above a limit's capacity).
	// |Cost| is at most ratelimit.MaxQuota.
	Cost int64
	// Costs, if not empty, are the descriptor's costs per cost unit
	// (several dimensions in one decision: requests, input tokens, output
	// tokens). A limit with a cost unit (rules.Spec.CostUnit) takes the
	// cost Costs gives its unit, and 0 (a check: denied when the limit is
	// in debt, consuming nothing) when Costs gives none; a limit without
	// one takes Cost. When Costs is empty, every limit takes Cost whatever
	// its unit, as with one cost per descriptor (Envoy's hits_addend), so
	// a rule file that gains cost units counts its callers as before until
	// they give costs. An inline limit always takes Cost. At most
	// rules.MaxCostUnits, each a unit rules.CheckCostUnit accepts, named
	// once, with |Cost| at most ratelimit.MaxQuota.
	Costs []UnitCost
	// InlineLimit, if not nil, replaces the limits the descriptor matches;
	// it limits the descriptor even when it matches no rule.
	InlineLimit *InlineLimit
	// Tag, in a request kept as a reservation, names the descriptor's
	// limits for Settle (SettleRequest.Tagged); empty means its place in
	// the request (SettleRequest.Costs). At most
	// ratelimit.MaxReservationTag bytes.
	Tag string
}

// A UnitCost is a request descriptor's cost for the limits of one cost
// unit.
type UnitCost struct {
	Unit string
	Cost int64
}

// checkUnitCosts checks the costs per cost unit of descriptor i: their
// count, their units' names, each unit once and each |cost| at most
// ratelimit.MaxQuota.
func checkUnitCosts(i int, costs []UnitCost) error {
	if err := CheckCostCount(i, len(costs)); err != nil {
		return err
	}
	for j, c := range costs {
		if err := rules.CheckCostUnit(c.Unit); err != nil {
			return invalid("descriptor %d: costs: %v", i, err)
		}
		if c.Cost < -ratelimit.MaxQuota || c.Cost > ratelimit.MaxQuota {
			return invalid("descriptor %d: cost %d of unit %s is beyond ±%d (MaxQuota)", i, c.Cost, c.Unit, int64(ratelimit.MaxQuota))
		}
		for _, o := range costs[:j] {
			if o.Unit == c.Unit {
				return invalid("descriptor %d: costs: unit %s given twice", i, c.Unit)
			}
		}
	}
	return nil
}

// cost returns what the descriptor takes from limit spec (nil for an
// inline limit): see Costs.
func (d *Descriptor) cost(spec *rules.Spec) int64 {
	if len(d.Costs) == 0 || spec == nil || spec.CostUnit == "" {
		return d.Cost
	}
	for _, c := range d.Costs {
		if c.Unit == spec.CostUnit {
			return c.Cost
		}
	}
	return 0
}

// An InlineLimit is a limit carried in a request descriptor instead of a
// rule file (Envoy's per-descriptor RateLimitOverride): a fixed window of
// RequestsPerUnit per Multiplier × Unit.
type InlineLimit struct {
	RequestsPerUnit uint32
	Unit            rules.Unit
	// Multiplier multiplies the window (Envoy's unit_multiplier); 0 means 1.
	Multiplier uint32
}

// period is the inline limit's window.
func (l *InlineLimit) period() time.Duration {
	return l.Unit.Duration() * time.Duration(max(l.Multiplier, 1))
}

// ErrInvalidRequest is wrapped by the errors of requests that are
// malformed or beyond a bound; adapters answer them with INVALID_ARGUMENT
// or 400.
var ErrInvalidRequest = errors.New("invalid request")

// invalid returns an error wrapping ErrInvalidRequest.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, a...))
}

// CheckDescriptorCount checks the number of descriptors of a request: 1 to
// rules.MaxDescriptors. An adapter that must refuse a request before it
// copies it calls CheckDescriptorCount and CheckEntryCount, the first two
// checks of Validate, so that its answer is Validate's.
func CheckDescriptorCount(n int) error {
	if n == 0 {
		return invalid("no descriptors: a request needs at least one")
	}
	if n > rules.MaxDescriptors {
		return invalid("%d descriptors; at most %d (MaxDescriptors)", n, rules.MaxDescriptors)
	}
	return nil
}

// CheckEntryCount checks the number of entries n of descriptor i of a
// request: 1 to rules.MaxEntries. See CheckDescriptorCount.
func CheckEntryCount(i, n int) error {
	if n == 0 {
		return invalid("descriptor %d has no entries; a descriptor needs at least one entry", i)
	}
	if n > rules.MaxEntries {
		return invalid("descriptor %d has %d entries; at most %d (MaxEntries)", i, n, rules.MaxEntries)
	}
	return nil
}

// CheckCostCount checks the number of costs n of descriptor i of a
// request: at most rules.MaxCostUnits. See CheckDescriptorCount.
func CheckCostCount(i, n int) error {
	if n > rules.MaxCostUnits {
		return invalid("descriptor %d: costs for %d units; at most %d (MaxCostUnits)", i, n, rules.MaxCostUnits)
	}
	return nil
}

// Validate reports whether r is well formed and within the bounds, with an
// error wrapping ErrInvalidRequest that names what is wrong. In order: the
// number of descriptors, the number of entries of each, the domain (not
// empty, valid UTF-8, at most rules.MaxKeyValueBytes), then for each
// descriptor its keys (not empty) and values (either may be empty), both
// valid UTF-8 and at most rules.MaxKeyValueBytes, its cost, its costs per
// unit and its inline limit. It is the one check of a request, which
// Service.Decide makes before anything else; it does not allocate when r
// is valid.
//
// Valid UTF-8 is required because a transport that repairs it (replacing
// each invalid byte by U+FFFD, as encoding/json does) would count two
// different requests against one key; the transports refuse such input
// before it gets here, and Validate makes sure for any other caller.
func (r *Request) Validate() error {
	if err := CheckDescriptorCount(len(r.Descriptors)); err != nil {
		return err
	}
	for i := range r.Descriptors {
		if err := CheckEntryCount(i, len(r.Descriptors[i].Entries)); err != nil {
			return err
		}
	}
	if r.Domain == "" {
		return invalid("domain is empty")
	}
	if n := len(r.Domain); n > rules.MaxKeyValueBytes {
		return invalid("domain is %d bytes; at most %d (MaxKeyValueBytes)", n, rules.MaxKeyValueBytes)
	}
	if !utf8.ValidString(r.Domain) {
		return invalid("domain is not valid UTF-8")
	}
	for i := range r.Descriptors {
		if err := r.Descriptors[i].validate(i); err != nil {
			return err
		}
	}
	return r.checkReservation()
}

// validate checks descriptor i but for its number of entries.
func (d *Descriptor) validate(i int) error {
	for j := range d.Entries {
		e := &d.Entries[j]
		switch n := len(e.Key); {
		case n == 0:
			return invalid("descriptor %d entry %d: key is empty", i, j)
		case n > rules.MaxKeyValueBytes:
			return invalid("descriptor %d entry %d: key is %d bytes; at most %d (MaxKeyValueBytes)", i, j, n, rules.MaxKeyValueBytes)
		case !utf8.ValidString(e.Key):
			return invalid("descriptor %d entry %d: key is not valid UTF-8", i, j)
		}
		if n := len(e.Value); n > rules.MaxKeyValueBytes {
			return invalid("descriptor %d entry %d: value is %d bytes; at most %d (MaxKeyValueBytes)", i, j, n, rules.MaxKeyValueBytes)
		}
		if !utf8.ValidString(e.Value) {
			return invalid("descriptor %d entry %d: value is not valid UTF-8", i, j)
		}
	}
	if d.Cost < -ratelimit.MaxQuota || d.Cost > ratelimit.MaxQuota {
		return invalid("descriptor %d: cost %d is beyond ±%d (MaxQuota)", i, d.Cost, int64(ratelimit.MaxQuota))
	}
	if err := checkUnitCosts(i, d.Costs); err != nil {
		return err
	}
	if l := d.InlineLimit; l != nil {
		unit := l.Unit.Duration()
		if unit == 0 {
			return invalid("descriptor %d: inline limit has unknown unit %d", i, l.Unit)
		}
		if p := l.period(); p <= 0 || p > ratelimit.MaxPeriod || p/unit != time.Duration(max(l.Multiplier, 1)) {
			return invalid("descriptor %d: inline limit window %d × %s exceeds %v", i, l.Multiplier, l.Unit, ratelimit.MaxPeriod)
		}
	}
	return nil
}

// An UnavailableError is the error of a request the store could not
// decide: the store returned an error (Err), or it could not reach its
// backend and a limit whose failure_mode is fail_closed denied the request
// (Rule; Err is nil). Neither is the request being over a limit: HTTP
// answers 503, never 429.
type UnavailableError struct {
	// Domain and Rule name the limit that failed closed.
	Domain, Rule string
	// RetryAfter is the time after which the store tries its backend
	// again, as the fail_closed decision gave it; 0 when unknown.
	RetryAfter time.Duration
	// Err is the store's error; nil when a limit failed closed.
	Err error
}

func (e *UnavailableError) Error() string {
	if e.Err != nil {
		return "the store could not decide: " + e.Err.Error()
	}
	return fmt.Sprintf("the store could not decide, and rule %q of domain %q fails closed (failure_mode: fail_closed)", e.Rule, e.Domain)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// FailedClosed reports whether a limit failed closed: the request was
// decided (denied), and the Response holds its statuses.
func (e *UnavailableError) FailedClosed() bool { return e.Err == nil }
