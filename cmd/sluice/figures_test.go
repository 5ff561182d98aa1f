package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestFigures measures a sluice binary under the loads, for
// bench/RESULTS.md: it runs only when -figures.bin names the binary, so
// that a build of an older commit can be measured the same way.
var (
	figuresBin   = flag.String("figures.bin", "", "TestFigures: the sluice binary to measure (empty: skip)")
	figuresArgs  = flag.String("figures.args", "", "TestFigures: extra flags of sluice serve, space-separated")
	figuresSlow  = flag.Int("figures.slow", 1500, "TestFigures: slow-body HTTP clients")
	figuresTick  = flag.Duration("figures.tick", 1500*time.Millisecond, "TestFigures: a slow client sends a byte this often")
	figuresIdle  = flag.Int("figures.idle", 1000, "TestFigures: idle gRPC connections")
	figuresWait  = flag.Duration("figures.wait", 15*time.Second, "TestFigures: how long the slow and idle clients stay before they go")
	figuresFlood = flag.Int("figures.flood", 3000, "TestFigures: connections of the gRPC flood")
	figuresGuess = flag.Duration("figures.guess", 2*time.Second, "TestFigures: how long one client guesses admin tokens")
	figuresCalm  = flag.Duration("figures.calm", 150*time.Second, "TestFigures: when to read memory again after the idle gRPC clients went (the runtime collects at least every 2 minutes, then returns memory to the OS)")
)

// figuresProcess is the measured binary, running, and a well-behaved
// client of its HTTP and gRPC listeners, each on one connection it keeps.
type figuresProcess struct {
	p    *sluiceProcess
	up   logRecord
	web  *http.Client
	conn *grpc.ClientConn
	rls  rlsv3.RateLimitServiceClient
}

