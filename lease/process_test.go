package lease_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

// The real-process test: three OS processes (this test binary, started
// again with procChildEnv set) share one Redis and one loopback HTTP
// server that enforces procCapacity requests a second (a token bucket with
// a tenth of a second of burst, answering 429 beyond). One is killed with
// SIGKILL halfway.

const (
	procChildEnv = "SLUICE_LEASE_CHILD"
	procCapacity = 500
	procParts    = 20
	procTTL      = 2 * time.Second
	procKillAt   = 7 * time.Second
	procRunFor   = 14 * time.Second
	procWorkers  = 16
)

// procEvent is one request as the test server saw it.
type procEvent struct {
	at     time.Duration
	client int
	ok     bool
}

func TestRealProcesses(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("real processes: 14 s")
	}
	srv := redistest.Standalone(t)
	begin := time.Now()
	bucket := ratelimit.NewLimiter(procCapacity, procCapacity/10)
	var mu sync.Mutex
	var events []procEvent
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c int
		fmt.Sscan(r.URL.Query().Get("c"), &c) //nolint:errcheck // 0 when absent
		now := time.Now()
		ok := bucket.AllowN(now, 1)
		mu.Lock()
		events = append(events, procEvent{at: now.Sub(begin), client: c, ok: ok})
		mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	t.Cleanup(hs.Close)

	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   chan string
	}
	var children []*child
	for i := 1; i <= 3; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseChildProcess$", "-test.timeout=60s")
		cmd.Env = append(os.Environ(), procChildEnv+"=1",
			"SLUICE_LEASE_REDIS="+srv.Addr(), "SLUICE_LEASE_URL="+hs.URL, fmt.Sprint("SLUICE_LEASE_ID=", i))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{cmd: cmd, stdin: stdin, out: make(chan string, 1)}
		go func() {
			var stats string
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if l := sc.Text(); strings.HasPrefix(l, "STATS ") {
					stats = l
				}
			}
			c.out <- stats
		}()
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // it may have exited
		children = append(children, c)
	}
	// Kill the third at procKillAt, stop the others at procRunFor.
	killTimer := time.NewTimer(time.Until(begin.Add(procKillAt)))
	<-killTimer.C
	if err := children[2].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Since(begin)
	stopTimer := time.NewTimer(time.Until(begin.Add(procRunFor)))
	<-stopTimer.C
	var stats []string
	for _, c := range children[:2] {
		c.stdin.Close()
	}
	for _, c := range children[:2] {
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child: %v", err)
		}
		stats = append(stats, <-c.out)
	}
	children[2].cmd.Wait() //nolint:errcheck // killed

	mu.Lock()
	defer mu.Unlock()
	secs := int(procRunFor / time.Second)
	perSec := make([][4]int, secs+1) // ok per client 1..3, and 429s
	var total, throttled int
	for _, e := range events {
		s := int(e.at / time.Second)
		if s > secs || e.client < 1 || e.client > 3 {
			continue
		}
		total++
		if e.ok {
			perSec[s][e.client-1]++
		} else {
			throttled++
			perSec[s][3]++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "t(s)     p1     p2     p3  total   429s\n")
	for s := range secs {
		r := perSec[s]
		fmt.Fprintf(&b, "%4d %6d %6d %6d %6d %6d\n", s, r[0], r[1], r[2], r[0]+r[1]+r[2], r[3])
	}
	t.Logf("per second (p3 killed at %v):\n%s", killed.Round(time.Millisecond), b.String())
	for _, s := range stats {
		t.Log(s)
	}

	if f := float64(throttled) / float64(max(1, total)); f > 0.01 {
		t.Errorf("throttled %d of %d requests (%.2f%%), want ≤ 1%%", throttled, total, 100*f)
	} else {
		t.Logf("throttled %d of %d requests (%.3f%%)", throttled, total, 100*f)
	}
	okIn := func(from, to time.Duration, clients ...int) int {
		n := 0
		for _, e := range events {
			if e.ok && e.at >= from && e.at < to {
				for _, c := range clients {
					if e.client == c {
						n++
					}
				}
			}
		}
		return n
	}
	for _, w := range [][2]time.Duration{{2 * time.Second, killed}, {killed + procTTL, procRunFor}} {
		u := float64(okIn(w[0], w[1], 1, 2, 3)) / (procCapacity * (w[1] - w[0]).Seconds())
		if u < 0.90 {
			t.Errorf("utilisation %.3f in [%v, %v), want ≥ 0.90", u, w[0].Round(time.Millisecond), w[1].Round(time.Millisecond))
		} else {
			t.Logf("utilisation %.4f in [%v, %v)", u, w[0].Round(time.Millisecond), w[1].Round(time.Millisecond))
		}
	}
	// Takeover: the first 250 ms window after the kill in which the two
	// survivors send at ≥ 90% of the capacity. They sent at 2/3 of it
	// before taking the victim's partitions, so they had taken them at
	// most 75 ms into that window ((1 − 0.9) / (1 − 2/3) of it).
	const win = 250 * time.Millisecond
	takeover := time.Duration(-1)
	for at := killed; at+win <= procRunFor; at += 5 * time.Millisecond {
		if float64(okIn(at, at+win, 1, 2)) >= 0.9*procCapacity*win.Seconds() {
			takeover = at + win*3/10 - killed
			break
		}
	}
	// The store frees the partitions at most TTL − Margin/2 (0.95 TTL)
	// after the kill (the victim's last renewal came before it), and the
	// survivors look just then: taking them costs a round trip and the
	// store's millisecond rounding, well within the other Margin/2.
	if limit := procTTL; takeover < 0 || takeover > limit {
		t.Errorf("survivors had the full capacity %v after the kill, want within %v (TTL %v)", takeover, limit, procTTL)
	} else {
		t.Logf("survivors had the full capacity at most %v after the kill (TTL %v)", takeover, procTTL)
	}
}

// TestLeaseChildProcess is one process of TestRealProcesses; it does
// nothing unless started by it.
func TestLeaseChildProcess(t *testing.T) {
	if os.Getenv(procChildEnv) == "" {
		t.Skip("helper process of TestRealProcesses")
	}
	id := os.Getenv("SLUICE_LEASE_ID")
	rc := redis.NewClient(&redis.Options{Addr: os.Getenv("SLUICE_LEASE_REDIS")})
	defer rc.Close()
	store, err := redisstore.NewLeaseStore(rc, "proc-test", redisstore.LeaseOptions{Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, err := lease.NewHolder(store, lease.Options{ID: "p" + id, Capacity: procCapacity, Partitions: procParts, TTL: procTTL})
	if err != nil {
		t.Fatal(err)
	}
	h.SetBacklog(1 << 30)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }() //nolint:errcheck // EOF or error: stop either way
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: procWorkers}}
	url := os.Getenv("SLUICE_LEASE_URL") + "/?c=" + id
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- h.Run(ctx) }()
	var wg sync.WaitGroup
	lim := h.Limiter()
	for range procWorkers {
		wg.Go(func() {
			for lim.Wait(ctx) == nil {
				resp, err := client.Get(url)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck // drained for reuse
				resp.Body.Close()
				h.Observe(resp.StatusCode, resp.Header)
			}
		})
	}
	wg.Wait()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	s := h.Stats()
	el := time.Since(start).Seconds()
	fmt.Printf("STATS p%s: store round trips %.2f/s, acquisitions %d, renewals %d, losses %d, releases %d, 429s %d\n",
		id, float64(s.StoreCalls)/el, s.Acquisitions, s.Renewals, s.Losses, s.Releases, s.Throttled)
}
