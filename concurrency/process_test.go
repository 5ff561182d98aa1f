package concurrency_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The multi-process test runs this test binary again as child processes;
// these variables tell a child what to do. Only tests read them.
const (
	envMode    = "SLUICE_SEMWORKER_MODE" // "work" or "hold"
	envRedis   = "SLUICE_SEMWORKER_REDIS"
	envURL     = "SLUICE_SEMWORKER_URL"
	envWorkers = "SLUICE_SEMWORKER_WORKERS"
	envIters   = "SLUICE_SEMWORKER_ITERS"
	envLimit   = "SLUICE_SEMWORKER_LIMIT"
	envWeight  = "SLUICE_SEMWORKER_WEIGHT" // modes "queue" and "weighted"
	envID      = "SLUICE_SEMWORKER_ID"
)

const (
	procLimit   = 50 // holders allowed
	procCount   = 4  // OS processes
	procWorkers = 50 // workers per process: 200 in all
	procIters   = 8  // critical sections per worker
	procTTL     = time.Second
)

var procOpts = concurrency.DistributedOptions{TTL: procTTL}

// TestSemWorkerProcess is not a test: it is the body of a child process of
// TestSemaphoreProcesses, and skips when run normally.
func TestSemWorkerProcess(t *testing.T) {
	mode := os.Getenv(envMode)
	if mode == "" {
		t.Skip("child process of TestSemaphoreProcesses, TestFairOrderAcrossProcesses and TestWeightedAcrossProcesses only")
	}
	atoi := func(k string) int {
		n, err := strconv.Atoi(os.Getenv(k))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		return n
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis), PoolSize: 64})
	defer c.Close()
	b, err := redisstore.NewSemaphoreStore(c, redisstore.SemaphoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "queue":
		childQueue(t, c, b, int64(atoi(envLimit)), int64(atoi(envWeight)), os.Getenv(envID))
		return
	case "weighted":
		childWeighted(t, c, b, int64(atoi(envLimit)), int64(atoi(envWeight)), atoi(envIters))
		return
	}
	d, err := concurrency.NewDistributed(b, "procs", int64(atoi(envLimit)), procOpts)
	if err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "work":
		childWork(t, d, os.Getenv(envURL), atoi(envWorkers), atoi(envIters))
	case "hold":
		childHold(t, d, atoi(envWorkers))
	default:
		t.Fatalf("unknown mode %q", mode)
	}
}

// childWork runs workers that each, iters times, acquire a permit, call the
// test server inside the critical section, and release.
func childWork(t *testing.T, d *concurrency.Distributed, url string, workers, iters int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var calls, lost atomic.Int64
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range iters {
				p, err := d.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				var resp *http.Response
				if err == nil {
					resp, err = client.Do(req)
				}
				if err == nil {
					io.Copy(io.Discard, resp.Body) //nolint:errcheck
					resp.Body.Close()
					calls.Add(1)
				}
				if p.Err() != nil {
					lost.Add(1)
				}
				if rerr := p.Release(ctx); err == nil {
					err = rerr
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	fmt.Printf("semworker: calls=%d lost=%d\n", calls.Load(), lost.Load())
}

// childHold acquires n permits, says so on stdout, and keeps them (renewing)
// until its stdin closes or it is killed.
func childHold(t *testing.T, d *concurrency.Distributed, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range n {
		if _, err := d.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("semworker: held=%d\n", n)
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // EOF when the parent goes away
}

// child is a running child process.
type child struct {
	cmd   *exec.Cmd
	lines chan string   // its "semworker:" lines; closed at EOF
	done  chan struct{} // closed when it has exited
	err   error         // its exit status, once done is closed
}

func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSemWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cmd.StdinPipe(); err != nil { // held open until Wait
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 16), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "semworker: "); ok {
				c.lines <- line
			} else if sc.Text() != "PASS" {
				fmt.Fprintln(os.Stderr, "child:", sc.Text()) // a failing child's test output
			}
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // it has usually exited
		for range c.lines {
		}
		<-c.done
	})
	return c
}

// concurrencyCounter is an HTTP handler that measures how many requests are
// inside it at once.
type concurrencyCounter struct {
	inside, peak, total atomic.Int64
	work                time.Duration
}

func (h *concurrencyCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.inside.Add(1)
	for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
	}
	h.total.Add(1)
	time.Sleep(h.work) // the protected service's work, not synchronisation
	h.inside.Add(-1)
}

