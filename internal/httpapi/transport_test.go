package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/ratelimit"
)

// sameRequest is one request written for every transport: descriptors of
// "key=value" entries, each with an optional cost.
type sameRequest struct {
	domain string
	descs  [][]string
	costs  []*int64 // per descriptor; nil or a nil entry: the default cost
}

func cost(n int64) *int64 { return &n }

// envoy is the request as Envoy's RateLimitRequest: a cost is a
// hits_addend, a negative one with is_negative_hits.
func (sr *sameRequest) envoy() *rlsv3.RateLimitRequest {
	in := &rlsv3.RateLimitRequest{Domain: sr.domain}
	for i, d := range sr.descs {
		pd := &commonv3.RateLimitDescriptor{}
		for _, e := range d {
			k, v, _ := strings.Cut(e, "=")
			pd.Entries = append(pd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if i < len(sr.costs) && sr.costs[i] != nil {
			c := *sr.costs[i]
			pd.IsNegativeHits = c < 0
			pd.HitsAddend = wrapperspb.UInt64(uint64(max(c, -c)))
		}
		in.Descriptors = append(in.Descriptors, pd)
	}
	return in
}

// check is the request as a /v1/check body.
func (sr *sameRequest) check() string {
	type ent struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	type desc struct {
		Entries []ent  `json:"entries"`
		Cost    *int64 `json:"cost,omitempty"`
	}
	body := struct {
		Domain      string `json:"domain"`
		Descriptors []desc `json:"descriptors"`
	}{Domain: sr.domain, Descriptors: []desc{}}
	for i, d := range sr.descs {
		dd := desc{Entries: []ent{}}
		for _, e := range d {
			k, v, _ := strings.Cut(e, "=")
			dd.Entries = append(dd.Entries, ent{k, v})
		}
		if i < len(sr.costs) {
			dd.Cost = sr.costs[i]
		}
		body.Descriptors = append(body.Descriptors, dd)
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func repeat[T any](n int, v T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestBadRequestSameOnEveryTransport: gRPC, POST /json and POST /v1/check
// refuse the same bad request with the same message, one that says what is
// wrong (an empty domain or descriptor list is not "beyond a bound").
func TestBadRequestSameOnEveryTransport(t *testing.T) {
	f := newFixture(t, Options{})
	one := [][]string{{"user=a"}}
	tests := []struct {
		name string
		req  sameRequest
		want string
		not  string // must not appear in the message
	}{
		{"empty domain", sameRequest{domain: "", descs: one}, "domain is empty", "bound"},
		{"no descriptors", sameRequest{domain: "t"}, "no descriptors: a request needs at least one", "bound"},
		{"empty entries", sameRequest{domain: "t", descs: [][]string{{"user=a"}, {}}}, "descriptor 1 has no entries; a descriptor needs at least one entry", "bound"},
		{"too many descriptors", sameRequest{domain: "t", descs: repeat(65, []string{"user=a"})}, "65 descriptors; at most 64 (MaxDescriptors)", ""},
		{"too many entries", sameRequest{domain: "t", descs: [][]string{repeat(17, "user=a")}}, "descriptor 0 has 17 entries; at most 16 (MaxEntries)", ""},
		{"long domain", sameRequest{domain: strings.Repeat("d", 257), descs: one}, "domain is 257 bytes; at most 256 (MaxKeyValueBytes)", ""},
		{"long key", sameRequest{domain: "t", descs: [][]string{{strings.Repeat("k", 257) + "=v"}}}, "descriptor 0 entry 0: key is 257 bytes; at most 256 (MaxKeyValueBytes)", ""},
		{"long value", sameRequest{domain: "t", descs: [][]string{{"user=a", "k=" + strings.Repeat("v", 300)}}}, "descriptor 0 entry 1: value is 300 bytes; at most 256 (MaxKeyValueBytes)", ""},
		{"huge cost", sameRequest{domain: "t", descs: one, costs: []*int64{cost(ratelimit.MaxQuota + 1)}}, "descriptor 0: cost 1099511627777 is beyond ±1099511627776 (MaxQuota)", ""},
		{"huge refund", sameRequest{domain: "t", descs: [][]string{{"user=a"}, {"user=b"}}, costs: []*int64{nil, cost(-ratelimit.MaxQuota - 1)}}, "descriptor 1: cost -1099511627777 is beyond ±1099511627776 (MaxQuota)", ""},
		{"count before domain", sameRequest{domain: "", descs: nil}, "no descriptors", ""},
	}
	grpcServer := rls.New(f.svc, rls.Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.req.envoy()
			_, err := grpcServer.ShouldRateLimit(context.Background(), in)
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("gRPC: %v, want INVALID_ARGUMENT", err)
			}
			body, err := protojson.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			msgs := map[string]string{
				"gRPC":      st.Message(),
				"/json":     problemDetail(t, do(t, "POST", f.srv.URL+"/json", string(body)), http.StatusBadRequest),
				"/v1/check": problemDetail(t, do(t, "POST", f.srv.URL+"/v1/check", tt.req.check()), http.StatusBadRequest),
			}
			for transport, msg := range msgs {
				if !strings.Contains(msg, tt.want) || (tt.not != "" && strings.Contains(msg, tt.not)) {
					t.Errorf("%s: %q; want it to contain %q and not %q", transport, msg, tt.want, tt.not)
				}
				if msg != msgs["gRPC"] {
					t.Errorf("%s says %q, gRPC %q", transport, msg, msgs["gRPC"])
				}
			}
		})
	}
}

// problemDetail checks that r is a problem with the given status and
// returns its detail.
func problemDetail(t *testing.T, r reply, status int) string {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d: %s", r.status, status, r.body)
	}
	var p problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Errorf("not a problem: %q", r.body)
	}
	return p.Detail
}

