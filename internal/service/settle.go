package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
)

// Reservations with settlement (costs known only after the answer)
//
// A Request with a Reservation id is decided as any other (Decide, or
// Reserve for paced waiting) and, admitted, is kept in the Service's
// Ledger under that id (ratelimit.Reservations.Keep): every limit that
// the store decided (not its failure mode) and that took a positive
// cost, with its storage key, its rule as decided (the
// configured or overridden rule, never the paced reservation's raised
// one) and the descriptor it belongs to. Settle then takes the record,
// once, with the actual cost of each descriptor, and decides the
// differences as package ratelimit's Reservations.Settle does: a refund
// when the actual cost is lower, a charge past the limit (a debt) when it
// is higher. A reservation never settled expires after its TTL and stays
// charged at its estimate.
//
//   - Shadow-mode limits are settled too (they took their cost); quota-mode
//     limits are settled when they admitted theirs.
//   - A request denied (OverLimit, or refused by its quota-mode limits)
//     keeps no reservation.
//   - A reservation that the Ledger cannot keep is an *UnavailableError
//     (the request was admitted and stays charged at its estimate); an id
//     already kept is an error wrapping ErrInvalidRequest and
//     ratelimit.ErrReservationExists. Both wrap ErrNotKept, and resp is
//     filled as decided.
//   - The rules are those of the reservation: a rule reloaded or
//     overridden between the two is settled as it was reserved.

// A SettleRequest settles a reservation with its actual costs.
type SettleRequest struct {
	// Reservation is the id the request was reserved under.
	Reservation string
	// Costs are the actual costs of the reserved request's descriptors,
	// in their order; a single cost applies to every descriptor. Each is
	// in [0, ratelimit.MaxQuota].
	Costs []int64
	// Units, if not nil, are the actual costs per cost unit (as a
	// Descriptor's Costs), of the reserved request's descriptors in their
	// order, or one list for every descriptor. A limit that counts a cost
	// unit takes its actual cost from its descriptor's list, and is
	// settled at its estimate when the list does not name its unit; a
	// limit without a unit then takes Costs, or its estimate when Costs is
	// empty. So an LLM call reserved with {"input_tokens": 1200,
	// "output_tokens": 1000} settles with {"output_tokens": 312} alone.
	Units [][]UnitCost
	// Tagged, instead of Costs and Units, are the actual costs by
	// descriptor Tag (a proxy's settlement, whose descriptors come in no
	// set order); a limit whose tag it lacks is settled at its estimate.
	Tagged map[string]int64
}

// A Settlement is what Settle decided, in units of cost summed over the
// reservation's limits.
type Settlement struct {
	Limits            int // the limits settled
	Refunded, Charged int64
}

// Settle settles req (see "Reservations with settlement"). Its errors:
// ErrInvalidRequest (a malformed id or cost; a cost list whose length is
// neither 1 nor the reservation's descriptor count, which is found once
// the record is taken, so the reservation stays at its estimate),
// ratelimit.ErrUnknownReservation (never kept, or expired),
// ratelimit.ErrAlreadySettled, and an *UnavailableError when the ledger
// or the store failed (wrapping ratelimit.ErrSettlementLost when the
// record was taken but its adjustment not applied).
func (s *Service) Settle(ctx context.Context, req *SettleRequest) (Settlement, error) {
	var out Settlement
	err := s.settle(ctx, req, &out)
	s.metrics.countSettle(err, out)
	return out, err
}

func (s *Service) settle(ctx context.Context, req *SettleRequest, out *Settlement) error {
	if s.rs == nil {
		return invalid("this server keeps no reservations")
	}
	if err := ratelimit.CheckReservationID(req.Reservation); err != nil {
		return invalid("reservation: %v", err)
	}
	n, nu := len(req.Costs), len(req.Units)
	if (n == 0 && nu == 0) == (req.Tagged == nil) || max(n, nu, len(req.Tagged)) > rules.MaxDescriptors {
		return invalid("%d costs; want 1, or one per descriptor (at most %d)", max(n, nu, len(req.Tagged)), rules.MaxDescriptors)
	}
	for i, us := range req.Units {
		if err := checkUnitCosts(i, us); err != nil {
			return err
		}
		for _, u := range us {
			if u.Cost < 0 {
				return invalid("descriptor %d: cost %d of unit %s is negative", i, u.Cost, u.Unit)
			}
		}
	}
	for i, c := range req.Costs {
		if c < 0 || c > ratelimit.MaxQuota {
			return invalid("cost %d (%d) out of range [0, %d]", i, c, int64(ratelimit.MaxQuota))
		}
	}
	for t, c := range req.Tagged {
		if c < 0 || c > ratelimit.MaxQuota {
			return invalid("cost of %q (%d) out of range [0, %d]", t, c, int64(ratelimit.MaxQuota))
		}
	}
	settled, err := s.rs.Settle(ctx, req.Reservation, func(_ int, r *ratelimit.Reserved) (int64, error) {
		tag, unit := splitTag(r.Tag)
		if req.Tagged != nil {
			if c, ok := req.Tagged[tag]; ok {
				return c, nil
			}
			return r.Estimate, nil
		}
		if unit != "" && req.Units != nil {
			us, err := forDescriptor(req.Units, tag)
			if err != nil {
				return 0, err
			}
			for _, u := range us {
				if u.Unit == unit {
					return u.Cost, nil
				}
			}
			return r.Estimate, nil
		}
		if len(req.Costs) == 0 {
			return r.Estimate, nil
		}
		return forDescriptor(req.Costs, tag)
	})
	switch {
	case errors.Is(err, ratelimit.ErrUnknownReservation), errors.Is(err, ratelimit.ErrAlreadySettled), errors.Is(err, ErrInvalidRequest):
		return err
	case errors.Is(err, ratelimit.ErrBadReservation):
		return invalid("%v", err)
	case err != nil:
		return &UnavailableError{Err: err}
	}
	for _, st := range settled {
		out.Limits++
		out.Refunded += st.Refunded
		out.Charged += st.Charged
	}
	return nil
}

