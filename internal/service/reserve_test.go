package service

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

const reserveRuleFile = `domain: p
descriptors:
  - key: api
    rate_limit: {period: 1s, requests_per_unit: 10, burst: 2, name: api}
  - key: both
    limits:
      - {period: 1s, requests_per_unit: 10, burst: 2, name: both_fast}
      - {period: 2s, requests_per_unit: 10, burst: 1, name: both_slow}
  - key: window
    rate_limit: {unit: second, requests_per_unit: 10, name: window}
  - key: shadow
    shadow_mode: true
    rate_limit: {period: 1s, requests_per_unit: 10, burst: 1, name: shadow}
  - key: shadowwin
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, name: shadowwin}
`

// reserveService is a Service on a memory store whose clock stands still
// at now, so that every wait is exact.
func reserveService(t *testing.T, now *time.Time) *Service {
	t.Helper()
	st := memstore.New(memstore.Options{JanitorInterval: -1, Now: func() time.Time { return *now }})
	t.Cleanup(func() { st.Close() })
	d, err := rules.Parse("p.yaml", []byte(reserveRuleFile))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Store: st, Rules: set, MaxReserveWait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func reserveReq(cost int64, kvs ...string) *Request {
	req := &Request{Domain: "p", Descriptors: descs(kvs...)}
	for i := range req.Descriptors {
		req.Descriptors[i].Cost = cost
	}
	return req
}

// TestReserveQueues: reservations at one instant on a limit of 10/s,
// burst 2, are told waits that queue them 100ms apart; one beyond its
// maxWait is refused with a Retry-After, and consumes nothing; reported
// in the limit's own terms (capacity 2, remaining 0).
func TestReserveQueues(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	svc := reserveService(t, &now)
	const ms = time.Millisecond
	var resp Response
	for i, want := range []time.Duration{0, 0, 100 * ms, 200 * ms, 300 * ms} {
		res, err := svc.Reserve(t.Context(), reserveReq(1, "api=a"), 300*ms, &resp)
		if err != nil || resp.Code != OK || res.Wait != want || res.Waits[0] != want {
			t.Fatalf("reservation %d: %+v, code %v, err %v; want wait %v", i, res, resp.Code, err, want)
		}
		if d := resp.Statuses[0].Decision; d.Capacity != 2 || (i >= 1 && d.Remaining != 0) {
			t.Fatalf("reservation %d: decision %+v; want capacity 2 and, once empty, remaining 0", i, d)
		}
	}
	res, err := svc.Reserve(t.Context(), reserveReq(1, "api=a"), 300*ms, &resp)
	if err != nil || resp.Code != OverLimit || res.Wait != 0 || resp.Statuses[0].Decision.RetryAfter != 100*ms {
		t.Fatalf("beyond maxWait: %+v, %+v, %v; want OverLimit, RetryAfter 100ms", res, resp, err)
	}
	if _, _, retry := resp.AppendFields(nil, nil); retry != 1 {
		t.Errorf("Retry-After %d s; want 1", retry)
	}
	// Nothing was consumed by the refusal: 100ms later, it fits.
	now = now.Add(100 * ms)
	if res, err := svc.Reserve(t.Context(), reserveReq(1, "api=a"), 300*ms, &resp); err != nil || resp.Code != OK || res.Wait != 300*ms {
		t.Fatalf("100ms later: %+v, code %v, %v; want wait 300ms", res, resp.Code, err)
	}
	// A plain check now sees the queue: denied.
	if err := svc.Decide(t.Context(), reserveReq(1, "api=a"), &resp); err != nil || resp.Code != OverLimit {
		t.Fatalf("check behind the queue: code %v, %v; want OverLimit", resp.Code, err)
	}
}

// TestReserveSeveralLimits: the wait is the longest of the limits';
// denied by one, none is consumed.
func TestReserveSeveralLimits(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	svc := reserveService(t, &now)
	const ms = time.Millisecond
	var resp Response
	// both_fast: 10/s burst 2; both_slow: 10 per 2s (5/s), burst 1.
	for i, want := range []time.Duration{0, 200 * ms, 400 * ms} {
		res, err := svc.Reserve(t.Context(), reserveReq(1, "both=x"), 400*ms, &resp)
		if err != nil || resp.Code != OK || res.Wait != want {
			t.Fatalf("reservation %d: %+v, code %v, %v; want wait %v", i, res, resp.Code, err, want)
		}
	}
	res, err := svc.Reserve(t.Context(), reserveReq(1, "both=x"), 400*ms, &resp)
	if err != nil || resp.Code != OverLimit || resp.Statuses[0].Decision.Rule != "both_slow" {
		t.Fatalf("fourth: %+v, %+v, %v; want denied by both_slow", res, resp, err)
	}
	// Denied by both_slow, a request with another limit takes nothing
	// from it: api=q is still full afterwards.
	res, err = svc.Reserve(t.Context(), reserveReq(1, "api=q", "both=x"), 400*ms, &resp)
	if err != nil || resp.Code != OverLimit || resp.Statuses[1].Decision.Rule != "both_slow" || res.Waits[0] != 0 {
		t.Fatalf("api=q with both=x: %+v, %+v, %v; want denied by both_slow", res, resp, err)
	}
	res, err = svc.Reserve(t.Context(), reserveReq(2, "api=q"), 0, &resp)
	if err != nil || resp.Code != OK || res.Wait != 0 {
		t.Fatalf("api=q alone: %+v, %+v, %v; want its whole burst at once", res, resp, err)
	}
}

// TestReserveRefuses: a window limit, a wait above the bound or negative
// are invalid requests naming what is wrong; shadow limits never make
// anyone wait.
func TestReserveRefuses(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	svc := reserveService(t, &now)
	var resp Response
	for _, tt := range []struct {
		req  *Request
		wait time.Duration
		want string
	}{
		{reserveReq(1, "window=a"), time.Second, `limit "window" of domain "p" cannot be reserved`},
		{reserveReq(1, "window=a"), time.Second, "fixed_window"},
		{reserveReq(1, "api=a"), 3 * time.Second, "exceeds this server's bound of 2s"},
		{reserveReq(1, "api=a"), -time.Second, "negative"},
	} {
		_, err := svc.Reserve(t.Context(), tt.req, tt.wait, &resp)
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Reserve(%v, %v) = %v; want invalid, containing %q", tt.req.Descriptors[0].Entries, tt.wait, err, tt.want)
		}
	}
	// A shadow limit of burst 1: the second reservation would wait
	// 100ms under it, but the caller is told 0; the status reports it.
	for i := range 2 {
		res, err := svc.Reserve(t.Context(), reserveReq(1, "shadow=a", "shadowwin=a"), time.Second, &resp)
		if err != nil || resp.Code != OK || res.Wait != 0 {
			t.Fatalf("shadow %d: %+v, code %v, %v; want OK, no wait", i, res, resp.Code, err)
		}
		if st := resp.Statuses[0]; !st.Shadow || st.Code != OK || (i == 1 && st.Decision.ResetAfter != 200*time.Millisecond) {
			t.Fatalf("shadow %d: status %+v", i, st)
		}
		if st := resp.Statuses[1]; !st.Shadow || st.Decision.Allowed != (i == 0) {
			t.Fatalf("shadow window %d: status %+v; want decided as a check (1/s)", i, st)
		}
	}
	// An unknown domain limits nothing.
	if res, err := svc.Reserve(t.Context(), &Request{Domain: "none", Descriptors: descs("api=a")}, time.Second, &resp); err != nil || res.Wait != 0 || resp.Code != OK {
		t.Errorf("unknown domain: %+v, %v", res, err)
	}
}

