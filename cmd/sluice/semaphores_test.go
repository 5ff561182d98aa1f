package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/fence"
	"github.com/sluicehq/sluice/internal/coord"
	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/redistest"
)

// coordToken is the coordination API's bearer token in these tests.
const coordToken = "a-test-coordination-token-0123456789"

// TestSemaphoresEndToEnd runs the built binary on the memory store and on
// a real redis-server, and drives its semaphores over HTTP and gRPC:
// acquire, renew, release; the limit held by concurrent acquirers of both
// transports; waiters granted one by one as permits are released; a
// holder that stops renewing losing its permit within the TTL to a
// waiter with a larger fence; wrong ids and tokens refused; reflection
// and health; waiters answered at once when serve stops. Every HTTP
// answer is checked against docs/openapi.yaml.
func TestSemaphoresEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildSluice(t)
	api := loadOpenAPI(t)
	tokenFile := filepath.Join(t.TempDir(), "coord-token")
	if err := os.WriteFile(tokenFile, []byte(coordToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			start := time.Now()
			args := []string{"serve", "--rules", rulesDir(t, map[string]string{"st.yaml": testRuleFile}), "--log-format", "json",
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
				"--coord-token-file", tokenFile, "--coord-max-waiters", "4"}
			if store == "redis" {
				args = append(args, "--store", "redis", "--redis-addr", redistest.Standalone(t).Addr())
			}
			p := startSluice(t, bin, []string{"SLUICE_COORD_TOKEN="}, args...)
			up := p.next(t, "sluice serving", 10*time.Second)
			c := newCoordClient(t, api, up.str("http"), up.str("grpc"))
			testSemaphores(t, c)
			testSemaphoreShutdown(t, c, p)
			t.Logf("%s: %v", store, time.Since(start).Round(time.Millisecond))
		})
	}
}

// grant is an acquired permit, whichever transport acquired it.
type grant struct {
	ID    string
	Fence uint64
	Valid time.Duration
}

// coordClient talks to one serve over both transports.
type coordClient struct {
	t    *testing.T
	api  *openAPI
	http string
	conn *grpc.ClientConn
	ctx  context.Context // carries the bearer token
}

func newCoordClient(t *testing.T, api *openAPI, httpAddr, grpcAddr string) *coordClient {
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+coordToken)
	return &coordClient{t: t, api: api, http: httpAddr, conn: conn, ctx: ctx}
}

// post sends body to path with token (none if ""), checks the answer
// against the OpenAPI document, and returns its status and decoded body.
func (c *coordClient) post(path, token, body string) (int, map[string]any) {
	c.t.Helper()
	code, m, err := c.do(c.t.Context(), path, token, body)
	if err != nil {
		c.t.Fatal(err)
	}
	return code, m
}

// do is post under ctx, returning the error of a request that got no
// answer; it fails no test itself but for an answer that does not match
// the OpenAPI document, so that goroutines may call it.
func (c *coordClient) do(ctx context.Context, path, token, body string) (int, map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+c.http+path, bytes.NewBufferString(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	if err := c.api.checkResponse(path, resp.StatusCode, resp.Header.Get("Content-Type"), b); err != nil {
		c.t.Errorf("POST %s %s: answer %d %s does not match docs/openapi.yaml: %v", path, body, resp.StatusCode, b, err)
	}
	var m map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &m); err != nil {
			return 0, nil, fmt.Errorf("POST %s: %w: %s", path, err, b)
		}
	}
	return resp.StatusCode, m, nil
}

// acquireHTTP acquires over HTTP, wanting status want.
func (c *coordClient) acquireHTTP(want int, name string, limit int64, ttl, wait time.Duration) grant {
	c.t.Helper()
	g, code := c.acquire(c.t.Context(), false, name, limit, ttl, wait)
	if code != want {
		c.t.Fatalf("HTTP acquire %q: %d, want %d", name, code, want)
	}
	return g
}

