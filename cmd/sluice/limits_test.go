package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// inProcess is serve running in this process, and one well-behaved client
// of each listener, each on a single connection it keeps.
type inProcess struct {
	up   map[string]string
	web  *http.Client // the HTTP and admin listeners
	conn *grpc.ClientConn
	rls  rlsv3.RateLimitServiceClient
}

// startInProcess serves the test rules in memory on free loopback ports,
// with the default limits changed by mod, and connects its clients. When
// the test ends it stops serve and checks that it stopped cleanly.
func startInProcess(t *testing.T, mod func(*limitsConfig)) *inProcess {
	t.Helper()
	cfg := serveConfig{
		rulesDir: rulesDir(t, map[string]string{"st.yaml": testRuleFile}), store: "memory",
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", adminAddr: "127.0.0.1:0", adminToken: "tok",
		maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second, limits: defaultLimits(),
	}
	mod(&cfg.limits)
	h := recordHandler{ch: make(chan map[string]string, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(h)) }()
	p := &inProcess{up: waitServing(t, h, done)}
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}
	p.web = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	conn, err := grpc.NewClient(p.up["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.conn, p.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	t.Cleanup(func() {
		conn.Close()
		tr.CloseIdleConnections()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("serve did not stop")
		}
	})
	// One call on each listener opens the connection the client keeps.
	p.check(t)
	p.decide(t)
	p.adminRules(t)
	return p
}

// timed runs call and returns how long it took.
func timed(t *testing.T, call func(*testing.T)) time.Duration {
	t.Helper()
	start := time.Now()
	call(t)
	return time.Since(start)
}

