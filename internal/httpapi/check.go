package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// checkRequest is the body of POST /v1/check.
type checkRequest struct {
	Domain      string            `json:"domain"`
	Descriptors []checkDescriptor `json:"descriptors"`
	// Cost is the cost of every descriptor without its own; absent means 1.
	Cost *int64 `json:"cost"`
	// Costs are the costs per cost unit of every descriptor without its
	// own (service.Descriptor.Costs).
	Costs costList `json:"costs"`
	// Settle asks for a reservation: admitted, the request is kept under
	// the id answered as "reservation", for POST /v1/settle within
	// SettleWithinMS (default and bound: ratelimit's
	// DefaultReservationTTL and MaxReservationTTL).
	Settle         *bool  `json:"settle"`
	SettleWithinMS *int64 `json:"settle_within_ms"`
}

type checkDescriptor struct {
	Entries []entry  `json:"entries"`
	Cost    *int64   `json:"cost"`
	Costs   costList `json:"costs"`
}

// costList is a costs object, {"input_tokens": 1200, "requests": 1}: cost
// units to integer costs, in the body's order. null is no costs; {} is an
// error (leave costs out instead). Service.Decide validates the units and
// bounds.
type costList []service.UnitCost

func (cl *costList) UnmarshalJSON(b []byte) error {
	*cl = (*cl)[:0]
	if string(b) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return errors.New(`field "costs": want an object of cost units to integer costs, as {"input_tokens": 1200}`)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		unit, _ := t.(string) // an object's member names are strings
		if t, err = dec.Token(); err != nil {
			return err
		}
		n, ok := t.(json.Number)
		cost, err := strconv.ParseInt(string(n), 10, 64)
		if !ok || err != nil {
			return fmt.Errorf("field \"costs\": unit %q: want an integer cost, got %v", unit, t)
		}
		*cl = append(*cl, service.UnitCost{Unit: unit, Cost: cost})
	}
	if len(*cl) == 0 {
		return errors.New(`field "costs": empty object; give a cost for at least one unit, or leave costs out`)
	}
	return nil
}

// entry is a rules.Entry with the JSON names of the API.
type entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// toEntries appends es to dst as rules.Entry values.
func toEntries(dst []rules.Entry, es []entry) []rules.Entry {
	for _, e := range es {
		dst = append(dst, rules.Entry(e))
	}
	return dst
}

// checkCall holds the buffers one /v1/check call reuses.
type checkCall struct {
	in      checkRequest
	entries []rules.Entry
	req     service.Request
	resp    service.Response
	scan    strictScan
	out     []byte
	policy  []byte
	limit   []byte
	// policyField is the RateLimit-Policy value last answered from this
	// call's buffers: the next answer with the same value shares it.
	policyField []string
}

// decodeCheck decodes a /v1/check body strictly into in: one JSON object,
// no unknown fields, nothing after it, and nothing that encoding/json
// would decode with a loss (invalid UTF-8, escaped lone surrogates,
// duplicate members; see strictScan), which scan finds. Errors name the
// offending field.
func decodeCheck(body []byte, in *checkRequest, scan *strictScan) error {
	if fastCheck(body, in) {
		return nil
	}
	return decodeCheckJSON(body, in, scan)
}

// decodeCheckJSON is decodeCheck with encoding/json, for every body.
func decodeCheckJSON(body []byte, in *checkRequest, scan *strictScan) error {
	// encoding/json decodes array elements into the slice's old elements
	// without zeroing them, so clear them: a field absent from this body
	// must not keep the last request's value.
	ds := in.Descriptors[:cap(in.Descriptors)]
	clear(ds)
	*in = checkRequest{Descriptors: ds[:0]}
	return decodeBodyStrict(body, in, scan)
}

// decodeBodyStrict decodes body into v: one JSON object, no unknown fields,
// nothing after it, and nothing that encoding/json would decode with a
// loss, which scan finds. Errors name the offending field.
func decodeBodyStrict(body []byte, v any, scan *strictScan) error {
	err := unmarshalStrict(body, v)
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return fmt.Errorf("field %q: want a JSON %s, got %s", te.Field, te.Type, te.Value)
	case errors.Is(err, io.EOF):
		return errors.New("empty body: want a JSON object")
	case err != nil:
		return err // names the unknown field: json: unknown field "x"
	}
	return scan.check(body, true)
}

