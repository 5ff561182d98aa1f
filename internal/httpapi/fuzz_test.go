package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// fuzzPost posts body to path and checks the answer is a decision (200 or
// 429 with a JSON body) or a problem (400, or 413 for a body over the
// bound, application/problem+json): never a panic, never a 5xx for a
// memory store.
func fuzzPost(t *testing.T, f *fixture, path string, body []byte) {
	req := httptest.NewRequest("POST", path, strings.NewReader(string(body)))
	w := httptest.NewRecorder()
	f.api.ServeHTTP(w, req)
	checkAnswer(t, w, body)
}

// checkAnswer checks the answer w to body as fuzzPost says.
func checkAnswer(t *testing.T, w *httptest.ResponseRecorder, body []byte) {
	t.Helper()
	switch w.Code {
	case 200, 429:
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("status %d with invalid JSON %q for %q", w.Code, w.Body, body)
		}
	case 400, 413:
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("%d with Content-Type %q for %q", w.Code, ct, body)
		}
		var p problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Status != w.Code || p.Detail == "" {
			t.Fatalf("%d with a bad problem %q (%v) for %q", w.Code, w.Body, err, body)
		}
	default:
		t.Fatalf("status %d (%s) for %q", w.Code, w.Body, body)
	}
}

func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{
		checkBody("t", "", "user=a"),
		checkBody("t", "0", "user=a", "vip=b"),
		checkBody("t", "-3", "g=x"),
		`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"a"},{"key":"x","value":"y"}],"cost":7}]}`,
		`{"domain":"t","descriptors":[{"entries":[]}]}`,
		`{"domain":"t","costs":{"input_tokens":5},"descriptors":[{"entries":[{"key":"model","value":"m"}],"costs":{"output_tokens":2,"ru":-1}}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"model","value":"m"}],"costs":{"Input":1,"x":1.5}}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"model","value":"m"}],"costs":{}}],"costs":null}`,
		`{"domain":"","descriptors":null,"cost":null}`,
		`{"domian":1}`,
		`[]`, `null`, `{`, `{"domain":"t"} x`,
	} {
		f.Add([]byte(s))
	}
	fx := newFixture(f, Options{MaxBodyBytes: 1 << 16})
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzPost(t, fx, "/v1/check", body)
	})
}

func FuzzEnvoyJSON(f *testing.F) {
	for _, s := range []string{
		`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"a"}],"hitsAddend":0}],"hitsAddend":3}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}],"limit":{"requestsPerUnit":5,"unit":"SECOND","unitMultiplier":3}}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"g","value":"a"}],"isNegativeHits":true,"hitsAddend":"2"}]}`,
		`{"domain":"nope","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`,
		`{"domain":"t","descriptors":[{"entries":[{"key":"a","value":"b"}],"limit":{"requestsPerUnit":1,"unit":"YEAR","unitMultiplier":4294967295}}]}`,
		`{}`, `{`, `[]`,
	} {
		f.Add([]byte(s))
	}
	fx := newFixture(f, Options{MaxBodyBytes: 1 << 16})
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzPost(t, fx, "/json", body)
	})
}
