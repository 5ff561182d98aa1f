package rls

import (
	"bytes"
	"context"
	"errors"
	"math"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

func entries(kv ...string) []*commonv3.RateLimitDescriptor_Entry {
	var es []*commonv3.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// TestConvertCosts: Envoy's conventions become the service's signed cost
// per descriptor.
func TestConvertCosts(t *testing.T) {
	tests := []struct {
		name    string
		hits    uint32                  // the request's hits_addend
		addend  *wrapperspb.UInt64Value // the descriptor's
		refund  bool
		want    int64
		isLimit bool
	}{
		{"request hits 0 counts as 1", 0, nil, false, 1, false},
		{"request hits", 3, nil, false, 3, false},
		{"descriptor hits win", 3, wrapperspb.UInt64(5), false, 5, false},
		{"descriptor hits 0 checks", 3, wrapperspb.UInt64(0), false, 0, false},
		{"refund of the request's hits", 0, nil, true, -1, false},
		{"refund of the descriptor's", 7, wrapperspb.UInt64(2), true, -2, false},
		{"saturated past int64", 0, wrapperspb.UInt64(math.MaxUint64), false, math.MaxInt64, false},
		{"inline limit", 0, nil, false, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &commonv3.RateLimitDescriptor{Entries: entries("k", "v"), HitsAddend: tt.addend, IsNegativeHits: tt.refund}
			if tt.isLimit {
				d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)}
			}
			var c call
			if err := c.convert(&rlsv3.RateLimitRequest{Domain: "d", HitsAddend: tt.hits, Descriptors: []*commonv3.RateLimitDescriptor{d}}); err != nil {
				t.Fatal(err)
			}
			got := c.req.Descriptors[0]
			if got.Cost != tt.want || c.req.Domain != "d" || len(got.Entries) != 1 || got.Entries[0] != (rules.Entry{Key: "k", Value: "v"}) {
				t.Errorf("descriptor = %+v, domain %q; want cost %d", got, c.req.Domain, tt.want)
			}
			if want := (service.InlineLimit{RequestsPerUnit: 4, Unit: rules.Hour, Multiplier: 2}); tt.isLimit != (got.InlineLimit != nil) || tt.isLimit && *got.InlineLimit != want {
				t.Errorf("inline limit = %+v, want %v", got.InlineLimit, tt.isLimit)
			}
		})
	}
}

// outageStore fails closed for every item, as a store whose backend is
// down does for rules with failure_mode fail_closed; with err, it fails.
type outageStore struct{ err error }

func (s outageStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if s.err != nil {
		return dst, s.err
	}
	for _, it := range items {
		dst = append(dst, ratelimit.Decision{Reason: ratelimit.ReasonFailClosed, RetryAfter: 1500 * time.Millisecond, Capacity: it.Rule.Capacity(), Rule: it.Rule.Name})
	}
	return dst, nil
}

func outageServer(t *testing.T, st ratelimit.Store) *Server {
	t.Helper()
	dom, err := rules.Parse("o.yaml", []byte("domain: o\ndescriptors:\n  - key: login\n    rate_limit: {unit: minute, requests_per_unit: 5, name: login, failure_mode: fail_closed}\n"))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(service.Options{Store: st, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	return New(svc, Options{Headers: true})
}

// TestFailedClosedOverGRPC: gRPC answers a request that failed closed
// OVER_LIMIT, with Retry-After, so that the rule's failure_mode decides
// whatever Envoy's failure_mode_deny (see the package documentation);
// ShouldRateLimitJSON reports it as the service's error; a store error is UNAVAILABLE.
func TestFailedClosedOverGRPC(t *testing.T) {
	in := &rlsv3.RateLimitRequest{Domain: "o", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: entries("login", "alice")}}}
	s := outageServer(t, outageStore{})
	out, err := s.ShouldRateLimit(t.Context(), in)
	if err != nil || out.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || out.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("ShouldRateLimit = %v, %v; want OVER_LIMIT", out, err)
	}
	retry := ""
	for _, h := range out.GetResponseHeadersToAdd() {
		if h.GetKey() == "Retry-After" {
			retry = h.GetValue()
		}
	}
	if retry != "2" {
		t.Errorf("Retry-After %q, want 2 (1.5s rounded up): %v", retry, out.GetResponseHeadersToAdd())
	}
	var ue *service.UnavailableError
	if out, err := s.ShouldRateLimitJSON(t.Context(), in); out != nil || !errors.As(err, &ue) || !ue.FailedClosed() {
		t.Errorf("ShouldRateLimitJSON = %v, %v; want a failed-closed *service.UnavailableError", out, err)
	}

	s = outageServer(t, outageStore{err: errors.New("connection refused")})
	_, err = s.ShouldRateLimit(t.Context(), in)
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != "the store could not decide: connection refused" {
		t.Errorf("a store error: %v; want UNAVAILABLE with the service's message", err)
	}
}

// failOpenStore admits every item as a store whose backend is down does
// for rules with failure_mode fail_open.
type failOpenStore struct{}

func (failOpenStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	for _, it := range items {
		dst = append(dst, ratelimit.Decision{Allowed: true, Reason: ratelimit.ReasonFailOpen, Capacity: it.Rule.Capacity(), Rule: it.Rule.Name})
	}
	return dst, nil
}

// TestFailOpenRemaining: a limit admitted by fail_open says nothing it
// does not know: limit_remaining is the rule's limit (0 would read as
// spent), duration_until_reset is absent, and the headers carry its
// policy but no RateLimit item, over gRPC and /json's conversion alike.
func TestFailOpenRemaining(t *testing.T) {
	in := &rlsv3.RateLimitRequest{Domain: "o", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: entries("login", "alice")}}}
	s := outageServer(t, failOpenStore{})
	for name, call := range map[string]func() (*rlsv3.RateLimitResponse, error){
		"ShouldRateLimit":     func() (*rlsv3.RateLimitResponse, error) { return s.ShouldRateLimit(t.Context(), in) },
		"ShouldRateLimitJSON": func() (*rlsv3.RateLimitResponse, error) { return s.ShouldRateLimitJSON(t.Context(), in) },
	} {
		out, err := call()
		if err != nil || out.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s = %v, %v; want OK", name, out, err)
		}
		st := out.GetStatuses()[0]
		if st.GetCurrentLimit().GetRequestsPerUnit() != 5 || st.GetLimitRemaining() != 5 || st.GetDurationUntilReset() != nil {
			t.Errorf("%s: status %v; want the limit 5, limit_remaining 5 and no duration_until_reset", name, st)
		}
		var keys []string
		for _, h := range out.GetResponseHeadersToAdd() {
			keys = append(keys, h.GetKey()+": "+h.GetValue())
		}
		if len(keys) != 1 || keys[0] != `RateLimit-Policy: "login";q=5;w=60` {
			t.Errorf("%s: headers %q; want the policy alone", name, keys)
		}
	}
	// The hand-written encoding says the same as protobuf-go's.
	out, _ := s.ShouldRateLimit(t.Context(), in)
	if b, err := (codec{}).Marshal(out); err != nil {
		t.Fatal(err)
	} else if want, _ := proto.Marshal(out); !bytes.Equal(b.Materialize(), want) {
		t.Errorf("wire encoding differs from protobuf-go's:\n%x\n%x", b, want)
	}
}
