package dashboard_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/topk"
)

const token = "t0ken"

func get(t *testing.T, h http.Handler, path, tok string) (*http.Response, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if tok != "" {
		r.Header.Set("Authorization", "bearer "+tok)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Result(), string(b)
}

func status(t *testing.T, h http.Handler) dashboard.Status {
	t.Helper()
	resp, body := get(t, h, "/status.json", token)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status.json: %d %s", resp.StatusCode, body)
	}
	var st dashboard.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestMiddleware: a library user's middleware, mounted with the page: the
// hot and denied keys show, with the token only.
func TestMiddleware(t *testing.T) {
	store := memstore.New(memstore.Options{JanitorInterval: -1})
	defer store.Close()
	tenant := httplimit.KeyFunc("tenant", false, func(r *http.Request) (string, bool) {
		v := r.Header.Get("X-Tenant")
		return v, v != ""
	})
	m, err := httplimit.New(httplimit.Options{
		Store: store,
		Policies: []httplimit.Policy{
			{Rule: ratelimit.Rule{Name: "per-tenant", Quota: 3, Period: time.Minute}, Keys: []httplimit.Key{tenant}},
			{Rule: ratelimit.Rule{Name: "per-api-key", Quota: 100, Period: time.Minute}, Keys: []httplimit.Key{httplimit.ByHeader("X-Api-Key")}},
		},
		Top: &topk.Options{K: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	app := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i, tn := range []string{"acme", "acme", "acme", "acme", "acme", "acme", "globex", "acme"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Tenant", tn)
		r.Header.Set("X-Api-Key", "sk-live-1234")
		w := httptest.NewRecorder()
		app.ServeHTTP(w, r)
		if want := i < 3 || tn == "globex"; (w.Code == http.StatusOK) != want {
			t.Fatalf("request %d (%s): %d", i, tn, w.Code)
		}
	}
	sem := concurrency.NewSemaphore(4)
	if !sem.TryAcquire(3) {
		t.Fatal("TryAcquire(3) of 4 failed")
	}
	d := dashboard.New(dashboard.Options{Token: token, Limits: []dashboard.LimitSource{m}, Semaphores: []dashboard.Semaphore{{Name: "workers", Semaphore: sem}}})

	st := status(t, d)
	if len(st.Limits) != 2 {
		t.Fatalf("%d limits, want 2: %+v", len(st.Limits), st.Limits)
	}
	pt := st.Limits[0]
	if pt.Name != "per-tenant" || pt.Limit != 3 || pt.Window != "1m0s" || pt.Decisions != 8 || pt.Denied != 4 {
		t.Errorf("per-tenant: %+v", pt)
	}
	if len(pt.Hot) != 2 || !strings.Contains(pt.Hot[0].Key, "acme") || pt.Hot[0].Count != 7 || pt.Hot[0].Err != 0 {
		t.Errorf("hot = %+v, want acme (7) first", pt.Hot)
	}
	if len(pt.MostDenied) != 1 || !strings.Contains(pt.MostDenied[0].Key, "acme") || pt.MostDenied[0].Denied != 4 {
		t.Errorf("most denied = %+v, want acme (4)", pt.MostDenied)
	}
	if len(pt.Near) == 0 || !strings.Contains(pt.Near[0].Key, "acme") || pt.Near[0].Used != 1 {
		t.Errorf("near = %+v, want acme at 100%%", pt.Near)
	}
	// ByHeader is a secret key: the API key is hashed.
	ak := st.Limits[1]
	if len(ak.Hot) != 1 || strings.Contains(ak.Hot[0].Key, "sk-live") || !strings.HasPrefix(ak.Hot[0].Key, "#") {
		t.Errorf("per-api-key hot = %+v, want one hashed key", ak.Hot)
	}
	if len(st.Semaphores) != 1 || st.Semaphores[0] != (dashboard.SemaphoreStatus{Name: "workers", Limit: 4, Held: 3}) {
		t.Errorf("semaphores = %+v", st.Semaphores)
	}

	for _, tok := range []string{"", "wrong"} {
		if resp, body := get(t, d, "/status.json", tok); resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "acme") {
			t.Errorf("token %q: %d %q, want 401 and no data", tok, resp.StatusCode, body)
		}
	}
	for _, p := range []string{"/", "/dash.js", "/dash.css"} {
		resp, body := get(t, d, p, "")
		if resp.StatusCode != http.StatusOK || strings.Contains(body, "acme") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("%s: %d, CSP %q", p, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
	}
	if resp, _ := get(t, d, "/status.json?k=0", token); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("k=0: %d, want 400", resp.StatusCode)
	}
	if st := decodeK(t, d, "1"); len(st.Limits[0].Hot) != 1 {
		t.Errorf("k=1: %d hot keys", len(st.Limits[0].Hot))
	}
	if resp, _ := get(t, d, "/nothing", token); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/nothing: %d", resp.StatusCode)
	}
}

func decodeK(t *testing.T, h http.Handler, k string) dashboard.Status {
	t.Helper()
	_, body := get(t, h, "/status.json?k="+k, token)
	var st dashboard.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err, body)
	}
	return st
}

