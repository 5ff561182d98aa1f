package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/internal/redistest"
)

// dashRules are the rules of the dashboard's tests: a low per-user limit
// that the load makes hot and denied, and a high per-tenant one.
const dashRules = `domain: dash
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_user}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100000, name: per_tenant}
`

const dashToken = "dash-token"

// startDashServe serves dashRules in process with the admin API and the
// top-K trackers on, and returns where it listens.
func startDashServe(t *testing.T) map[string]string {
	t.Helper()
	dir := rulesDir(t, map[string]string{"dash.yaml": dashRules})
	up, _, _ := serveInProcess(t, serveConfig{
		rulesDir: dir, store: "memory", memoryMaxKeys: 1 << 16,
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", adminAddr: "127.0.0.1:0", adminToken: dashToken,
		maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second, top: topConfig{k: 20},
	})
	return up
}

var dashClient = &http.Client{Timeout: 10 * time.Second}

// dashCheck decides one descriptor entry and returns the status code.
func dashCheck(t *testing.T, up map[string]string, key, value string) int {
	t.Helper()
	body := fmt.Sprintf(`{"domain":"dash","descriptors":[{"entries":[{"key":%q,"value":%q}]}]}`, key, value)
	resp, err := dashClient.Post("http://"+up["http"]+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// dashLoad makes hot-user hot and denied (12 calls, 5 admitted), warm-user
// warm, and 20 users seen once.
func dashLoad(t *testing.T, up map[string]string) {
	t.Helper()
	denied := 0
	for range 12 {
		if dashCheck(t, up, "user", "hot-user") == http.StatusTooManyRequests {
			denied++
		}
	}
	if denied != 7 {
		t.Fatalf("hot-user: %d of 12 denied, want 7", denied)
	}
	for range 3 {
		dashCheck(t, up, "user", "warm-user")
	}
	for i := range 20 {
		dashCheck(t, up, "user", fmt.Sprint("once-", i))
	}
}

// holdSemaphore holds semaphore "dash-api" (limit 1) through serve's
// coordination API, with one more acquire waiting on it, and returns the
// holder's fence and permit id once serve counts the waiter. The waiter
// goes away when the test ends, or after 9 s (409).
func holdSemaphore(t *testing.T, up map[string]string) (fence uint64, permit string) {
	t.Helper()
	post := func(ctx context.Context, op, body string) (int, map[string]any, error) {
		return dashPost(ctx, up, "/v1/semaphores/"+op, body)
	}
	code, g, err := post(t.Context(), "acquire", `{"name":"dash-api","limit":1,"ttl_ms":60000}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("acquire: %d %v %v", code, g, err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	var waiter sync.WaitGroup
	waiter.Go(func() {
		code, m, err := post(wctx, "acquire", `{"name":"dash-api","limit":1,"wait_ms":9000}`)
		if wctx.Err() == nil && code != http.StatusConflict { // its wait over, in a long test
			t.Errorf("the waiter was answered other than 409 while the test ran: %d %v %v", code, m, err)
		}
	})
	t.Cleanup(func() { cancel(); waiter.Wait() })
	// Until serve counts the waiter: each round a round trip, within the
	// waiter's wait.
	deadline := time.Now().Add(8 * time.Second)
	for {
		code, h, err := post(t.Context(), "holders", `{"name":"dash-api"}`)
		if err != nil || code != http.StatusOK {
			t.Fatalf("holders: %d %v %v", code, h, err)
		}
		if h["waiting"] == 1.0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve does not count the waiter: %v", h)
		}
	}
	return uint64(g["fence"].(float64)), g["permit_id"].(string)
}

// dashPost posts body to serve's HTTP API at path and decodes the JSON
// answer.
func dashPost(ctx context.Context, up map[string]string, path, body string) (int, map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+up["http"]+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	resp, err := dashClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	err = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m, err
}

// The leased service joinLease holds, and the demand it states.
const (
	dashLeased     = "dash-leased"
	dashLeasedRate = 25
	dashLeasedLog  = 3
)

// joinLease makes a remote holder of dashLeased (capacity 100 in 4
// partitions, TTL 60 s) through serve's coordination API over HTTP,
// states its demand (25 a second, a backlog of 3), and returns its holder
// id and the rate granted once an answer grants one (each round a long
// poll of at most 2 s; its backlog asks for every partition).
func joinLease(t *testing.T, up map[string]string) (id string, rate float64) {
	t.Helper()
	code, g, err := dashPost(t.Context(), up, "/v1/leases/join", fmt.Sprintf(`{"service":%q,"capacity":100,"partitions":4,"ttl_ms":60000}`, dashLeased))
	if err != nil || code != http.StatusOK {
		t.Fatalf("join: %d %v %v", code, g, err)
	}
	id = g["holder_id"].(string)
	code, g, err = dashPost(t.Context(), up, "/v1/leases/demand", fmt.Sprintf(`{"service":%q,"holder_id":%q,"rate":%d,"backlog":%d}`, dashLeased, id, dashLeasedRate, dashLeasedLog))
	if err != nil || code != http.StatusOK {
		t.Fatalf("demand: %d %v %v", code, g, err)
	}
	for range 10 {
		if r, _ := g["rate"].(float64); r > 0 {
			return id, r
		}
		code, g, err = dashPost(t.Context(), up, "/v1/leases/watch", fmt.Sprintf(`{"service":%q,"holder_id":%q,"version":%v,"wait_ms":2000}`, dashLeased, id, g["version"]))
		if err != nil || code != http.StatusOK {
			t.Fatalf("watch: %d %v %v", code, g, err)
		}
	}
	t.Fatalf("no rate granted to the holder within 10 polls: %v", g)
	return "", 0
}

// admin calls the admin API with the token.
func admin(t *testing.T, up map[string]string, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+up["admin"]+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+dashToken)
	resp, err := dashClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminTop: GET /admin/v1/top names the hot and denied keys, with
// their error bounds, and refuses what it cannot answer.
func TestAdminTop(t *testing.T) {
	up := startDashServe(t)
	dashLoad(t, up)
	fence, _ := holdSemaphore(t, up)
	holderID, rate := joinLease(t, up)
	// The status (the dashboard's) shows the semaphore held through the
	// coordination API, with its holder and its waiter, and the leased
	// service with its remote holder (by member id, not holder id).
	code, body := admin(t, up, "GET", "/admin/v1/status", "")
	var st struct {
		Coordination struct {
			Leases []struct {
				Service     string
				Capacity    float64
				Partitions  int
				HolderCount int `json:"holder_count"`
				Holders     []struct {
					Member         string
					Weight         float64
					JoinedForMS    int64 `json:"joined_for_ms"`
					Rate           float64
					DemandRate     float64 `json:"demand_rate"`
					Backlog        int64
					Leases         int
					ValidForMS     int64 `json:"valid_for_ms"`
					HeartbeatAgoMS int64 `json:"heartbeat_ago_ms"`
				}
			}
			Semaphores []struct {
				Name            string
				Limit, Held     int64
				Waiting, Queued int
				Error           string
				Holders         []struct {
					Fence       uint64
					Weight      int64
					HeldForMS   *int64 `json:"held_for_ms"`
					ExpiresInMS int64  `json:"expires_in_ms"`
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
		t.Fatalf("status: %d %v %s", code, err, body)
	}
	if sems := st.Coordination.Semaphores; len(sems) != 1 || sems[0].Name != "dash-api" || sems[0].Limit != 1 || sems[0].Held != 1 || sems[0].Waiting != 1 || sems[0].Queued != 0 ||
		len(sems[0].Holders) != 1 || sems[0].Holders[0].Fence != fence || sems[0].Holders[0].Weight != 1 || sems[0].Holders[0].HeldForMS == nil ||
		sems[0].Holders[0].ExpiresInMS <= 0 || sems[0].Holders[0].ExpiresInMS > 60000 {
		t.Errorf("status's coordination = %+v, want dash-api held once (fence %d) and waited on once", st.Coordination, fence)
	}
	if ls := st.Coordination.Leases; len(ls) != 1 || ls[0].Service != dashLeased || ls[0].Capacity != 100 || ls[0].Partitions != 4 || ls[0].HolderCount != 1 || len(ls[0].Holders) != 1 {
		t.Errorf("status's leases = %+v, want %s with one holder", ls, dashLeased)
	} else if h := ls[0].Holders[0]; !strings.HasPrefix(h.Member, "remote-") || h.Weight != 1 || h.JoinedForMS < 0 || h.Rate != rate || h.DemandRate != dashLeasedRate ||
		h.Backlog != dashLeasedLog || h.Leases != 4 || h.ValidForMS <= 0 || h.ValidForMS > 60000 || h.HeartbeatAgoMS < 0 || h.HeartbeatAgoMS > h.JoinedForMS {
		t.Errorf("status's lease holder = %+v, want its demand (%d/s, %d), rate %v on 4 leases", h, dashLeasedRate, dashLeasedLog, rate)
	}
	if strings.Contains(body, holderID) {
		t.Errorf("the status shows the holder id %s", holderID)
	}
	code, body = admin(t, up, "GET", "/admin/v1/top?domain=dash&rule=per_user&k=3", "")
	if code != http.StatusOK {
		t.Fatalf("top: %d %s", code, body)
	}
	var l struct {
		Decisions, Denied int64
		Hot               []struct {
			Key        string
			Count, Err int64
		}
		DeniedKeys []struct {
			Key    string
			Denied int64
		} `json:"denied_keys"`
		Near []struct {
			Key  string
			Used float64
		}
	}
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatal(err)
	}
	if l.Decisions != 35 || l.Denied != 7 || len(l.Hot) != 3 || l.Hot[0].Key != "user:hot-user" || l.Hot[0].Count != 12 || l.Hot[0].Err != 0 || l.Hot[1].Key != "user:warm-user" {
		t.Errorf("top = %s", body)
	}
	if len(l.DeniedKeys) != 1 || l.DeniedKeys[0].Key != "user:hot-user" || l.DeniedKeys[0].Denied != 7 {
		t.Errorf("denied keys = %+v", l.DeniedKeys)
	}
	if len(l.Near) == 0 || l.Near[0].Key != "user:hot-user" || l.Near[0].Used != 1 {
		t.Errorf("near = %+v", l.Near)
	}
	for path, want := range map[string]int{
		"/admin/v1/top?domain=dash&rule=nope":             http.StatusNotFound,
		"/admin/v1/top?domain=dash&rule=per_user&k=0":     http.StatusBadRequest,
		"/admin/v1/top?domain=dash&rule=per_user&k=12345": http.StatusBadRequest,
		"/admin/v1/status?k=x":                            http.StatusBadRequest,
	} {
		if code, body := admin(t, up, "GET", path, ""); code != want {
			t.Errorf("%s: %d %s, want %d", path, code, body, want)
		}
	}
	resp, err := dashClient.Get("http://" + up["admin"] + "/admin/v1/top?domain=dash&rule=per_user")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("top without the token: %d", resp.StatusCode)
	}
}

// TestTopOnce: sluice top -once against a running server prints the hot
// and denied keys.
func TestTopOnce(t *testing.T) {
	up := startDashServe(t)
	dashLoad(t, up)
	fence, _ := holdSemaphore(t, up)
	holderID, rate := joinLease(t, up)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(dashToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runArgs(t, t.Context(), "top", "-addr", up["admin"], "-token-file", tokenFile, "-once", "-k", "3")
	if err != nil {
		t.Fatalf("top: %v\n%s", err, errOut)
	}
	t.Logf("sluice top -once:\n%s", out)
	for _, want := range []string{"dash / per_user", "35 decisions, 7 denied", "user:hot-user", "user:warm-user", "100%", "store memory healthy", "1 of 2 rules decided nothing yet"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	hot := regexp.MustCompile(`(?m)^  user:hot-user +12 +0 +user:hot-user +7 +0 +user:hot-user +100%`)
	if !hot.MatchString(out) {
		t.Errorf("no row with hot-user's 12 decisions, 7 denials and 100%% used")
	}
	// The semaphore held through serve: limit 1, 1 held, 1 waiting, none
	// queued, its holder's fence and weight, time held and time left.
	sem := regexp.MustCompile(fmt.Sprintf(`(?m)^  dash-api +1 +1 +1 +0 +%d +1 +[0-9.]+m?s +[0-9.]+s +$`, fence))
	if !strings.Contains(out, "semaphores held through the coordination API") || !sem.MatchString(out) {
		t.Errorf("no row of dash-api with its holder (fence %d) and its waiter", fence)
	}
	// The leased service: capacity 100 in 4 partitions, 1 holder, by its
	// member id, weight 1, joined ago, its rate, its stated demand, 4
	// leases, their validity and its last heartbeat.
	leased := regexp.MustCompile(fmt.Sprintf(`(?m)^  %s +100 +4 +1 +remote-[0-9a-f]{16} +1 +[0-9.]+m?s ago +%v/s +%d/s +%d +4 +[0-9.]+m?s +[0-9.]+[mµn]?s ago +$`,
		dashLeased, rate, dashLeasedRate, dashLeasedLog))
	if !strings.Contains(out, "leases held through the coordination API") || !leased.MatchString(out) {
		t.Errorf("no row of %s with its remote holder", dashLeased)
	}
	if strings.Contains(out, holderID) {
		t.Errorf("top shows the holder id %s", holderID)
	}
	if _, errOut, err := runArgs(t, t.Context(), "top", "-addr", up["admin"], "-once"); err == nil || !strings.Contains(err.Error()+errOut, "401") {
		t.Errorf("top without a token: %v %s, want a 401", err, errOut)
	}
}

// frames counts the screens sluice top writes and ends it after two.
type frames struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	n      int
	cancel context.CancelFunc
}

func (f *frames) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.buf.Write(p)
	if f.n++; f.n == 2 {
		f.cancel()
	}
	return len(p), nil
}

// TestTopRefreshes: without -once, sluice top redraws the screen and
// shows rates from the second reading on.
func TestTopRefreshes(t *testing.T) {
	up := startDashServe(t)
	dashLoad(t, up)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	f := &frames{cancel: cancel}
	t.Setenv(adminTokenEnv, dashToken)
	if err := runTop(ctx, []string{"-addr", up["admin"], "-interval", "200ms"}, f, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := f.buf.String()
	if strings.Count(out, "\x1b[H\x1b[2J") != 2 || !strings.Contains(out, "denied/s") || !strings.Contains(out, "user:hot-user") {
		t.Errorf("two frames with rates and hot-user wanted:\n%s", out)
	}
}

func FuzzDecodeStatus(f *testing.F) {
	f.Add([]byte(`{"title":"x","limits":[{"domain":"d","name":"r","decisions":3,"hot":[{"key":"k","count":3}],"near":[{"key":"k","used":0.5,"whole_in_ns":1000}]}]}`))
	f.Add([]byte(`{"store":{"kind":"redis","healthy":false,"error":"down"}}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"coordination":{"semaphores":[],"leases":[{"service":"s","capacity":1.5,"partitions":2,"holder_count":-3,"holders":[{"member":"m","valid_for_ms":-1}]},{"service":"t"}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeStatus(bytes.NewReader(b))
		if err != nil {
			return
		}
		var out bytes.Buffer
		renderTop(&out, st, st) // never panics, whatever the server says
	})
}

// TestTopLeasesRows: sluice top's leases table writes a service's cells
// on its first holder's line only, says how many holders it does not
// list, and writes a dash for a service listed without holders.
func TestTopLeasesRows(t *testing.T) {
	var out bytes.Buffer
	renderCoordination(&out, &dashboard.CoordinationStatus{Leases: []dashboard.LeasedService{
		{Service: "db", Capacity: 100, Partitions: 4, HolderCount: 4, Holders: []dashboard.RemoteHolder{
			{Member: "remote-aa", Weight: 2, JoinedForMS: 61000, Rate: 33.333, DemandRate: 40, Backlog: 7, Leases: 1, ValidForMS: 2500, HeartbeatAgoMS: 120},
			{Member: "remote-bb", Weight: 1, JoinedForMS: 1500, Rate: 66.667, Leases: 3, ValidForMS: 2900, HeartbeatAgoMS: 5},
		}},
		{Service: "idle", Capacity: 10, Partitions: 1},
	}})
	t.Logf("\n%s", out.String())
	for _, re := range []string{
		`(?m)^  db +100 +4 +4 +remote-aa +2 +1m1s ago +33\.3/s +40/s +7 +1 +2\.5s +120ms ago +$`,
		`(?m)^ +remote-bb +1 +1\.5s ago +66\.7/s +0/s +0 +3 +2\.9s +5ms ago +$`,
		`(?m)^ +\(2 more\) +$`,
		`(?m)^  idle +10 +1 +0 +- +$`,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("no line matches %s", re)
		}
	}
	if strings.Contains(out.String(), "semaphores held") {
		t.Errorf("a semaphores table without semaphores")
	}
}

// chromium returns the browser the test drives: Debian's chromium, which
// .ci/run installs. Without it the test skips, except under CI=true.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed; .ci/run installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed")
	return ""
}

// dashBrowser starts headless Chromium for the test and returns its tab,
// a function that waits (up to 30 s) for a JavaScript expression to be
// true, and one that returns the text of a CSS selector.
func dashBrowser(t *testing.T, browser string) (context.Context, func(what, expr string), func(sel string) string) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1600))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancel(); cancelTab(); cancelAlloc() })
	poll := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("%s (%s): %v", what, expr, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	return ctx, poll, text
}

