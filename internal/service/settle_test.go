package service

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

const settleRuleFile = `domain: s
descriptors:
  - key: tokens
    rate_limit: {period: 10s, requests_per_unit: 100, name: tokens}
  - key: win
    rate_limit: {unit: minute, requests_per_unit: 100, name: win}
  - key: shadow
    shadow_mode: true
    rate_limit: {period: 10s, requests_per_unit: 100, name: shadow}
  - key: model
    limits:
      - {period: 10s, requests_per_unit: 10, name: requests}
      - {period: 10s, requests_per_unit: 1000, cost_unit: input_tokens, name: input}
      - {period: 10s, requests_per_unit: 1000, cost_unit: output_tokens, name: output}
`

// settleService is a Service on a memory store, which is its Ledger,
// whose clock stands still at *now.
func settleService(t *testing.T, now *time.Time) *Service {
	t.Helper()
	st := memstore.New(memstore.Options{JanitorInterval: -1, Now: func() time.Time { return *now }})
	t.Cleanup(func() { st.Close() })
	d, err := rules.Parse("s.yaml", []byte(settleRuleFile))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Store: st, Ledger: st, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func settleReq(id string, costs ...int64) *Request {
	req := &Request{Domain: "s", Reservation: id}
	for i, c := range costs {
		req.Descriptors = append(req.Descriptors, Descriptor{Entries: []rules.Entry{{Key: []string{"tokens", "win", "shadow"}[i], Value: "a"}}, Cost: c})
	}
	return req
}

// TestSettle: a reservation of 60 tokens and 10 on a window, settled at
// 20 and 30: 40 refunded, 20 charged; the remaining says so; a repeat is
// ErrAlreadySettled; the costs are per descriptor.
func TestSettle(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	svc := settleService(t, &now)
	var resp Response
	id := ratelimit.NewReservationID()
	if err := svc.Decide(t.Context(), settleReq(id, 60, 10, 5), &resp); err != nil || resp.Code != OK || resp.Reservation != id {
		t.Fatalf("reserve: %v, %+v", err, resp)
	}
	out, err := svc.Settle(t.Context(), &SettleRequest{Reservation: id, Costs: []int64{20, 30, 5}})
	if err != nil || out != (Settlement{Limits: 3, Refunded: 40, Charged: 20}) {
		t.Fatalf("Settle = %+v, %v; want 3 limits, 40 refunded, 20 charged", out, err)
	}
	if err := svc.Decide(t.Context(), settleReq("", 0, 0), &resp); err != nil {
		t.Fatal(err)
	}
	if a, b := resp.Statuses[0].Decision.Remaining, resp.Statuses[1].Decision.Remaining; a != 80 || b != 70 {
		t.Fatalf("remaining %d, %d after settling at 20 and 30; want 80, 70", a, b)
	}
	if _, err := svc.Settle(t.Context(), &SettleRequest{Reservation: id, Costs: []int64{1}}); !errors.Is(err, ratelimit.ErrAlreadySettled) {
		t.Fatalf("repeat: %v", err)
	}
	if _, err := svc.Settle(t.Context(), &SettleRequest{Reservation: ratelimit.NewReservationID(), Costs: []int64{1}}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("unknown: %v", err)
	}
	id2 := ratelimit.NewReservationID()
	if err := svc.Decide(t.Context(), settleReq(id2, 1, 1), &resp); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Settle(t.Context(), &SettleRequest{Reservation: id2, Costs: []int64{1, 2, 3}}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("3 costs for 2 descriptors: %v, want ErrInvalidRequest", err)
	}
	for _, bad := range []SettleRequest{{Reservation: "bad id", Costs: []int64{1}}, {Reservation: id}, {Reservation: id, Costs: []int64{-1}}} {
		if _, err := svc.Settle(t.Context(), &bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Settle(%+v) = %v, want ErrInvalidRequest", bad, err)
		}
	}
}

// TestSettleDenied: a denied request keeps no reservation; an id used
// twice is refused; a request without a ledger cannot reserve.
func TestSettleDenied(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	svc := settleService(t, &now)
	var resp Response
	id := ratelimit.NewReservationID()
	if err := svc.Decide(t.Context(), settleReq(id, 101), &resp); err != nil || resp.Code != OverLimit || resp.Reservation != "" {
		t.Fatalf("over the limit: %v, %+v", err, resp)
	}
	if _, err := svc.Settle(t.Context(), &SettleRequest{Reservation: id, Costs: []int64{1}}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("settling a denied request: %v", err)
	}
	if err := svc.Decide(t.Context(), settleReq(id, 1), &resp); err != nil {
		t.Fatal(err)
	}
	if err := svc.Decide(t.Context(), settleReq(id, 1), &resp); !errors.Is(err, ratelimit.ErrReservationExists) || !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("an id used twice: %v", err)
	}
	bare, _ := New(Options{Store: memstore.New(memstore.Options{JanitorInterval: -1})})
	if err := bare.Decide(t.Context(), settleReq(id, 1), &resp); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("a reservation without a ledger: %v", err)
	}
}

