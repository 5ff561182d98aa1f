package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/fence"
	"github.com/sluicehq/sluice/internal/coord"
	"github.com/sluicehq/sluice/internal/coord/sluicev1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The scenario's Go workers are this test binary run again
// (TestSemaphoreScenarioChild); these variables tell a child what to do.
// Only tests read them.
const (
	scenChildEnv   = "SLUICE_SEMSCEN_CHILD" // "lib", "grpc" or "stale"
	scenRedisEnv   = "SLUICE_SEMSCEN_REDIS"
	scenGRPCEnv    = "SLUICE_SEMSCEN_GRPC"
	scenStubEnv    = "SLUICE_SEMSCEN_STUB"
	scenNameEnv    = "SLUICE_SEMSCEN_NAME"
	scenLimitEnv   = "SLUICE_SEMSCEN_LIMIT"
	scenTTLEnv     = "SLUICE_SEMSCEN_TTL"
	scenThreadsEnv = "SLUICE_SEMSCEN_THREADS"
	scenFairEnv    = "SLUICE_SEMSCEN_FAIR"
	scenIDEnv      = "SLUICE_SEMSCEN_ID"
	scenTimeoutEnv = "SLUICE_SEMSCEN_TIMEOUT"
)

// scenConfig is one run of the semaphores scenario.
type scenConfig struct {
	lib, grpc, python int           // worker processes: the Go library on Redis, Go through serve's gRPC, Python through serve's HTTP
	threads           int           // acquiring loops per worker
	limit             int64         // permits
	ttl               time.Duration // the library's and Python's permits' TTL (gRPC workers ask 10 s and do not renew)
	callMin, callMax  time.Duration // the stub's work per call, uniform
	warm, steady      time.Duration // after the stub first sees limit calls at once: not measured, then measured
	redisTimeout      time.Duration // serve's --redis-timeout and the library workers' client's Timeout; 0 for the default, redisstore.DefaultTimeout
	fair              bool
	kill, stale       bool // the sub-scenarios: a worker SIGKILLed holding permits; one SIGSTOPped between its check and its call
}

// scenFigures is what a run measured over its steady window.
type scenFigures struct {
	window                      time.Duration
	grants                      int64   // calls the stub received in the window: one per grant
	transient, calls            int64   // whole run: acquires and releases that failed with the store's error (T lines; an acquire is retried after 50 ms, a permit not released lapses), calls the stub received
	util                        float64 // permit-seconds inside the stub ÷ (limit × window)
	peak                        int64   // most calls inside the stub at once, whole run
	scripts, commands           float64 // per grant: script runs (EVALSHA, EVAL: round trips), and every command Redis counted (those the scripts run included)
	perKind                     map[string][]time.Duration
	cpuServe, cpuWork, cpuRedis time.Duration // CPU per grant: serve, every worker, redis-server
	killFreed, killRefilled     time.Duration // after the SIGKILL: the victim's permits gone from the store; the stub back at the limit
	loadavg                     string
}

// p returns the q-quantile of the acquire latencies of kind ("" for all).
func (f *scenFigures) p(kind string, q float64) time.Duration {
	var all []time.Duration
	for k, ds := range f.perKind {
		if kind == "" || k == kind {
			all = append(all, ds...)
		}
	}
	return quantile(all, q)
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func (f *scenFigures) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "window %v, %d grants (%.0f/s), utilisation %.2f%%, peak %d; per grant: %.2f script calls, %.2f Redis commands; CPU per grant: serve %v, workers %v, redis %v; load %s\n",
		f.window.Round(time.Millisecond), f.grants, float64(f.grants)/f.window.Seconds(), 100*f.util, f.peak, f.scripts, f.commands,
		f.cpuServe.Round(time.Microsecond), f.cpuWork.Round(time.Microsecond), f.cpuRedis.Round(time.Microsecond), f.loadavg)
	fmt.Fprintf(&b, "  whole run: %d calls at the stub, %d acquires or releases failed with a store error\n", f.calls, f.transient)
	for _, k := range []string{"", "lib", "grpc", "python"} {
		name := k
		if k == "" {
			name = "all"
		}
		n := len(f.perKind[k])
		if k == "" {
			n = 0
			for _, ds := range f.perKind {
				n += len(ds)
			}
		}
		fmt.Fprintf(&b, "  acquire %-6s n=%4d p50 %8v p99 %8v\n", name, n, f.p(k, 0.5).Round(10*time.Microsecond), f.p(k, 0.99).Round(10*time.Microsecond))
	}
	if f.killFreed > 0 {
		fmt.Fprintf(&b, "  SIGKILL: the victim's permits gone from the store after %v, the stub back at the limit after %v\n", f.killFreed.Round(time.Millisecond), f.killRefilled.Round(time.Millisecond))
	}
	return b.String()
}

