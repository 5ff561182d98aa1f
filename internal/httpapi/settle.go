package httpapi

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// settleFields reads /v1/check's and /v1/reserve's "settle" and
// "settle_within_ms": the id to keep the request under (a new one) and
// for how long, or nothing.
func settleFields(settle *bool, withinMS *int64) (string, time.Duration, error) {
	if settle == nil || !*settle {
		if withinMS != nil {
			return "", 0, errors.New(`field "settle_within_ms" without "settle": true`)
		}
		return "", 0, nil
	}
	var ttl time.Duration
	if withinMS != nil {
		if *withinMS <= 0 || *withinMS > int64(ratelimit.MaxReservationTTL/time.Millisecond) {
			return "", 0, errors.New(`field "settle_within_ms": ` + strconv.FormatInt(*withinMS, 10) + ` out of range [1, ` + strconv.FormatInt(int64(ratelimit.MaxReservationTTL/time.Millisecond), 10) + `]`)
		}
		ttl = time.Duration(*withinMS) * time.Millisecond
	}
	return ratelimit.NewReservationID(), ttl, nil
}

// appendReservation appends `,"reservation":"<id>"` when resp kept one.
func appendReservation(b []byte, resp *service.Response) []byte {
	if resp.Reservation == "" {
		return b
	}
	b = append(b, `,"reservation":"`...)
	b = append(b, resp.Reservation...) // URL-safe base64: nothing to escape
	return append(b, '"')
}

// settleRequest is the body of POST /v1/settle: the reservation and its
// actual costs, either for every descriptor ("cost", "costs") or for
// each descriptor of the reserved request, in its order ("descriptors").
// "costs" are the actual costs per cost unit; a limit whose unit they do
// not name is settled at its estimate (service.SettleRequest.Units).
type settleRequest struct {
	Reservation *string            `json:"reservation"`
	Cost        *int64             `json:"cost"`
	Costs       costList           `json:"costs"`
	Descriptors []settleDescriptor `json:"descriptors"`
}

type settleDescriptor struct {
	Cost  *int64   `json:"cost"`
	Costs costList `json:"costs"`
}

// settleResponse is the answer of POST /v1/settle.
type settleResponse struct {
	Settled        bool  `json:"settled"`
	AlreadySettled bool  `json:"already_settled"`
	Limits         int   `json:"limits"`
	Refunded       int64 `json:"refunded"`
	Charged        int64 `json:"charged"`
}

// decodeSettle decodes and checks a /v1/settle body into req (the costs'
// units and bounds are Service.Settle's to check).
func decodeSettle(body []byte, scan *strictScan, req *service.SettleRequest) error {
	var in settleRequest
	if err := decodeBodyStrict(body, &in, scan); err != nil {
		return err
	}
	top := in.Cost != nil || in.Costs != nil
	switch {
	case in.Reservation == nil:
		return errors.New(`field "reservation" is required`)
	case top == (in.Descriptors != nil):
		return errors.New(`give either "cost" or "costs" (every descriptor's), or "descriptors" (each descriptor's, in the reserved request's order)`)
	case len(in.Descriptors) > rules.MaxDescriptors:
		return errors.New(`field "descriptors": ` + strconv.Itoa(len(in.Descriptors)) + ` descriptors; at most ` + strconv.Itoa(rules.MaxDescriptors))
	case in.Descriptors != nil && len(in.Descriptors) == 0:
		return errors.New(`field "descriptors" is empty`)
	}
	if err := ratelimit.CheckReservationID(*in.Reservation); err != nil {
		return errors.New(`field "reservation": ` + err.Error())
	}
	req.Reservation = *in.Reservation
	req.Costs, req.Units = req.Costs[:0], req.Units[:0]
	if top {
		in.Descriptors = append(in.Descriptors, settleDescriptor{in.Cost, in.Costs})
	}
	withCost := in.Descriptors[0].Cost != nil
	for i, d := range in.Descriptors {
		switch {
		case d.Cost == nil && d.Costs == nil:
			return errors.New(`descriptor ` + strconv.Itoa(i) + `: give "cost", "costs" or both`)
		case (d.Cost != nil) != withCost:
			return errors.New(`descriptor ` + strconv.Itoa(i) + `: give "cost" for every descriptor or for none`)
		case d.Cost != nil && (*d.Cost < 0 || *d.Cost > ratelimit.MaxQuota):
			return errors.New(`cost ` + strconv.FormatInt(*d.Cost, 10) + ` out of range [0, ` + strconv.FormatInt(ratelimit.MaxQuota, 10) + `]`)
		}
		if d.Cost != nil {
			req.Costs = append(req.Costs, *d.Cost)
		}
		req.Units = append(req.Units, []service.UnitCost(d.Costs))
	}
	if !slices.ContainsFunc(req.Units, func(us []service.UnitCost) bool { return us != nil }) {
		req.Units = nil
	}
	return nil
}

// settle answers POST /v1/settle: 200 with what was refunded and charged;
// 200 with "already_settled" for a repeat (settling is idempotent, so a
// client that lost the first answer may send again); 404 for a
// reservation never kept or expired (it stays charged at its estimate);
// 400 for a malformed body; 503 when the ledger or the store failed.
func (a *API) settle(w http.ResponseWriter, r *http.Request) {
	c := a.calls.Get().(*checkCall)
	defer a.calls.Put(c)
	var req service.SettleRequest
	if err := decodeSettle(body(r), &c.scan, &req); err != nil {
		writeProblem(w, r, http.StatusBadRequest, "decoding the settle request: "+err.Error())
		return
	}
	out, err := a.svc.Settle(r.Context(), &req)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, settleResponse{Settled: true, Limits: out.Limits, Refunded: out.Refunded, Charged: out.Charged})
	case errors.Is(err, ratelimit.ErrAlreadySettled):
		writeJSON(w, http.StatusOK, settleResponse{AlreadySettled: true})
	case errors.Is(err, ratelimit.ErrUnknownReservation):
		writeProblem(w, r, http.StatusNotFound, "reservation "+req.Reservation+": never kept, or expired (it stays charged at its estimate)")
	default:
		decisionError(w, r, err)
	}
}
