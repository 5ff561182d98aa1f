package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/coord"
	"github.com/sluicehq/sluice/lease"
)

// leaseFixture is an API with the lease routes on memory stores.
func leaseFixture(t testing.TB, token string) (*fixture, *coord.Service) {
	t.Helper()
	s, err := coord.New(coord.Options{Store: concurrency.NewMemoryStore(), Token: token,
		Leases: func(string) (lease.Store, error) { return lease.NewMemoryStore(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return newFixture(t, Options{Leases: s, MaxBodyBytes: 1 << 12}), s
}

// leasePost posts body to the lease route op with token.
func leasePost(t *testing.T, f *fixture, op, token, body string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/leases/"+op, strings.NewReader(body))
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

// TestLeaseRoutes: join, a watch that answers once the capacity is
// leased, demand, errors as problems with the coordination API's
// statuses, leave; all behind the token.
func TestLeaseRoutes(t *testing.T) {
	f, _ := leaseFixture(t, "tok")
	join := `{"service":"db","capacity":100,"partitions":4,"ttl_ms":2000,"backlog":10}`
	if w, _ := leasePost(t, f, "join", "", join); w.Code != 401 || w.Header().Get("WWW-Authenticate") == "" {
		t.Errorf("without the token: %d %v", w.Code, w.Header())
	}
	w, g := leasePost(t, f, "join", "tok", join)
	if w.Code != 200 || len(g["holder_id"].(string)) != 26 || g["version"] != 1.0 || g["rate"] != 0.0 || g["leases"] == nil {
		t.Fatalf("join: %d %v", w.Code, g)
	}
	id := g["holder_id"].(string)
	for range 20 {
		w, g = leasePost(t, f, "watch", "tok", `{"service":"db","holder_id":"`+id+`","version":`+jsonNum(g["version"])+`,"wait_ms":2000}`)
		if w.Code != 200 {
			t.Fatalf("watch: %d %v", w.Code, g)
		}
		if g["rate"] == 100.0 {
			break
		}
	}
	if g["rate"] != 100.0 || g["window_ms"] != 1000.0 || g["valid_for_ms"].(float64) <= 0 || g["valid_for_ms"].(float64) > 2000 ||
		g["pace_rate"].(float64) <= 0 || g["burst"].(float64) < 1 || len(g["leases"].([]any)) != 4 {
		t.Fatalf("the grant at the full rate: %v", g)
	}
	// A watch at the current version waits for a change (a renewal's
	// new validity is one), or answers as it is after the wait.
	start := time.Now()
	w, same := leasePost(t, f, "watch", "tok", `{"service":"db","holder_id":"`+id+`","version":`+jsonNum(g["version"])+`,"wait_ms":50}`)
	if w.Code != 200 || same["rate"] != 100.0 || (same["version"] == g["version"] && time.Since(start) < 50*time.Millisecond) {
		t.Errorf("watch at version %v: %d %v after %v; want a later version, or the same after the wait", g["version"], w.Code, same, time.Since(start))
	}
	if w, m := leasePost(t, f, "demand", "tok", `{"service":"db","holder_id":"`+id+`","backlog":10,"version":`+jsonNum(g["version"])+`}`); w.Code != 200 || m["rate"] != 100.0 {
		t.Errorf("demand: %d %v", w.Code, m)
	}
	for _, tc := range []struct {
		op, body, detail string
		code             int
	}{
		{"join", `{"service":"db","capacity":100,"partitions":4,"partitons":2}`, `unknown field "partitons"`, 400},
		{"join", `{"service":"db","capacity":"100","partitions":4}`, `field "capacity"`, 400},
		{"join", `{"service":"db","capacity":100,"partitions":0}`, `partitions 0`, 400},
		{"join", `{"service":"db","capacity":200,"partitions":4}`, `capacity 100 in 4 partitions`, 400},
		{"join", `{"service":"a{b}","capacity":1,"partitions":1}`, `brace`, 400},
		{"join", `{"service":"db","capacity":100,"partitions":4,"ttl_ms":1}`, `ttl 1ms`, 400},
		{"demand", `{"service":"db","holder_id":"AAAAAAAAAAAAAAAAAAAAAAAAAA"}`, `no holder with this id`, 404},
		{"demand", `{"service":"other","holder_id":"` + id + `"}`, `no holder with this id`, 404},
		{"demand", `{"service":"db","holder_id":"` + id + `","backlog":-1}`, `backlog -1`, 400},
		{"watch", `{"service":"db","holder_id":"` + id + `","wait_ms":3600000}`, `wait 1h0m0s`, 400},
		{"watch", `{"service":"db","holder_id":"short"}`, `holder_id is 5 bytes`, 400},
		{"leave", `{"service":"db","holder_id":"` + id + `","version":1}`, `unknown field "version"`, 400},
	} {
		w, p := leasePost(t, f, tc.op, "tok", tc.body)
		if w.Code != tc.code || !strings.Contains(p["detail"].(string), tc.detail) {
			t.Errorf("%s %s: %d %v; want %d with %q", tc.op, tc.body, w.Code, p, tc.code, tc.detail)
		}
	}
	if w, _ := leasePost(t, f, "leave", "tok", `{"service":"db","holder_id":"`+id+`"}`); w.Code != 204 {
		t.Errorf("leave: %d", w.Code)
	}
	if w, _ := leasePost(t, f, "leave", "tok", `{"service":"db","holder_id":"`+id+`"}`); w.Code != 404 {
		t.Errorf("second leave: %d, want 404", w.Code)
	}
}

// jsonNum writes a decoded JSON number back.
func jsonNum(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// FuzzLeaseJSON posts arbitrary bodies to every lease route: each is
// answered as the routes document (a grant, 204, or a problem naming what
// is wrong), never a 500; and a body the strict decoder takes holds, as
// encoding/json reads it, the very same request, so that no two bodies
// reach one service or holder.
func FuzzLeaseJSON(f *testing.F) {
	for _, s := range []string{
		`{"service":"db","capacity":100,"partitions":4}`,
		`{"service":"db","capacity":100,"partitions":4,"ttl_ms":1000,"weight":2,"window_ms":500,"rate":10,"backlog":5}`,
		`{"service":"db","holder_id":"AAAAAAAAAAAAAAAAAAAAAAAAAA","rate":1,"backlog":2,"version":3}`,
		`{"service":"db","holder_id":"AAAAAAAAAAAAAAAAAAAAAAAAAA","version":1,"wait_ms":1}`,
		`{"service":"d\u00e9","capacity":1e308,"partitions":1}`, `{"service":"db","SERVICE":"x","capacity":1,"partitions":1}`,
		`{"service":"db","capacity":-1,"partitions":4}`, `{}`, `[]`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	s, err := coord.New(coord.Options{Store: concurrency.NewMemoryStore(), Limits: coord.Limits{MaxWait: time.Millisecond, MaxHolders: 2, MaxServices: 4},
		Leases: func(string) (lease.Store, error) { return lease.NewMemoryStore(), nil }})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Shutdown)
	fx := newFixture(f, Options{Leases: s, MaxBodyBytes: 1 << 12})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, op := range []string{"join", "demand", "watch", "leave"} {
			req := httptest.NewRequest("POST", "/v1/leases/"+op, strings.NewReader(string(body)))
			w := httptest.NewRecorder()
			fx.api.ServeHTTP(w, req)
			switch w.Code {
			case 200, 204, 400, 404, 413, 429:
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
		same := func(strict, loose any) {
			if err := decodeBodyStrict(body, strict, new(strictScan)); err != nil {
				return
			}
			if err := json.Unmarshal(body, loose); err != nil {
				t.Fatalf("the strict decoder took %q, encoding/json refuses it: %v", body, err)
			}
			a, _ := json.Marshal(strict)
			b, _ := json.Marshal(loose)
			if string(a) != string(b) {
				t.Fatalf("%q: strictly %s, by encoding/json %s", body, a, b)
			}
		}
		same(new(joinBody), new(joinBody))
		same(new(demandBody), new(demandBody))
		same(new(watchBody), new(watchBody))
	})
}