// TestSemaphoreScenario is the proof for semaphores, in real
// processes on loopback: one sluice serve on a redis-server of the
// test's, and 20 worker processes — 6 Go processes on the library's
// SemaphoreStore on the same Redis directly, 6 Go processes through
// serve's gRPC API, 8 Python processes through its HTTP API
// (clients/python/sluice.py) — share one semaphore of 50 permits to a
// stub API that counts the calls inside it, each call carrying its
// permit's fence. It checks that the stub never has more than 50 calls
// inside; that under saturating demand (80 loops for 50 permits) the
// permits are in use at the stub at least 95% of the time; that every
// grant's fence is new, whichever path granted it (one counter, one
// store: serve is one more user of the library's keys); that each worker
// made calls; that the permits of a worker SIGKILLed while holding them
// leave the store within the TTL (and not before half of it: they
// lapsed, nobody released them) and are taken again; and, when serve
// answers POST /v1/semaphores/holders, that a worker SIGSTOPped between
// its local check of its permit and its call, past its TTL, is refused
// by a stub that admits only the fences serve lists.
func TestSemaphoreScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary, 20 worker processes")
	}
	f := runScenario(t, scenConfig{
		lib: 6, grpc: 6, python: 8, threads: 4, limit: 50, ttl: 2 * time.Second,
		callMin: 100 * time.Millisecond, callMax: 600 * time.Millisecond,
		warm: 2 * time.Second, steady: 8 * time.Second, kill: true, stale: true,
		// The Go workers are this race-instrumented binary on a shared
		// machine: a Redis call's 50 ms default bound is often spent
		// before the call is sent (see bench/RESULTS.md, section 19).
		// A waiting acquire now waits through that, but a release still
		// fails, and its permit stays taken until its TTL: at 50 ms, 0
		// to 27 releases failed a run, and utilisation fell below 95%
		// in 3 runs of 7 on a loaded machine.
		redisTimeout: 250 * time.Millisecond,
	})
	t.Logf("scenario:\n%s", f)
	if f.transient > f.calls/50 {
		t.Errorf("%d acquires or releases failed with the store's error (timeout %v), %d calls made: more than 2%%", f.transient, 250*time.Millisecond, f.calls)
	}
	if f.util < 0.95 {
		t.Errorf("utilisation %.2f%% over the steady window, want at least 95%% under saturating demand", 100*f.util)
	}
}

// scenario is a running scenario: its processes and what they report.
type scenario struct {
	t     *testing.T
	cfg   scenConfig
	name  string
	redis string // its address
	stub  *scenStub
	mu    sync.Mutex
	acqs  []scenSample // acquire latencies, as the lines arrive
	errs  []string     // E lines
	trans []string     // T lines: an acquire failed with the store's error
	procs []*scenWorker
}

type scenSample struct {
	at   time.Time
	kind string
	d    time.Duration
}

// scenWorker is a worker process and the lines it prints, A and E lines
// apart (kept by the scenario).
type scenWorker struct {
	kind, id  string
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	lines     chan string
	exit      chan error
	exited    bool
	stderr    lockedWriter
	stderrBuf bytes.Buffer
}

func (w *scenWorker) stderrText() string {
	w.stderr.mu.Lock()
	defer w.stderr.mu.Unlock()
	return w.stderrBuf.String()
}