// TestDashboardStaleToken: a page opened with a stale token stops polling
// after the refusal and says why and how to go on; the right token is
// then accepted 10 times out of 10 from the same address, even once the
// address's failures have spent its budget, and entered in the page makes
// it live. (The issue: the page polled on after 401 and 429, and the right
// token then got 429 on 8 of 10 tries.)
func TestDashboardStaleToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	browser := chromium(t)
	up := startDashServe(t)
	ctx, poll, text := dashBrowser(t, browser)
	page := "http://" + up["admin"] + "/admin/dashboard/"
	// refused counts the admin API's refused authentications, at the
	// server: the stale page's requests for status.json.
	refused := func() float64 {
		t.Helper()
		n := 0.0
		for name, mf := range scrape(t, "http://"+up["http"]+"/metrics") {
			if name == "sluice_admin_auth_failures_total" || name == "sluice_admin_auth_refused_total" {
				n += mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return n
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(page+"#token=stale-token")); err != nil {
		t.Fatal(err)
	}
	poll("the page says the token was refused", `document.getElementById("state").textContent.includes("stopped: the token was refused (401)")`)
	if s := text("#state"); !strings.Contains(s, "Enter the right token") || !strings.Contains(s, "reload") {
		t.Errorf("the message does not say how to go on: %q", s)
	}
	if n := refused(); n != 1 {
		t.Fatalf("%v refused requests after the first refusal, want 1", n)
	}
	// Three poll intervals (the page polls every second): a page that
	// polled on would be refused twice more at least.
	<-time.After(3500 * time.Millisecond)
	if n := refused(); n != 1 {
		t.Errorf("the page polled on after the refusal: %v refused requests, want 1", n)
	}

	// Spend the rest of the address's budget (the page and this client
	// share 127.0.0.1), then the right token: 10 of 10.
	status := func(tok string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", page+"status.json", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := dashClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 5 {
		status("stale-token")
	}
	if code := status("stale-token"); code != http.StatusTooManyRequests {
		t.Fatalf("a stale token past the budget: %d, want 429", code)
	}
	ok := 0
	for range 10 {
		if status(dashToken) == http.StatusOK {
			ok++
		}
	}
	if ok != 10 {
		t.Errorf("the right token from the same address: %d of 10 accepted, want 10", ok)
	}

	// The stale token again, now past the budget: the page names the 429.
	if err := chromedp.Do(ctx, chromedp.Navigate(page+"#token=stale-again")); err != nil {
		t.Fatal(err)
	}
	poll("the page names the 429", `document.getElementById("state").textContent.includes("too many failed authentications from this address (429, retry after")`)
	before := refused()

	// The right token, entered in the page.
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token"), dashToken)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`))); err != nil {
		t.Fatal(err)
	}
	poll("the page is live with the right token", `document.getElementById("state").textContent.startsWith("live") && document.querySelector("#rules tbody tr") !== null`)
	if n := refused(); n != before {
		t.Errorf("the right token was refused in the page: %v refusals, want %v", n, before)
	}
}

