package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/coord"
	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
)

// TestLeasesEndToEnd runs the built binary on the memory store and on a
// real redis-server, and drives its capacity leases over HTTP and gRPC:
// two remote holders of one service (one on each transport: heartbeats,
// HTTP long polls, a gRPC stream) share its capacity, each converging to
// half; a third holder beyond --coord-max-holders, wrong holder ids,
// requests outside the bounds and calls without the token are refused;
// a holder that goes silent loses its leases within its TTL of being
// ended, and the other then has the whole capacity; leave; a long poll and
// a stream waiting when serve stops are answered at once. Every HTTP
// answer is checked against docs/openapi.yaml.
func TestLeasesEndToEnd(t *testing.T) {
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
			args := []string{"serve", "--rules", rulesDir(t, map[string]string{"st.yaml": testRuleFile}), "--log-format", "json",
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
				"--coord-token-file", tokenFile, "--coord-max-holders", "2", "--coord-max-partitions", "64"}
			if store == "redis" {
				args = append(args, "--store", "redis", "--redis-addr", redistest.Standalone(t).Addr())
			}
			p := startSluice(t, bin, []string{"SLUICE_COORD_TOKEN="}, args...)
			up := p.next(t, "sluice serving", 10*time.Second)
			c := newCoordClient(t, api, up.str("http"), up.str("grpc"))
			testLeases(t, c)
			testLeaseShutdown(t, c, p)
		})
	}
}

// The leased service of testLeases: 100 units a second in 10 partitions,
// holders with a TTL of one second.
const (
	e2eCapacity   = 100
	e2ePartitions = 10
	e2eTTL        = time.Second
)

// leaseState is what a holder's client has seen last.
type leaseState struct {
	mu   sync.Mutex
	g    coord.LeaseGrant
	seen chan struct{} // closed and remade at every new grant
}

func newLeaseState(g coord.LeaseGrant) *leaseState {
	return &leaseState{g: g, seen: make(chan struct{})}
}

func (s *leaseState) set(g coord.LeaseGrant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.Version > s.g.Version {
		s.g = g
		close(s.seen)
		s.seen = make(chan struct{})
	}
}

func (s *leaseState) get() (coord.LeaseGrant, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.g, s.seen
}

// waitRate waits until the holder's grant has rate, within d, and
// returns it and how long it took.
func (s *leaseState) waitRate(t *testing.T, who string, rate float64, d time.Duration) (coord.LeaseGrant, time.Duration) {
	t.Helper()
	start := time.Now()
	timeout := time.After(d)
	for {
		g, seen := s.get()
		if g.Rate == rate {
			return g, time.Since(start)
		}
		select {
		case <-seen:
		case <-timeout:
			t.Fatalf("%s: rate %v after %v, want %v", who, g.Rate, d, rate)
		}
	}
}

// grantOf decodes an HTTP grant.
func grantOf(m map[string]any) coord.LeaseGrant {
	g := coord.LeaseGrant{HolderID: m["holder_id"].(string), Version: uint64(m["version"].(float64)), Rate: m["rate"].(float64),
		PaceRate: m["pace_rate"].(float64), Burst: int(m["burst"].(float64)),
		Window: time.Duration(m["window_ms"].(float64)) * time.Millisecond, ValidFor: time.Duration(m["valid_for_ms"].(float64)) * time.Millisecond}
	for _, l := range m["leases"].([]any) {
		l := l.(map[string]any)
		g.Leases = append(g.Leases, lease.Grant{Partition: int(l["partition"].(float64)), Epoch: uint64(l["epoch"].(float64))})
	}
	return g
}