// start starts cmd as a worker of kind; it is killed (by its PID) when
// the test ends if it still runs.
func (s *scenario) start(kind, id string, cmd *exec.Cmd) *scenWorker {
	t := s.t
	t.Helper()
	w := &scenWorker{kind: kind, id: id, cmd: cmd, lines: make(chan string, 256), exit: make(chan error, 1)}
	w.stderr.w = &w.stderrBuf
	cmd.Stderr = &w.stderr
	dieWithParent(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(w.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l := sc.Text()
			switch {
			case strings.HasPrefix(l, "A "):
				us, err := strconv.ParseInt(l[2:], 10, 64)
				s.mu.Lock()
				if err != nil {
					s.errs = append(s.errs, fmt.Sprintf("%s %s: %q", kind, id, l))
				} else {
					s.acqs = append(s.acqs, scenSample{time.Now(), kind, time.Duration(us) * time.Microsecond})
				}
				s.mu.Unlock()
			case strings.HasPrefix(l, "E "):
				s.mu.Lock()
				s.errs = append(s.errs, fmt.Sprintf("%s %s: %s", kind, id, l[2:]))
				s.mu.Unlock()
			case strings.HasPrefix(l, "T "):
				s.mu.Lock()
				s.trans = append(s.trans, fmt.Sprintf("%s %s: %s", kind, id, l[2:]))
				s.mu.Unlock()
			default:
				w.lines <- l
			}
		}
	}()
	go func() {
		<-readDone
		w.exit <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if !w.exited {
			_ = cmd.Process.Kill() // only the process this test started; an error if it has exited
			<-w.exit
		}
	})
	s.procs = append(s.procs, w)
	return w
}

// expect returns the fields after prefix of the next line starting with
// it (other lines, such as the testing package's, are skipped).
func (w *scenWorker) expect(t *testing.T, prefix string, within time.Duration) []string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				t.Fatalf("%s worker %s exited before printing %q: %v\n%s", w.kind, w.id, prefix, <-w.exit, w.stderrText())
			}
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(strings.TrimPrefix(l, prefix))
			}
		case <-deadline:
			t.Fatalf("%s worker %s printed no %q within %v\n%s", w.kind, w.id, prefix, within, w.stderrText())
			return nil
		}
	}
}

// wait waits for the worker to exit, within d, and returns how.
func (w *scenWorker) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-w.exit:
		w.exited = true
		return err
	case <-time.After(d):
		t.Fatalf("%s worker %s did not exit within %v\n%s", w.kind, w.id, d, w.stderrText())
		return nil
	}
}

// goChild returns the command of a Go worker of mode.
func (s *scenario) goChild(mode, id string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestSemaphoreScenarioChild$", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), append([]string{scenChildEnv + "=" + mode, scenIDEnv + "=" + id, scenNameEnv + "=" + s.name,
		scenLimitEnv + "=" + strconv.FormatInt(s.cfg.limit, 10), scenThreadsEnv + "=" + strconv.Itoa(s.cfg.threads),
		scenFairEnv + "=" + strconv.FormatBool(s.cfg.fair), scenStubEnv + "=" + s.stub.url}, env...)...)
	return cmd
}

