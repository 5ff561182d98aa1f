package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/reserve"
)

// combinedRules turn on, in one domain, what a user combines: a real
// limit, a shadow-mode one, two quota-mode ones and a per-value metric.
const combinedRules = `domain: mix
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 3, name: per_user}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, name: trial_pool}
  - key: plan
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, name: plan_quota}
  - key: region
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100, name: region_quota}
  - key: job
    rate_limit: {period: 1s, requests_per_unit: 10, burst: 1, name: job_pace}
  - key: model
    detailed_metric: true
    limits:
      - {unit: hour, requests_per_unit: 5, name: model_requests}
      - {unit: hour, requests_per_unit: 100, cost_unit: tokens, name: model_tokens}
`

// TestCombinedBinary drives the built binary with the features a user
// turns on together — shadow mode, quota mode, a per-value metric, top-K,
// --headers, an override set through the admin API, reservations, and
// the coordination API's semaphores and leases — on the memory store, on
// Redis and on a Redis Cluster (a breaker per master), over gRPC, /json
// and /v1/check in turn, against what the decided semantics say: one
// count shared by the three transports, the override applied against
// what was consumed (and to the spacing of reservations), shadow never
// denying, a request over quota allowed while
// a real limit admits it, a semaphore's permit and a lease holder shown by
// the admin status beside the limits.
func TestCombinedBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildSluice(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mix.yaml"), []byte(combinedRules), 0o644); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(longToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stores := map[string]func(t *testing.T) []string{
		"memory": func(*testing.T) []string { return nil },
		"redis": func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-addr", redistest.Standalone(t).Addr()}
		},
		// A Cluster: the descriptors' keys on different masters, each
		// behind a breaker of its own.
		"cluster": func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-addr", strings.Join(redistest.Cluster(t).Addrs(), ",")}
		},
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"serve", "--rules", dir, "--log-format", "json", "--headers",
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
				"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokenFile}, store(t)...)
			p := startSluice(t, bin, nil, args...)
			up := p.next(t, "sluice serving", 20*time.Second)
			testCombined(t, up.str("grpc"), up.str("http"), up.str("admin"))
		})
	}
}