// TestSemaphoreProcesses is the test: 50 holders allowed, 200
// workers in 4 OS processes, never more than 50 inside the test server;
// then a process holding permits is killed with SIGKILL and its permits
// come back within the TTL.
func TestSemaphoreProcesses(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("starts OS processes")
	}
	srv := redistest.Standalone(t)
	counter := &concurrencyCounter{work: 2 * time.Millisecond}
	hs := httptest.NewServer(counter)
	t.Cleanup(hs.Close)
	env := []string{
		envRedis + "=" + srv.Addr(), envURL + "=" + hs.URL,
		envLimit + "=" + strconv.Itoa(procLimit),
	}

	admin := srv.Client()
	cmdsBefore := roundTrips(t, admin)
	start := time.Now()
	var kids []*child
	for range procCount {
		kids = append(kids, startChild(t, append(env, envMode+"=work",
			envWorkers+"="+strconv.Itoa(procWorkers), envIters+"="+strconv.Itoa(procIters))...))
	}
	var calls int64
	for i, k := range kids {
		for line := range k.lines {
			var c, l int64
			if _, err := fmt.Sscanf(line, "calls=%d lost=%d", &c, &l); err != nil {
				t.Fatalf("child %d said %q: %v", i, line, err)
			}
			calls += c
			if l != 0 {
				t.Errorf("child %d lost %d permits while working", i, l)
			}
		}
		if <-k.done; k.err != nil {
			t.Fatalf("child %d: %v", i, k.err)
		}
	}
	elapsed := time.Since(start)
	cmds := roundTrips(t, admin) - cmdsBefore
	want := int64(procCount * procWorkers * procIters)
	if calls != want || counter.total.Load() != want {
		t.Fatalf("calls: children counted %d, server %d; want %d", calls, counter.total.Load(), want)
	}
	peak := counter.peak.Load()
	if peak > procLimit {
		t.Fatalf("peak concurrency at the server = %d, above the limit %d", peak, procLimit)
	}
	if peak < procLimit/5 {
		t.Errorf("peak concurrency at the server = %d: the semaphore barely admitted anyone", peak)
	}
	t.Logf("%d calls by %d workers in %d processes in %v (process start-up included); peak concurrency %d of %d; %d Redis round trips (%.2f per call, %.0f/s)",
		calls, procCount*procWorkers, procCount, elapsed.Round(time.Millisecond), peak, procLimit,
		cmds, float64(cmds)/float64(calls), float64(cmds)/elapsed.Seconds())

	// A process takes every permit, then dies without releasing them.
	holder := startChild(t, append(env, envMode+"=hold", envWorkers+"="+strconv.Itoa(procLimit))...)
	if line := <-holder.lines; line != fmt.Sprintf("held=%d", procLimit) {
		t.Fatalf("holder said %q", line)
	}
	b, err := redisstore.NewSemaphoreStore(srv.Client(), redisstore.SemaphoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Poll every few milliseconds, to time the return of the permits closely.
	d, err := concurrency.NewDistributed(b, "procs", procLimit, concurrency.DistributedOptions{TTL: procTTL, MinBackoff: 2 * time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(context.Background()); !errors.Is(err, concurrency.ErrNoPermit) {
		t.Fatalf("TryAcquire while the holder holds every permit = %v, want ErrNoPermit", err)
	}
	if err := holder.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	killed := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*procTTL)
	defer cancel()
	var first time.Duration
	for i := range procLimit {
		p, err := d.Acquire(ctx)
		if err != nil {
			t.Fatalf("permit %d after the kill: %v", i, err)
		}
		t.Cleanup(func() { p.Release(context.Background()) })
		if i == 0 {
			first = time.Since(killed)
		}
	}
	all := time.Since(killed)
	if <-holder.done; !errors.As(holder.err, new(*exec.ExitError)) {
		t.Errorf("holder exit = %v, want killed", holder.err)
	}
	if limit := procTTL + 250*time.Millisecond; all > limit { // polling every 5ms, on a loaded machine
		t.Errorf("the killed holder's %d permits came back after %v, want within TTL %v (+ backoff)", procLimit, all, procTTL)
	}
	t.Logf("killed holder's permits: first back after %v, all %d after %v (TTL %v)",
		first.Round(time.Millisecond), procLimit, all.Round(time.Millisecond), procTTL)
}

// roundTrips counts the calls a semaphore makes, one per round trip:
// its scripts (EVALSHA, or EVAL the first time: acquire, renew, release),
// from INFO commandstats. (Redis counts the commands a script runs there
// too, so a command the scripts use, such as ZREM, is no measure of round
// trips.)
func roundTrips(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval":
			calls, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			n += v
		}
	}
	return n
}