// runScenario runs cfg and returns its figures, failing t when an
// invariant breaks.
func runScenario(t *testing.T, cfg scenConfig) *scenFigures {
	python := needPython(t)
	bin := buildSluice(t)
	rs := redistest.Standalone(t)
	rc := rs.Client()
	tokenFile := filepath.Join(t.TempDir(), "coord-token")
	if err := os.WriteFile(tokenFile, []byte(coordToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	timeout := cmp.Or(cfg.redisTimeout, redisstore.DefaultTimeout)
	serve := startSluice(t, bin, []string{"SLUICE_COORD_TOKEN="}, "serve", "--rules", rulesDir(t, map[string]string{"st.yaml": testRuleFile}),
		"--log-format", "json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--coord-token-file", tokenFile,
		"--store", "redis", "--redis-addr", rs.Addr(), "--redis-timeout", timeout.String())
	up := serve.next(t, "sluice serving", 20*time.Second)
	serveHTTP, serveGRPC := "http://"+up.str("http"), up.str("grpc")

	// serve's semaphores live under its --redis-prefix (default
	// redisstore.DefaultPrefix) + "sem:": the library's default.
	if want := redisstore.DefaultPrefix + "sem:"; redisstore.DefaultSemaphorePrefix != want {
		t.Fatalf("the library's semaphore prefix %q is not serve's default %q", redisstore.DefaultSemaphorePrefix, want)
	}
	store, err := redisstore.NewSemaphoreStore(rc, redisstore.SemaphoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := &scenario{t: t, cfg: cfg, name: "partner-api", redis: rs.Addr()}
	s.stub = newScenStub(s.name, cfg)
	s.stub.holders = func(ctx context.Context) (map[uint64]bool, int, error) { return holders(ctx, serveHTTP, s.name) }
	srv := httptest.NewServer(s.stub)
	defer srv.Close()
	s.stub.url = srv.URL

	// The workers.
	redisEnv := scenRedisEnv + "=" + rs.Addr()
	ttlEnv := scenTTLEnv + "=" + cfg.ttl.String()
	timeoutEnv := scenTimeoutEnv + "=" + timeout.String()
	var libs []*scenWorker
	for i := range cfg.lib {
		libs = append(libs, s.start("lib", "lib"+strconv.Itoa(i), s.goChild("lib", "lib"+strconv.Itoa(i), redisEnv, ttlEnv, timeoutEnv)))
	}
	for i := range cfg.grpc {
		s.start("grpc", "grpc"+strconv.Itoa(i), s.goChild("grpc", "grpc"+strconv.Itoa(i), scenGRPCEnv+"="+serveGRPC))
	}
	script, err := filepath.Abs(filepath.Join("testdata", "semscen_worker.py"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := filepath.Abs(filepath.Join("..", "..", "clients", "python"))
	if err != nil {
		t.Fatal(err)
	}
	fair := "0"
	if cfg.fair {
		fair = "1"
	}
	for i := range cfg.python {
		id := "py" + strconv.Itoa(i)
		cmd := exec.Command(python, script, serveHTTP, coordToken, s.name, strconv.FormatInt(cfg.limit, 10),
			strconv.FormatFloat(cfg.ttl.Seconds(), 'f', -1, 64), srv.URL, strconv.Itoa(cfg.threads), fair, id)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+client, "PYTHONDONTWRITEBYTECODE=1")
		s.start("python", id, cmd)
	}

	// Saturated: the stub has had limit calls inside at once.
	select {
	case <-s.stub.full:
	case <-time.After(30 * time.Second):
		t.Fatalf("the stub never had %d calls inside at once (peak %d); errors: %q", cfg.limit, s.stub.snapshot().peak, s.errors())
	}
	f := &scenFigures{}
	// The warm-up and the window are spans measured, not synchronisations.
	time.Sleep(cfg.warm)
	before := s.measure(rc, serve)
	time.Sleep(cfg.steady)
	after := s.measure(rc, serve)
	f.window = after.at.Sub(before.at)
	f.grants = after.stub.calls - before.stub.calls
	f.util = (after.stub.area - before.stub.area) / (float64(cfg.limit) * f.window.Seconds())
	if f.grants > 0 {
		g := float64(f.grants)
		f.scripts = float64(after.scripts-before.scripts) / g
		f.commands = float64(after.commands-before.commands) / g
		f.cpuServe = (after.cpuServe - before.cpuServe) / time.Duration(f.grants)
		f.cpuWork = (after.cpuWork - before.cpuWork) / time.Duration(f.grants)
		f.cpuRedis = (after.cpuRedis - before.cpuRedis) / time.Duration(f.grants)
	}
	f.perKind = map[string][]time.Duration{}
	s.mu.Lock()
	for _, a := range s.acqs {
		if !a.at.Before(before.at) && !a.at.After(after.at) {
			f.perKind[a.kind] = append(f.perKind[a.kind], a.d)
		}
	}
	s.mu.Unlock()
	f.loadavg = loadavg()

	var victim *scenWorker
	if cfg.kill && len(libs) > 0 {
		victim = libs[0]
		f.killFreed, f.killRefilled = s.killHolder(victim, rc, store)
	}
	if cfg.stale {
		t.Run("sigstop", func(t *testing.T) { s.staleHolder(t, serveHTTP) })
	}

	// Stop every worker: each finishes its call, releases, and says how
	// many grants it had.
	for _, w := range s.procs {
		if w != victim && !w.exited {
			w.stdin.Close()
		}
	}
	for _, w := range s.procs {
		if w == victim || w.exited {
			continue
		}
		got := w.expect(t, "done", 30*time.Second)
		if err := w.wait(t, 10*time.Second); err != nil {
			t.Errorf("%s worker %s: %v\n%s", w.kind, w.id, err, w.stderrText())
		}
		n, err := strconv.Atoi(got[0])
		if err != nil || n < 1 {
			t.Errorf("%s worker %s had %q grants, want some", w.kind, w.id, got)
		}
		if c := s.stub.perWorker()[w.id]; c != n {
			t.Errorf("%s worker %s reports %d grants, the stub saw %d of its calls", w.kind, w.id, n, c)
		}
	}

	end := s.stub.snapshot()
	f.peak, f.calls = end.peak, end.calls
	s.mu.Lock()
	f.transient = int64(len(s.trans))
	if len(s.trans) > 0 {
		t.Logf("store errors, first: %q", s.trans[:min(len(s.trans), 5)])
	}
	s.mu.Unlock()
	if f.peak > cfg.limit {
		t.Errorf("the stub had %d calls inside at once; the limit is %d", f.peak, cfg.limit)
	}
	if errs := s.errors(); len(errs) > 0 {
		t.Errorf("%d worker errors, first: %q", len(errs), errs[:min(len(errs), 10)])
	}
	s.stub.mu.Lock()
	defer s.stub.mu.Unlock()
	if len(s.stub.bad) > 0 {
		t.Errorf("%d calls with bad fencing fields or a fence seen twice, first: %q", len(s.stub.bad), s.stub.bad[:min(len(s.stub.bad), 10)])
	}
	kinds := map[string]bool{}
	for id := range s.stub.workers {
		kinds[strings.TrimRight(id, "0123456789")] = true
	}
	if cfg.lib > 0 && !kinds["lib"] || cfg.grpc > 0 && !kinds["grpc"] || cfg.python > 0 && !kinds["py"] {
		t.Errorf("calls came from workers of kinds %v only", kinds)
	}
	return f
}

func (s *scenario) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs)
}

// scenMeasure is a reading of the counters a window is measured between.
type scenMeasure struct {
	at                          time.Time
	stub                        stubReading
	scripts, commands           int64
	cpuServe, cpuWork, cpuRedis time.Duration
}

// measure reads the stub, Redis's command counts and the processes' CPU
// times.
func (s *scenario) measure(rc *redis.Client, serve *sluiceProcess) scenMeasure {
	t := s.t
	t.Helper()
	m := scenMeasure{at: time.Now(), stub: s.stub.snapshot()}
	info, err := rc.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":calls=")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		n, err := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats: %q: %v", l, err)
		}
		switch cmd := strings.TrimPrefix(name, "cmdstat_"); cmd {
		case "info":
			continue // the test's own
		case "evalsha", "eval":
			m.scripts += n
		}
		m.commands += n
	}
	server, err := rc.Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(server, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			pid, _ := strconv.Atoi(v)
			m.cpuRedis = cpuTime(pid)
		}
	}
	m.cpuServe = cpuTime(serve.cmd.Process.Pid)
	for _, w := range s.procs {
		if !w.exited {
			m.cpuWork += cpuTime(w.cmd.Process.Pid)
		}
	}
	return m
}