func startFigures(t *testing.T) *figuresProcess {
	t.Helper()
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	args := append([]string{"serve", "--rules", dir, "--log-format", "json",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, strings.Fields(*figuresArgs)...)
	f := &figuresProcess{p: startSluice(t, *figuresBin, nil, args...)}
	f.up = f.p.next(t, "sluice serving", 10*time.Second)
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: 10 * time.Minute}
	f.web = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	conn, err := grpc.NewClient(f.up.str("grpc"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	f.conn, f.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	t.Cleanup(func() {
		conn.Close()
		tr.CloseIdleConnections()
	})
	f.latency(t, 10) // opens the connections the clients keep
	return f
}

// sample is what the process holds.
type sample struct {
	goroutines, fds int
	rssMB, heapMB   float64
	refused         string // sluice_connections_refused_total, where exported
}

func (s sample) String() string {
	str := fmt.Sprintf("goroutines %d, fds %d, RSS %.1f MB, heap in use %.1f MB", s.goroutines, s.fds, s.rssMB, s.heapMB)
	if s.refused != "" {
		str += ", refused " + s.refused
	}
	return str
}

var (
	goroutinesLine = regexp.MustCompile(`(?m)^go_goroutines (\S+)$`)
	heapLine       = regexp.MustCompile(`(?m)^go_memstats_heap_inuse_bytes (\S+)$`)
	refusedLine    = regexp.MustCompile(`(?m)^sluice_connections_refused_total\{listener="(\w+)"\} (\S+)$`)
)

// sample reads the process's goroutines from its metrics, its file
// descriptors and resident memory from /proc.
func (f *figuresProcess) sample(t *testing.T) sample {
	t.Helper()
	var s sample
	resp, err := f.web.Get("http://" + f.up.str("http") + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if m := goroutinesLine.FindSubmatch(body); m != nil {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		s.goroutines = int(v)
	}
	if m := heapLine.FindSubmatch(body); m != nil {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		s.heapMB = v / (1 << 20)
	}
	var refused []string
	for _, m := range refusedLine.FindAllSubmatch(body, -1) {
		refused = append(refused, string(m[1])+"="+string(m[2]))
	}
	s.refused = strings.Join(refused, " ")
	pid := f.p.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	s.fds = len(fds)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB$`).FindSubmatch(status); m != nil {
		kb, _ := strconv.Atoi(string(m[1]))
		s.rssMB = float64(kb) / 1024
	}
	return s
}

// latency calls the well-behaved clients n times each, one call at a time,
// and returns the median, 99th percentile and slowest answer over both.
func (f *figuresProcess) latency(t *testing.T, n int) string {
	t.Helper()
	var ds []time.Duration
	body := `{"domain":"st","descriptors":[{"entries":[{"key":"other","value":"x"}]}]}`
	req := &rlsv3.RateLimitRequest{Domain: "st", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "other", Value: "x"}}}}}
	for range n {
		start := time.Now()
		resp, err := f.web.Post("http://"+f.up.str("http")+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("check: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ds = append(ds, time.Since(start))
		start = time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		_, err = f.rls.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration { return ds[int(q*float64(len(ds)-1))].Round(time.Microsecond) }
	return fmt.Sprintf("answers p50 %v, p99 %v, max %v", at(0.5), at(0.99), ds[len(ds)-1].Round(time.Microsecond))
}

// pause waits d: the figures are read at fixed times after a load starts.
func pause(d time.Duration) { <-time.After(d) }

func TestFigures(t *testing.T) {
	if *figuresBin == "" {
		t.Skip("measures a binary given by -figures.bin")
	}
	t.Run("slow-body", func(t *testing.T) {
		f := startFigures(t)
		t.Logf("baseline: %v", f.sample(t))
		var slow []slowConn
		for range *figuresSlow {
			c, err := net.DialTimeout("tcp", f.up.str("http"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
			slow = append(slow, slowConn{c, byteStep})
		}
		tr := startTrickle(t, *figuresTick, slow...)
		pause(2 * time.Second)
		t.Logf("%d slow-body clients, +2s: %v; %s", len(slow), f.sample(t), f.latency(t, 100))
		pause(*figuresWait - 2*time.Second)
		t.Logf("+%v, clients still sending: %v; %d cut by the server", *figuresWait, f.sample(t), tr.cutCount())
		tr.close()
		pause(3 * time.Second)
		t.Logf("3s after the clients went: %v", f.sample(t))
	})
	t.Run("idle-grpc", func(t *testing.T) {
		f := startFigures(t)
		t.Logf("baseline: %v", f.sample(t))
		var idle []*grpc.ClientConn
		for range *figuresIdle {
			conn, err := grpc.NewClient(f.up.str("grpc"), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			(&figuresProcess{rls: rlsv3.NewRateLimitServiceClient(conn), web: f.web, up: f.up}).latency(t, 1)
			idle = append(idle, conn)
		}
		t.Logf("%d idle gRPC connections: %v", len(idle), f.sample(t))
		pause(*figuresWait)
		t.Logf("+%v, clients still connected: %v", *figuresWait, f.sample(t))
		for _, c := range idle {
			c.Close()
		}
		pause(3 * time.Second)
		t.Logf("3s after the clients went: %v", f.sample(t))
		pause(*figuresCalm - 3*time.Second)
		t.Logf("%v after the clients went: %v", *figuresCalm, f.sample(t))
	})
	t.Run("grpc-flood", func(t *testing.T) {
		f := startFigures(t)
		t.Logf("baseline: %v; %s", f.sample(t), f.latency(t, 100))
		var flood []net.Conn
		for range *figuresFlood {
			c, err := net.DialTimeout("tcp", f.up.str("grpc"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			flood = append(flood, c)
		}
		pause(time.Second)
		t.Logf("%d silent gRPC connections, +1s: %v; %s", len(flood), f.sample(t), f.latency(t, 100))
		for _, c := range flood {
			c.Close()
		}
		pause(3 * time.Second)
		t.Logf("3s after the flood went: %v", f.sample(t))
	})
	t.Run("admin-guess", func(t *testing.T) {
		// One client guesses the admin token as fast as one keep-alive
		// connection allows, for --figures.guess.
		dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
		p := startSluice(t, *figuresBin, []string{adminTokenEnv + "=the-token"}, "serve", "--rules", dir, "--log-format", "json",
			"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
		up := p.next(t, "sluice serving", 10*time.Second)
		go func() {
			for range p.logs { // the warnings of a limited build: counted below
			}
		}()
		web := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}, Timeout: 10 * time.Second}
		codes := map[int]int{}
		start := time.Now()
		for i := 0; time.Since(start) < *figuresGuess; i++ {
			req, _ := http.NewRequest("GET", "http://"+up.str("admin")+"/admin/v1/rules", nil)
			req.Header.Set("Authorization", fmt.Sprintf("Bearer guess-%d", i))
			resp, err := web.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[resp.StatusCode]++
		}
		took := time.Since(start)
		total := 0
		for _, n := range codes {
			total += n
		}
		t.Logf("%d wrong tokens in %v (%.0f/s), answered %v; 401s (tokens checked): %.0f/s",
			total, took.Round(time.Millisecond), float64(total)/took.Seconds(), codes, float64(codes[http.StatusUnauthorized])/took.Seconds())
	})
	t.Run("sigterm-slow-body", func(t *testing.T) {
		f := startFigures(t)
		c, err := net.DialTimeout("tcp", f.up.str("http"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
		startTrickle(t, *figuresTick, slowConn{c, byteStep})
		pause(time.Second)
		sent := time.Now()
		if err := f.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		for range f.p.logs {
		}
		err = f.p.waitExit(t, time.Minute)
		t.Logf("one slow-body client: exited %v after SIGTERM: %v", time.Since(sent).Round(time.Millisecond), err)
	})
}