// errTrailing is unmarshalStrict's error for data after the JSON value.
var errTrailing = errors.New("unexpected data after the JSON object")

// unmarshalStrict decodes body into v: one JSON value, no unknown fields,
// nothing after it (errTrailing).
func unmarshalStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errTrailing
	}
	return nil
}

// convert fills c.req from c.in: the costs pass through as they are (a
// descriptor's cost or costs, each replacing the request's). It
// checks the counts before it copies anything, with the service's own
// checks; Service.Decide validates the rest.
func (c *checkCall) convert() error {
	in := &c.in
	if err := service.CheckDescriptorCount(len(in.Descriptors)); err != nil {
		return err
	}
	n := 0
	for i := range in.Descriptors {
		if err := service.CheckEntryCount(i, len(in.Descriptors[i].Entries)); err != nil {
			return err
		}
		n += len(in.Descriptors[i].Entries)
	}
	cost := int64(1)
	if in.Cost != nil {
		cost = *in.Cost
	}
	var err error
	if c.req.Reservation, c.req.ReservationTTL, err = settleFields(in.Settle, in.SettleWithinMS); err != nil {
		return fmt.Errorf("%w: %w", service.ErrInvalidRequest, err)
	}
	c.entries = slices.Grow(c.entries[:0], n) // sub-slices never move
	c.req.Domain = in.Domain
	c.req.Descriptors = c.req.Descriptors[:0]
	for i := range in.Descriptors {
		d := &in.Descriptors[i]
		start := len(c.entries)
		c.entries = toEntries(c.entries, d.Entries)
		sd := service.Descriptor{Entries: c.entries[start:len(c.entries):len(c.entries)], Cost: cost, Costs: in.Costs}
		if d.Cost != nil {
			sd.Cost = *d.Cost
		}
		if len(d.Costs) > 0 {
			sd.Costs = d.Costs
		}
		c.req.Descriptors = append(c.req.Descriptors, sd)
	}
	return nil
}

// check answers POST /v1/check.
func (a *API) check(w http.ResponseWriter, r *http.Request) {
	c := a.calls.Get().(*checkCall)
	defer a.calls.Put(c)
	if err := decodeCheck(body(r), &c.in, &c.scan); err != nil {
		writeProblem(w, r, http.StatusBadRequest, "decoding the check request: "+err.Error())
		return
	}
	if err := c.convert(); err != nil {
		decisionError(w, r, err)
		return
	}
	if err := a.svc.Decide(r.Context(), &c.req, &c.resp); err != nil {
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
	c.out = a.appendCheckResponse(c.out[:0], &c.resp)
	w.WriteHeader(code)
	_, _ = w.Write(c.out)
}

// Header values shared by every answer. net/http only reads them (and
// copies the map before writing it out), and nothing here changes them.
var (
	jsonType    = []string{"application/json"}
	problemType = []string{"application/problem+json"}
	noStore     = []string{"no-store"}
)

// setHeaders sets RateLimit-Policy and RateLimit for every decided limit,
// and Retry-After when the request is over the limit and can succeed later.
// The keys are canonical already (Set would canonicalise them again); the
// policy, the same for every answer of the same limits, is shared with the
// call's last answer when it has not changed, and the other two values
// take one allocation together (see answerFields).
func (a *API) setHeaders(h http.Header, c *checkCall) {
	var retry int64
	c.policy, c.limit, retry = c.resp.AppendFields(c.policy[:0], c.limit[:0])
	if len(c.policy) == 0 {
		return
	}
	if len(c.policyField) == 0 || c.policyField[0] != string(c.policy) {
		c.policyField = []string{string(c.policy)}
	}
	h["Ratelimit-Policy"] = c.policyField
	f := newAnswerFields(c.limit, retry)
	if len(c.limit) > 0 { // none when every limit failed open: nothing is known
		h["Ratelimit"] = f.limit[:]
	}
	if retry > 0 {
		h["Retry-After"] = f.retry[:]
	}
}

// answerFields holds the values of an answer's RateLimit and Retry-After
// fields and their bytes in one allocation, where []string{string(b)}
// takes two per field. The header map keeps them until net/http writes the
// answer, after the handler has returned its buffers to the pool, so they
// cannot point into those.
type answerFields struct {
	limit, retry [1]string
	buf          [120]byte
}

// newAnswerFields returns the fields for limit and, if retry > 0, the
// Retry-After seconds. The bytes are written once, here, and never
// changed, as unsafe.String requires.
func newAnswerFields(limit []byte, retry int64) *answerFields {
	f := new(answerFields)
	b := append(f.buf[:0], limit...)
	n := len(b)
	if retry > 0 {
		b = strconv.AppendInt(b, retry, 10)
	}
	if len(b) > len(f.buf) { // grew out of buf: a long list of limits
		s := string(b)
		f.limit[0], f.retry[0] = s[:n], s[n:]
		return f
	}
	f.limit[0] = unsafe.String(&f.buf[0], n)
	if len(b) > n {
		f.retry[0] = unsafe.String(&f.buf[n], len(b)-n)
	}
	return f
}

// appendCheckResponse appends the JSON answer of /v1/check (see the
// package documentation) without reflection.
func (a *API) appendCheckResponse(b []byte, resp *service.Response) []byte {
	over := resp.Code == service.OverLimit
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, !over)
	b = append(b, `,"code":`...)
	b = appendCode(b, resp.Code)
	b = appendReservation(b, resp)
	b = append(b, `,"descriptors":[`...)
	for i := range resp.Statuses {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendStatus(b, &resp.Statuses[i])
	}
	return append(b, "]}\n"...)
}