// cpuTime returns the user and system CPU time process pid has used, from
// /proc (0 where there is none).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	_, after, ok := bytes.Cut(b, []byte(") "))
	if !ok {
		return 0
	}
	f := strings.Fields(string(after))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ, 100 on Linux
}

// killHolder has victim (a library worker) hold a permit in each of its
// loops, SIGKILLs it, and returns when its permits left the store and
// when the stub was back at the limit, both from the kill.
func (s *scenario) killHolder(victim *scenWorker, rc *redis.Client, store *redisstore.SemaphoreStore) (freed, refilled time.Duration) {
	t := s.t
	if _, err := io.WriteString(victim.stdin, "hold\n"); err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for range s.cfg.threads {
		tokens = append(tokens, victim.expect(t, "held", 20*time.Second)[0])
	}
	key := store.Key(s.name)
	ctx := t.Context()
	for _, tok := range tokens {
		if err := rc.ZScore(ctx, key, tok).Err(); err != nil {
			t.Fatalf("the victim's token %s is not in %s: %v", tok, key, err)
		}
	}
	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil { // SIGKILL: no release, no renewal
		t.Fatal(err)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := killed.Add(s.cfg.ttl + 3*time.Second)
	for left := tokens; len(left) > 0; {
		<-tick.C
		if time.Now().After(deadline) {
			t.Fatalf("%d of the killed worker's permits still in the store %v after the kill (TTL %v)", len(left), time.Since(killed), s.cfg.ttl)
		}
		left = slices.DeleteFunc(left, func(tok string) bool { return errors.Is(rc.ZScore(ctx, key, tok).Err(), redis.Nil) })
	}
	freed = time.Since(killed)
	for s.stub.snapshot().in < s.cfg.limit {
		<-tick.C
		if time.Now().After(deadline) {
			t.Fatalf("the stub is not back at %d calls inside %v after the kill", s.cfg.limit, time.Since(killed))
		}
	}
	refilled = time.Since(killed)
	// The permits lapsed (last renewed at most TTL/3 + 10% before the
	// kill), and came back within the TTL and a few poll intervals.
	if freed < s.cfg.ttl/2 || freed > s.cfg.ttl+500*time.Millisecond {
		t.Errorf("the killed worker's %d permits left the store %v after the kill, want between TTL/2 and TTL + 500 ms (TTL %v)", len(tokens), freed, s.cfg.ttl)
	}
	victim.exited = true
	<-victim.exit
	return freed, refilled
}

// staleHolder runs a library worker that takes a permit, checks it
// (Permit.Err), and is SIGSTOPped before its call until serve lists its
// permit no more; SIGCONTed, it makes the call, which the stub, now
// admitting only the fences serve lists, must refuse.
func (s *scenario) staleHolder(t *testing.T, serveHTTP string) {
	const ttl = time.Second
	w := s.start("stale", "stale", s.goChild("stale", "stale", scenRedisEnv+"="+s.redis, scenTTLEnv+"="+ttl.String(), scenTimeoutEnv+"="+cmp.Or(s.cfg.redisTimeout, redisstore.DefaultTimeout).String()))
	got := w.expect(t, "checked", 30*time.Second)
	fenceNo, err := strconv.ParseUint(got[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		listed, _, err := holders(t.Context(), serveHTTP, s.name)
		if err != nil {
			t.Fatal(err)
		}
		if !listed[fenceNo] {
			break
		}
		if time.Since(stopped) > ttl+5*time.Second {
			t.Fatalf("serve still lists fence %d %v after its holder stopped (TTL %v)", fenceNo, time.Since(stopped), ttl)
		}
		<-tick.C
	}
	s.stub.fenced.Store(true)
	before := s.stub.snapshot().calls
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(w.stdin, "call\n"); err != nil {
		t.Fatal(err)
	}
	called := w.expect(t, "called", 20*time.Second)
	if len(called) != 2 || called[0] != "409" {
		t.Errorf("the stale holder's call (fence %d): %q, want the stub's 409", fenceNo, called)
	}
	if len(called) == 2 && called[1] != "lost" {
		t.Errorf("the stale holder's permit after its call: %q, want lost (Permit.Err)", called[1])
	}
	w.stdin.Close()
	if err := w.wait(t, 10*time.Second); err != nil {
		t.Errorf("the stale holder: %v\n%s", err, w.stderrText())
	}
	// The others' calls go on, each admitted by the fenced stub.
	deadline := time.Now().Add(10 * time.Second)
	for s.stub.snapshot().calls < before+2*s.cfg.limit {
		if time.Now().After(deadline) {
			t.Fatalf("the fenced stub admitted %d calls in 10 s", s.stub.snapshot().calls-before)
		}
		<-tick.C
	}
	s.stub.mu.Lock()
	refused := slices.Clone(s.stub.refused)
	s.stub.mu.Unlock()
	if !slices.Equal(refused, []uint64{fenceNo}) {
		t.Errorf("the fenced stub refused fences %v, want only the stale holder's %d", refused, fenceNo)
	}
}

// holders asks serve for the fences of name's holders (and how many
// wait): POST /v1/semaphores/holders {"name": name}.
func holders(ctx context.Context, base, name string) (map[uint64]bool, int, error) {
	body, _ := json.Marshal(map[string]string{"name": name})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/semaphores/holders", bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+coordToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("POST /v1/semaphores/holders: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Name    string `json:"name"`
		Holders []struct {
			Fence       uint64 `json:"fence"`
			Weight      int64  `json:"weight"`
			HeldForMs   int64  `json:"held_for_ms"`
			ExpiresInMs int64  `json:"expires_in_ms"`
		} `json:"holders"`
		Waiting int `json:"waiting"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, 0, fmt.Errorf("POST /v1/semaphores/holders: %w: %s", err, b)
	}
	if out.Name != name {
		return nil, 0, fmt.Errorf("POST /v1/semaphores/holders: name %q, asked %q", out.Name, name)
	}
	m := make(map[uint64]bool, len(out.Holders))
	for _, h := range out.Holders {
		m[h.Fence] = true
	}
	return m, out.Waiting, nil
}

// scenStub is the external API the permits protect: it counts the calls
// inside it (and integrates that count over time), checks each call's
// fencing fields (the semaphore's name; a fence not seen before, since
// each grant makes one call) and, once fenced is set, admits only the
// fences serve lists as holders (409 otherwise).
type scenStub struct {
	name             string
	limit            int64
	callMin, callMax time.Duration
	url              string
	holders          func(context.Context) (map[uint64]bool, int, error)
	fenced           atomic.Bool
	full             chan struct{} // closed when limit calls are inside at once

	mu      sync.Mutex
	in      int64
	peak    int64
	area    float64 // call-seconds inside
	last    time.Time
	calls   int64
	seen    map[uint64]string // fence → worker
	workers map[string]int    // calls per worker
	bad     []string
	refused []uint64
}

func newScenStub(name string, cfg scenConfig) *scenStub {
	return &scenStub{name: name, limit: cfg.limit, callMin: cfg.callMin, callMax: cfg.callMax, full: make(chan struct{}),
		last: time.Now(), seen: map[uint64]string{}, workers: map[string]int{}}
}

type stubReading struct {
	in, peak, calls int64
	area            float64
}

func (st *scenStub) snapshot() stubReading {
	st.mu.Lock()
	defer st.mu.Unlock()
	now := time.Now()
	return stubReading{in: st.in, peak: st.peak, calls: st.calls, area: st.area + float64(st.in)*now.Sub(st.last).Seconds()}
}

func (st *scenStub) perWorker() map[string]int {
	st.mu.Lock()
	defer st.mu.Unlock()
	m := make(map[string]int, len(st.workers))
	for k, v := range st.workers {
		m[k] = v
	}
	return m
}

// moveLocked adds d (±1) to the calls inside, integrating first.
func (st *scenStub) moveLocked(d int64) {
	now := time.Now()
	st.area += float64(st.in) * now.Sub(st.last).Seconds()
	st.last = now
	st.in += d
	if st.in > st.peak {
		st.peak = st.in
	}
	if st.in == st.limit {
		select {
		case <-st.full:
		default:
			close(st.full)
		}
	}
}

func (st *scenStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	worker := r.Header.Get("X-Worker")
	resource, token, err := fence.Parse(r.Header)
	if err == nil && resource != st.name {
		err = fmt.Errorf("resource %q, want %q", resource, st.name)
	}
	if err != nil {
		st.mu.Lock()
		st.bad = append(st.bad, worker+": "+err.Error())
		st.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if st.fenced.Load() {
		listed, _, err := st.holders(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !listed[token] {
			st.mu.Lock()
			st.refused = append(st.refused, token)
			st.mu.Unlock()
			http.Error(w, fmt.Sprintf("fence %d holds no permit of %q now", token, st.name), http.StatusConflict)
			return
		}
	}
	st.mu.Lock()
	if prev, dup := st.seen[token]; dup {
		st.bad = append(st.bad, fmt.Sprintf("fence %d sent by %s after %s", token, worker, prev))
	}
	st.seen[token] = worker
	st.workers[worker]++
	st.calls++
	st.moveLocked(1)
	st.mu.Unlock()
	// The API's work (not a synchronisation: nothing waits for it).
	time.Sleep(st.callMin + rand.N(st.callMax-st.callMin+1))
	st.mu.Lock()
	st.moveLocked(-1)
	st.mu.Unlock()
}

// TestSemaphoreScenarioChild is not a test: it is the body of a Go worker
// process of TestSemaphoreScenario, and skips when run normally.
func TestSemaphoreScenarioChild(t *testing.T) {
	mode := os.Getenv(scenChildEnv)
	if mode == "" {
		t.Skip("a worker process of TestSemaphoreScenario only")
	}
	env := func(k string) string {
		v := os.Getenv(k)
		if v == "" {
			t.Fatalf("%s is not set", k)
		}
		return v
	}
	atoi := func(k string) int {
		n, err := strconv.Atoi(env(k))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	name, id, stub := env(scenNameEnv), env(scenIDEnv), env(scenStubEnv)
	limit, threads := int64(atoi(scenLimitEnv)), atoi(scenThreadsEnv)
	fair := env(scenFairEnv) == "true"
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: threads}, Timeout: 10 * time.Second}
	call := func(f uint64) int {
		req, err := http.NewRequest("POST", stub, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		fence.Set(req.Header, name, f)
		req.Header.Set("X-Worker", id)
		resp, err := hc.Do(req)
		if err != nil {
			say("E call: %v", err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// pause is the wait after an acquire failed with the store's error, so
	// that a failing store is not asked in a hot loop (not a
	// synchronisation).
	pause := func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	// stdin: "hold" makes each loop keep its next permit (the test kills
	// the process), "call" lets the stale holder call; EOF stops.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var holding atomic.Bool
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if sc.Text() == "hold" {
				holding.Store(true)
			}
			lines <- sc.Text()
		}
		stop()
	}()

	switch mode {
	case "lib", "stale":
		ttl, err := time.ParseDuration(env(scenTTLEnv))
		if err != nil {
			t.Fatal(err)
		}
		timeout, err := time.ParseDuration(env(scenTimeoutEnv))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{env(scenRedisEnv)}, PoolSize: 2*threads + 4, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		// The defaults: the keys sluice serve uses on the same Redis.
		store, err := redisstore.NewSemaphoreStore(rc, redisstore.SemaphoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d, err := concurrency.NewDistributed(store, name, limit, concurrency.DistributedOptions{TTL: ttl, Fair: fair})
		if err != nil {
			t.Fatal(err)
		}
		if mode == "stale" {
			p, err := d.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The holder's own check, right before its call...
			if err := p.Err(); err != nil {
				t.Fatalf("a permit just granted: %v", err)
			}
			say("checked %d", p.Fence())
			// ... and here the process is stopped, past the permit's TTL.
			if _, ok := <-lines; !ok {
				t.Fatal("stdin closed before the call")
			}
			st := call(p.Fence())
			lost := "held"
			if errors.Is(p.Err(), concurrency.ErrLost) {
				lost = "lost"
			}
			say("called %d %s", st, lost)
			_ = p.Release(context.Background())
			<-ctx.Done()
			return
		}
		var grants atomic.Int64
		var wg sync.WaitGroup
		for range threads {
			wg.Go(func() {
				for ctx.Err() == nil {
					start := time.Now()
					p, err := d.Acquire(ctx)
					if err != nil {
						if ctx.Err() == nil {
							// The store failed (a call past its timeout):
							// the wait ends; ask again a little later.
							say("T acquire: %v", err)
							pause(ctx)
						}
						continue
					}
					say("A %d", time.Since(start).Microseconds())
					if holding.Load() {
						say("held %s", p.Token())
						select {} // renewing, until the test kills the process
					}
					if err := p.Err(); err != nil {
						say("E permit lost before its call: %v", err)
					} else {
						st := call(p.Fence())
						grants.Add(1)
						if st != http.StatusOK {
							say("E the stub answered %d to fence %d", st, p.Fence())
						}
					}
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					if err := p.Release(rctx); err != nil {
						// The store failed: the permit lapses within its TTL.
						say("T release: %v", err)
					}
					cancel()
				}
			})
		}
		wg.Wait()
		say("done %d", grants.Load())

	case "grpc":
		conn, err := grpc.NewClient(env(scenGRPCEnv), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		md := metadata.Pairs("authorization", "Bearer "+coordToken)
		invoke := func(ctx context.Context, method string, in, out any) error {
			return conn.Invoke(metadata.NewOutgoingContext(ctx, md), "/"+coord.ServiceName+"/"+method, in, out)
		}
		var grants atomic.Int64
		var wg sync.WaitGroup
		for range threads {
			wg.Go(func() {
				for ctx.Err() == nil {
					start := time.Now()
					var g sluicev1.AcquireResponse
					// A TTL well beyond a call: no renewal needed.
					err := invoke(ctx, "Acquire", &sluicev1.AcquireRequest{Name: name, Limit: limit, Ttl: durationpb.New(10 * time.Second), Wait: durationpb.New(5 * time.Second), Fair: fair}, &g)
					switch {
					case ctx.Err() != nil:
						continue
					case status.Code(err) == codes.ResourceExhausted:
						continue // none within the wait: ask again
					case status.Code(err) == codes.Unavailable:
						say("T acquire: %v", err)
						pause(ctx)
						continue
					case err != nil:
						say("E acquire: %v", err)
						continue
					}
					say("A %d", time.Since(start).Microseconds())
					st := call(g.GetFence())
					grants.Add(1)
					if st != http.StatusOK {
						say("E the stub answered %d to fence %d", st, g.GetFence())
					}
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					err = invoke(rctx, "Release", &sluicev1.ReleaseRequest{Name: name, PermitId: g.GetPermitId()}, new(sluicev1.ReleaseResponse))
					cancel()
					switch {
					case status.Code(err) == codes.Unavailable:
						// The store failed: the permit lapses within its TTL.
						say("T release: %v", err)
					case err != nil:
						say("E release: %v", err)
					}
				}
			})
		}
		wg.Wait()
		say("done %d", grants.Load())
	default:
		t.Fatalf("unknown mode %q", mode)
	}
}