// TestReserveOutage: a limit admitted by fail_open tells no wait (the
// store could not be asked); one that fails closed is an
// *UnavailableError, as for Decide.
func TestReserveOutage(t *testing.T) {
	set := overrideSet(t, `domain: o
descriptors:
  - key: open
    rate_limit: {period: 1s, requests_per_unit: 5, name: open}
  - key: closed
    rate_limit: {period: 1s, requests_per_unit: 5, name: closed, failure_mode: fail_closed}
`)
	svc, err := New(Options{Store: outageStore{}, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	var resp Response
	res, err := svc.Reserve(t.Context(), &Request{Domain: "o", Descriptors: descs("open=a")}, time.Second, &resp)
	if err != nil || resp.Code != OK || res.Wait != 0 || resp.Statuses[0].Decision.Reason != ratelimit.ReasonFailOpen || resp.Statuses[0].Decision.Capacity != 5 {
		t.Fatalf("fail_open: %+v, %+v, %v; want OK, no wait, capacity 5", res, resp, err)
	}
	var ue *UnavailableError
	if _, err := svc.Reserve(t.Context(), &Request{Domain: "o", Descriptors: descs("closed=a")}, time.Second, &resp); !errors.As(err, &ue) || !ue.FailedClosed() || ue.Rule != "closed" {
		t.Fatalf("fail_closed: %v; want an *UnavailableError naming rule closed", err)
	}
}

// TestReserveIndependent: with Independent, a limit that admits keeps
// its reservation though another denies, as Decide counts.
func TestReserveIndependent(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	st := memstore.New(memstore.Options{JanitorInterval: -1, Now: func() time.Time { return now }})
	defer st.Close()
	d, err := rules.Parse("p.yaml", []byte(reserveRuleFile))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Store: st, Rules: set, Independent: true})
	if err != nil {
		t.Fatal(err)
	}
	var resp Response
	const ms = time.Millisecond
	// both_slow (burst 1, 200ms) takes the first; the second would wait
	// 200ms > 100ms: denied, but both_fast keeps what it took.
	for i, want := range []Code{OK, OverLimit} {
		if _, err := svc.Reserve(t.Context(), reserveReq(1, "both=i"), 100*ms, &resp); err != nil || resp.Code != want {
			t.Fatalf("reservation %d: code %v, %v; want %v", i, resp.Code, err, want)
		}
	}
	// both_fast (10/s, burst 2) kept the second's unit: its debt is 200ms,
	// and a third unit brings it to 300ms (a check then reports it).
	res, err := svc.Reserve(t.Context(), reserveReq(1, "both=i"), time.Second, &resp)
	if err != nil || res.Wait != 200*ms {
		t.Fatalf("third: %+v, code %v, %v; want a wait of 200ms (both_slow's: its debt 200ms + 200ms − 200ms)", res, resp.Code, err)
	}
	if err := svc.Decide(t.Context(), reserveReq(0, "both=i"), &resp); err != nil {
		t.Fatal(err)
	}
	if d := resp.Statuses[0].Decision; d.Rule != "both_fast" || d.ResetAfter != 300*ms {
		t.Fatalf("both_fast after three reservations, one denied by both_slow: %+v; want ResetAfter 300ms", d)
	}
}
