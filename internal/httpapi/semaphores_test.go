package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/coord"
)

// semFixture is an API with the semaphore routes on a memory store.
func semFixture(t testing.TB, token string, l coord.Limits) *fixture {
	t.Helper()
	s, err := coord.New(coord.Options{Store: concurrency.NewMemoryStore(), Token: token, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	return newFixture(t, Options{Semaphores: s, MaxBodyBytes: 1 << 12})
}

// semPost posts body to the semaphore route op with token.
func semPost(t *testing.T, f *fixture, op, token, body string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/semaphores/"+op, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	f.api.ServeHTTP(w, req)
	var m map[string]any
	if w.Body.Len() > 0 {
		if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
			t.Fatalf("%s %s: %v: %q", op, body, err, w.Body)
		}
	}
	return w, m
}

func TestSemaphoreRoutes(t *testing.T) {
	f := semFixture(t, "tok", coord.Limits{})
	if w, _ := semPost(t, f, "acquire", "", `{"name":"a","limit":1}`); w.Code != 401 || w.Header().Get("WWW-Authenticate") == "" {
		t.Errorf("without the token: %d %v", w.Code, w.Header())
	}
	if w, _ := semPost(t, f, "acquire", "bad", `{"name":"a","limit":1}`); w.Code != 401 {
		t.Errorf("with a wrong token: %d", w.Code)
	}
	w, g := semPost(t, f, "acquire", "tok", `{"name":"a","limit":1,"ttl_ms":2000}`)
	if w.Code != 200 || g["fence"] != 1.0 || g["valid_for_ms"].(float64) > 2000 || len(g["permit_id"].(string)) != 26 {
		t.Fatalf("acquire: %d %v", w.Code, g)
	}
	id := g["permit_id"].(string)
	if w, p := semPost(t, f, "acquire", "tok", `{"name":"a","limit":1}`); w.Code != http.StatusConflict || !strings.Contains(p["detail"].(string), "no permit") {
		t.Errorf("acquire of a full semaphore: %d %v", w.Code, p)
	}
	if w, m := semPost(t, f, "renew", "tok", `{"name":"a","permit_id":"`+id+`","ttl_ms":3000}`); w.Code != 200 || m["valid_for_ms"].(float64) <= 2000 {
		t.Errorf("renew: %d %v", w.Code, m)
	}
	for _, tc := range []struct {
		op, body, detail string
		code             int
	}{
		{"acquire", `{"name":"a","limit":1,"lmit":2}`, `unknown field "lmit"`, 400},
		{"acquire", `{"name":"a","limit":1,"name":"b"}`, `"name"`, 400},
		{"acquire", `{"name":"a","limit":"1"}`, `field "limit"`, 400},
		{"acquire", `{"name":"a\ud800","limit":1}`, `surrogate`, 400},
		{"acquire", `{"name":"a","limit":1} {}`, `after the JSON object`, 400},
		{"acquire", ``, `empty body`, 400},
		{"acquire", `{"name":"` + strings.Repeat("x", 5000) + `","limit":1}`, `exceeds 4096 bytes`, 413},
		{"acquire", `{"name":"a","limit":1,"ttl_ms":99}`, `ttl 99ms`, 400},
		{"acquire", `{"name":"a","limit":1,"ttl_ms":9223372036854775807}`, `ttl`, 400},
		{"renew", `{"name":"a","permit_id":"` + id + `","ttl_ms":-1}`, `ttl -1ms`, 400},
		{"renew", `{"name":"a","permit_id":"AAAAAAAAAAAAAAAAAAAAAAAAAA"}`, `no permit with this id`, 404},
		{"release", `{"name":"a","permit_id":"` + id + `","ttl_ms":1}`, `unknown field "ttl_ms"`, 400},
		{"release", `{"name":"b","permit_id":"` + id + `"}`, `no permit with this id`, 404},
		{"holders", `{"name":"a","permit_id":"` + id + `"}`, `unknown field "permit_id"`, 400},
		{"holders", `{"name":""}`, `name is empty`, 400},
		{"holders", `{}`, `name is empty`, 400},
	} {
		w, p := semPost(t, f, tc.op, "tok", tc.body)
		if w.Code != tc.code || w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(p["detail"].(string), tc.detail) {
			t.Errorf("%s %.60s: %d %v; want %d saying %q", tc.op, tc.body, w.Code, p, tc.code, tc.detail)
		}
	}
	if w, _ := semPost(t, f, "holders", "", `{"name":"a"}`); w.Code != 401 {
		t.Errorf("holders without the token: %d", w.Code)
	}
	w, hs := semPost(t, f, "holders", "tok", `{"name":"a"}`)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("holders: %d %v", w.Code, hs)
	}
	// Exactly the contract's fields, and never the permit's id.
	if strings.Contains(w.Body.String(), id) {
		t.Errorf("holders shows the permit id: %s", w.Body)
	}
	var got struct {
		Name    string                   `json:"name"`
		Holders []map[string]json.Number `json:"holders"`
		Waiting int                      `json:"waiting"`
	}
	dec := json.NewDecoder(strings.NewReader(w.Body.String()))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("holders: %v in %s", err, w.Body)
	}
	if got.Name != "a" || got.Waiting != 0 || len(got.Holders) != 1 {
		t.Fatalf("holders = %s, want a's one holder", w.Body)
	}
	h := got.Holders[0]
	held, _ := h["held_for_ms"].Int64()
	exp, _ := h["expires_in_ms"].Int64()
	if len(h) != 4 || h["fence"] != "1" || h["weight"] != "1" || held < 0 || exp <= 2000 || exp > 3000 {
		t.Errorf("holder = %v, want fence 1, weight 1, held_for_ms >= 0, expires_in_ms in (2000, 3000] (renewed for 3 s)", h)
	}
	if w, _ := semPost(t, f, "release", "tok", `{"name":"a","permit_id":"`+id+`"}`); w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Errorf("release: %d %q", w.Code, w.Body)
	}
	if w, _ := semPost(t, f, "release", "tok", `{"name":"a","permit_id":"`+id+`"}`); w.Code != http.StatusNotFound {
		t.Errorf("second release: %d", w.Code)
	}
	w, _ = semPost(t, f, "holders", "tok", `{"name":"a"}`)
	var compact bytes.Buffer
	if err := json.Compact(&compact, w.Body.Bytes()); w.Code != 200 || err != nil || compact.String() != `{"name":"a","holders":[],"waiting":0}` {
		t.Errorf("holders after the release: %d %q (%v)", w.Code, w.Body, err)
	}
}

