package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// newStore returns a memstore whose clock stands still at a fixed instant,
// so that every Retry-After and reset is exact.
func newStore(t *testing.T) *memstore.Store {
	t.Helper()
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	s := memstore.New(memstore.Options{Now: func() time.Time { return t0 }, JanitorInterval: -1})
	t.Cleanup(func() { s.Close() })
	return s
}

// fakeStore answers every Decide with fixed decisions or an error.
type fakeStore struct {
	reason ratelimit.Reason
	retry  time.Duration
	err    error
}

func (f fakeStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	if f.err != nil {
		return dst, f.err
	}
	for _, it := range items {
		allowed := f.reason == ratelimit.ReasonOK || f.reason == ratelimit.ReasonFailOpen
		dst = append(dst, ratelimit.Decision{Allowed: allowed, Reason: f.reason, Capacity: it.Rule.Capacity(), RetryAfter: f.retry, Rule: it.Rule.Name})
	}
	return dst, nil
}

// noRead is a request body that fails the test if anyone reads it.
type noRead struct{ t *testing.T }

func (n noRead) Read([]byte) (int, error) {
	n.t.Error("the middleware read the body of a request it refused")
	return 0, io.EOF
}

// dump renders a response as a golden file: status, sorted header fields
// (without Date), blank line, body.
func dump(rec *httptest.ResponseRecorder) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d %s\n", rec.Code, http.StatusText(rec.Code))
	keys := make([]string, 0, len(rec.Header()))
	for k := range rec.Header() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range rec.Header()[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	b.WriteString("\n")
	b.Write(rec.Body.Bytes())
	return b.Bytes()
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("response differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestMiddlewareGolden(t *testing.T) {
	perIP := httplimit.Policy{
		Rule: ratelimit.Rule{Name: "per_ip", Quota: 2, Period: time.Second},
		Keys: []httplimit.Key{httplimit.ByIP()},
	}
	tenant := httplimit.Policy{
		Rule: ratelimit.Rule{Name: "tenant", Algorithm: ratelimit.FixedWindow, Quota: 15, Period: time.Minute},
		Keys: []httplimit.Key{httplimit.ByHeader("X-Tenant")},
		Cost: httplimit.CostByMethod(map[string]int64{"POST": 10}, 1),
	}
	writes := httplimit.Policy{
		Rule: ratelimit.Rule{Name: "writes", Algorithm: ratelimit.FixedWindow, Quota: 30, Period: time.Minute},
		Keys: []httplimit.Key{httplimit.ByMethod(), httplimit.ByIP()},
		Cost: httplimit.CostByMethod(map[string]int64{"GET": 0}, 20),
	}
	tests := []struct {
		name   string
		cfg    httplimit.Options
		method string
		header http.Header
		before int // requests sent before the one dumped
	}{
		{name: "allowed", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}}, method: "GET"},
		{name: "denied", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}}, method: "GET", before: 2},
		{name: "denied_legacy", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}, LegacyHeaders: true}, method: "GET", before: 2},
		{name: "allowed_omit", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}, OmitAllowedHeaders: true}, method: "GET"},
		{
			name: "multi_denied_secret_key", cfg: httplimit.Options{Policies: []httplimit.Policy{tenant, writes}},
			method: "POST", header: http.Header{"X-Tenant": {"acme-secret"}}, before: 1,
		},
		{
			name: "multi_one_applies", cfg: httplimit.Options{Policies: []httplimit.Policy{tenant, writes}},
			method: "GET",
		},
		{
			name: "exceeds_capacity", cfg: httplimit.Options{Policies: []httplimit.Policy{{
				Rule: ratelimit.Rule{Name: "big", Quota: 5, Period: time.Second},
				Cost: func(*http.Request) int64 { return 6 },
			}}},
			method: "PUT",
		},
		{name: "fail_closed", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}, Store: fakeStore{reason: ratelimit.ReasonFailClosed, retry: 1500 * time.Millisecond}}, method: "GET"},
		{name: "store_error", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}, Store: fakeStore{err: errors.New("backend down")}}, method: "GET"},
		{name: "shed", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}, Shed: func(*http.Request) (time.Duration, bool) { return 3 * time.Second, true }}, method: "GET"},
		{name: "shadow_denied", cfg: httplimit.Options{Policies: []httplimit.Policy{perIP}, Shadow: true}, method: "GET", before: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg.Store == nil {
				cfg.Store = newStore(t)
			}
			var events []httplimit.Event
			cfg.OnDecision = func(e *httplimit.Event) { events = append(events, *e) }
			m, err := httplimit.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			handled := 0
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				handled++
				io.WriteString(w, "ok\n")
			}))
			send := func(refuseRead bool) *httptest.ResponseRecorder {
				var body io.Reader = strings.NewReader("{}")
				if refuseRead {
					body = noRead{t}
				}
				req := httptest.NewRequest(tt.method, "http://api.example/items/7", body)
				req.RemoteAddr = "192.0.2.7:51000"
				for k, v := range tt.header {
					req.Header[k] = v
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec
			}
			for range tt.before {
				send(false)
			}
			before := handled
			rec := send(refused(tt.name))
			checkGolden(t, "middleware_"+tt.name, dump(rec))
			if rec.Header().Get("Content-Type") == "application/problem+json" && !json.Valid(rec.Body.Bytes()) {
				t.Errorf("problem body is not JSON: %s", rec.Body)
			}
			passed := handled > before
			if want := rec.Code == http.StatusOK; passed != want {
				t.Errorf("handler ran = %v, status %d", passed, rec.Code)
			}
			if len(events) == 0 {
				t.Fatal("OnDecision was not called")
			}
			last := events[len(events)-1]
			if last.Status != 0 && last.Status != rec.Code {
				t.Errorf("event status %d, response %d", last.Status, rec.Code)
			}
			if tt.name == "shadow_denied" && (!last.Denied || !last.Shadow || last.Status != 0) {
				t.Errorf("shadow event = %+v, want Denied and Shadow with status 0", last)
			}
			if tt.name == "store_error" && last.Err == nil {
				t.Error("event carries no store error")
			}
		})
	}
}