// TestSettlePaced: a paced reservation (Reserve) keeps an id too, and its
// settlement is decided under the limit's own rule.
func TestSettlePaced(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	svc := settleService(t, &now)
	var resp Response
	id := ratelimit.NewReservationID()
	if _, err := svc.Reserve(t.Context(), settleReq(id, 100), time.Second, &resp); err != nil || resp.Reservation != id {
		t.Fatalf("Reserve: %v, %+v", err, resp)
	}
	out, err := svc.Settle(t.Context(), &SettleRequest{Reservation: id, Costs: []int64{10}})
	if err != nil || out.Refunded != 90 {
		t.Fatalf("Settle = %+v, %v; want 90 refunded", out, err)
	}
}

// TestSettleUnits: a call reserved with 1 request, 300 input and 300
// output tokens and settled with {"output_tokens": 120} alone: the
// output limit gets 180 back, the request and input limits stay at their
// estimates; a cost with unit costs settles the limits without a unit;
// a negative unit cost is refused.
func TestSettleUnits(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	svc := settleService(t, &now)
	model := []rules.Entry{{Key: "model", Value: "m"}}
	reserve := func() string {
		t.Helper()
		id := ratelimit.NewReservationID()
		var resp Response
		req := &Request{Domain: "s", Reservation: id, Descriptors: []Descriptor{{Entries: model, Cost: 1,
			Costs: []UnitCost{{"input_tokens", 300}, {"output_tokens", 300}}}}}
		if err := svc.Decide(t.Context(), req, &resp); err != nil || resp.Code != OK || resp.Reservation != id {
			t.Fatalf("reserve: %v, %+v", err, resp)
		}
		return id
	}
	decide := func(output int64) Code {
		t.Helper()
		var resp Response
		req := &Request{Domain: "s", Descriptors: []Descriptor{{Entries: model, Costs: []UnitCost{{"output_tokens", output}}}}}
		if err := svc.Decide(t.Context(), req, &resp); err != nil {
			t.Fatal(err)
		}
		return resp.Code
	}
	id := reserve()
	out, err := svc.Settle(t.Context(), &SettleRequest{Reservation: id, Units: [][]UnitCost{{{"output_tokens", 120}}}})
	if err != nil || out.Limits != 3 || out.Refunded != 180 || out.Charged != 0 {
		t.Fatalf("Settle(output_tokens 120) = %+v, %v; want 3 limits, 180 refunded", out, err)
	}
	id = reserve()
	out, err = svc.Settle(t.Context(), &SettleRequest{Reservation: id, Costs: []int64{0}, Units: [][]UnitCost{{{"input_tokens", 350}}}})
	if err != nil || out.Refunded != 1 || out.Charged != 50 {
		t.Fatalf("Settle(cost 0, input_tokens 350) = %+v, %v; want 1 refunded, 50 charged", out, err)
	}
	if _, err := svc.Settle(t.Context(), &SettleRequest{Reservation: reserve(), Units: [][]UnitCost{{{"output_tokens", -1}}}}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("a negative unit cost: %v; want ErrInvalidRequest", err)
	}
	// Output tokens used: 120 settled, then twice 300 at the estimate.
	if decide(281) != OverLimit || decide(280) != OK {
		t.Fatalf("after the settlements, 280 output tokens should be left")
	}
}