// acquire acquires under ctx over HTTP or, with grpc, over gRPC, and
// returns the grant and the answer's status, a gRPC code as its HTTP
// status; -1 when no answer came (ctx ended). It fails no test itself,
// so that goroutines may call it.
func (c *coordClient) acquire(ctx context.Context, grpc bool, name string, limit int64, ttl, wait time.Duration) (grant, int) {
	if !grpc {
		code, m, err := c.do(ctx, "/v1/semaphores/acquire", coordToken,
			fmt.Sprintf(`{"name":%q,"limit":%d,"ttl_ms":%d,"wait_ms":%d}`, name, limit, ttl.Milliseconds(), wait.Milliseconds()))
		if err != nil {
			return grant{}, -1
		}
		if code != http.StatusOK {
			return grant{}, code
		}
		return grant{ID: m["permit_id"].(string), Fence: uint64(m["fence"].(float64)), Valid: time.Duration(m["valid_for_ms"].(float64)) * time.Millisecond}, code
	}
	g, code := c.acquireGRPC(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+coordToken), name, limit, ttl, wait)
	if n, ok := map[codes.Code]int{codes.OK: 200, codes.ResourceExhausted: 429, codes.InvalidArgument: 400, codes.Unavailable: 503}[code]; ok {
		return g, n
	}
	return g, -1
}

// acquireGRPC acquires over gRPC under ctx, returning its status code.
func (c *coordClient) acquireGRPC(ctx context.Context, name string, limit int64, ttl, wait time.Duration) (grant, codes.Code) {
	var out sluicev1.AcquireResponse
	err := c.invoke(ctx, "Acquire", &sluicev1.AcquireRequest{Name: name, Limit: limit, Ttl: durationpb.New(ttl), Wait: durationpb.New(wait)}, &out)
	return grant{ID: out.GetPermitId(), Fence: out.GetFence(), Valid: out.GetValidFor().AsDuration()}, status.Code(err)
}

func (c *coordClient) invoke(ctx context.Context, method string, in, out proto.Message) error {
	return c.conn.Invoke(ctx, "/"+coord.ServiceName+"/"+method, in, out)
}

// releaseHTTP releases over HTTP, wanting status want.
func (c *coordClient) releaseHTTP(want int, name, id string) {
	c.t.Helper()
	if code, m := c.post("/v1/semaphores/release", coordToken, fmt.Sprintf(`{"name":%q,"permit_id":%q}`, name, id)); code != want {
		c.t.Errorf("HTTP release %q: %d %v, want %d", name, code, m, want)
	}
}