// refused reports whether the named case refuses the request, so that its
// body must stay unread.
func refused(name string) bool {
	return !strings.HasPrefix(name, "allowed") && name != "multi_one_applies" && name != "shadow_denied"
}

// TestMiddlewareAllOrNothing: a request that the second limit denies takes
// nothing from the first.
func TestMiddlewareAllOrNothing(t *testing.T) {
	store := newStore(t)
	m, err := httplimit.New(httplimit.Options{Store: store, Policies: []httplimit.Policy{
		{Rule: ratelimit.Rule{Name: "user", Quota: 10, Period: time.Second}, Keys: []httplimit.Key{httplimit.ByHeader("X-User")}},
		{Rule: ratelimit.Rule{Name: "endpoint", Quota: 1, Period: time.Hour}, Keys: []httplimit.Key{httplimit.ByRoute(nil)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	codes := make([]int, 0, 3)
	for range 3 {
		req := httptest.NewRequest("GET", "/items/1", nil)
		req.Header.Set("X-User", "u1")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	if want := []int{200, 429, 429}; !slices.Equal(codes, want) {
		t.Fatalf("codes = %v, want %v", codes, want)
	}
	st, ok := store.State("user|u1")
	if !ok {
		t.Fatal("no state for user|u1")
	}
	// One admitted request of cost 1 at 10/s: the TAT is 100 ms ahead.
	if got := time.Duration(st.T - time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC).UnixNano()); got != 100*time.Millisecond {
		t.Errorf("user bucket TAT ahead by %v, want 100ms: denied requests consumed", got)
	}
	if _, ok := store.State("endpoint|GET /items/{id}"); !ok {
		t.Error("the route key is not the ServeMux pattern")
	}
}

func TestMiddlewareRouteOutsideMux(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(http.ResponseWriter, *http.Request) {})
	var keys []string
	m, err := httplimit.New(httplimit.Options{
		Store: newStore(t),
		Policies: []httplimit.Policy{{
			Rule: ratelimit.Rule{Name: "r", Quota: 100, Period: time.Second},
			Keys: []httplimit.Key{httplimit.ByRoute(mux)},
			Cost: httplimit.CostByRoute(mux, map[string]int64{"POST /orders": 7}, 1),
		}},
		OnDecision: func(e *httplimit.Event) { keys = append(keys, fmt.Sprint(e.Keys, e.Decisions[0].Remaining)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(mux)
	for _, target := range []string{"/orders", "/nowhere"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", target, nil))
	}
	if want := []string{"[r|POST /orders] 93"}; !slices.Equal(keys, want) {
		t.Errorf("decisions = %q, want %q (unmatched routes are not limited)", keys, want)
	}
}

func TestNewRejects(t *testing.T) {
	good := httplimit.Policy{Rule: ratelimit.Rule{Name: "a", Quota: 1, Period: time.Second}}
	store := newStore(t)
	tests := []struct {
		name string
		cfg  httplimit.Options
		want string
	}{
		{"no store", httplimit.Options{Policies: []httplimit.Policy{good}}, "Store is nil"},
		{"no limits", httplimit.Options{Store: store}, "Policies is empty"},
		{"duplicate", httplimit.Options{Store: store, Policies: []httplimit.Policy{good, good}}, `two policies are named "a"`},
		{"invalid rule", httplimit.Options{Store: store, Policies: []httplimit.Policy{{Rule: ratelimit.Rule{Name: "x", Quota: 1}}}}, "invalid rule"},
		{"nil append", httplimit.Options{Store: store, Policies: []httplimit.Policy{{Rule: good.Rule, Keys: []httplimit.Key{{Scope: "s"}}}}}, "no Append"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httplimit.New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestByIPTrusted(t *testing.T) {
	var got []string
	m, err := httplimit.New(httplimit.Options{
		Store: newStore(t),
		Policies: []httplimit.Policy{{
			Rule: ratelimit.Rule{Name: "ip", Quota: 100, Period: time.Second},
			Keys: []httplimit.Key{httplimit.ByIP(netip.MustParsePrefix("10.0.0.0/8"))},
		}},
		OnDecision: func(e *httplimit.Event) { got = append(got, e.Keys[0]) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.NotFoundHandler())
	for _, peer := range []string{"10.1.2.3:80", "203.0.113.9:80", "pipe"} {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = peer
		req.Header.Set("X-Forwarded-For", "198.51.100.1, 10.9.9.9")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	want := []string{"ip|198.51.100.1", "ip|203.0.113.9", "ip|unknown"}
	if !slices.Equal(got, want) {
		t.Errorf("keys = %q, want %q", got, want)
	}
}

// TestLongKeysAreHashed: a key longer than the bound is stored as its rule
// name and a SHA-256, whatever its length, and distinct values stay
// distinct.
func TestLongKeysAreHashed(t *testing.T) {
	var keys []string
	m, err := httplimit.New(httplimit.Options{
		Store: newStore(t),
		Policies: []httplimit.Policy{{
			Rule: ratelimit.Rule{Name: "k", Quota: 100, Period: time.Second},
			Keys: []httplimit.Key{httplimit.ByHeader("X-Api-Key")},
		}},
		OnDecision: func(e *httplimit.Event) { keys = append(keys, e.Keys[0]) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.NotFoundHandler())
	for _, v := range []string{"short", strings.Repeat("a", 5000), strings.Repeat("a", 4999) + "b"} {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Api-Key", v)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(keys) != 3 || keys[0] != "k|short" {
		t.Fatalf("keys = %q", keys)
	}
	for _, k := range keys[1:] {
		if len(k) != len("k|#")+64 || !strings.HasPrefix(k, "k|#") {
			t.Errorf("long key stored as %q, want k|# and a hex SHA-256", k)
		}
	}
	if keys[1] == keys[2] {
		t.Error("two long keys collided")
	}
}

// TestProblemEscaping: odd key values and rule names still give valid JSON
// that carries them.
func TestProblemEscaping(t *testing.T) {
	const name, key = "we\"ird</name>", "k\"\\<\x01\xff\u00e9"
	m, err := httplimit.New(httplimit.Options{
		Store: newStore(t),
		Policies: []httplimit.Policy{{
			Rule: ratelimit.Rule{Name: name, Quota: 1, Period: time.Hour},
			Keys: []httplimit.Key{httplimit.KeyFunc("odd", false, func(*http.Request) (string, bool) { return key, true })},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.NotFoundHandler())
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	var p struct {
		Violated []string `json:"violated-policies"`
		Limits   []struct {
			Policy, Scope, Key string
		} `json:"limits"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	wantKey := "k\"\\<\x01\ufffd\u00e9"
	if len(p.Violated) != 1 || p.Violated[0] != name || len(p.Limits) != 1 || p.Limits[0].Key != wantKey || p.Limits[0].Scope != "odd" {
		t.Errorf("problem = %+v, want policy %q and key %q", p, name, wantKey)
	}
}

// TestNewRefusesZeroValues: a policy without a name, with a zero Quota, or
// keyed by ByHeader("") is refused at construction, naming the field.
func TestNewRefusesZeroValues(t *testing.T) {
	store := memstore.New(memstore.Options{})
	rule := ratelimit.Rule{Name: "p", Quota: 10, Period: time.Second}
	for _, tt := range []struct {
		name string
		p    httplimit.Policy
		want string
	}{
		{"no name", httplimit.Policy{Rule: ratelimit.Rule{Quota: 10, Period: time.Second}}, "Policy.Rule.Name is empty"},
		{"no quota", httplimit.Policy{Rule: ratelimit.Rule{Name: "p", Period: time.Second}}, "Quota is 0"},
		{"ByHeader empty", httplimit.Policy{Rule: rule, Keys: []httplimit.Key{httplimit.ByIP(), httplimit.ByHeader("")}}, `Policy.Keys[1]: ByHeader(""): the header name is empty`},
	} {
		if _, err := httplimit.New(httplimit.Options{Store: store, Policies: []httplimit.Policy{tt.p}}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: New = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	if _, err := httplimit.New(httplimit.Options{Store: store, Policies: []httplimit.Policy{{Rule: rule, Keys: []httplimit.Key{httplimit.ByHeader("X-Api-Key")}}}}); err != nil {
		t.Errorf("a valid policy: %v", err)
	}
}