// TestDashboardInBrowser loads the dashboard in headless Chromium against
// a running serve under a small load: without the token it shows no data;
// with it, the rules (with an override set through the admin API), a live
// chart and the top tables with the keys the load made hot and denied.
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	browser := chromium(t)
	up := startDashServe(t)
	dashLoad(t, up)
	if code, body := admin(t, up, "PUT", "/admin/v1/overrides/dash/per_tenant", `{"limit":777,"ttl":"10m","reason":"incident 42"}`); code != http.StatusOK {
		t.Fatalf("override: %d %s", code, body)
	}
	// A small load while the page is open: hot-user and a tenant, 20
	// decisions a second, until the test ends.
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var loadDone sync.WaitGroup
	loadDone.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
				dashCheck(t, up, "user", "hot-user")
				dashCheck(t, up, "tenant", "acme")
			}
		}
	})
	t.Cleanup(func() { stopLoad(); loadDone.Wait() })

	fence, permit := holdSemaphore(t, up)
	holderID, _ := joinLease(t, up)
	ctx, poll, text := dashBrowser(t, browser)
	page := "http://" + up["admin"] + "/admin/dashboard/"

	// Without the token: the page loads, and shows nothing.
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	poll("the page asks for the token", `document.getElementById("state").textContent.includes("no data")`)
	if body := text("body"); strings.Contains(body, "hot-user") || strings.Contains(body, "per_user") || strings.Contains(body, "incident 42") || strings.Contains(body, "dash-api") || strings.Contains(body, dashLeased) {
		t.Errorf("without the token the page shows data:\n%s", body)
	}

	// With the token, in the URL's fragment.
	if err := chromedp.Do(ctx, chromedp.Navigate(page+"#token="+dashToken)); err != nil {
		t.Fatal(err)
	}
	poll("the semaphore held through the coordination API", fmt.Sprintf(`document.querySelector('#coord-semaphores tr[data-fence="%d"]') !== null`, fence))
	if sems := text("#coord-semaphores"); !strings.Contains(sems, "dash-api") || !strings.Contains(sems, "expires in") {
		t.Errorf("coordination table: %q", sems)
	}
	poll("the leased service's remote holder", `document.querySelector('#coord-leases tr[data-member^="remote-"]') !== null`)
	if ls := text("#coord-leases"); !strings.Contains(ls, dashLeased) || !strings.Contains(ls, fmt.Sprintf("%d/s", dashLeasedRate)) || !strings.Contains(ls, "heartbeat") {
		t.Errorf("leases table: %q", ls)
	}
	html, err := chromedp.Run(ctx, chromedp.OuterHTML("html"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(html, holderID) || !strings.Contains(html, dashLeased) {
		t.Errorf("the page shows the holder id %s, or not the leased service", holderID)
	}
	poll("the chart has samples with decisions", `Number(document.getElementById("chart").dataset.samples) >= 4 && Number(document.getElementById("chart").dataset.max) > 0`)
	poll("the top tables", `document.querySelector('[data-limit="dash / per_user"]') !== null`)
	perUser := text(`[data-limit="dash / per_user"]`)
	for _, want := range []string{"hottest", "most denied", "nearest the limit", "user:hot-user", "user:warm-user", "100%"} {
		if !strings.Contains(perUser, want) {
			t.Errorf("per_user's tables lack %q:\n%s", want, perUser)
		}
	}
	rulesText := text("#rules")
	for _, want := range []string{"per_user", "per_tenant", "777 for", "incident 42", "dash.yaml:"} {
		if !strings.Contains(rulesText, want) {
			t.Errorf("rules table lacks %q:\n%s", want, rulesText)
		}
	}
	if s := text("#store"); !strings.Contains(s, "memory") || !strings.Contains(s, "healthy") {
		t.Errorf("store section: %q", s)
	}
	if legend := text("#legend"); !strings.Contains(legend, "dash / per_user") {
		t.Errorf("chart legend: %q", legend)
	}
	picture := os.Getenv("SLUICE_DASHBOARD_PNG") // refreshes the README's picture
	if picture != "" {
		// A minute of varied load first, so that the chart has a shape,
		// the semaphore's permit renewed and the lease holder's demand
		// stated every second, so that they stay in the picture.
		for i := range 60 {
			if code, m, err := dashPost(t.Context(), up, "/v1/semaphores/renew", fmt.Sprintf(`{"name":"dash-api","permit_id":%q,"ttl_ms":60000}`, permit)); err != nil || code != http.StatusOK {
				t.Fatalf("renew: %d %v %v", code, m, err)
			}
			if code, m, err := dashPost(t.Context(), up, "/v1/leases/demand", fmt.Sprintf(`{"service":%q,"holder_id":%q,"rate":%d,"backlog":%d}`, dashLeased, holderID, dashLeasedRate, dashLeasedLog)); err != nil || code != http.StatusOK {
				t.Fatalf("demand: %d %v %v", code, m, err)
			}
			for j := range 5 + (i%20)*2 {
				dashCheck(t, up, "user", fmt.Sprint("burst-", i/10, "-", j%3))
			}
			<-time.After(time.Second)
		}
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(t.TempDir(), "dashboard.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	if picture != "" {
		if err := os.WriteFile(picture, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Forgetting the token empties the page.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#forget"))); err != nil {
		t.Fatal(err)
	}
	poll("the page forgets", `document.getElementById("state").textContent.includes("no data") && document.querySelectorAll("#limits .limit").length === 0`)
	if body := text("body"); strings.Contains(body, "hot-user") {
		t.Errorf("after Forget the page still shows data")
	}
}

// metricNames scrapes a running serve's /metrics and returns the names a
// query may use: each family's, and a histogram's _bucket, _sum and _count.
func metricNames(t *testing.T, up map[string]string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for name, f := range scrape(t, "http://"+up["http"]+"/metrics") {
		names[name] = true
		if f.GetType().String() == "HISTOGRAM" || f.GetType().String() == "SUMMARY" {
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		}
	}
	return names
}

// scrape reads the metric families at url.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := dashClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// drainMetrics starts sluice drain with leased capacity (100/s on a
// redis-server of the test's, an embedded NATS server on a temporary
// directory) and -metrics-addr, and returns what its /metrics serves.
func drainMetrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	rs := redistest.Standalone(t)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer sink.Close()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runDrainWith(ctx, []string{"-data", t.TempDir(), "-url", sink.URL, "-lease-redis", rs.Addr(),
			"-capacity", "100/s", "-partitions", "10", "-lease-service", "deploy-test", "-follow", "-metrics-addr", "127.0.0.1:0"}, pw, nil)
		pw.Close()
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("drain: %v", err)
		}
	}()
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg="drain: metrics" addr=(\S+)`)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		close(addr)
	}()
	a, ok := <-addr
	if !ok {
		t.Fatal("sluice drain logged no metrics address")
	}
	fams := scrape(t, "http://"+a+"/metrics")
	go func() {
		for range addr {
		}
	}()
	return fams
}

// selectors returns the metric names an expression selects.
func selectors(t *testing.T, p parser.Parser, expr string) []string {
	t.Helper()
	e, err := p.ParseExpr(expr)
	if err != nil {
		t.Errorf("%q does not parse: %v", expr, err)
		return nil
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				t.Errorf("%q selects by labels only; name the metric", expr)
			}
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

// grafanaExprs returns every query of a Grafana dashboard: the panels'
// (rows' too) and the template variables', with Grafana's interval
// variables replaced by a duration so that they parse.
func grafanaExprs(t *testing.T, b []byte) []string {
	t.Helper()
	type panel struct {
		Targets []struct{ Expr string }
		Panels  []json.RawMessage
	}
	var d struct {
		Panels     []json.RawMessage
		Templating struct {
			List []struct{ Type, Query string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")
	var out []string
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			for _, tg := range p.Targets {
				out = append(out, vars.Replace(tg.Expr))
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Query)
		if m == nil {
			t.Errorf("template variable query %q: want label_values(metric, label)", v.Query)
			continue
		}
		out = append(out, m[1])
	}
	return out
}

// TestDeployFiles: every expression of deploy/grafana/sluice.json and
// deploy/prometheus/alerts.yaml parses (the alert rules as promtool check
// rules checks them, with the same package), and every metric they use is
// one a running serve exports.
func TestDeployFiles(t *testing.T) {
	up := startDashServe(t)
	dashLoad(t, up) // so that the labelled families have series
	exported := metricNames(t, up)
	// The drain and lease panels and alerts read sluice drain's metrics.
	drained := drainMetrics(t)
	for name := range drained {
		exported[name] = true
	}
	if c := drained["sluice_lease_capacity"]; c == nil || len(c.GetMetric()) != 1 || c.GetMetric()[0].GetGauge().GetValue() != 100 {
		t.Errorf("sluice drain's sluice_lease_capacity: %v, want one series of 100", c)
	}
	p := parser.NewParser(parser.Options{})
	used := map[string][]string{}

	alerts := filepath.Join("..", "..", "deploy", "prometheus", "alerts.yaml")
	b, err := os.ReadFile(alerts)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", alerts, err)
	}
	nAlerts := 0
	if groups != nil {
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				nAlerts++
				if r.Alert == "" || r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
					t.Errorf("rule %q: want an alert with a severity and a summary", r.Alert)
				}
				for _, n := range selectors(t, p, r.Expr) {
					used[n] = append(used[n], "alert "+r.Alert)
				}
			}
		}
	}
	if nAlerts < 6 {
		t.Errorf("%d alerts, want at least the six docs/operations.md describes", nAlerts)
	}

	grafana := filepath.Join("..", "..", "deploy", "grafana", "sluice.json")
	if b, err = os.ReadFile(grafana); err != nil {
		t.Fatal(err)
	}
	exprs := grafanaExprs(t, b)
	if len(exprs) < 10 {
		t.Errorf("%d queries in the dashboard", len(exprs))
	}
	for _, e := range exprs {
		for _, n := range selectors(t, p, e) {
			used[n] = append(used[n], "grafana")
		}
	}
	for n, where := range used {
		if !exported[n] {
			t.Errorf("%s (used by %s) is not a metric sluice serve or sluice drain exports", n, strings.Join(where, ", "))
		}
	}
	t.Logf("%d alerts and %d dashboard queries use %d metrics, all exported", nAlerts, len(exprs), len(used))
}