func testSemaphores(t *testing.T, c *coordClient) {
	// The service is listed by reflection and healthy.
	if names := reflectedServices(t, c.conn); !names[coord.ServiceName] {
		t.Errorf("reflection lists %v, not %s", names, coord.ServiceName)
	}
	hc, err := healthpb.NewHealthClient(c.conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: coord.ServiceName})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of %s: %v, %v", coord.ServiceName, hc, err)
	}

	// The bearer token.
	body := `{"name":"db","limit":2}`
	for _, tok := range []string{"", "wrong"} {
		if code, _ := c.post("/v1/semaphores/acquire", tok, body); code != http.StatusUnauthorized {
			t.Errorf("HTTP acquire with token %q: %d, want 401", tok, code)
		}
	}
	if _, code := c.acquireGRPC(t.Context(), "db", 2, time.Second, 0); code != codes.Unauthenticated {
		t.Errorf("gRPC acquire without the token: %v, want UNAUTHENTICATED", code)
	}

	// Acquire, renew and release, over both; fences grow.
	h := c.acquireHTTP(200, "db", 2, 10*time.Second, 0)
	g, code := c.acquireGRPC(c.ctx, "db", 2, 10*time.Second, 0)
	if code != codes.OK || g.Fence <= h.Fence || g.ID == h.ID {
		t.Fatalf("gRPC grant after an HTTP one: %+v %v; HTTP's %+v", g, code, h)
	}
	for _, x := range []grant{h, g} {
		// Counted from the request's receipt: TTL less its margin, and
		// the moment serve took before its store call.
		if x.Valid <= 9*time.Second || x.Valid > 10*time.Second-10*time.Second/50+100*time.Millisecond {
			t.Errorf("grant %+v: valid for %v, want (9s, TTL - TTL/50 + 100ms]", x, x.Valid)
		}
	}
	c.acquireHTTP(http.StatusConflict, "db", 2, time.Second, 0)
	testHolders(t, c, "db", h, g)
	if _, code := c.acquireGRPC(c.ctx, "db", 2, time.Second, 0); code != codes.ResourceExhausted {
		t.Errorf("gRPC acquire of a full semaphore: %v, want RESOURCE_EXHAUSTED", code)
	}
	if code, m := c.post("/v1/semaphores/renew", coordToken, fmt.Sprintf(`{"name":"db","permit_id":%q,"ttl_ms":20000}`, g.ID)); code != 200 || m["valid_for_ms"].(float64) < 10000 {
		t.Errorf("HTTP renew of the gRPC permit: %d %v", code, m)
	}
	var rn sluicev1.RenewResponse
	if err := c.invoke(c.ctx, "Renew", &sluicev1.RenewRequest{Name: "db", PermitId: h.ID}, &rn); err != nil || rn.GetValidFor().AsDuration() <= 0 {
		t.Errorf("gRPC renew of the HTTP permit: %v, %v", &rn, err)
	}
	// Wrong ids: well-formed but never granted (404, NOT_FOUND),
	// malformed (400), the right id under another name (404).
	other := "AAAAAAAAAAAAAAAAAAAAAAAAAA"
	if code, _ := c.post("/v1/semaphores/renew", coordToken, fmt.Sprintf(`{"name":"db","permit_id":%q}`, other)); code != http.StatusNotFound {
		t.Errorf("HTTP renew of a wrong id: %d, want 404", code)
	}
	if err := c.invoke(c.ctx, "Release", &sluicev1.ReleaseRequest{Name: "db", PermitId: other}, new(sluicev1.ReleaseResponse)); status.Code(err) != codes.NotFound {
		t.Errorf("gRPC release of a wrong id: %v, want NOT_FOUND", err)
	}
	c.releaseHTTP(http.StatusBadRequest, "db", "not-an-id")
	c.releaseHTTP(http.StatusNotFound, "other", h.ID)
	for _, bad := range []string{`{"name":"db","limit":2,"extra":1}`, `{"name":"db","limit":3,"weight":4}`, `{"name":"","limit":1}`, `{"name":"db","limit":1,"ttl_ms":1}`, `{"name":"db","limit":1,"wait_ms":3600000}`, `not json`} {
		if code, _ := c.post("/v1/semaphores/acquire", coordToken, bad); code != http.StatusBadRequest {
			t.Errorf("HTTP acquire %s: %d, want 400", bad, code)
		}
	}
	checker := &fence.Checker{Held: c.held}
	if err := checker.Check(t.Context(), "db", h.Fence); err != nil {
		t.Errorf("fence.Checker on /v1/semaphores/holders, fence %d held: %v", h.Fence, err)
	}
	c.releaseHTTP(http.StatusNoContent, "db", h.ID)
	if err := checker.Check(t.Context(), "db", h.Fence); !errors.Is(err, fence.ErrNotHeld) {
		t.Errorf("fence.Checker on /v1/semaphores/holders, fence %d released: %v, want ErrNotHeld", h.Fence, err)
	}
	if err := checker.Check(t.Context(), "db", g.Fence); err != nil {
		t.Errorf("fence.Checker on /v1/semaphores/holders, fence %d still held: %v", g.Fence, err)
	}
	if err := c.invoke(c.ctx, "Release", &sluicev1.ReleaseRequest{Name: "db", PermitId: g.ID}, new(sluicev1.ReleaseResponse)); err != nil {
		t.Errorf("gRPC release: %v", err)
	}
	c.releaseHTTP(http.StatusNotFound, "db", h.ID)

	testSemaphoreLimit(t, c)
	testSemaphoreWaiters(t, c)
	testSemaphoreLapse(t, c)

	// The calls are counted.
	resp, err := http.Get("http://" + c.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	scrape, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`sluice_semaphore_calls_total{method="acquire",outcome="ok"} `, `sluice_semaphore_calls_total{method="release",outcome="not_found"} `, `sluice_semaphore_calls_total{method="acquire",outcome="too_many_waiters"} `, "sluice_semaphore_waiting 0\n"} {
		if !bytes.Contains(scrape, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// held is a fence.HeldFunc on /v1/semaphores/holders: what a protected
// service in any language would do.
func (c *coordClient) held(ctx context.Context, name string, token uint64) (bool, error) {
	code, m, err := c.do(ctx, "/v1/semaphores/holders", coordToken, fmt.Sprintf(`{"name":%q}`, name))
	if err != nil || code != http.StatusOK {
		return false, fmt.Errorf("holders: %d %v %v", code, m, err)
	}
	for _, h := range m["holders"].([]any) {
		if uint64(h.(map[string]any)["fence"].(float64)) == token {
			return true, nil
		}
	}
	return false, nil
}

// testHolders lists name, held by exactly the grants held (in their
// order) with nobody waiting, over both transports, without the token
// (refused) and with a bad name.
func testHolders(t *testing.T, c *coordClient, name string, held ...grant) {
	t.Helper()
	body := fmt.Sprintf(`{"name":%q}`, name)
	for _, tok := range []string{"", "wrong"} {
		if code, _ := c.post("/v1/semaphores/holders", tok, body); code != http.StatusUnauthorized {
			t.Errorf("HTTP holders with token %q: %d, want 401", tok, code)
		}
	}
	if code, _ := c.post("/v1/semaphores/holders", coordToken, `{"name":""}`); code != http.StatusBadRequest {
		t.Errorf("HTTP holders of the empty name: %d, want 400", code)
	}
	code, m := c.post("/v1/semaphores/holders", coordToken, body)
	hs, _ := m["holders"].([]any)
	if code != http.StatusOK || m["name"] != name || m["waiting"] != 0.0 || len(hs) != len(held) {
		t.Fatalf("HTTP holders of %q: %d %v, want %d holders and nobody waiting", name, code, m, len(held))
	}
	for i, g := range held {
		h := hs[i].(map[string]any)
		if uint64(h["fence"].(float64)) != g.Fence || h["weight"] != 1.0 || h["held_for_ms"] == nil || h["expires_in_ms"].(float64) <= 0 {
			t.Errorf("HTTP holder %d: %v, want fence %d, weight 1, a time held and a time left", i, h, g.Fence)
		}
		if strings.Contains(fmt.Sprint(m), g.ID) {
			t.Errorf("HTTP holders shows permit id %s", g.ID)
		}
	}
	var out sluicev1.HoldersResponse
	if err := c.invoke(c.ctx, "Holders", &sluicev1.HoldersRequest{Name: name}, &out); err != nil || len(out.GetHolders()) != len(held) || out.GetWaiting() != 0 {
		t.Fatalf("gRPC holders of %q: %v, %v", name, &out, err)
	}
	for i, g := range held {
		if h := out.GetHolders()[i]; h.GetFence() != g.Fence || h.GetWeight() != 1 || h.GetHeldFor() == nil || h.GetExpiresIn().AsDuration() <= 0 {
			t.Errorf("gRPC holder %d: %v, want fence %d", i, h, g.Fence)
		}
	}
}

// testSemaphoreLimit runs 4 acquirers (--coord-max-waiters), two on each
// transport, on a semaphore of limit 2, and checks that no more than 2
// hold a permit at once and every acquire is granted.
func testSemaphoreLimit(t *testing.T, c *coordClient) {
	const limit, rounds = 2, 8
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for range rounds {
				g, code := c.acquire(t.Context(), w%2 == 1, "pool", limit, 10*time.Second, 8*time.Second)
				if code != http.StatusOK {
					t.Errorf("acquire of the pool (gRPC %v): %d", w%2 == 1, code)
					return
				}
				n := held.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				held.Add(-1)
				if w%2 == 0 {
					c.releaseHTTP(http.StatusNoContent, "pool", g.ID)
				} else if err := c.invoke(c.ctx, "Release", &sluicev1.ReleaseRequest{Name: "pool", PermitId: g.ID}, new(sluicev1.ReleaseResponse)); err != nil {
					t.Errorf("gRPC release of the pool: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p < 1 || p > limit {
		t.Errorf("peak permits held = %d, want 1 to %d", p, limit)
	}
}

// gather starts 4 acquirers (2 per transport) waiting up to 9 s on name,
// whose one permit the caller holds, and returns once all of them wait:
// when one more is refused 429 (--coord-max-waiters 4; probe). Each
// waiter's answer comes on the channel; the first waiter (over HTTP) hangs
// up when ctx0 ends.
func gather(t *testing.T, c *coordClient, ctx0 context.Context, name string, wg *sync.WaitGroup) <-chan grantStatus {
	answers := make(chan grantStatus, 4)
	for w := range 4 {
		ctx := t.Context()
		if w == 0 {
			ctx = ctx0
		}
		wg.Go(func() {
			for {
				// 429 while the probe holds a place: ask again.
				g, code := c.acquire(ctx, w%2 == 1, name, 1, 30*time.Second, 9*time.Second)
				if code != http.StatusTooManyRequests {
					answers <- grantStatus{g, code}
					return
				}
			}
		})
	}
	probe(t, c, name, http.StatusTooManyRequests)
	return answers
}

// probe asks for a permit of name, waiting a millisecond, until the
// answer is want: 429 once 4 acquires wait (--coord-max-waiters 4), 409
// (no permit within the wait) once fewer do.
func probe(t *testing.T, c *coordClient, name string, want int) {
	t.Helper()
	deadline := time.Now().Add(8 * time.Second)
	for {
		code, m := c.post("/v1/semaphores/acquire", coordToken, fmt.Sprintf(`{"name":%q,"limit":1,"ttl_ms":1000,"wait_ms":1}`, name))
		if code == want {
			return
		}
		if (code != http.StatusConflict && code != http.StatusTooManyRequests) || time.Now().After(deadline) {
			t.Fatalf("probe of %s: %d %v, waiting for %d", name, code, m, want)
		}
	}
}

// grantStatus is a waiter's answer.
type grantStatus struct {
	g    grant
	code int
}

// testSemaphoreWaiters holds the one permit of a semaphore and lets 4
// acquirers wait on it (gather). One hangs up: once serve has let it go
// (the probe is told 409, not 429), permit after permit is released:
// each release grants one of the 3 others, with a larger fence, and then
// the semaphore is free: the caller that hung up holds nothing.
func testSemaphoreWaiters(t *testing.T, c *coordClient) {
	held := c.acquireHTTP(200, "lock", 1, 30*time.Second, 0)
	var wg sync.WaitGroup
	ctx0, hangUp := context.WithCancel(t.Context())
	answers := gather(t, c, ctx0, "lock", &wg)
	hangUp()
	if a := <-answers; a.code != -1 {
		t.Fatalf("the waiter that hung up: %d, want no answer", a.code)
	}
	probe(t, c, "lock", http.StatusConflict)
	fence := held.Fence
	for range 3 {
		c.releaseHTTP(http.StatusNoContent, "lock", held.ID)
		a := <-answers
		if a.code != http.StatusOK {
			t.Fatalf("waiter: %d", a.code)
		}
		if held = a.g; held.Fence <= fence {
			t.Errorf("waiter granted fence %d, not above %d", held.Fence, fence)
		}
		fence = held.Fence
	}
	wg.Wait()
	c.releaseHTTP(http.StatusNoContent, "lock", held.ID)
	free := c.acquireHTTP(200, "lock", 1, time.Second, 0)
	c.releaseHTTP(http.StatusNoContent, "lock", free.ID)
}

// testSemaphoreShutdown lets 4 acquirers wait on a semaphore held, then
// stops serve: the waiters are answered 503 (UNAVAILABLE) at once rather
// than holding up the drain for their wait, and serve exits 0.
func testSemaphoreShutdown(t *testing.T, c *coordClient, p *sluiceProcess) {
	c.acquireHTTP(200, "drain", 1, 30*time.Second, 0)
	var wg sync.WaitGroup
	answers := gather(t, c, t.Context(), "drain", &wg)
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if a := <-answers; a.code != http.StatusServiceUnavailable {
			t.Errorf("waiter at shutdown: %d, want 503", a.code)
		}
	}
	wg.Wait()
	if err := p.waitExit(t, 15*time.Second); err != nil {
		t.Errorf("serve exited with %v", err)
	}
}

// testSemaphoreLapse acquires a permit with a short TTL and never renews
// it: a waiter gets the semaphore within the TTL (and a poll interval),
// with a larger fence, and the lapsed id renews nothing.
func testSemaphoreLapse(t *testing.T, c *coordClient) {
	const ttl = 500 * time.Millisecond
	start := time.Now()
	crashed := c.acquireHTTP(200, "crash", 1, ttl, 0)
	g, code := c.acquireGRPC(c.ctx, "crash", 1, 10*time.Second, 5*time.Second)
	if code != codes.OK {
		t.Fatalf("acquire after a holder stopped renewing: %v", code)
	}
	if d := time.Since(start); d > ttl+2*time.Second {
		t.Errorf("the lapsed permit came back after %v; TTL %v", d, ttl)
	}
	if g.Fence <= crashed.Fence {
		t.Errorf("fence after the lapse %d, not above %d", g.Fence, crashed.Fence)
	}
	if code, _ := c.post("/v1/semaphores/renew", coordToken, fmt.Sprintf(`{"name":"crash","permit_id":%q}`, crashed.ID)); code != http.StatusNotFound {
		t.Errorf("renewal of the lapsed permit: %d, want 404", code)
	}
	c.releaseHTTP(http.StatusNoContent, "crash", g.ID)
}

// reflectedServices lists the services gRPC reflection reports.
func reflectedServices(t *testing.T, conn *grpc.ClientConn) map[string]bool {
	t.Helper()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		names[s.GetName()] = true
	}
	return names
}

// openAPI is docs/openapi.yaml, and a checker of answers against it: the
// subset of JSON Schema the document uses (type object, array, string,
// integer, number or boolean; properties, required, additionalProperties
// false; items; minimum, maximum, minLength, maxLength, pattern; $ref
// within the document). A
// keyword it does not know fails the check, so that the document cannot
// promise what nothing checks.
type openAPI struct{ doc map[string]any }

func loadOpenAPI(t *testing.T) *openAPI {
	t.Helper()
	b, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("docs/openapi.yaml: openapi %v, want 3.1.0", doc["openapi"])
	}
	return &openAPI{doc: doc}
}

// node returns the object at v, following a $ref ("#/a/b").
func (o *openAPI) node(v any) (map[string]any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not an object: %v", v)
	}
	ref, ok := m["$ref"].(string)
	if !ok {
		return m, nil
	}
	var cur any = o.doc
	for _, part := range regexp.MustCompile(`/`).Split(ref, -1)[1:] {
		next, ok := cur.(map[string]any)[part]
		if !ok {
			return nil, fmt.Errorf("$ref %s: no %q", ref, part)
		}
		cur = next
	}
	return o.node(cur)
}

