package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestSettle: a check with "settle": true answers a reservation id;
// /v1/settle refunds what the actual cost did not use; a repeat is 200
// already_settled; an unknown id is 404; a malformed body is 400.
func TestSettle(t *testing.T) {
	f := newFixture(t, Options{})
	check := `{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"s"}]}],"cost":4,"settle":true,"settle_within_ms":60000}`
	var got struct {
		Allowed     bool                        `json:"allowed"`
		Code        string                      `json:"code"`
		Reservation string                      `json:"reservation"`
		Descriptors []struct{ Remaining int64 } `json:"descriptors"`
	}
	r := do(t, "POST", f.srv.URL+"/v1/check", check)
	if err := json.Unmarshal([]byte(r.body), &got); err != nil || r.status != 200 || ratelimit.CheckReservationID(got.Reservation) != nil || got.Descriptors[0].Remaining != 0 {
		t.Fatalf("check with settle: %d %s (%v)", r.status, r.body, err)
	}
	// The burst (4) is taken: the same check is 429, without an id.
	r = do(t, "POST", f.srv.URL+"/v1/check", check)
	if r.status != http.StatusTooManyRequests || strings.Contains(r.body, "reservation") {
		t.Fatalf("over the limit: %d %s", r.status, r.body)
	}
	settle := `{"reservation":"` + got.Reservation + `","descriptors":[{"cost":1}]}`
	r = do(t, "POST", f.srv.URL+"/v1/settle", settle)
	if r.status != 200 || !strings.Contains(r.body, `"refunded": 3`) || !strings.Contains(r.body, `"settled": true`) {
		t.Fatalf("settle: %d %s", r.status, r.body)
	}
	// 3 came back: a check of 3 passes.
	r = do(t, "POST", f.srv.URL+"/v1/check", `{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"s"}]}],"cost":3}`)
	if r.status != 200 {
		t.Fatalf("after the refund: %d %s", r.status, r.body)
	}
	r = do(t, "POST", f.srv.URL+"/v1/settle", settle)
	if r.status != 200 || !strings.Contains(r.body, `"already_settled": true`) {
		t.Fatalf("repeat: %d %s", r.status, r.body)
	}
	r = do(t, "POST", f.srv.URL+"/v1/settle", `{"reservation":"`+ratelimit.NewReservationID()+`","cost":1}`)
	if r.status != http.StatusNotFound || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("unknown: %d %s", r.status, r.body)
	}
	for _, bad := range []string{
		`{"cost":1}`,
		`{"reservation":"x y","cost":1}`,
		`{"reservation":"abc"}`,
		`{"reservation":"abc","cost":1,"descriptors":[{"cost":1}]}`,
		`{"reservation":"abc","cost":-1}`,
		`{"reservation":"abc","descriptors":[{}]}`,
		`{"reservation":"abc","descriptors":[]}`,
		`{"reservation":"abc","cost":1,"extra":1}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","descriptors":[{"cost":1},{"costs":{"output_tokens":1}}]}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","costs":{}}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","costs":{"output_tokens":-1}}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","costs":{"Output":1}}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","cost":1,"descriptors":[{"costs":{"a":1}}]}`,
	} {
		if r := do(t, "POST", f.srv.URL+"/v1/settle", bad); r.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, r.status, r.body)
		}
	}
	// A paced reservation keeps one too.
	var paced struct {
		Allowed     bool   `json:"allowed"`
		Reservation string `json:"reservation"`
	}
	r = do(t, "POST", f.srv.URL+"/v1/reserve", `{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"p"}]}],"cost":2,"max_wait_ms":0,"settle":true}`)
	if err := json.Unmarshal([]byte(r.body), &paced); err != nil || r.status != 200 || !paced.Allowed || ratelimit.CheckReservationID(paced.Reservation) != nil {
		t.Fatalf("reserve with settle: %d %s (%v)", r.status, r.body, err)
	}
	if r = do(t, "POST", f.srv.URL+"/v1/settle", `{"reservation":"`+paced.Reservation+`","cost":2}`); r.status != 200 || !strings.Contains(r.body, `"limits": 1`) {
		t.Fatalf("settling the paced reservation: %d %s", r.status, r.body)
	}
	for _, bad := range []string{
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"s"}]}],"settle_within_ms":5}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"s"}]}],"settle":true,"settle_within_ms":0}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"s"}]}],"settle":true,"settle_within_ms":86400001}`,
	} {
		if r := do(t, "POST", f.srv.URL+"/v1/check", bad); r.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, r.status, r.body)
		}
	}
}

// TestSettleUnits: a model call reserved with 40 input and 50 output
// tokens (the whole output budget) and settled with its output tokens
// alone gives back 40 of them and keeps the input estimate.
func TestSettleUnits(t *testing.T) {
	f := newFixture(t, Options{})
	var got struct {
		Reservation string `json:"reservation"`
	}
	r := do(t, "POST", f.srv.URL+"/v1/check", `{"domain":"t","descriptors":[{"entries":[{"key":"model","value":"u"}],"costs":{"input_tokens":40,"output_tokens":50}}],"settle":true}`)
	if err := json.Unmarshal([]byte(r.body), &got); err != nil || r.status != 200 || got.Reservation == "" {
		t.Fatalf("check with settle: %d %s (%v)", r.status, r.body, err)
	}
	r = do(t, "POST", f.srv.URL+"/v1/settle", `{"reservation":"`+got.Reservation+`","costs":{"output_tokens":10}}`)
	if r.status != 200 || !strings.Contains(r.body, `"refunded": 40`) || !strings.Contains(r.body, `"limits": 3`) {
		t.Fatalf("settle: %d %s", r.status, r.body)
	}
	over := `{"domain":"t","descriptors":[{"entries":[{"key":"model","value":"u"}],"costs":{"input_tokens":61,"output_tokens":40}}]}`
	if r = do(t, "POST", f.srv.URL+"/v1/check", over); r.status != http.StatusTooManyRequests {
		t.Fatalf("61 input tokens after 40 kept of 100: %d %s", r.status, r.body)
	}
	fits := `{"domain":"t","descriptors":[{"entries":[{"key":"model","value":"u"}],"costs":{"input_tokens":60,"output_tokens":40}}]}`
	if r = do(t, "POST", f.srv.URL+"/v1/check", fits); r.status != 200 {
		t.Fatalf("60 input and 40 output tokens left: %d %s", r.status, r.body)
	}
}

// FuzzSettleJSON: any /v1/settle body is answered 200, 400 or 404, with
// JSON or a problem, never a panic or a 5xx on a memory store.
func FuzzSettleJSON(f *testing.F) {
	for _, s := range []string{
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","cost":3}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","descriptors":[{"cost":1},{"cost":2}]}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","costs":{"output_tokens":312}}`,
		`{"reservation":"AAAAAAAAAAAAAAAAAAAAAA","descriptors":[{"cost":1,"costs":{"a":1}},{"cost":2}]}`,
		`{"reservation":"","cost":0}`, `{"reservation":null}`, `{}`, `[]`, `{`,
	} {
		f.Add([]byte(s))
	}
	fx := newFixture(f, Options{MaxBodyBytes: 1 << 16})
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("POST", "/v1/settle", strings.NewReader(string(body)))
		w := httptest.NewRecorder()
		fx.api.ServeHTTP(w, req)
		if w.Code == http.StatusNotFound {
			if w.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("404 without a problem for %q", body)
			}
			return
		}
		checkAnswer(t, w, body)
	})
}
