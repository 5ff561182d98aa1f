package faultnet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// ratelimitVersion is the envoyproxy/ratelimit pseudo-version bench/peers.sh
// builds (its RATELIMIT_VERSION; the module has no tagged release on the
// proxy). RATELIMIT_VERSION overrides it here too.
const ratelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"

// ratelimitBinary builds envoyproxy/ratelimit's service as bench/peers.sh
// does: go install from the Go module proxy only (checked against the
// checksum database) into a GOPATH of its own, PEERS_GOPATH if set (to
// keep its module cache between runs), else a temporary one. Nothing of
// it enters the repository. Outside CI a failed build skips the test.
func ratelimitBinary(t *testing.T) string {
	t.Helper()
	version := ratelimitVersion
	if v := os.Getenv("RATELIMIT_VERSION"); v != "" {
		version = v
	}
	gopath := os.Getenv("PEERS_GOPATH")
	if gopath == "" {
		gopath = t.TempDir()
	}
	gobin := t.TempDir()
	start := time.Now()
	build := exec.Command("go", "install", "github.com/envoyproxy/ratelimit/src/service_cmd@"+version)
	build.Dir = gobin // outside Sluice's module
	build.Env = append(os.Environ(), "GOPATH="+gopath, "GOBIN="+gobin, "GOPROXY=https://proxy.golang.org",
		"GOFLAGS=-buildvcs=false -modcacherw", "GOWORK=off", "GOTOOLCHAIN=local", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		msg := fmt.Sprintf("envoyproxy/ratelimit %s did not build from the module proxy: %v\n%.2000s", version, err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Logf("built envoyproxy/ratelimit %s in %v", version, time.Since(start).Round(time.Millisecond))
	return filepath.Join(gobin, "service_cmd")
}

// rttPeerRules: TestFaultRTT's rules (rttRules) in envoyproxy/ratelimit's
// terms: one counter per value, a limit no run reaches.
const rttPeerRules = `domain: rtt
descriptors:
  - key: envoy
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

// startRatelimit runs envoyproxy/ratelimit (the binary bin) on h, at its
// defaults but for the addresses, the config directory, statsd (off) and
// Redis (redisAddr, over TCP), and returns a client of its gRPC service from the host from once
// it decides.
func startRatelimit(t *testing.T, bin string, h, from *faultnet.Host, redisAddr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	root := t.TempDir()
	conf := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "rtt.yaml"), []byte(rttPeerRules), 0o600); err != nil {
		t.Fatal(err)
	}
	const httpPort, grpcPort, debugPort = 9080, 9081, 9082 // beside serve's
	cmd := h.Command(bin)
	cmd.Env = append(os.Environ(), "RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
		"HOST="+h.IP(), fmt.Sprint("PORT=", httpPort), "GRPC_HOST="+h.IP(), fmt.Sprint("GRPC_PORT=", grpcPort),
		"DEBUG_HOST="+h.IP(), fmt.Sprint("DEBUG_PORT=", debugPort))
	p := h.StartCmd("ratelimit", cmd)
	c := rlsClient(t, from, h.Addr(grpcPort))
	err := redisproc.Poll(30*time.Second, p.Exited(), func(ctx context.Context) (bool, string, error) {
		r, err := c.ShouldRateLimit(ctx, rlsRequest("envoy", "ready"))
		if err != nil {
			return false, "ShouldRateLimit:", err
		}
		return r.GetOverallCode() == rlsv3.RateLimitResponse_OK, r.GetOverallCode().String(), nil
	})
	if err != nil {
		t.Fatalf("envoyproxy/ratelimit on %s: %v\n%s", h.Name(), err, p.LogTail())
	}
	return c
}

// rlsClient is a gRPC client of the rate limit service at addr, dialled
// from the host from.
func rlsClient(t *testing.T, from *faultnet.Host, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return from.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// rlsRequest asks for one unit of key=value in the domain rtt.
func rlsRequest(key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "rtt", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
}

// closedLoop calls op from workers goroutines, each again as soon as its
// last call returns, for d, and returns the operations the calls recorded
// in hist; w is the worker's index.
func closedLoop(workers int, d time.Duration, op func(hist *faultnet.History, w int)) []faultnet.Op {
	var hist faultnet.History
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					op(&hist, w)
				}
			}
		})
	}
	<-time.After(d) // the measurement's own span
	close(stop)
	wg.Wait()
	return hist.Ops()
}

// failureDecisions is how many decisions s has made by a failure mode
// (sluice_decisions_total of the outcomes fail_open, fail_closed and
// local), read from its /metrics: over gRPC an answer does not tell.
func (s *serve) failureDecisions(t *testing.T) float64 {
	t.Helper()
	resp, err := s.c.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s %v", resp.Status, err)
	}
	var n float64
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "sluice_decisions_total{")
		labels, value, cut := strings.Cut(rest, "} ")
		if !ok || !cut || !strings.Contains(labels, `outcome="fail_open"`) &&
			!strings.Contains(labels, `outcome="fail_closed"`) && !strings.Contains(labels, `outcome="local"`) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("/metrics: %q: %v", line, err)
		}
		n += v
	}
	return n
}

// TestFaultRTTPeer: TestFaultRTT beside envoyproxy/ratelimit. Sluice
// serve (strict, batched and approximate counting) and envoyproxy/ratelimit
// run on one host and decide on one Redis reached through one delaying
// relay; 16 closed-loop clients on another host call ShouldRateLimit over
// gRPC (each on a key of its own, one connection per service), 2 s per
// system, the four in turn, three rounds at each of 0.1, 1 and 10 ms round
// trip. envoyproxy/ratelimit runs at its defaults (a pool of 10 Redis
// connections; an error when Redis fails), serve at its own (a 50 ms
// Redis timeout, past which the failure mode decides). Measured:
// admissions a second (no limit is reached, so every call should be
// admitted) and p50/p99 of every answer, each the median over the rounds
// of the ratio to Sluice strict's in the same round; how many decisions
// serve made by the failure mode and how many calls its overload guard
// shed (answered OVER_LIMIT, the only denial here). Checked: strict and
// envoyproxy/ratelimit, which wait for Redis on every decision, take at
// least the round trip at p50 — the relay is on their path — and no
// system leaves a call without an answer.
func TestFaultRTTPeer(t *testing.T) {
	inMakeFaults(t)
	n := faultnet.New(t)
	bin := ratelimitBinary(t)
	rh, wh, sh, ch := n.Host("redis"), n.Host("wan"), n.Host("serve"), n.Host("client")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	relay := wh.Relay(redisPort, redis.Addr(), 50*time.Microsecond)
	envoy := startRatelimit(t, bin, sh, ch, relay.Addr())
	// SERVEFLAGS: more flags for serve, as bench/rls.sh takes them.
	srv := startServe(t, sh, ch, rttRules, append([]string{"--store", "redis", "--redis-addr", relay.Addr()},
		strings.Fields(os.Getenv("SERVEFLAGS"))...)...)
	sluice := rlsClient(t, ch, sh.Addr(grpcPort))

	const (
		workers = 16
		span    = 2 * time.Second
		rounds  = 3
	)
	systems := []struct {
		name, key string // the descriptor key: rttRules' counting mode, or rttPeerRules'
		c         rlsv3.RateLimitServiceClient
		srv       *serve // Sluice's, whose failure-mode decisions are counted
	}{{"strict", "strict", sluice, srv}, {"batched", "batched", sluice, srv}, {"approximate", "approximate", sluice, srv},
		{"envoyproxy/ratelimit", "envoy", envoy, nil}}
	type result struct {
		rate      float64 // admitted a second: the only answer of the limits here
		lat       faultnet.LatencyReport
		failed    int // calls without a decision
		denied    int // OVER_LIMIT: no limit is reached, so serve's overload guard shed it
		byFailure int // decisions by Sluice's failure mode (a Redis call past the 50 ms timeout)
	}
	measure := func(key string, c rlsv3.RateLimitServiceClient, srv *serve, d time.Duration) result {
		var before float64
		if srv != nil {
			before = srv.failureDecisions(t)
		}
		reqs := make([]*rlsv3.RateLimitRequest, workers)
		for w := range reqs {
			reqs[w] = rlsRequest(key, fmt.Sprint(w))
		}
		ops := closedLoop(workers, d, func(hist *faultnet.History, w int) {
			op := faultnet.Op{Client: w, Start: time.Now(), Outcome: faultnet.Failed}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r, err := c.ShouldRateLimit(ctx, reqs[w])
			cancel()
			op.End = time.Now()
			switch {
			case err != nil:
				op.Reason = err.Error()
			case r.GetOverallCode() == rlsv3.RateLimitResponse_OK:
				op.Outcome = faultnet.Admitted
			default:
				op.Outcome = faultnet.Denied
			}
			hist.Add(op)
		})
		r := result{lat: faultnet.CheckLatency(ops, time.Second)}
		for _, op := range ops {
			switch op.Outcome {
			case faultnet.Failed:
				r.failed++
			case faultnet.Denied:
				r.denied++
			}
		}
		r.rate = float64(len(ops)-r.failed-r.denied) / d.Seconds()
		if srv != nil {
			r.byFailure = int(srv.failureDecisions(t) - before)
		}
		return r
	}
	median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	for _, rtt := range []time.Duration{100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond} {
		relay.SetDelay(rtt / 2)
		res := make([][]result, len(systems)) // [system][round]
		for round := range rounds {
			for i, s := range systems {
				if round == 0 {
					measure(s.key, s.c, s.srv, 300*time.Millisecond) // warm: connections, leases, views
				}
				res[i] = append(res[i], measure(s.key, s.c, s.srv, span))
			}
		}
		for i, s := range systems {
			var rate, p50, p99, rateX, p50X, p99X []float64
			failed, denied, byFailure, decided := 0, 0, 0, 0
			for round, r := range res[i] {
				base := res[0][round]
				rate, p50, p99 = append(rate, r.rate), append(p50, float64(r.lat.P50)), append(p99, float64(r.lat.P99))
				rateX, p50X, p99X = append(rateX, r.rate/base.rate), append(p50X, float64(r.lat.P50)/float64(base.lat.P50)),
					append(p99X, float64(r.lat.P99)/float64(base.lat.P99))
				failed, denied, byFailure, decided = failed+r.failed, denied+r.denied, byFailure+r.byFailure, decided+r.lat.N-r.failed
			}
			m50, m99 := time.Duration(median(p50)).Round(10*time.Microsecond), time.Duration(median(p99)).Round(10*time.Microsecond)
			measured := fmt.Sprintf("%.0f admitted/s (%.2f× Sluice strict), p50 %v (%.2f×), p99 %v (%.2f×) of %d answers",
				median(rate), median(rateX), m50, median(p50X), m99, median(p99X), decided)
			if s.srv != nil {
				measured += fmt.Sprintf(", %d by the failure mode", byFailure)
			}
			measured += fmt.Sprintf(", %d shed (OVER_LIMIT), %d calls without one", denied, failed)
			t.Logf("rtt %v %-20s %s", rtt, s.name, measured)
			row(t, fmt.Sprintf("RTT %v between the service and Redis (a delaying relay), %d closed-loop gRPC clients, %s; medians of %d interleaved rounds", rtt, workers, s.name, rounds), measured)
			if failed > 0 {
				t.Errorf("rtt %v: %s left %d calls without an answer", rtt, s.name, failed)
			}
			if (s.key == "strict" || s.key == "envoy") && time.Duration(median(p50)) < rtt {
				t.Errorf("rtt %v: %s's p50 %v is less than the round trip to Redis", rtt, s.name, m50)
			}
		}
	}
}
