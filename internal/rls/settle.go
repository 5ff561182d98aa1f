package rls

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// Reservations settled when the stream ends
//
// Envoy's rate limit filter can call again when a stream ends (a rate
// limit with apply_on_stream_done), with a hits_addend that only the
// response told (dynamic metadata a filter set from the usage an LLM
// reported, as Envoy AI Gateway does). Two descriptor entries turn the
// two calls into a reservation and its settlement:
//
//   - ReserveKey (sluice_reserve), with the request's id as its value
//     (Envoy's request_headers action on x-request-id), in a descriptor of
//     the request-time call: the call is kept as a reservation (the
//     descriptor's hits_addend is the estimate) when it is admitted.
//   - SettleKey (sluice_settle), with the same request id, in a
//     descriptor of the stream-done call with the same other entries: its
//     hits_addend is the actual cost, and the call settles the
//     reservation (service.Service.Settle): the difference is refunded,
//     or charged past the limit. A settlement is never denied: its
//     descriptors are answered OK whatever happened (an unknown or expired
//     reservation, a repeat, a store that failed: counted in
//     sluice_settlements_total), as Envoy ignores the answer anyway.
//
// Both entries are removed before the descriptor is matched, so the rules
// see the descriptor without them (a rule keyed on them never matches). The reservation's id is derived from
// the domain, the request id and the descriptors' other entries (each
// reserved descriptor is tagged by a hash of its entries), so the
// stream-done call must carry the same descriptors as the request-time
// one, and a client that chose its own x-request-id reaches no
// reservation but those of descriptors equal to its own. A request id
// used twice keeps the first reservation: the second call is decided as
// a plain check (its estimate taken, never settled), and so is one whose
// reservation the ledger failed to keep, and every call when the service
// keeps no reservations. A call may mix settled descriptors with others,
// which are decided as usual.

// The descriptor entries that reserve and settle.
const (
	ReserveKey = "sluice_reserve"
	SettleKey  = "sluice_settle"
)

// settling is what convert found of the two entries in one call.
type settling struct {
	reserveID, settleID string // the request ids, "" when absent
	reserveTags         []string
	settleTags          []string
	tagged              map[string]int64 // settled descriptors' costs by tag
	settledAt           []int            // their indexes in the call
	keeps               bool             // the service keeps reservations
}

func (st *settling) reset() {
	st.reserveID, st.settleID = "", ""
	st.reserveTags, st.settleTags, st.settledAt = st.reserveTags[:0], st.settleTags[:0], st.settledAt[:0]
	st.tagged = nil
}

// mark records a reserved entry of descriptor i; it reports whether e is one.
func (st *settling) mark(i int, e rules.Entry) (bool, error) {
	var id *string
	switch e.Key {
	case ReserveKey:
		id = &st.reserveID
	case SettleKey:
		id = &st.settleID
	default:
		return false, nil
	}
	switch {
	case e.Value == "":
		return true, invalid(i, "entry %s has no request id", e.Key)
	case *id != "" && *id != e.Value:
		return true, invalid(i, "entry %s says %q where an earlier descriptor said %q: one call is one request", e.Key, e.Value, *id)
	}
	*id = e.Value
	return true, nil
}

// descriptorTag is a descriptor's tag in a reservation: 128 bits of the
// SHA-256 of its entries, unpadded URL-safe base64.
func descriptorTag(es []rules.Entry) string {
	h := sha256.New()
	var n [2]byte
	for _, e := range es {
		for _, s := range [2]string{e.Key, e.Value} {
			n[0], n[1] = byte(len(s)>>8), byte(len(s))
			h.Write(n[:])
			h.Write([]byte(s))
		}
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// reservationID is the id of the reservation of request id requestID in
// domain whose descriptors have tags (in any order): 128 bits of a
// SHA-256, a ratelimit reservation id.
func reservationID(domain, requestID string, tags []string) string {
	tags = slices.Clone(tags)
	slices.Sort(tags)
	tags = slices.Compact(tags)
	h := sha256.New()
	for _, s := range append([]string{domain, requestID}, tags...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// invalid is a request error naming descriptor i.
func invalid(i int, format string, a ...any) error {
	return fmt.Errorf("%w: descriptor %d: %s", service.ErrInvalidRequest, i, fmt.Sprintf(format, a...))
}

// settle settles the call's settled descriptors, if any; it never fails
// the call (see above).
func (s *Server) settle(ctx context.Context, c *call) {
	st := &c.settling
	if st.settleID == "" {
		return
	}
	_, _ = s.svc.Settle(ctx, &service.SettleRequest{
		Reservation: reservationID(c.req.Domain, st.settleID, st.settleTags),
		Tagged:      st.tagged,
	})
}

// notKept reports whether err is an admitted call whose reservation could
// not be kept (a request id used twice, a ledger that failed): the call
// stands as decided, a plain check, rather than an error that Envoy's
// failure_mode_deny would decide.
func notKept(err error) bool {
	return errors.Is(err, service.ErrNotKept)
}

// settled records descriptor i, which carries SettleKey, as a settlement:
// its cost is the actual cost of the reserved descriptor with its entries.
func (st *settling) settled(i int, d *service.Descriptor) error {
	if d.Cost < 0 || d.Cost > ratelimit.MaxQuota {
		return invalid(i, "settles at %d; an actual cost is 0 to %d", d.Cost, int64(ratelimit.MaxQuota))
	}
	if d.InlineLimit != nil {
		return invalid(i, "settles, and has a limit: a settlement decides no limit of its own")
	}
	tag := descriptorTag(d.Entries)
	if st.tagged == nil {
		st.tagged = make(map[string]int64)
	}
	st.tagged[tag] = d.Cost
	st.settleTags = append(st.settleTags, tag)
	st.settledAt = append(st.settledAt, i)
	return nil
}
