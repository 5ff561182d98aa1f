package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// TestStoreOutageIsNever429: whenever the store cannot decide — an error,
// a wrong number of decisions, a decision that failed closed, whatever
// other policies say — the answer is 503 with Retry-After, never 429.
func TestStoreOutageIsNever429(t *testing.T) {
	limited := ratelimit.Decision{Reason: ratelimit.ReasonLimited, RetryAfter: time.Minute}
	closed := ratelimit.Decision{Reason: ratelimit.ReasonFailClosed, RetryAfter: 2500 * time.Millisecond}
	admitted := ratelimit.Decision{Allowed: true}
	tests := []struct {
		name  string
		store storetest.Canned
		retry string
	}{
		{"error", storetest.Canned{Err: errors.New("down")}, "4"},
		{"error after decisions", storetest.Canned{Decisions: []ratelimit.Decision{limited, limited}, Err: errors.New("down")}, "4"},
		{"too few decisions", storetest.Canned{Decisions: []ratelimit.Decision{limited}}, "4"},
		{"too many decisions", storetest.Canned{Decisions: []ratelimit.Decision{admitted, admitted, admitted}}, "4"},
		{"failed closed", storetest.Canned{Decisions: []ratelimit.Decision{closed, admitted}}, "3"},
		{"limited, then failed closed", storetest.Canned{Decisions: []ratelimit.Decision{limited, closed}}, "3"},
		{"failed closed, then limited", storetest.Canned{Decisions: []ratelimit.Decision{closed, limited}}, "3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ev httplimit.Event
			m, err := httplimit.New(httplimit.Options{
				Store: tt.store,
				Policies: []httplimit.Policy{
					{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}, Keys: []httplimit.Key{httplimit.ByIP()}},
					{Rule: ratelimit.Rule{Name: "b", Quota: 1, Period: time.Second}},
				},
				ErrorRetryAfter: 3500 * time.Millisecond,
				OnDecision:      func(e *httplimit.Event) { ev = *e },
			})
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				t.Error("the handler ran")
			})).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", rec.Code)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.retry {
				t.Errorf("Retry-After %q, want %q", got, tt.retry)
			}
			if !strings.Contains(rec.Body.String(), "temporary-reduced-capacity") {
				t.Errorf("problem %s, want temporary-reduced-capacity", rec.Body)
			}
			if ev.Status != http.StatusServiceUnavailable || !ev.Denied {
				t.Errorf("event status %d, denied %v; want 503, denied", ev.Status, ev.Denied)
			}
			if wantErr := tt.store.Err != nil || len(tt.store.Decisions) != 2; (ev.Err != nil) != wantErr {
				t.Errorf("event error %v, want one: %v", ev.Err, wantErr)
			}
		})
	}
}

// TestLocalDenial: while the store is out, a rule that fails locally
// (ratelimit.FailLocal) still enforces its quota, at this replica's share:
// its denial is the caller's quota spent, a 429, and tells when to retry as
// a store's denial does.
func TestLocalDenial(t *testing.T) {
	local := ratelimit.Decision{Reason: ratelimit.ReasonLocal, RetryAfter: 1500 * time.Millisecond}
	m, err := httplimit.New(httplimit.Options{
		Store:    storetest.Canned{Decisions: []ratelimit.Decision{local}},
		Policies: []httplimit.Policy{{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", rec.Code)
	}
	if got := rec.Header().Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After %q, want 2", got)
	}
	if !strings.Contains(rec.Body.String(), `"retry-after":2`) || !strings.Contains(rec.Body.String(), "Retry in 2 s.") {
		t.Errorf("problem %s, want a retry-after of 2 s", rec.Body)
	}
}