// checkResponse checks a POST answer of path: its status is documented,
// with its media type, and its body matches the schema (or is empty when
// the document gives no content).
func (o *openAPI) checkResponse(path string, status int, contentType string, body []byte) error {
	op, err := o.node(o.doc["paths"].(map[string]any)[path])
	if err != nil {
		return fmt.Errorf("path %s: %w", path, err)
	}
	post, err := o.node(op["post"])
	if err != nil {
		return err
	}
	resp, err := o.node(post["responses"].(map[string]any)[strconv.Itoa(status)])
	if err != nil {
		return fmt.Errorf("status %d is not documented", status)
	}
	content, ok := resp["content"].(map[string]any)
	if !ok {
		if len(body) != 0 {
			return fmt.Errorf("a body where the document has none")
		}
		return nil
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return fmt.Errorf("Content-Type %q: %w", contentType, err)
	}
	media, err := o.node(content[mt])
	if err != nil {
		return fmt.Errorf("media type %s is not documented for %d", mt, status)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	return o.validate(media["schema"], v, "$")
}

// validate checks v against schema s.
func (o *openAPI) validate(s any, v any, at string) error {
	sch, err := o.node(s)
	if err != nil {
		return fmt.Errorf("%s: schema: %w", at, err)
	}
	for k := range sch {
		switch k {
		case "type", "properties", "required", "additionalProperties", "items", "minimum", "maximum", "minLength", "maxLength", "pattern", "description",
			"minItems", "maxItems": // arrays' bounds: /v1/reserve's descriptors
		default:
			return fmt.Errorf("%s: the checker does not know the keyword %q", at, k)
		}
	}
	num := func(k string) (int64, bool) {
		n, ok := sch[k].(int)
		return int64(n), ok
	}
	switch sch["type"] {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an object", at, v)
		}
		req, _ := sch["required"].([]any)
		for _, r := range req {
			if _, ok := m[r.(string)]; !ok {
				return fmt.Errorf("%s: required %q missing", at, r)
			}
		}
		props, _ := sch["properties"].(map[string]any)
		for k, x := range m {
			p, ok := props[k]
			if !ok {
				if sch["additionalProperties"] == false {
					return fmt.Errorf("%s: property %q not in the schema", at, k)
				}
				continue
			}
			if err := o.validate(p, x, at+"."+k); err != nil {
				return err
			}
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: %v is not a string", at, v)
		}
		n := int64(utf8.RuneCountInString(str))
		if lo, ok := num("minLength"); ok && n < lo {
			return fmt.Errorf("%s: %q shorter than %d", at, str, lo)
		}
		if hi, ok := num("maxLength"); ok && n > hi {
			return fmt.Errorf("%s: %q longer than %d", at, str, hi)
		}
		if p, ok := sch["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			return fmt.Errorf("%s: %q does not match %s", at, str, p)
		}
	case "integer":
		jn, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %v is not a number", at, v)
		}
		n, err := jn.Int64()
		if err != nil {
			return fmt.Errorf("%s: %v is not an integer", at, v)
		}
		if lo, ok := num("minimum"); ok && n < lo {
			return fmt.Errorf("%s: %d below %d", at, n, lo)
		}
		if hi, ok := num("maximum"); ok && n > hi {
			return fmt.Errorf("%s: %d above %d", at, n, hi)
		}
	case "number":
		jn, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %v is not a number", at, v)
		}
		f, err := jn.Float64()
		if err != nil {
			return fmt.Errorf("%s: %v: %w", at, v, err)
		}
		if lo, ok := num("minimum"); ok && f < float64(lo) {
			return fmt.Errorf("%s: %v below %d", at, f, lo)
		}
		if hi, ok := num("maximum"); ok && f > float64(hi) {
			return fmt.Errorf("%s: %v above %d", at, f, hi)
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an array", at, v)
		}
		if lo, ok := num("minItems"); ok && int64(len(a)) < lo {
			return fmt.Errorf("%s: %d items, fewer than %d", at, len(a), lo)
		}
		if hi, ok := num("maxItems"); ok && int64(len(a)) > hi {
			return fmt.Errorf("%s: %d items, more than %d", at, len(a), hi)
		}
		items, ok := sch["items"]
		if !ok {
			return fmt.Errorf("%s: an array schema without items", at)
		}
		for i, x := range a {
			if err := o.validate(items, x, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: %v is not a boolean", at, v)
		}
	default:
		return fmt.Errorf("%s: the checker does not know type %v", at, sch["type"])
	}
	return nil
}