// failClosedStore answers every item as a store whose backend is down
// does by the rule's failure_mode; fail_closed items are told to retry
// after retry.
type failClosedStore struct{ retry time.Duration }

func (s failClosedStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	for _, it := range items {
		d := ratelimit.Decision{Capacity: it.Rule.Capacity(), Rule: it.Rule.Name}
		switch it.Rule.Failure {
		case ratelimit.FailClosed:
			d.Reason, d.RetryAfter = ratelimit.ReasonFailClosed, s.retry
		default:
			d.Allowed, d.Reason = true, ratelimit.ReasonFailOpen
		}
		dst = append(dst, d)
	}
	return dst, nil
}

const outageRules = `domain: t
descriptors:
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 5, name: login, failure_mode: fail_closed}
  - key: page
    rate_limit: {unit: minute, requests_per_unit: 5, name: page}
`

// TestStoreOutageIs503: a limit that fails closed while the store is down
// is answered 503 with Retry-After and a problem naming the cause, on
// /v1/check and /json, never 429; a fail_open one still admits.
func TestStoreOutageIs503(t *testing.T) {
	svc, err := service.New(service.Options{Store: failClosedStore{retry: 1500 * time.Millisecond}, Rules: loadSet(t, outageRules)})
	if err != nil {
		t.Fatal(err)
	}
	api, err := New(Options{Service: svc, RLS: rls.New(svc, rls.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, api)
	for _, tt := range []struct{ path, body string }{
		{"/v1/check", checkBody("t", "", "login=alice")},
		{"/json", `{"domain":"t","descriptors":[{"entries":[{"key":"login","value":"alice"}]}]}`},
		{"/v1/check", checkBody("t", "", "page=home", "login=alice")},
	} {
		r := do(t, "POST", srv+tt.path, tt.body)
		detail := problemDetail(t, r, http.StatusServiceUnavailable)
		if !strings.Contains(detail, `"login"`) || !strings.Contains(detail, "fail_closed") {
			t.Errorf("%s: detail %q does not name the rule and its failure_mode", tt.path, detail)
		}
		if ra := r.header.Get("Retry-After"); ra != "2" {
			t.Errorf("%s: Retry-After %q, want 2 (1.5s rounded up)", tt.path, ra)
		}
	}
	r := do(t, "POST", srv+"/v1/check", checkBody("t", "", "page=home"))
	if r.status != 200 || !strings.Contains(r.body, `"reason":"fail_open"`) {
		t.Errorf("fail_open during the outage: %d %s", r.status, r.body)
	}
	// Nothing is known of the key: no "remaining" (it said 0) nor reset,
	// and no RateLimit item; the limit and its policy are stated.
	if !strings.Contains(r.body, `"limit":5,"retry_after_ms":0,"reason":"fail_open"`) || strings.Contains(r.body, `"remaining"`) || strings.Contains(r.body, `"reset_after_ms"`) {
		t.Errorf("a fail_open answer states what is not known: %s", r.body)
	}
	if rl, pol := r.header.Values("RateLimit"), r.header.Get("RateLimit-Policy"); len(rl) != 0 || pol != `"page";q=5;w=60` {
		t.Errorf("fail_open: RateLimit %q (want none), RateLimit-Policy %q", rl, pol)
	}
}

// TestBodyTooLarge413: a body over MaxBodyBytes is 413 Content Too Large,
// with a problem naming the bound, on both JSON APIs.
func TestBodyTooLarge413(t *testing.T) {
	f := newFixture(t, Options{MaxBodyBytes: 4096})
	body := `{"domain":"` + strings.Repeat("d", 5000) + `"}`
	for _, path := range []string{"/v1/check", "/json"} {
		detail := problemDetail(t, do(t, "POST", f.srv.URL+path, body), http.StatusRequestEntityTooLarge)
		if want := fmt.Sprintf("exceeds %d bytes (MaxBodyBytes)", 4096); !strings.Contains(detail, want) {
			t.Errorf("%s: detail %q lacks %q", path, detail, want)
		}
	}
}

// newServer serves h on a loopback port for the test and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}