// FuzzSemaphoreJSON posts arbitrary bodies to the four semaphore routes:
// each answer is a grant, a renewal, a release, a listing or a problem with a
// detail, never a panic or a 5xx; and a body accepted by the strict
// decoder names the semaphore that encoding/json finds in it, so that no
// two names reach one semaphore.
func FuzzSemaphoreJSON(f *testing.F) {
	for _, s := range []string{
		`{"name":"db","limit":2}`,
		`{"name":"db","limit":2,"weight":2,"ttl_ms":1000,"wait_ms":1,"fair":true}`,
		`{"name":"db","permit_id":"AAAAAAAAAAAAAAAAAAAAAAAAAA","ttl_ms":500}`,
		`{"name":"d\u00e9","limit":1}`, `{"name":"db","NAME":"x","limit":1}`,
		`{"name":"db","limit":-1}`, `{}`, `[]`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	fx := semFixture(f, "", coord.Limits{MaxWait: time.Millisecond})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, op := range []string{"acquire", "renew", "release", "holders"} {
			req := httptest.NewRequest("POST", "/v1/semaphores/"+op, strings.NewReader(string(body)))
			w := httptest.NewRecorder()
			fx.api.ServeHTTP(w, req)
			switch w.Code {
			case 200, 204, 400, 404, 409, 413:
			default:
				t.Fatalf("%s: status %d (%s) for %q", op, w.Code, w.Body, body)
			}
			if w.Code >= 400 {
				var p problem
				if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != w.Code || p.Detail == "" || w.Header().Get("Content-Type") != "application/problem+json" {
					t.Fatalf("%s: %d with a bad problem %q for %q", op, w.Code, w.Body, body)
				}
			}
		}
		req, err := decodeAcquire(body)
		if err != nil {
			return
		}
		var plain struct{ Name string }
		if err := json.Unmarshal(body, &plain); err != nil || plain.Name != req.Name {
			t.Fatalf("strict decoding named %q, encoding/json %q (%v), for %q", req.Name, plain.Name, err, body)
		}
	})
}