// appendStatus appends one descriptor's object of the answer of
// /v1/check, which ends with '}'.
func appendStatus(b []byte, st *service.Status) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, st.Code == service.OK)
	b = append(b, `,"code":`...)
	b = appendCode(b, st.Code)
	switch {
	case st.Rule != nil:
		d := &st.Decision
		b = append(b, `,"matched":true,"rule":`...)
		b = appendJSONString(b, d.Rule)
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, d.Capacity, 10)
		if u := st.CostUnit(); u != "" {
			b = append(b, `,"cost_unit":`...)
			b = appendJSONString(b, u)
		}
		if st.RemainingKnown() { // not for fail_open: nothing is known of the key
			b = append(b, `,"remaining":`...)
			b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
			b = append(b, `,"reset_after_ms":`...)
			b = strconv.AppendInt(b, ceilMillis(d.ResetAfter), 10)
		}
		b = append(b, `,"retry_after_ms":`...)
		if d.RetryAfter == ratelimit.Never {
			b = append(b, "-1"...)
		} else {
			b = strconv.AppendInt(b, ceilMillis(d.RetryAfter), 10)
		}
		b = append(b, `,"reason":"`...)
		b = append(b, d.Reason.String()...)
		b = append(b, `","shadow":`...)
		b = strconv.AppendBool(b, st.Shadow)
		b = append(b, `,"quota_mode":`...)
		b = strconv.AppendBool(b, st.Quota)
		b = append(b, `,"quota_exceeded":`...)
		b = strconv.AppendBool(b, st.QuotaExceeded)
		b = append(b, `,"unlimited":false`...)
	case st.Unlimited:
		b = append(b, `,"matched":true,"rule":`...)
		name := ""
		if st.Spec != nil {
			name = st.Spec.Name
		}
		b = appendJSONString(b, name)
		b = append(b, `,"reason":"ok","shadow":false,"quota_mode":false,"quota_exceeded":false,"unlimited":true`...)
	default:
		b = append(b, `,"matched":false,"reason":"ok","shadow":false,"quota_mode":false,"quota_exceeded":false,"unlimited":false`...)
	}
	return append(b, '}')
}

func appendCode(b []byte, c service.Code) []byte {
	if c == service.OverLimit {
		return append(b, `"OVER_LIMIT"`...)
	}
	return append(b, `"OK"`...)
}

// ceilMillis rounds d up to whole milliseconds.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	if d > math.MaxInt64-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// appendJSONString appends s as a JSON string. Invalid UTF-8 becomes
// U+FFFD, as encoding/json writes it.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, `\u202`...)
			b = append(b, hex[r&15])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