// TestLeases: two holders of one service, through a LeaseWatch: each shows
// its grant, and every member with what it has and wants.
func TestLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := dashboard.WatchLeases(lease.NewMemoryStore())
		var ls []dashboard.Lease
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{}, 2)
		for _, id := range []string{"a", "b"} {
			h, err := lease.NewHolder(w, lease.Options{ID: id, Capacity: 100, Partitions: 10, TTL: 3 * time.Second, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			h.SetBacklog(1000) // both want everything
			go func() { _ = h.Run(ctx); done <- struct{}{} }()
			ls = append(ls, dashboard.Lease{Name: "billing", Holder: h, Watch: w})
		}
		time.Sleep(10 * time.Second) // fake time: rounds of heartbeats
		synctest.Wait()
		d := dashboard.New(dashboard.Options{Leases: ls})
		st := d.Status(t.Context(), 0)
		if len(st.Leases) != 2 {
			t.Fatalf("%d leases", len(st.Leases))
		}
		has := 0
		for _, l := range st.Leases {
			if l.Capacity != 100 || l.Partitions != 10 || l.Granted <= 0 || l.Leases == 0 || len(l.Members) != 2 {
				t.Errorf("lease %+v", l)
			}
			if l.Want < l.Need {
				t.Errorf("%s wants %d < needs %d", l.Member, l.Want, l.Need)
			}
		}
		for _, m := range st.Leases[0].Members {
			has += m.Has
			if m.Has > 0 && m.ExpiresInMS <= 0 {
				t.Errorf("member %+v has leases and no expiry", m)
			}
		}
		if has == 0 || has > 10 {
			t.Errorf("members have %d partitions of 10", has)
		}
		cancel()
		<-done
		<-done
		if _, _, ok := w.View("a"); ok {
			t.Error("a's view kept after it left")
		}
	})
}

func FuzzParseK(f *testing.F) {
	for _, s := range []string{"", "1", "20", "1000", "1001", "0", "-1", "x", "99999999999999999999", " 5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := dashboard.ParseK(s)
		if err != nil {
			if k != 0 {
				t.Errorf("ParseK(%q) = %d with an error", s, k)
			}
			return
		}
		if s == "" && k != 0 || s != "" && (k < 1 || k > dashboard.MaxK) {
			t.Errorf("ParseK(%q) = %d", s, k)
		}
	})
}

// TestCoordination: what Options.Coordination reports is in status.json
// (semaphores and leased services), a holder's unknown time held left out, and no coordination at all
// without it.
func TestCoordination(t *testing.T) {
	held := int64(1234)
	d := dashboard.New(dashboard.Options{Token: token, Coordination: func(context.Context) *dashboard.CoordinationStatus {
		return &dashboard.CoordinationStatus{Semaphores: []dashboard.HeldSemaphore{{
			Name: "api", Limit: 2, Held: 2, Waiting: 3, Queued: -1,
			Holders: []dashboard.SemaphoreHolder{{Fence: 17, Weight: 1, HeldForMS: &held, ExpiresInMS: 8766}, {Fence: 18, Weight: 1, ExpiresInMS: 9000}},
		}}, Leases: []dashboard.LeasedService{{
			Service: "db", Capacity: 100, Partitions: 4, HolderCount: 3,
			Holders: []dashboard.RemoteHolder{{Member: "remote-0123456789abcdef", Weight: 1, JoinedForMS: 5000, Rate: 50, DemandRate: 40, Backlog: 7, Leases: 2, ValidForMS: 2900, HeartbeatAgoMS: 100}},
		}}}
	}})
	resp, body := get(t, d, "/status.json", token)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status.json: %d %s", resp.StatusCode, body)
	}
	for _, want := range []string{
		`"coordination":{"semaphores":[{"name":"api","limit":2,"holders":[{"fence":17,"weight":1,"held_for_ms":1234,"expires_in_ms":8766},{"fence":18,"weight":1,"expires_in_ms":9000}],"held":2,"waiting":3,"queued":-1}],` +
			`"leases":[{"service":"db","capacity":100,"partitions":4,"holder_count":3,"holders":[{"member":"remote-0123456789abcdef","weight":1,"joined_for_ms":5000,` +
			`"rate":50,"demand_rate":40,"backlog":7,"leases":2,"valid_for_ms":2900,"heartbeat_ago_ms":100}]}]}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("status.json = %s\nwant it to contain %s", body, want)
		}
	}
	if _, body := get(t, dashboard.New(dashboard.Options{Token: token}), "/status.json", token); strings.Contains(body, "coordination") {
		t.Errorf("status.json without Options.Coordination = %s, want no coordination", body)
	}
}