func testCombined(t *testing.T, grpcAddr, httpAddr, adminAddr string) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	do := func(addr, method, path, body string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+longToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	// ask sends one request of the four descriptors user=ann, trial=t1,
	// plan=free, region=eu over the transport of step i (gRPC, /json, /v1/check in
	// turn) and returns the overall answer and the RateLimit field.
	type answer struct {
		over      bool
		rateLimit string
		body      string
	}
	ask := func(i int) answer {
		t.Helper()
		kv := [][2]string{{"user", "ann"}, {"trial", "t1"}, {"plan", "free"}, {"region", "eu"}}
		switch i % 3 {
		case 0:
			var descs []*commonv3.RateLimitDescriptor
			for _, e := range kv {
				descs = append(descs, &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: e[0], Value: e[1]}}})
			}
			var hdr metadata.MD
			resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "mix", Descriptors: descs}, grpc.Header(&hdr))
			if err != nil {
				t.Fatalf("step %d: gRPC: %v", i, err)
			}
			var rl string
			for _, h := range resp.GetResponseHeadersToAdd() {
				if h.GetKey() == "RateLimit" {
					rl = h.GetValue()
				}
			}
			return answer{over: resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT, rateLimit: rl, body: resp.String()}
		default:
			var ds []string
			for _, e := range kv {
				ds = append(ds, fmt.Sprintf(`{"entries":[{"key":%q,"value":%q}]}`, e[0], e[1]))
			}
			path := "/json"
			if i%3 == 2 {
				path = "/v1/check"
			}
			code, h, body := do(httpAddr, "POST", path, `{"domain":"mix","descriptors":[`+strings.Join(ds, ",")+`]}`)
			if code != 200 && code != 429 {
				t.Fatalf("step %d: %s: %d %s", i, path, code, body)
			}
			return answer{over: code == 429, rateLimit: h.Get("RateLimit"), body: body}
		}
	}
	// per_user admits 3 an hour; trial (shadow) would deny from the
	// second; plan (quota mode) is over from the second, but the request
	// stays allowed: region, its other quota descriptor, is not over.
	for i := range 3 {
		a := ask(i)
		if a.over {
			t.Fatalf("step %d: over the limit, want allowed (shadow never denies; one quota descriptor of two over): %s", i, a.body)
		}
		if want := fmt.Sprintf(`"per_user";r=%d;`, 2-i); !strings.Contains(a.rateLimit, want) {
			t.Errorf("step %d: RateLimit %q, want %s…: one count across the transports", i, a.rateLimit, want)
		}
	}
	// An override lifts per_user to 5 against what was consumed (3): two
	// more are admitted, then the real limit denies.
	if code, _, body := do(adminAddr, "PUT", "/admin/v1/overrides/mix/per_user", `{"limit":5,"ttl":"10m","reason":"combined test"}`); code != 200 {
		t.Fatalf("override: %d %s", code, body)
	}
	for i := 3; i < 5; i++ {
		if a := ask(i); a.over || !strings.Contains(a.rateLimit, fmt.Sprintf(`"per_user";r=%d;`, 4-i)) {
			t.Fatalf("step %d with the override: over=%v RateLimit %q: %s", i, a.over, a.rateLimit, a.body)
		}
	}
	if a := ask(5); !a.over {
		t.Fatalf("step 5: allowed past the override's 5: %s", a.body)
	}
	testCombinedReserve(t, do, conn, httpAddr, adminAddr)
	testCombinedSettle(t, do, httpAddr, adminAddr)
	testCombinedCoordination(t, do, httpAddr, adminAddr)
	// Top-K saw the user; the per-value series counts ann; no panic.
	code, _, top := do(adminAddr, "GET", "/admin/v1/top?domain=mix&rule=per_user", "")
	if code != 200 || !strings.Contains(top, "ann") {
		t.Errorf("top of per_user: %d %s", code, top)
	}
	_, _, metrics := do(httpAddr, "GET", "/metrics", "")
	for _, want := range []string{
		`sluice_detailed_decisions_total{domain="mix",key="mix.user_ann",outcome="ok",rule="per_user"} 5`,
		`sluice_detailed_decisions_total{domain="mix",key="mix.user_ann",outcome="over_limit",rule="per_user"} 1`,
		`sluice_decisions_total{domain="mix",outcome="shadow_would_deny",rule="trial_pool"}`,
		`sluice_decisions_total{domain="mix",outcome="quota_exceeded",rule="plan_quota"}`,
		`sluice_decisions_total{domain="mix",outcome="ok",rule="region_quota"}`,
		`sluice_panics_total{listener="grpc"} 0`,
		`sluice_panics_total{listener="http"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		for _, l := range strings.Split(metrics, "\n") {
			if strings.Contains(l, `domain="mix"`) {
				t.Log(l)
			}
		}
	}
}

// doFunc sends a request with the admin token and returns the answer.
type doFunc func(addr, method, path, body string) (int, http.Header, string)

// testCombinedReserve reserves on job_pace (10/s, burst 1) over
// /v1/reserve and gRPC's Reserve in turn, one queue for both: the
// instants the answers tell are one interval apart, 100 ms; an override
// to 2/s spaces them 500 ms apart. Each told instant is
// known to lie between the request's sending and its answer's arrival,
// plus the wait told (rounded up to a millisecond), so the check holds
// however slow the machine.
func testCombinedReserve(t *testing.T, do doFunc, conn *grpc.ClientConn, httpAddr, adminAddr string) {
	t.Helper()
	type told struct{ early, late time.Time }
	calls := 0
	reserveOnce := func() told {
		t.Helper()
		calls++
		sent := time.Now()
		if calls%2 == 0 {
			var out sluicev1.ReserveResponse
			err := conn.Invoke(t.Context(), reserve.ReserveMethod, &sluicev1.ReserveRequest{
				Domain:      "mix",
				Descriptors: []*sluicev1.RateLimitDescriptor{{Entries: []*sluicev1.RateLimitEntry{{Key: "job", Value: "j1"}}}},
				MaxWait:     durationpb.New(10 * time.Second),
			}, &out)
			got := time.Now()
			if err != nil || !out.GetAllowed() {
				t.Fatalf("gRPC Reserve: %v %v", err, &out)
			}
			w := out.GetWait().AsDuration()
			return told{sent.Add(w), got.Add(w)}
		}
		code, _, body := do(httpAddr, "POST", "/v1/reserve", `{"domain":"mix","descriptors":[{"entries":[{"key":"job","value":"j1"}]}],"max_wait_ms":10000}`)
		got := time.Now()
		var r struct {
			Allowed bool  `json:"allowed"`
			WaitMS  int64 `json:"wait_ms"`
		}
		if err := json.Unmarshal([]byte(body), &r); code != 200 || err != nil || !r.Allowed {
			t.Fatalf("reserve: %d %s (%v)", code, body, err)
		}
		w := time.Duration(r.WaitMS) * time.Millisecond // rounded up
		return told{sent.Add(w - time.Millisecond), got.Add(w)}
	}
	spaced := func(what string, interval time.Duration, a, b told) {
		t.Helper()
		if lo, hi := b.early.Sub(a.late), b.late.Sub(a.early); interval < lo || interval > hi {
			t.Errorf("%s: the second reservation told %v–%v after the first, want %v", what, lo, hi, interval)
		}
	}
	a, b := reserveOnce(), reserveOnce()
	spaced("job_pace at 10/s", 100*time.Millisecond, a, b)
	if code, _, body := do(adminAddr, "PUT", "/admin/v1/overrides/mix/job_pace", `{"limit":2,"ttl":"10m","reason":"combined test"}`); code != 200 {
		t.Fatalf("override of job_pace: %d %s", code, body)
	}
	reserveOnce() // the first under the override follows the old interval's queue
	c, d := reserveOnce(), reserveOnce()
	spaced("job_pace overridden to 2/s", 500*time.Millisecond, c, d)
	if code, _, top := do(adminAddr, "GET", "/admin/v1/top?domain=mix&rule=job_pace", ""); code != 200 || !strings.Contains(top, "j1") {
		t.Errorf("top of job_pace after reservations: %d %s", code, top)
	}
}

// testCombinedCoordination takes a semaphore's permit and joins a leased
// service through the HTTP coordination API of the same serve, and finds
// both in the admin status beside the limits; a second acquire is
// refused while the permit is held, and the next grant after its release
// testCombinedSettle: a check of 80 tokens kept with "settle" beside a
// shadow-mode descriptor, settled at 20 tokens alone: 60 come back (the
// request and shadow limits stay at their estimates), so 80 more fit and
// one more does not; an override raising the tokens to 200 applies
// against the 100 consumed; a repeat settlement is already_settled.
func testCombinedSettle(t *testing.T, do doFunc, httpAddr, adminAddr string) {
	check := func(tokens int, extra string) (int, string) {
		t.Helper()
		code, _, body := do(httpAddr, "POST", "/v1/check", fmt.Sprintf(`{"domain":"mix","descriptors":[{"entries":[{"key":"model","value":"m1"}],"costs":{"tokens":%d}}%s]}`, tokens, extra))
		return code, body
	}
	code, _, body := do(httpAddr, "POST", "/v1/check", `{"domain":"mix","descriptors":[{"entries":[{"key":"model","value":"m1"}],"costs":{"tokens":80}},{"entries":[{"key":"trial","value":"t9"}]}],"settle":true}`)
	var kept struct {
		Reservation string `json:"reservation"`
	}
	if err := json.Unmarshal([]byte(body), &kept); err != nil || code != 200 || kept.Reservation == "" {
		t.Fatalf("check with settle: %d %s (%v)", code, body, err)
	}
	if code, body := check(30, ""); code != http.StatusTooManyRequests {
		t.Fatalf("30 tokens past 80 of 100: %d %s", code, body)
	}
	settle := `{"reservation":"` + kept.Reservation + `","costs":{"tokens":20}}`
	if code, _, body := do(httpAddr, "POST", "/v1/settle", settle); code != 200 || !strings.Contains(body, `"refunded": 60`) || !strings.Contains(body, `"limits": 3`) {
		t.Fatalf("settle at 20 tokens: %d %s; want 60 refunded over 3 limits", code, body)
	}
	if code, body := check(80, ""); code != 200 {
		t.Fatalf("80 tokens after 60 came back: %d %s", code, body)
	}
	if code, body := check(1, ""); code != http.StatusTooManyRequests {
		t.Fatalf("a token past 100: %d %s", code, body)
	}
	if code, _, body := do(adminAddr, "PUT", "/admin/v1/overrides/mix/model_tokens", `{"limit":200,"ttl":"10m","reason":"combined test"}`); code != 200 {
		t.Fatalf("override: %d %s", code, body)
	}
	if code, body := check(100, ""); code != 200 {
		t.Fatalf("100 tokens under the override of 200, 100 consumed: %d %s", code, body)
	}
	if code, body := check(1, ""); code != http.StatusTooManyRequests {
		t.Fatalf("a token past the override's 200: %d %s", code, body)
	}
	if code, _, body := do(httpAddr, "POST", "/v1/settle", settle); code != 200 || !strings.Contains(body, `"already_settled": true`) {
		t.Fatalf("repeat: %d %s", code, body)
	}
}

// carries a larger fence.
func testCombinedCoordination(t *testing.T, do doFunc, httpAddr, adminAddr string) {
	t.Helper()
	type grant struct {
		PermitID string `json:"permit_id"`
		Fence    uint64 `json:"fence"`
	}
	acquire := func() (int, grant) {
		t.Helper()
		code, _, body := do(httpAddr, "POST", "/v1/semaphores/acquire", `{"name":"mix-sem","limit":1,"ttl_ms":30000}`)
		var g grant
		if code == 200 {
			if err := json.Unmarshal([]byte(body), &g); err != nil || g.PermitID == "" || g.Fence == 0 {
				t.Fatalf("acquire: %s (%v)", body, err)
			}
		}
		return code, g
	}
	code, g := acquire()
	if code != 200 {
		t.Fatalf("acquire of a free semaphore: %d", code)
	}
	if code, _ := acquire(); code != 409 {
		t.Errorf("second acquire of a limit of 1: %d, want 409", code)
	}
	code, _, body := do(httpAddr, "POST", "/v1/leases/join", `{"service":"mix-svc","capacity":100,"partitions":4,"rate":50}`)
	var joined struct {
		HolderID string  `json:"holder_id"`
		Rate     float64 `json:"rate"`
	}
	if err := json.Unmarshal([]byte(body), &joined); code != 200 || err != nil || joined.HolderID == "" {
		t.Fatalf("join: %d %s (%v)", code, body, err)
	}
	code, _, body = do(adminAddr, "GET", "/admin/v1/status", "")
	var st struct {
		Limits []struct {
			Name string `json:"name"`
		} `json:"limits"`
		Coordination *struct {
			Semaphores []struct {
				Name    string `json:"name"`
				Held    int64  `json:"held"`
				Holders []struct {
					Fence uint64 `json:"fence"`
				} `json:"holders"`
			} `json:"semaphores"`
			Leases []struct {
				Service     string `json:"service"`
				HolderCount int    `json:"holder_count"`
			} `json:"leases"`
		} `json:"coordination"`
	}
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Coordination == nil {
		t.Fatalf("status: %d %s (%v)", code, body, err)
	}
	if strings.Contains(body, g.PermitID) || strings.Contains(body, joined.HolderID) {
		t.Errorf("the status reveals a permit or holder id: %s", body)
	}
	var limits []string
	for _, l := range st.Limits {
		limits = append(limits, l.Name)
	}
	if !slices.Contains(limits, "per_user") {
		t.Errorf("status limits %v, want per_user among them", limits)
	}
	if s := st.Coordination.Semaphores; len(s) != 1 || s[0].Name != "mix-sem" || s[0].Held != 1 || len(s[0].Holders) != 1 || s[0].Holders[0].Fence != g.Fence {
		t.Errorf("status semaphores %+v, want mix-sem held once at fence %d", s, g.Fence)
	}
	if l := st.Coordination.Leases; len(l) != 1 || l[0].Service != "mix-svc" || l[0].HolderCount != 1 {
		t.Errorf("status leases %+v, want mix-svc with one holder", l)
	}
	if code, _, body := do(httpAddr, "POST", "/v1/semaphores/release", fmt.Sprintf(`{"name":"mix-sem","permit_id":%q}`, g.PermitID)); code != 204 {
		t.Errorf("release: %d %s", code, body)
	}
	if code, g2 := acquire(); code != 200 || g2.Fence <= g.Fence {
		t.Errorf("acquire after the release: %d, fence %d after %d", code, g2.Fence, g.Fence)
	}
	if code, _, body := do(httpAddr, "POST", "/v1/leases/leave", fmt.Sprintf(`{"service":"mix-svc","holder_id":%q}`, joined.HolderID)); code != 200 && code != 204 {
		t.Errorf("leave: %d %s", code, body)
	}
}
