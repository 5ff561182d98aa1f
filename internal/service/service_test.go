package service

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// outageStore decides as a store whose backend is down, by each rule's
// failure_mode, except the rules named in limited, which it denies as over
// their limit; with err set, it fails instead.
type outageStore struct {
	limited map[string]bool
	err     error
}

func (s outageStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if s.err != nil {
		return dst, s.err
	}
	for _, it := range items {
		d := ratelimit.Decision{Capacity: it.Rule.Capacity(), Rule: it.Rule.Name}
		switch {
		case s.limited[it.Rule.Name]:
			d.Reason, d.RetryAfter = ratelimit.ReasonLimited, time.Minute
		case it.Rule.Failure == ratelimit.FailClosed:
			d.Reason, d.RetryAfter = ratelimit.ReasonFailClosed, time.Duration(len(it.Rule.Name))*time.Second
		default:
			d.Allowed, d.Reason = true, ratelimit.ReasonFailOpen
		}
		dst = append(dst, d)
	}
	return dst, nil
}

const outageRules = `domain: o
descriptors:
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 5, name: login, failure_mode: fail_closed}
  - key: signup
    rate_limit: {unit: minute, requests_per_unit: 5, name: signup_form, failure_mode: fail_closed}
  - key: page
    rate_limit: {unit: minute, requests_per_unit: 5, name: page}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: shadow, failure_mode: fail_closed}
`

func descs(kvs ...string) []Descriptor {
	var ds []Descriptor
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		ds = append(ds, Descriptor{Entries: []rules.Entry{{Key: k, Value: v}}, Cost: 1})
	}
	return ds
}

// TestFailedClosedIsUnavailable: a request denied only by limits that
// failed closed is an *UnavailableError naming the one that retries last,
// with the statuses filled; a limit over its own quota makes it a plain
// denial; a store error is an *UnavailableError wrapping it.
func TestFailedClosedIsUnavailable(t *testing.T) {
	set := overrideSet(t, outageRules)
	tests := []struct {
		name    string
		store   outageStore
		descs   []Descriptor
		code    Code
		rule    string // of the UnavailableError; "" for no error
		retry   time.Duration
		errText string
	}{
		{"fail_open admits", outageStore{}, descs("page=a"), OK, "", 0, ""},
		{"fail_closed", outageStore{}, descs("page=a", "login=a"), OverLimit, "login", 5 * time.Second, `rule "login" of domain "o" fails closed (failure_mode: fail_closed)`},
		{"the last retry", outageStore{}, descs("login=a", "signup=a"), OverLimit, "signup_form", 11 * time.Second, `"signup_form"`},
		{"a shadow limit does not deny", outageStore{}, descs("shadow=a"), OK, "", 0, ""},
		{"over a limit as well", outageStore{limited: map[string]bool{"page": true}}, descs("login=a", "page=a"), OverLimit, "", 0, ""},
		{"store error", outageStore{err: errors.New("connection refused")}, descs("page=a"), OK, "", 0, "the store could not decide: connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc, err := New(Options{Store: tt.store, Rules: set})
			if err != nil {
				t.Fatal(err)
			}
			var resp Response
			err = svc.Decide(t.Context(), &Request{Domain: "o", Descriptors: tt.descs}, &resp)
			if tt.errText == "" {
				if err != nil || resp.Code != tt.code {
					t.Fatalf("Decide = %v, code %v; want no error, code %v", err, resp.Code, tt.code)
				}
				return
			}
			var ue *UnavailableError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.errText) {
				t.Fatalf("Decide = %v; want an *UnavailableError containing %q", err, tt.errText)
			}
			if tt.store.err != nil {
				if !errors.Is(err, tt.store.err) || ue.FailedClosed() {
					t.Errorf("a store error: %#v; want it wrapped, not failed closed", ue)
				}
				return
			}
			if !ue.FailedClosed() || ue.Rule != tt.rule || ue.Domain != "o" || ue.RetryAfter != tt.retry {
				t.Errorf("error = %#v; want rule %q of domain o failed closed, retry after %v", ue, tt.rule, tt.retry)
			}
			if resp.Code != tt.code || len(resp.Statuses) != len(tt.descs) {
				t.Errorf("response code %v with %d statuses; want %v with %d", resp.Code, len(resp.Statuses), tt.code, len(tt.descs))
			}
		})
	}
}

// knownStore answers as a store whose backend is down for fail_open
// rules, and as a store that was asked for the others: admitted, 3 left.
type knownStore struct{}

