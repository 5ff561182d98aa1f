package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

// reserveServer serves the test rules on a memory store whose clock
// stands still unless the test moves it.
func reserveServer(t *testing.T) (*httptest.Server, *storetest.Clock) {
	t.Helper()
	clock := storetest.NewClock(time.Unix(1_800_000_000, 0))
	mem := memstore.New(memstore.Options{JanitorInterval: -1, Now: clock.Now})
	t.Cleanup(func() { mem.Close() })
	svc, err := service.New(service.Options{Store: mem, Rules: loadSet(t, testRules)})
	if err != nil {
		t.Fatal(err)
	}
	api, err := New(Options{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return srv, clock
}

// reserveResponse mirrors the JSON answer of /v1/reserve.
type reserveResponse struct {
	Allowed     bool   `json:"allowed"`
	Code        string `json:"code"`
	WaitMS      int64  `json:"wait_ms"`
	Descriptors []struct {
		Allowed       bool   `json:"allowed"`
		Code          string `json:"code"`
		Matched       bool   `json:"matched"`
		Rule          string `json:"rule"`
		Limit         int64  `json:"limit"`
		Remaining     int64  `json:"remaining"`
		ResetAfterMS  int64  `json:"reset_after_ms"`
		RetryAfterMS  int64  `json:"retry_after_ms"`
		Reason        string `json:"reason"`
		Shadow        bool   `json:"shadow"`
		QuotaMode     bool   `json:"quota_mode"`
		QuotaExceeded bool   `json:"quota_exceeded"`
		Unlimited     bool   `json:"unlimited"`
		WaitMS        int64  `json:"wait_ms"`
	} `json:"descriptors"`
}

// TestReserve: on rule gcra (2/s, burst 4; one unit every 500ms), at
// one instant, the burst goes at once, the next unit waits 500ms, and a
// reservation that would wait longer than max_wait_ms is 429 with
// Retry-After, consuming nothing.
func TestReserve(t *testing.T) {
	srv, clock := reserveServer(t)
	url := srv.URL + "/v1/reserve"
	body := func(cost, maxWait string) string {
		return `{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"r"}]}],"cost":` + cost + `,"max_wait_ms":` + maxWait + `}`
	}
	var got reserveResponse
	r := do(t, "POST", url, body("4", "1000"))
	decodeStrict(t, r.body, &got)
	if r.status != http.StatusOK || !got.Allowed || got.WaitMS != 0 || got.Descriptors[0].Limit != 4 || got.Descriptors[0].Remaining != 0 {
		t.Fatalf("the burst: %d %s", r.status, r.body)
	}
	r = do(t, "POST", url, body("1", "1000"))
	got = reserveResponse{}
	decodeStrict(t, r.body, &got)
	if r.status != http.StatusOK || !got.Allowed || got.WaitMS != 500 || got.Descriptors[0].WaitMS != got.WaitMS {
		t.Fatalf("one more unit: %d %s; want a wait of 500ms", r.status, r.body)
	}
	if r.header.Get("Ratelimit-Policy") == "" || r.header.Get("Retry-After") != "" {
		t.Errorf("admitted: header %v", r.header)
	}
	// Two more would wait 1.5s > 1s: refused, and a reservation of 1s
	// fits in 500ms.
	r = do(t, "POST", url, body("2", "1000"))
	got = reserveResponse{}
	decodeStrict(t, r.body, &got)
	if d := got.Descriptors[0]; r.status != http.StatusTooManyRequests || got.Allowed || got.WaitMS != 0 || d.Reason != "limited" || d.RetryAfterMS != 500 || r.header.Get("Retry-After") != "1" {
		t.Fatalf("beyond max_wait_ms: %d %v %s", r.status, r.header, r.body)
	}
	// Nothing was taken: 250ms later, one more unit waits 750ms.
	clock.Advance(250 * time.Millisecond)
	r = do(t, "POST", url, body("1", "1000"))
	got = reserveResponse{}
	decodeStrict(t, r.body, &got)
	if r.status != http.StatusOK || got.WaitMS != 750 {
		t.Fatalf("after the refusal: %d %s; want a wait of 750ms", r.status, r.body)
	}
}

// TestReserveRefuses: what cannot be reserved is 400 naming why.
func TestReserveRefuses(t *testing.T) {
	f := newFixture(t, Options{})
	url := f.srv.URL + "/v1/reserve"
	for _, tt := range []struct{ body, want string }{
		{`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"max_wait_ms":1000}`, `limit \"per_user\" of domain \"t\" cannot be reserved`},
		{`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}]}]}`, `max_wait_ms\" is required`},
		{`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}]}],"max_wait_ms":-1}`, "is negative"},
		{`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}]}],"max_wait_ms":61000}`, "exceeds this server's bound of 1m0s"},
		{`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}]}],"max_wait_ms":1000,"wait":1}`, `unknown field \"wait\"`},
		{`{"domain":"t","descriptors":[],"max_wait_ms":1000}`, "no descriptors"},
	} {
		r := do(t, "POST", url, tt.body)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, tt.want) || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s; want 400 containing %q", tt.body, r.status, r.body, tt.want)
		}
	}
}

// FuzzReserveJSON: any body is answered with a reservation (200, 429) or
// a problem (400, 413), never a panic nor a 5xx on a memory store.
func FuzzReserveJSON(f *testing.F) {
	for _, s := range []string{
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}]}],"max_wait_ms":1000}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}],"cost":3}],"cost":0,"max_wait_ms":0}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}],"cost":-2}],"max_wait_ms":60000}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"max_wait_ms":1}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"trial","value":"a"}]},{"entries":[{"key":"vip","value":"b"}]}],"max_wait_ms":5}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}]}],"max_wait_ms":9223372036854775807}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}]}]}`,
		`{"domain":"t","max_wait_ms":1,"MAX_WAIT_MS":2}`,
		`[]`, `null`, `{`,
	} {
		f.Add([]byte(s))
	}
	fx := newFixture(f, Options{MaxBodyBytes: 1 << 16})
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzPost(t, fx, "/v1/reserve", body)
	})
}
