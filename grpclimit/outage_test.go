package grpclimit_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// TestStoreOutageIsNeverResourceExhausted: whenever the store cannot
// decide — an error, a wrong number of decisions, a decision that failed
// closed, whatever other policies say — the call fails with UNAVAILABLE and
// a RetryInfo, never RESOURCE_EXHAUSTED, and the service is not called.
func TestStoreOutageIsNeverResourceExhausted(t *testing.T) {
	limited := ratelimit.Decision{Reason: ratelimit.ReasonLimited, RetryAfter: time.Minute}
	closed := ratelimit.Decision{Reason: ratelimit.ReasonFailClosed, RetryAfter: 2500 * time.Millisecond}
	admitted := ratelimit.Decision{Allowed: true}
	tests := []struct {
		name  string
		store storetest.Canned
		retry time.Duration
	}{
		{"error", storetest.Canned{Err: errors.New("down")}, 3 * time.Second},
		{"error after decisions", storetest.Canned{Decisions: []ratelimit.Decision{limited, limited}, Err: errors.New("down")}, 3 * time.Second},
		{"too few decisions", storetest.Canned{Decisions: []ratelimit.Decision{limited}}, 3 * time.Second},
		{"too many decisions", storetest.Canned{Decisions: []ratelimit.Decision{admitted, admitted, admitted}}, 3 * time.Second},
		{"failed closed", storetest.Canned{Decisions: []ratelimit.Decision{closed, admitted}}, 2500 * time.Millisecond},
		{"limited, then failed closed", storetest.Canned{Decisions: []ratelimit.Decision{limited, closed}}, 2500 * time.Millisecond},
		{"failed closed, then limited", storetest.Canned{Decisions: []ratelimit.Decision{closed, limited}}, 2500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, h := start(t, grpclimit.Options{
				Store: tt.store,
				Policies: []grpclimit.Policy{
					{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}, Keys: []grpclimit.Key{grpclimit.ByPeer()}},
					{Rule: ratelimit.Rule{Name: "b", Quota: 1, Period: time.Second}},
				},
				ErrorRetryAfter: 3 * time.Second,
			}, nil)
			_, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("err = %v, want UNAVAILABLE", err)
			}
			if d, ok := grpclimit.RetryDelay(err); !ok || d != tt.retry {
				t.Errorf("RetryInfo %v, %v; want %v", d, ok, tt.retry)
			}
			if n := h.calls.Load(); n != 0 {
				t.Errorf("the service saw %d calls, want none", n)
			}
		})
	}
}

// TestLocalDenial: while the store is out, a rule that fails locally
// (ratelimit.FailLocal) still enforces its quota, at this replica's share:
// its denial is RESOURCE_EXHAUSTED, with a RetryInfo as a store's denial.
func TestLocalDenial(t *testing.T) {
	local := ratelimit.Decision{Reason: ratelimit.ReasonLocal, RetryAfter: 1500 * time.Millisecond}
	cl, _ := start(t, grpclimit.Options{
		Store:    storetest.Canned{Decisions: []ratelimit.Decision{local}},
		Policies: []grpclimit.Policy{{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}}},
	}, nil)
	_, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want RESOURCE_EXHAUSTED", err)
	}
	if d, ok := grpclimit.RetryDelay(err); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryInfo %v, %v; want 1.5s", d, ok)
	}
}