// check asks POST /v1/check about a descriptor no rule limits.
func (p *inProcess) check(t *testing.T) {
	t.Helper()
	resp, err := p.web.Post("http://"+p.up["http"]+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"st","descriptors":[{"entries":[{"key":"other","value":"x"}]}]}`))
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("check: %d", resp.StatusCode)
	}
}

// decide asks ShouldRateLimit about a descriptor no rule limits.
func (p *inProcess) decide(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	out, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "st",
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "other", Value: "x"}}}}})
	if err != nil || out.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v", out, err)
	}
}

// adminRules asks the admin API for the rules.
func (p *inProcess) adminRules(t *testing.T) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+p.up["admin"]+"/admin/v1/rules", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := p.web.Do(req)
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("admin: %d", resp.StatusCode)
	}
}

// answerTimes calls each well-behaved client n times and returns the
// slowest answer of each, by listener.
func (p *inProcess) answerTimes(t *testing.T, n int) map[string]time.Duration {
	t.Helper()
	worst := map[string]time.Duration{}
	for range n {
		worst["http"] = max(worst["http"], timed(t, p.check))
		worst["grpc"] = max(worst["grpc"], timed(t, p.decide))
		worst["admin"] = max(worst["admin"], timed(t, p.adminRules))
	}
	return worst
}

// connMetrics returns the value of sluice_connections_<name> for each
// listener, read from GET /metrics.
func (p *inProcess) connMetrics(t *testing.T, name string) map[string]int {
	t.Helper()
	resp, err := p.web.Get("http://" + p.up["http"] + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	re := regexp.MustCompile(`(?m)^sluice_connections_` + name + `\{listener="(\w+)"\} (\S+)$`)
	got := map[string]int{}
	for _, m := range re.FindAllSubmatch(body, -1) {
		v, err := strconv.ParseFloat(string(m[2]), 64)
		if err != nil {
			t.Fatal(err)
		}
		got[string(m[1])] = int(v)
	}
	if len(got) != 3 {
		t.Fatalf("sluice_connections_%s: %v, want grpc, http and admin in\n%s", name, got, body)
	}
	return got
}

// openFDs is the number of file descriptors this process has open, or -1
// where /proc does not tell.
func openFDs() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(fds)
}

// eventually polls cond until it holds, for at most within, and returns how
// long that took. It is for what only a count can tell, such as goroutines
// that have ended.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// goroutineSlack is how far the goroutine count may stray from its
// baseline for reasons of no interest here: a gRPC client reconnecting, a
// timer, the race detector.
const goroutineSlack = 12

// TestServeSlowClientsAreCut: clients that send their header or body a byte
// at a time, on every listener, are cut once their time is up, while they
// are still sending; meanwhile well-behaved clients are answered at once;
// and the goroutines and file descriptors they held come back.
func TestServeSlowClientsAreCut(t *testing.T) {
	p := startInProcess(t, func(l *limitsConfig) {
		l.httpReadHeaderTimeout = 300 * time.Millisecond
		l.httpReadTimeout = time.Second
		l.grpcHandshakeTimeout = 300 * time.Millisecond
		l.grpcMaxConnAge = time.Second
		l.grpcMaxConnAgeGrace = 500 * time.Millisecond
	})
	g0, f0 := runtime.NumGoroutine(), openFDs()
	open0, accepted0 := p.connMetrics(t, "open"), p.connMetrics(t, "accepted_total")

	const n = 10
	var slow []slowConn
	for range n {
		slow = append(slow,
			slowConn{slowBody(t, p.up["http"], "POST", "/v1/check", ""), byteStep},
			slowConn{slowHeader(t, p.up["http"]), byteStep},
			slowConn{slowBody(t, p.up["admin"], "PUT", "/admin/v1/overrides/st/per_user", "Authorization: Bearer tok\r\n"), byteStep},
			slowConn{slowHeader(t, p.up["admin"]), byteStep},
			slowConn{dialRaw(t, p.up["grpc"]), prefaceStep()},
		)
		c, streams, _ := slowStreams(t, p.up["grpc"], 4)
		slow = append(slow, slowConn{c, dataStep(streams)})
	}
	tr := startTrickle(t, 100*time.Millisecond, slow...)
	// Every slow client was let in: none of this is about the caps. A
	// dial returns once the kernel has the connection, before serve's
	// accept loop counts it: on a loaded machine the last are counted a
	// little later.
	eventually(t, 5*time.Second, fmt.Sprintf("%d more connections accepted on http and admin than %v", 2*n, accepted0), func() bool {
		accepted := p.connMetrics(t, "accepted_total")
		return accepted["http"]-accepted0["http"] >= 2*n && accepted["admin"]-accepted0["admin"] >= 2*n
	})
	held := runtime.NumGoroutine()

	worst := p.answerTimes(t, 10)
	t.Logf("slowest answers with %d slow clients on: %v", len(slow), worst)
	for name, d := range worst {
		if d > time.Second {
			t.Errorf("%s: a well-behaved client waited %v with slow clients on", name, d)
		}
	}

	// The slow clients are still sending, and the server closes them: each
	// sees a write fail.
	took := eventually(t, 10*time.Second, "every slow client's connection closed by the server", func() bool {
		return tr.cutCount() == len(slow)
	})
	back := eventually(t, 10*time.Second, "connections and goroutines back to the baseline", func() bool {
		open := p.connMetrics(t, "open")
		return open["http"] <= open0["http"] && open["admin"] <= open0["admin"] && open["grpc"] <= open0["grpc"] &&
			runtime.NumGoroutine() <= g0+goroutineSlack
	})
	t.Logf("goroutines %d at the start, %d with %d slow clients; all cut within %v, goroutines back to %d %v later",
		g0, held, len(slow), took.Round(time.Millisecond), runtime.NumGoroutine(), back.Round(time.Millisecond))
	select {
	case <-tr.done:
		t.Fatal("the trickle stopped before the server cut its clients")
	default:
	}
	tr.close()
	if f0 >= 0 {
		eventually(t, 10*time.Second, "file descriptors back to the baseline", func() bool { return openFDs() <= f0+2 })
	}
}

// TestServeConnectionFlood: connections beyond a listener's cap are closed
// at once and counted, on every listener; the clients already connected
// are answered meanwhile; the goroutines held stay within the cap, and
// come back with the file descriptors once the flood's clients go.
func TestServeConnectionFlood(t *testing.T) {
	caps := map[string]int{"http": 8, "admin": 4, "grpc": 8}
	p := startInProcess(t, func(l *limitsConfig) {
		l.httpMaxConns, l.adminMaxConns, l.grpcMaxConns = caps["http"], caps["admin"], caps["grpc"]
		// The flood's silent connections keep their places for the
		// whole test.
		l.httpReadHeaderTimeout, l.grpcHandshakeTimeout = time.Minute, time.Minute
	})
	g0, f0 := runtime.NumGoroutine(), openFDs()
	open0, accepted0 := p.connMetrics(t, "open"), p.connMetrics(t, "accepted_total")

	flood := map[string][]net.Conn{}
	for name, cap := range caps {
		for range 4 * cap {
			flood[name] = append(flood[name], dialRaw(t, p.up[name]))
		}
	}
	// The last of each flood is beyond the cap: closed at once.
	for name, conns := range flood {
		if err := readUntilClosed(conns[len(conns)-1], 5*time.Second); !errors.Is(err, errClosedByServer) {
			t.Errorf("%s: a connection beyond the cap: %v; want it closed at once", name, err)
		}
	}
	eventually(t, 10*time.Second, "every connection of the flood accepted or refused", func() bool {
		accepted, refused := p.connMetrics(t, "accepted_total"), p.connMetrics(t, "refused_total")
		for name := range caps {
			if accepted[name]-accepted0[name]+refused[name] < len(flood[name]) {
				return false
			}
		}
		return true
	})
	open, refused, maxes := p.connMetrics(t, "open"), p.connMetrics(t, "refused_total"), p.connMetrics(t, "max")
	for name, cap := range caps {
		if open[name] != cap || maxes[name] != cap {
			t.Errorf("%s: %d connections open, sluice_connections_max %d; want the cap, %d", name, open[name], maxes[name], cap)
		}
		if want := len(flood[name]) - (cap - open0[name]); refused[name] != want {
			t.Errorf("%s: %d refused, want %d", name, refused[name], want)
		}
	}
	held := runtime.NumGoroutine()
	if limit := g0 + caps["http"] + caps["admin"] + caps["grpc"] + goroutineSlack; held > limit {
		t.Errorf("%d goroutines during the flood, %d before it; want at most %d", held, g0, limit)
	}
	worst := p.answerTimes(t, 10)
	t.Logf("flood of %d connections: slowest answers %v; goroutines %d before, %d during; refused %v",
		len(flood["http"])+len(flood["admin"])+len(flood["grpc"]), worst, g0, held, refused)
	for name, d := range worst {
		if d > time.Second {
			t.Errorf("%s: a connected client waited %v during the flood", name, d)
		}
	}

	for _, conns := range flood {
		for _, c := range conns {
			c.Close()
		}
	}
	eventually(t, 10*time.Second, "connections, goroutines and file descriptors back to the baseline", func() bool {
		open := p.connMetrics(t, "open")
		return open["http"] == open0["http"] && open["admin"] == open0["admin"] && open["grpc"] == open0["grpc"] &&
			runtime.NumGoroutine() <= g0+goroutineSlack && openFDs() <= f0+2
	})
}

// TestServeGRPCMaxStreams: calls beyond --grpc-max-streams on one
// connection are refused (RST_STREAM REFUSED_STREAM), so a client holding
// calls open holds at most that many handlers; other clients are answered.
func TestServeGRPCMaxStreams(t *testing.T) {
	const streams = 4
	p := startInProcess(t, func(l *limitsConfig) { l.grpcMaxStreams = streams })
	g0 := runtime.NumGoroutine()
	c, accepted, refused := slowStreams(t, p.up["grpc"], 3*streams)
	startTrickle(t, 100*time.Millisecond, slowConn{c, dataStep(accepted)})
	if len(accepted) != streams || refused != 2*streams {
		t.Errorf("%d calls accepted, %d refused; want %d and %d", len(accepted), refused, streams, 2*streams)
	}
	if held, limit := runtime.NumGoroutine(), g0+streams+goroutineSlack; held > limit {
		t.Errorf("%d goroutines with %d calls held open, %d before; want at most %d", held, len(accepted), g0, limit)
	}
	if d := timed(t, p.decide); d > time.Second {
		t.Errorf("another client waited %v", d)
	}
}

// TestServeIdleGRPCReclaimed: gRPC connections without a call for
// --grpc-max-conn-idle are closed by the server (GOAWAY), though their
// clients keep them; the clients see it as their connection going idle.
func TestServeIdleGRPCReclaimed(t *testing.T) {
	p := startInProcess(t, func(l *limitsConfig) { l.grpcMaxConnIdle = time.Second })
	g0, f0 := runtime.NumGoroutine(), openFDs()
	const n = 20
	var idle []*grpc.ClientConn
	for range n {
		conn, err := grpc.NewClient(p.up["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		(&inProcess{rls: rlsv3.NewRateLimitServiceClient(conn)}).decide(t) // connected
		idle = append(idle, conn)
	}
	if open := p.connMetrics(t, "open"); open["grpc"] < n {
		t.Fatalf("%d gRPC connections open, want at least %d", open["grpc"], n)
	}
	took := eventually(t, 10*time.Second, "idle gRPC connections closed by the server", func() bool {
		return p.connMetrics(t, "open")["grpc"] <= 1 // at most the well-behaved client's
	})
	t.Logf("%d idle gRPC connections closed by the server %v after their last call", n, took.Round(time.Millisecond))
	for i, conn := range idle {
		if s := conn.GetState(); s != connectivity.Idle {
			t.Errorf("client %d: %v, want IDLE: the server closed its connection", i, s)
		}
		conn.Close()
	}
	eventually(t, 10*time.Second, "goroutines and file descriptors back to the baseline", func() bool {
		return runtime.NumGoroutine() <= g0+goroutineSlack && openFDs() <= f0+2
	})
}

// TestServeLimitFlags: every limit has a flag, documented by help, whose
// zero or negative value is a usage error naming it; the defaults are
// valid, and a config built in code gets them for the fields it leaves out.
func TestServeLimitFlags(t *testing.T) {
	stdout, _, err := runArgs(t, t.Context(), "help", "serve")
	if err != nil {
		t.Fatal(err)
	}
	d := defaultLimits()
	if err := d.validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	for _, f := range d.flags() {
		if !strings.Contains(stdout, "-"+f.name+" ") && !strings.Contains(stdout, "-"+f.name+"\n") {
			t.Errorf("help serve does not list --%s", f.name)
		}
		if f.b != nil {
			continue
		}
		for _, v := range []string{"0", "-1"} {
			if f.d != nil {
				v += "s"
			}
			_, _, err := runArgs(t, t.Context(), "serve", "--"+f.name, v)
			var uerr usageError
			if !errors.As(err, &uerr) || !strings.Contains(err.Error(), "--"+f.name) {
				t.Errorf("--%s %s: %v; want a usage error naming the flag", f.name, v, err)
			}
		}
	}
	_, _, err = runArgs(t, t.Context(), "serve", "--grpc-max-streams", fmt.Sprint(1<<32))
	if !strings.Contains(fmt.Sprint(err), "--grpc-max-streams") {
		t.Errorf("--grpc-max-streams 2^32: %v; want a usage error", err)
	}
	_, _, err = runArgs(t, t.Context(), "serve", "--shutdown-timeout", "0s")
	if !strings.Contains(fmt.Sprint(err), "--shutdown-timeout") {
		t.Errorf("--shutdown-timeout 0s: %v; want a usage error", err)
	}

	got := limitsConfig{grpcMaxStreams: 7}.withDefaults()
	want := defaultLimits()
	want.grpcMaxStreams = 7
	if got != want {
		t.Errorf("withDefaults = %+v, want %+v", got, want)
	}
}

// TestDrainReportsStuckCalls: a call that has not returned a second after
// its connection was closed at the shutdown deadline is stuck in the
// service itself, not waiting on its client: drain reports it, so that
// serve exits 1.
func TestDrainReportsStuckCalls(t *testing.T) {
	lim := defaultLimits()
	entered, release := make(chan struct{}), make(chan struct{})
	hs := newHTTPServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release // deaf to its request's context: stuck
	}), &lim)
	var lc net.ListenConfig
	lns := &listeners{}
	var err error
	if lns.http, err = listenCapped(t.Context(), &lc, "127.0.0.1:0", 4); err != nil {
		t.Fatal(err)
	}
	if lns.grpc, err = listenCapped(t.Context(), &lc, "127.0.0.1:0", 4); err != nil {
		t.Fatal(err)
	}
	defer lns.close()
	s := &servers{grpc: grpc.NewServer(), http: hs}
	served := make(chan error, 2)
	go func() { served <- ignoreClosed(hs.Serve(lns.http)) }()
	go func() { served <- s.grpc.Serve(lns.grpc) }()
	called := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + lns.http.Addr().String() + "/")
		if err == nil {
			resp.Body.Close()
		}
		called <- err
	}()
	<-entered

	cfg := &serveConfig{store: "memory", shutdownTimeout: 100 * time.Millisecond}
	start := time.Now()
	err = s.drain(cfg, lns, slog.New(slog.DiscardHandler))
	took := time.Since(start)
	close(release)
	if err == nil || !strings.Contains(err.Error(), "HTTP calls still running 1s after their connections were closed") {
		t.Errorf("drain with a stuck call: %v; want the stuck calls reported", err)
	}
	if took < cfg.shutdownTimeout+cutGrace(cfg) || took > cfg.shutdownTimeout+cutGrace(cfg)+time.Second {
		t.Errorf("drain took %v; want the timeout and the grace, %v", took, cfg.shutdownTimeout+cutGrace(cfg))
	}
	if err := <-called; err == nil {
		t.Error("the stuck call's client got an answer; want its connection closed")
	}
	for range 2 {
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve: %v", err)
		}
	}
}