func testLeases(t *testing.T, c *coordClient) {
	if names := reflectedServices(t, c.conn); !names[coord.LeaseServiceName] {
		t.Errorf("reflection lists %v, not %s", names, coord.LeaseServiceName)
	}
	hc, err := healthpb.NewHealthClient(c.conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: coord.LeaseServiceName})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of %s: %v, %v", coord.LeaseServiceName, hc, err)
	}
	join := fmt.Sprintf(`{"service":"api","capacity":%d,"partitions":%d,"ttl_ms":%d,"backlog":1000}`, e2eCapacity, e2ePartitions, e2eTTL.Milliseconds())
	if code, _ := c.post("/v1/leases/join", "", join); code != http.StatusUnauthorized {
		t.Errorf("HTTP join without the token: %d, want 401", code)
	}
	gjoin := &sluicev1.JoinRequest{Service: "api", Capacity: e2eCapacity, Partitions: e2ePartitions, Ttl: durationpb.New(e2eTTL), Backlog: 1000}
	if err := c.leaseInvoke(t.Context(), "Join", gjoin, new(sluicev1.JoinResponse)); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC join without the token: %v, want UNAUTHENTICATED", err)
	}

	// A over HTTP, B over gRPC.
	start := time.Now()
	code, m := c.post("/v1/leases/join", coordToken, join)
	if code != 200 {
		t.Fatalf("HTTP join: %d %v", code, m)
	}
	a := newLeaseState(grantOf(m))
	var jb sluicev1.JoinResponse
	if err := c.leaseInvoke(c.ctx, "Join", gjoin, &jb); err != nil {
		t.Fatal(err)
	}
	b := newLeaseState(coord.GrantFromMsg(jb.GetGrant()))
	aID, bID := a.g.HolderID, b.g.HolderID

	ctx, cancel := context.WithCancel(c.ctx) // with the token, for gRPC
	defer cancel()
	bctx, silenceB := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// A: heartbeats and long polls over HTTP, acknowledging what it saw.
	wg.Go(func() {
		for ctx.Err() == nil {
			g, _ := a.get()
			code, m, err := c.do(ctx, "/v1/leases/watch", coordToken, fmt.Sprintf(`{"service":"api","holder_id":%q,"version":%d,"wait_ms":2000}`, aID, g.Version))
			if err != nil {
				return
			}
			if code != 200 {
				t.Errorf("A's watch: %d %v", code, m)
				return
			}
			a.set(grantOf(m))
		}
	})
	wg.Go(func() { c.heartbeatHTTP(ctx, t, a, "api") })
	// B: a gRPC stream, and heartbeats over gRPC until silenced.
	wg.Go(func() {
		st, err := c.conn.NewStream(bctx, &grpc.StreamDesc{ServerStreams: true}, "/"+coord.LeaseServiceName+"/Watch")
		if err != nil {
			t.Error(err)
			return
		}
		if err := st.SendMsg(&sluicev1.WatchRequest{Service: "api", HolderId: bID}); err != nil {
			return
		}
		_ = st.CloseSend()
		for {
			var w sluicev1.WatchResponse
			if err := st.RecvMsg(&w); err != nil {
				return
			}
			b.set(coord.GrantFromMsg(w.GetGrant()))
		}
	})
	wg.Go(func() {
		for {
			g, _ := b.get()
			var d sluicev1.DemandResponse
			if err := c.leaseInvoke(bctx, "Demand", &sluicev1.DemandRequest{Service: "api", HolderId: bID, Backlog: 1000, Version: g.Version}, &d); err != nil {
				if bctx.Err() == nil {
					t.Errorf("B's demand: %v", err)
				}
				return
			}
			select {
			case <-bctx.Done():
				return
			case <-time.After(e2eTTL / 4):
			}
		}
	})

	// Each converges to half.
	half := float64(e2eCapacity) / 2
	ga, ta := a.waitRate(t, "A", half, 10*time.Second)
	gb, tb := b.waitRate(t, "B", half, 10*time.Second)
	t.Logf("both at their share %v after the joins: A %v, B %v after waiting", time.Since(start).Round(time.Millisecond), ta.Round(time.Millisecond), tb.Round(time.Millisecond))
	for who, g := range map[string]coord.LeaseGrant{"A": ga, "B": gb} {
		if len(g.Leases) != e2ePartitions/2 || g.PaceRate <= 0 || g.PaceRate >= half || g.Burst < 1 || g.Window != time.Second || g.ValidFor <= 0 || g.ValidFor > e2eTTL {
			t.Errorf("%s's grant at its share: %+v", who, g)
		}
	}

	// Refusals: a third holder, holder ids of another or made up, bounds.
	if code, m := c.post("/v1/leases/join", coordToken, join); code != http.StatusTooManyRequests {
		t.Errorf("a third holder (--coord-max-holders 2): %d %v, want 429", code, m)
	}
	other := "AAAAAAAAAAAAAAAAAAAAAAAAAA"
	for _, tc := range []struct {
		path, body string
		want       int
	}{
		{"/v1/leases/demand", fmt.Sprintf(`{"service":"other","holder_id":%q}`, aID), 404},
		{"/v1/leases/demand", fmt.Sprintf(`{"service":"api","holder_id":%q}`, other), 404},
		{"/v1/leases/watch", fmt.Sprintf(`{"service":"api","holder_id":%q}`, aID[:20]), 400},
		{"/v1/leases/leave", fmt.Sprintf(`{"service":"other","holder_id":%q}`, bID), 404},
		{"/v1/leases/join", `{"service":"x","capacity":0,"partitions":1}`, 400},
		{"/v1/leases/join", `{"service":"x","capacity":10,"partitions":65}`, 400},
		{"/v1/leases/join", `{"service":"x","capacity":10,"partitions":1,"ttl_ms":1}`, 400},
		{"/v1/leases/join", `{"service":"x","capacity":10,"partitions":1,"weight":5000}`, 400},
		{"/v1/leases/join", `{"service":"x{y}","capacity":10,"partitions":1}`, 400},
		{"/v1/leases/join", `{"service":"api","capacity":50,"partitions":10}`, 400},
		{"/v1/leases/watch", fmt.Sprintf(`{"service":"api","holder_id":%q,"wait_ms":3600000}`, aID), 400},
	} {
		if code, m := c.post(tc.path, coordToken, tc.body); code != tc.want {
			t.Errorf("POST %s %s: %d %v, want %d", tc.path, tc.body, code, m, tc.want)
		}
	}
	if err := c.leaseInvoke(c.ctx, "Demand", &sluicev1.DemandRequest{Service: "api", HolderId: other}, new(sluicev1.DemandResponse)); status.Code(err) != codes.NotFound {
		t.Errorf("gRPC demand of a made-up holder: %v, want NOT_FOUND", err)
	}
	if err := c.leaseInvoke(c.ctx, "Join", &sluicev1.JoinRequest{Service: "x", Capacity: 10, Partitions: 65}, new(sluicev1.JoinResponse)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("gRPC join of 65 partitions: %v, want INVALID_ARGUMENT", err)
	}

	// B goes silent: serve ends it after its TTL, its leases expire
	// within a TTL more, and A takes them.
	silenceB()
	full, took := a.waitRate(t, "A", e2eCapacity, 3*e2eTTL+2*time.Second)
	t.Logf("A at the whole capacity %v after B's last heartbeat", took.Round(time.Millisecond))
	if took > 2*e2eTTL+time.Second || took < e2eTTL {
		t.Errorf("A had the whole capacity %v after B fell silent, want between its TTL %v and 2 TTL and a second", took, e2eTTL)
	}
	if len(full.Leases) != e2ePartitions {
		t.Errorf("A at the whole capacity holds %d leases, want %d", len(full.Leases), e2ePartitions)
	}
	if err := c.leaseInvoke(c.ctx, "Demand", &sluicev1.DemandRequest{Service: "api", HolderId: bID}, new(sluicev1.DemandResponse)); status.Code(err) != codes.NotFound {
		t.Errorf("the silent holder's demand: %v, want NOT_FOUND", err)
	}
	cancel()
	wg.Wait()
	if code, m := c.post("/v1/leases/leave", coordToken, fmt.Sprintf(`{"service":"api","holder_id":%q}`, aID)); code != http.StatusNoContent {
		t.Errorf("leave: %d %v", code, m)
	}
	scrape := c.scrape(t)
	for _, want := range []string{`sluice_lease_calls_total{method="join",outcome="ok"} 2`, `sluice_lease_calls_total{method="join",outcome="too_many"} 1`,
		`sluice_lease_calls_total{method="demand",outcome="not_found"} `, "sluice_lease_holders 0\n"} {
		if !bytes.Contains(scrape, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// testLeaseShutdown joins a holder (no demand: its grant does not change)
// with an HTTP long poll and a gRPC stream waiting on it, then stops serve: both are answered at once (503,
// UNAVAILABLE) rather than holding up the drain, and serve exits 0.
func testLeaseShutdown(t *testing.T, c *coordClient, p *sluiceProcess) {
	code, m := c.post("/v1/leases/join", coordToken, `{"service":"drain","capacity":10,"partitions":2}`)
	if code != 200 {
		t.Fatalf("join: %d %v", code, m)
	}
	id := m["holder_id"].(string)
	polled := make(chan int, 1)
	// The signal goes once the poll's request is written: a request
	// still being sent when serve stops listening fails to connect.
	parked := make(chan struct{})
	var once sync.Once
	sent := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(parked) }) },
	})
	go func() {
		// A holder that states no demand holds no leases: its grant
		// does not change, and the poll waits until something ends it.
		ver := uint64(m["version"].(float64))
		for {
			code, w, err := c.do(sent, "/v1/leases/watch", coordToken, fmt.Sprintf(`{"service":"drain","holder_id":%q,"version":%d,"wait_ms":9000}`, id, ver))
			switch {
			case err != nil:
				t.Logf("the long poll (version %d): %v", ver, err)
				polled <- -1
				return
			case code != http.StatusOK:
				polled <- code
				return
			}
			ver = uint64(w["version"].(float64))
		}
	}()
	st, err := c.conn.NewStream(c.ctx, &grpc.StreamDesc{ServerStreams: true}, "/"+coord.LeaseServiceName+"/Watch")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(&sluicev1.WatchRequest{Service: "drain", HolderId: id}); err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	if err := st.RecvMsg(new(sluicev1.WatchResponse)); err != nil { // the grant at once: the stream is open
		t.Fatal(err)
	}
	streamed := make(chan error, 1)
	go func() {
		for {
			if err := st.RecvMsg(new(sluicev1.WatchResponse)); err != nil {
				streamed <- err
				return
			}
		}
	}()
	// Written is not read: a request serve has not read yet is on a
	// connection its shutdown closes as idle. Stop once serve counts
	// both watches waiting.
	<-parked
	for deadline := time.Now().Add(10 * time.Second); !bytes.Contains(c.scrape(t), []byte("sluice_lease_watches 2\n")); {
		if time.Now().After(deadline) {
			t.Fatalf("serve does not count the long poll and the stream as waiting:\n%s", c.scrape(t))
		}
		runtime.Gosched()
	}
	stopped := time.Now()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := <-polled; code != http.StatusServiceUnavailable {
		t.Errorf("a long poll at shutdown: %d, want 503", code)
	}
	if err := <-streamed; status.Code(err) != codes.Unavailable {
		t.Errorf("a stream at shutdown: %v, want UNAVAILABLE", err)
	}
	if d := time.Since(stopped); d > 5*time.Second {
		t.Errorf("the watches were answered %v after the signal, want at once (their waits were 9 s)", d)
	}
	if err := p.waitExit(t, 15*time.Second); err != nil {
		t.Errorf("serve exited with %v", err)
	}
}

// heartbeatHTTP states the holder's demand over HTTP every quarter of
// the TTL until ctx ends, acknowledging the version it saw.
func (c *coordClient) heartbeatHTTP(ctx context.Context, t *testing.T, s *leaseState, service string) {
	for {
		g, _ := s.get()
		code, m, err := c.do(ctx, "/v1/leases/demand", coordToken, fmt.Sprintf(`{"service":%q,"holder_id":%q,"backlog":1000,"version":%d}`, service, g.HolderID, g.Version))
		if err != nil {
			return
		}
		if code != 200 {
			if ctx.Err() == nil {
				t.Errorf("demand: %d %v", code, m)
			}
			return
		}
		s.set(grantOf(m))
		select {
		case <-ctx.Done():
			return
		case <-time.After(e2eTTL / 4):
		}
	}
}

func (c *coordClient) leaseInvoke(ctx context.Context, method string, in, out any) error {
	return c.conn.Invoke(ctx, "/"+coord.LeaseServiceName+"/"+method, in, out)
}

// scrape returns serve's /metrics.
func (c *coordClient) scrape(t *testing.T) []byte {
	t.Helper()
	resp, err := http.Get("http://" + c.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
