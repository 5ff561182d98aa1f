package httpapi

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/service"
)

// reserveRequest is the body of POST /v1/reserve: /v1/check's, and the
// longest wait the caller accepts.
type reserveRequest struct {
	checkRequest
	// MaxWaitMS is required: a reservation that may not wait is a check.
	MaxWaitMS *int64 `json:"max_wait_ms"`
}

// reserve answers POST /v1/reserve (see the package documentation): the
// request decided as a reservation (service.Service.Reserve); 200 with
// the wait when admitted, 429 with Retry-After when it would have to
// wait longer than max_wait_ms.
func (a *API) reserve(w http.ResponseWriter, r *http.Request) {
	c := a.calls.Get().(*checkCall)
	defer a.calls.Put(c)
	var in reserveRequest
	if err := decodeBodyStrict(body(r), &in, &c.scan); err != nil {
		writeProblem(w, r, http.StatusBadRequest, "decoding the reserve request: "+err.Error())
		return
	}
	maxWait, err := reserveMaxWait(in.MaxWaitMS)
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, "decoding the reserve request: "+err.Error())
		return
	}
	pooled := c.in // its buffers stay with the pooled call
	c.in = in.checkRequest
	err = c.convert()
	c.in = pooled
	if err != nil {
		decisionError(w, r, err)
		return
	}
	res, err := a.svc.Reserve(r.Context(), &c.req, maxWait, &c.resp)
	if err != nil {
		decisionError(w, r, err)
		return
	}
	h := w.Header()
	h["Content-Type"] = jsonType
	h["Cache-Control"] = noStore
	a.setHeaders(h, c)
	code := http.StatusOK
	if c.resp.Code == service.OverLimit {
		code = http.StatusTooManyRequests
	}
	c.out = appendReserveResponse(c.out[:0], &c.resp, &res)
	w.WriteHeader(code)
	_, _ = w.Write(c.out)
}

// reserveMaxWait reads max_wait_ms: required, at least 0; the service
// bounds it above.
func reserveMaxWait(ms *int64) (time.Duration, error) {
	switch {
	case ms == nil:
		return 0, errors.New(`field "max_wait_ms" is required: the longest wait, in milliseconds, the caller accepts (0: none; use /v1/check)`)
	case *ms < 0:
		return 0, errors.New(`field "max_wait_ms": ` + strconv.FormatInt(*ms, 10) + ` is negative`)
	case *ms > math.MaxInt64/int64(time.Millisecond):
		return 0, errors.New(`field "max_wait_ms": ` + strconv.FormatInt(*ms, 10) + ` is too large`)
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

// appendReserveResponse appends the JSON answer of /v1/reserve: that of
// /v1/check with "wait_ms", the request's and each descriptor's, rounded
// up to whole milliseconds so that a caller never sends early.
func appendReserveResponse(b []byte, resp *service.Response, res *service.Reservation) []byte {
	over := resp.Code == service.OverLimit
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, !over)
	b = append(b, `,"code":`...)
	b = appendCode(b, resp.Code)
	b = append(b, `,"wait_ms":`...)
	b = strconv.AppendInt(b, ceilMillis(res.Wait), 10)
	b = appendReservation(b, resp)
	b = append(b, `,"descriptors":[`...)
	for i := range resp.Statuses {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendStatus(b, &resp.Statuses[i])
		b = append(b[:len(b)-1], `,"wait_ms":`...) // before its '}'
		var wait time.Duration
		if i < len(res.Waits) {
			wait = res.Waits[i]
		}
		b = strconv.AppendInt(b, ceilMillis(wait), 10)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}