func (knownStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	for _, it := range items {
		d := ratelimit.Decision{Allowed: true, Capacity: it.Rule.Capacity(), Rule: it.Rule.Name}
		if it.Rule.Failure == ratelimit.FailOpen {
			d.Reason = ratelimit.ReasonFailOpen // Remaining 0: nothing known
		} else {
			d.Remaining, d.ResetAfter = 3, time.Minute
		}
		dst = append(dst, d)
	}
	return dst, nil
}

// TestFailOpenRemainingUnknown: a limit admitted by fail_open knows
// nothing of its key, so its Remaining (0) never wins a descriptor's
// status over a limit that does know; alone it is reported as unknown,
// and the RateLimit field leaves it out (the policy stays).
func TestFailOpenRemainingUnknown(t *testing.T) {
	dom, err := rules.Parse("f.yaml", []byte(`domain: f
descriptors:
  - key: k
    limits:
      - {unit: minute, requests_per_unit: 5, name: open, failure_mode: fail_open}
      - {unit: hour, requests_per_unit: 50, name: known, failure_mode: fail_closed}
  - key: alone
    rate_limit: {unit: minute, requests_per_unit: 5, name: alone, failure_mode: fail_open}
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Store: knownStore{}, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	var resp Response
	if err := svc.Decide(t.Context(), &Request{Domain: "f", Descriptors: descs("k=a", "alone=a")}, &resp); err != nil {
		t.Fatal(err)
	}
	if st := &resp.Statuses[0]; st.Rule.Name != "known" || !st.RemainingKnown() || st.Decision.Remaining != 3 {
		t.Errorf("two limits, one failed open: status of %q, remaining %d (known %v); want known's 3", st.Rule.Name, st.Decision.Remaining, st.RemainingKnown())
	}
	if st := &resp.Statuses[1]; st.Rule.Name != "alone" || st.RemainingKnown() {
		t.Errorf("a limit alone that failed open: %q, remaining known %v; want unknown", st.Rule.Name, st.RemainingKnown())
	}
	policy, limit, retry := resp.AppendFields(nil, nil)
	if string(policy) != `"known";q=50;w=3600, "alone";q=5;w=60` || string(limit) != `"known";r=3;t=60` || retry != 0 {
		t.Errorf("fields: policy %q, limit %q, retry %d", policy, limit, retry)
	}
}

// TestValidateDoesNotAllocate: the one check of every request costs no
// allocation when the request is valid.
func TestValidateDoesNotAllocate(t *testing.T) {
	req := Request{Domain: "o", Descriptors: []Descriptor{
		{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Cost: -3},
		{Entries: []rules.Entry{{Key: "k", Value: "v"}, {Key: "k2"}}, InlineLimit: &InlineLimit{RequestsPerUnit: 5, Unit: rules.Minute, Multiplier: 2}},
	}}
	if err := req.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = req.Validate() }); n != 0 {
		t.Errorf("Validate allocates %v times", n)
	}
}

// TestValidateBounds: every bound of a request, at it and past it, with an
// error that names what is wrong.
func TestValidateBounds(t *testing.T) {
	long := strings.Repeat("v", rules.MaxKeyValueBytes+1)
	ok := strings.Repeat("v", rules.MaxKeyValueBytes)
	entries := func(n int) []rules.Entry {
		es := make([]rules.Entry, n)
		for i := range es {
			es[i].Key = "k"
		}
		return es
	}
	many := func(n int) []Descriptor {
		ds := make([]Descriptor, n)
		for i := range ds {
			ds[i].Entries = entries(1)
		}
		return ds
	}
	tests := []struct {
		name string
		req  Request
		want string // "" when valid
	}{
		{"ok", Request{Domain: "d", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: ok}}}}}, ""},
		{"domain at the bound", Request{Domain: ok, Descriptors: many(1)}, ""},
		{"max descriptors", Request{Domain: "d", Descriptors: many(rules.MaxDescriptors)}, ""},
		{"max entries", Request{Domain: "d", Descriptors: []Descriptor{{Entries: entries(rules.MaxEntries)}}}, ""},
		{"empty domain", Request{Descriptors: many(1)}, "domain is empty"},
		{"long domain", Request{Domain: long, Descriptors: many(1)}, "(MaxKeyValueBytes)"},
		{"no descriptors", Request{Domain: "d"}, "no descriptors: a request needs at least one"},
		{"too many descriptors", Request{Domain: "d", Descriptors: many(rules.MaxDescriptors + 1)}, "65 descriptors; at most 64 (MaxDescriptors)"},
		{"no entries", Request{Domain: "d", Descriptors: []Descriptor{{}}}, "descriptor 0 has no entries"},
		{"too many entries", Request{Domain: "d", Descriptors: []Descriptor{{Entries: entries(rules.MaxEntries + 1)}}}, "descriptor 0 has 17 entries; at most 16 (MaxEntries)"},
		{"long key", Request{Domain: "d", Descriptors: []Descriptor{{Entries: entries(1)}, {Entries: []rules.Entry{{Key: "a", Value: "b"}, {Key: long, Value: "v"}}}}}, "descriptor 1 entry 1: key is 257 bytes; at most 256 (MaxKeyValueBytes)"},
		{"long value", Request{Domain: "d", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: long}}}}}, "descriptor 0 entry 0: value is 257 bytes"},
		{"huge cost", Request{Domain: "d", Descriptors: []Descriptor{{Entries: entries(1), Cost: ratelimit.MaxQuota + 1}}}, "(MaxQuota)"},
		{"empty value", Request{Domain: "d", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k"}}}}}, ""},
		{"empty key", Request{Domain: "d", Descriptors: []Descriptor{{Entries: entries(1)}, {Entries: []rules.Entry{{Key: "a", Value: "b"}, {Value: "v"}}}}}, "descriptor 1 entry 1: key is empty"},
		{"invalid UTF-8 domain", Request{Domain: "d\xff", Descriptors: many(1)}, "domain is not valid UTF-8"},
		{"invalid UTF-8 key", Request{Domain: "d", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "\xffk", Value: "v"}}}}}, "descriptor 0 entry 0: key is not valid UTF-8"},
		{"invalid UTF-8 value", Request{Domain: "d", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "\xed\xa0\x80"}}}}}, "descriptor 0 entry 0: value is not valid UTF-8"},
		{"U+FFFD is valid", Request{Domain: "\ufffd", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "\ufffd", Value: "\ufffd"}}}}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("got %v; want an ErrInvalidRequest containing %q", err, tt.want)
			}
		})
	}
}

// TestInlineLimitOnUnlimited: an inline limit on descriptors that match an
// unlimited rule counts per descriptor and domain, not on one key shared
// by all of them (the model-checked test, cmd/sluice, found that it did).
func TestInlineLimitOnUnlimited(t *testing.T) {
	const src = `domain: o
descriptors:
  - key: k
    rate_limit: {unlimited: true, name: free}
`
	set := overrideSet(t, src)
	svc, err := New(Options{Store: memstore.New(memstore.Options{}), Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(values ...string) Code {
		t.Helper()
		var req Request
		req.Domain = "o"
		for _, v := range values {
			req.Descriptors = append(req.Descriptors, Descriptor{Entries: []rules.Entry{{Key: "k", Value: v}}, Cost: 1,
				InlineLimit: &InlineLimit{RequestsPerUnit: 1, Unit: rules.Minute}})
		}
		var resp Response
		if err := svc.Decide(context.Background(), &req, &resp); err != nil {
			t.Fatal(err)
		}
		return resp.Code
	}
	if ask("a") != OK || ask("b") != OK || ask("c", "d") != OK {
		t.Fatal("a descriptor was denied by another's inline limit")
	}
	if ask("a") != OverLimit {
		t.Fatal("a's inline limit of 1 a minute admitted a second request")
	}
}

// TestInlineLimitOnShadow: an inline limit replaces a shadow-mode rule's
// limit without taking its mode: it denies, as in envoyproxy/ratelimit.
func TestInlineLimitOnShadow(t *testing.T) {
	const src = `domain: o
descriptors:
  - key: k
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100, name: trial}
`
	svc, err := New(Options{Store: memstore.New(memstore.Options{}), Rules: overrideSet(t, src)})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Domain: "o", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "a"}}, Cost: 1,
		InlineLimit: &InlineLimit{RequestsPerUnit: 1, Unit: rules.Minute}}}}
	var resp Response
	for i, want := range []Code{OK, OverLimit} {
		if err := svc.Decide(context.Background(), &req, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Code != want || resp.Statuses[0].Shadow {
			t.Fatalf("request %d: %v, shadow %v; want %v from the inline limit, not shadow", i, resp.Code, resp.Statuses[0].Shadow, want)
		}
	}
}