// TestOpenAPIChecker checks the checker: answers that break the document
// are caught.
func TestOpenAPIChecker(t *testing.T) {
	api := loadOpenAPI(t)
	const acquire = "/v1/semaphores/acquire"
	good := `{"permit_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","fence":3,"valid_for_ms":900}`
	if err := api.checkResponse(acquire, 200, "application/json", []byte(good)); err != nil {
		t.Errorf("a good grant: %v", err)
	}
	for _, tc := range []struct {
		status int
		ct     string
		body   string
	}{
		{200, "application/json", `{"permit_id":"abc","fence":3,"valid_for_ms":900}`},
		{200, "application/json", `{"permit_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","fence":0,"valid_for_ms":900}`},
		{200, "application/json", `{"permit_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","fence":3}`},
		{200, "application/json", `{"permit_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","fence":3,"valid_for_ms":900,"x":1}`},
		{200, "application/json", `{"permit_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","fence":1.5,"valid_for_ms":900}`},
		{200, "application/problem+json", good},
		{418, "application/json", good},
		{409, "application/problem+json", `{"type":"about:blank","title":"Conflict"}`},
	} {
		if err := api.checkResponse(acquire, tc.status, tc.ct, []byte(tc.body)); err == nil {
			t.Errorf("%d %s %s: passed", tc.status, tc.ct, tc.body)
		}
	}
	if err := api.checkResponse("/v1/semaphores/release", 204, "", []byte("x")); err == nil {
		t.Error("a body in a 204 passed")
	}
	const demand = "/v1/leases/demand"
	goodGrant := `{"holder_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","version":2,"rate":250,"pace_rate":245.5,"burst":2,"window_ms":1000,"valid_for_ms":800,"leases":[{"partition":3,"epoch":7}]}`
	if err := api.checkResponse(demand, 200, "application/json", []byte(goodGrant)); err != nil {
		t.Errorf("a good lease grant: %v", err)
	}
	for _, body := range []string{
		`{"holder_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","version":2,"rate":"250","pace_rate":245.5,"burst":2,"window_ms":1000,"valid_for_ms":800,"leases":[]}`,
		`{"holder_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","version":2,"rate":-1,"pace_rate":245.5,"burst":2,"window_ms":1000,"valid_for_ms":800,"leases":[]}`,
		`{"holder_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","version":2,"rate":250,"pace_rate":245.5,"burst":2,"window_ms":1000,"valid_for_ms":800,"leases":{}}`,
		`{"holder_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","version":2,"rate":250,"pace_rate":245.5,"burst":2,"window_ms":1000,"valid_for_ms":800,"leases":[{"partition":3,"epoch":0}]}`,
		`{"holder_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ","version":2,"rate":250,"pace_rate":245.5,"burst":2,"window_ms":1000,"valid_for_ms":800}`,
	} {
		if err := api.checkResponse(demand, 200, "application/json", []byte(body)); err == nil {
			t.Errorf("lease grant %s: passed", body)
		}
	}
	const holders = "/v1/semaphores/holders"
	if err := api.checkResponse(holders, 200, "application/json", []byte(`{"name":"api","holders":[{"fence":17,"weight":1,"held_for_ms":1234,"expires_in_ms":8766},{"fence":18,"weight":2,"expires_in_ms":1}],"waiting":3}`)); err != nil {
		t.Errorf("a good listing: %v", err)
	}
	for _, body := range []string{
		`{"name":"api","holders":[{"fence":17,"weight":1,"held_for_ms":1234,"expires_in_ms":8766,"permit_id":"ABCDEFGHIJKLMNOPQRSTUVWXYZ"}],"waiting":3}`,
		`{"name":"api","holders":[{"fence":0,"weight":1,"expires_in_ms":8766}],"waiting":3}`,
		`{"name":"api","holders":[{"fence":17,"weight":1}],"waiting":3}`,
		`{"name":"api","holders":{},"waiting":3}`,
		`{"name":"api","holders":[]}`,
	} {
		if err := api.checkResponse(holders, 200, "application/json", []byte(body)); err == nil {
			t.Errorf("listing %s: passed", body)
		}
	}
	// Every $ref of the document resolves, whether a test's answers
	// reach it or not.
	var walk func(at string, v any)
	walk = func(at string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if _, ok := v["$ref"]; ok {
				if _, err := api.node(v); err != nil {
					t.Errorf("%s: %v", at, err)
				}
			}
			for k, x := range v {
				walk(at+"/"+k, x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s/%d", at, i), x)
			}
		}
	}
	walk("#", api.doc)
}