// reserved returns what a reservation of the admitted request req of sc
// keeps: every limit the store decided that took a positive cost, with its rule as decided
// and its tag, which Settle reads back (splitTag): its descriptor's Tag, or
// "index/count" (its index among the request's count of descriptors),
// followed by "#unit" when the limit counts a cost unit (neither a Tag,
// URL-safe base64, nor an index holds a '#').
func (sc *scratch) reserved(req *Request) []ratelimit.Reserved {
	kept := sc.kept[:0]
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.rule == nil {
			continue
		}
		it, d := sc.item(c), sc.decision(c)
		// A limit its store's failure mode decided (local, fail_open) was
		// never counted at the store: a refund there would give back what
		// it never took, so it is not kept and stays at its estimate.
		if d.Allowed && d.Reason == ratelimit.ReasonOK && it.Cost > 0 {
			tag := req.Descriptors[c.desc].Tag
			if tag == "" {
				tag = strconv.Itoa(c.desc) + "/" + strconv.Itoa(len(req.Descriptors))
			}
			if c.spec != nil && c.spec.CostUnit != "" {
				tag += "#" + c.spec.CostUnit
			}
			kept = append(kept, ratelimit.Reserved{Key: it.Key, Rule: c.rule, Estimate: it.Cost, Tag: tag})
		}
	}
	sc.kept = kept
	return kept
}

// splitTag splits a kept limit's tag into its descriptor's part and its
// cost unit ("" for none); see reserved.
func splitTag(tag string) (desc, unit string) {
	if i := strings.LastIndexByte(tag, '#'); i >= 0 {
		return tag[:i], tag[i+1:]
	}
	return tag, ""
}

// forDescriptor returns the element of costs (the actual costs of a
// settlement: one for every descriptor, or one per descriptor) for the
// descriptor whose kept tag is "index/count".
func forDescriptor[T any](costs []T, tag string) (T, error) {
	if len(costs) == 1 {
		return costs[0], nil
	}
	var zero T
	i, n, _ := strings.Cut(tag, "/")
	d, err := strconv.Atoi(i)
	if err != nil || d < 0 || d >= len(costs) || n != strconv.Itoa(len(costs)) {
		return zero, invalid("the reservation has %s descriptors; %d costs given", n, len(costs))
	}
	return costs[d], nil
}

// ErrNotKept is wrapped by the error of a request that was admitted (its
// Response says so, and its costs are taken) but whose reservation could
// not be kept.
var ErrNotKept = errors.New("admitted, but its reservation could not be kept")

// keep records kept as the reservation req.Reservation, and tells resp.
func (s *Service) keep(ctx context.Context, kept []ratelimit.Reserved, req *Request, resp *Response) error {
	err := s.rs.Keep(ctx, req.Reservation, kept, req.ReservationTTL)
	switch {
	case err == nil:
		resp.Reservation = req.Reservation
		return nil
	case errors.Is(err, ratelimit.ErrReservationExists), errors.Is(err, ratelimit.ErrBadReservation):
		return fmt.Errorf("%w: %w: reservation %s: %w", ErrInvalidRequest, ErrNotKept, req.Reservation, err)
	}
	return &UnavailableError{Err: fmt.Errorf("%w: %w", ErrNotKept, err)}
}

// KeepsReservations reports whether the Service has a Ledger: whether a
// Request may ask for a reservation.
func (s *Service) KeepsReservations() bool { return s.rs != nil }

// checkReservation checks a Request's reservation fields.
func (r *Request) checkReservation() error {
	if r.Reservation == "" {
		if r.ReservationTTL != 0 {
			return invalid("a reservation TTL without a reservation")
		}
		return nil
	}
	if err := ratelimit.CheckReservationID(r.Reservation); err != nil {
		return invalid("reservation: %v", err)
	}
	if r.ReservationTTL < 0 || r.ReservationTTL > ratelimit.MaxReservationTTL {
		return invalid("reservation TTL %v out of range [0, %v]", r.ReservationTTL, ratelimit.MaxReservationTTL)
	}
	for i := range r.Descriptors {
		if n := len(r.Descriptors[i].Tag); n > ratelimit.MaxReservationTag {
			return invalid("descriptor %d: tag of %d bytes; at most %d", i, n, ratelimit.MaxReservationTag)
		}
	}
	return nil
}

// storeClock is the clock of a store that tells it (memstore), which
// places a reservation in its window.
type storeClock interface{ Now() time.Time }
