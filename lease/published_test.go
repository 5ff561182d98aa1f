package lease_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// The published example in real OS processes: A (10,000 records) and B
// (5,000) share 500 req/s leased as 20 × 25 on a redis-server, against a
// loopback HTTP server that counts in fixed one-second windows and answers
// 429 with Retry-After beyond 500 in a window. Each record is sent until
// it is accepted. The lower bounds: 30 s for A (all 15,000 at 500/s) and
// 20 s for B (its 5,000 at half).
const (
	pubChildEnv = "SLUICE_PUBLISHED_CHILD"
	pubCapacity = 500
	pubParts    = 20
	pubTTL      = 2 * time.Second
	pubWorkers  = 16
	// pubRuns is how many runs in a row the test makes (and each must
	// meet the bounds); SLUICE_PUBLISHED_RUNS changes it while developing.
	pubRuns = 10
)

// pubEvent is one request as the server saw it.
type pubEvent struct {
	at     time.Duration // since the start signal
	client byte          // 'A' or 'B'
	record int
	ok     bool
}

// pubRun is the outcome of one run.
type pubRun struct {
	a, b           time.Duration // when each sent its last accepted record
	total, refused int
	lost, dupes    int
	freed          time.Duration // A at ≥ 95 % of the full rate, after B's end
	perSec         [][3]int      // accepted A, B; 429s
	stats          []string
}

func TestPublishedExampleProcesses(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("real processes: 10 runs of 30 s")
	}
	runs := pubRuns
	if v := os.Getenv("SLUICE_PUBLISHED_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SLUICE_PUBLISHED_RUNS=%q", v)
		}
		runs = n
	}
	srv := redistest.Standalone(t)
	var all []pubRun
	for i := range runs {
		r := publishedRun(t, srv.Addr(), fmt.Sprint("published-", i))
		all = append(all, r)
		var b strings.Builder
		fmt.Fprintf(&b, "t(s)      A      B   429s\n")
		for s, x := range r.perSec {
			fmt.Fprintf(&b, "%4d %6d %6d %6d\n", s, x[0], x[1], x[2])
		}
		t.Logf("run %d: A %.3f s, B %.3f s, throttled %d of %d (%.3f%%), lost %d, accepted twice %d, A at the full rate %v after B's end\n%s%s",
			i+1, r.a.Seconds(), r.b.Seconds(), r.refused, r.total, 100*float64(r.refused)/float64(max(1, r.total)),
			r.lost, r.dupes, r.freed.Round(time.Millisecond), b.String(), strings.Join(r.stats, "\n"))
		if r.a < 30*time.Second || r.a > 31500*time.Millisecond {
			t.Errorf("run %d: A finished at %v, want within 5%% of 30 s", i+1, r.a)
		}
		if r.b < 20*time.Second || r.b > 21*time.Second {
			t.Errorf("run %d: B finished at %v, want within 5%% of 20 s", i+1, r.b)
		}
		if float64(r.refused) > 0.001*float64(r.total) {
			t.Errorf("run %d: throttled %d of %d requests, want ≤ 0.1%%", i+1, r.refused, r.total)
		}
		if r.lost != 0 || r.dupes != 0 {
			t.Errorf("run %d: %d records lost, %d accepted twice, want none", i+1, r.lost, r.dupes)
		}
		if r.freed < 0 || r.freed > 250*time.Millisecond {
			t.Errorf("run %d: A at the full rate %v after B's end, want within 250 ms", i+1, r.freed)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| run | A (s) | B (s) | 429s | requests | A at full rate after B's end |\n| --: | --: | --: | --: | --: | --: |\n")
	for i, r := range all {
		fmt.Fprintf(&b, "| %d | %.3f | %.3f | %d | %d | %d ms |\n", i+1, r.a.Seconds(), r.b.Seconds(), r.refused, r.total, r.freed.Milliseconds())
	}
	t.Logf("summary:\n%s", b.String())
}

// publishedRun runs the example once on the Redis at addr, under the
// service name svc.
func publishedRun(t *testing.T, addr, svc string) pubRun {
	t.Helper()
	var (
		mu     sync.Mutex
		events []pubEvent
		start  time.Time // the start signal; zero before
		window int64     = -1
		count  int
	)
	origin := time.Now() // the server's windows start here, whole seconds on
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rec, err := strconv.Atoi(q.Get("r"))
		c := q.Get("c")
		if err != nil || len(c) != 1 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		now := time.Now()
		el := now.Sub(origin)
		mu.Lock()
		if n := int64(el / time.Second); n != window {
			window, count = n, 0
		}
		ok := count < pubCapacity
		if ok {
			count++
		}
		if !start.IsZero() {
			events = append(events, pubEvent{at: now.Sub(start), client: c[0], record: rec, ok: ok})
		}
		mu.Unlock()
		w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=1`, pubCapacity))
		if !ok {
			left := time.Second - el%time.Second
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(left.Seconds()))))
			w.Header().Set("Retry-After-Ms", strconv.FormatInt(max(1, left.Milliseconds()), 10))
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	hs := httptest.NewUnstartedServer(handler)
	hs.Config.ReadHeaderTimeout = 5 * time.Second
	hs.Config.IdleTimeout = 30 * time.Second
	hs.Start()
	defer hs.Close()

	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines chan string
	}
	var children []*child
	for _, spec := range []struct {
		name    string
		records int
	}{{"A", 10000}, {"B", 5000}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPublishedExampleChild$", "-test.timeout=120s")
		cmd.Env = append(os.Environ(), pubChildEnv+"=1", "SLUICE_PUBLISHED_REDIS="+addr, "SLUICE_PUBLISHED_SERVICE="+svc,
			"SLUICE_PUBLISHED_URL="+hs.URL, "SLUICE_PUBLISHED_NAME="+spec.name, fmt.Sprint("SLUICE_PUBLISHED_RECORDS=", spec.records))
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
		c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 8)}
		go func() {
			defer close(c.lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if l := sc.Text(); strings.HasPrefix(l, "READY") || strings.HasPrefix(l, "STATS ") {
					c.lines <- l
				}
			}
		}()
		children = append(children, c)
		defer func() { cmd.Process.Kill(); cmd.Wait() }() //nolint:errcheck // it may have exited
	}
	for _, c := range children {
		select {
		case l := <-c.lines:
			if l != "READY" {
				t.Fatalf("child said %q, want READY", l)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("child not ready within 60 s")
		}
	}
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "GO\n"); err != nil {
			t.Fatal(err)
		}
	}
	var r pubRun
	for _, c := range children {
		select {
		case l := <-c.lines:
			r.stats = append(r.stats, l)
		case <-time.After(90 * time.Second):
			t.Fatal("child not done within 90 s")
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child: %v", err)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	accepted := map[byte]map[int]int{'A': {}, 'B': {}}
	var aTimes []time.Duration
	for _, e := range events {
		r.total++
		if !e.ok {
			r.refused++
		} else {
			accepted[e.client][e.record]++
			switch e.client {
			case 'A':
				r.a = max(r.a, e.at)
				aTimes = append(aTimes, e.at)
			case 'B':
				r.b = max(r.b, e.at)
			}
		}
		s := int(e.at / time.Second)
		for len(r.perSec) <= s {
			r.perSec = append(r.perSec, [3]int{})
		}
		switch {
		case !e.ok:
			r.perSec[s][2]++
		case e.client == 'A':
			r.perSec[s][0]++
		default:
			r.perSec[s][1]++
		}
	}
	for c, n := range map[byte]int{'A': 10000, 'B': 5000} {
		for i := range n {
			switch k := accepted[c][i]; {
			case k == 0:
				r.lost++
			case k > 1:
				r.dupes += k - 1
			}
		}
	}
	// A at ≥ 95 % of the full (paced) rate after B's end: the first
	// 200 ms window starting after B's last accepted record in which A
	// had that many accepted, less the part of it it took to get there.
	sort.Slice(aTimes, func(i, j int) bool { return aTimes[i] < aTimes[j] })
	const win = 200 * time.Millisecond
	full := 0.95 * 490 * win.Seconds()
	r.freed = -1
	for at := r.b; at+win <= r.a; at += 5 * time.Millisecond {
		lo := sort.Search(len(aTimes), func(i int) bool { return aTimes[i] >= at })
		hi := sort.Search(len(aTimes), func(i int) bool { return aTimes[i] >= at+win })
		if float64(hi-lo) >= full {
			r.freed = at - r.b
			break
		}
	}
	return r
}

// TestPublishedExampleChild is one processor of
// TestPublishedExampleProcesses; it does nothing unless started by it. It
// says READY once connected, starts on a line from its stdin, sends its
// records (each until accepted) with pubWorkers goroutines, and prints
// its holder's figures.
func TestPublishedExampleChild(t *testing.T) {
	if os.Getenv(pubChildEnv) == "" {
		t.Skip("helper process of TestPublishedExampleProcesses")
	}
	name := os.Getenv("SLUICE_PUBLISHED_NAME")
	records, err := strconv.Atoi(os.Getenv("SLUICE_PUBLISHED_RECORDS"))
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: os.Getenv("SLUICE_PUBLISHED_REDIS")})
	defer rc.Close()
	store, err := redisstore.NewLeaseStore(rc, os.Getenv("SLUICE_PUBLISHED_SERVICE"), redisstore.LeaseOptions{Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, err := lease.NewHolder(store, lease.Options{ID: name, Capacity: pubCapacity, Partitions: pubParts, TTL: pubTTL})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: pubWorkers}, Timeout: 10 * time.Second}
	base := os.Getenv("SLUICE_PUBLISHED_URL") + "/?c=" + name + "&r="
	// Connect to Redis before the start, so that the run measures the
	// holders, not process start-up.
	if err := rc.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("READY")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- h.Run(ctx) }()
	queue := make(chan int, records)
	for i := range records {
		queue <- i
	}
	var (
		mu   sync.Mutex
		left = records
	)
	h.SetBacklog(left)
	lim := h.Limiter()
	var wg sync.WaitGroup
	for range pubWorkers {
		wg.Go(func() {
			for {
				var rec int
				select {
				case rec = <-queue:
				case <-ctx.Done():
					return
				}
				if lim.Wait(ctx) != nil {
					return
				}
				resp, err := client.Get(base + strconv.Itoa(rec))
				if err != nil {
					queue <- rec
					continue
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck // drained for reuse
				resp.Body.Close()
				h.Observe(resp.StatusCode, resp.Header)
				if resp.StatusCode != http.StatusOK {
					queue <- rec
					continue
				}
				mu.Lock()
				left--
				done := left == 0
				h.SetBacklog(left)
				mu.Unlock()
				if done {
					cancel()
				}
			}
		})
	}
	wg.Wait()
	cancel()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	s := h.Stats()
	el := time.Since(start).Seconds()
	fmt.Printf("STATS %s: store round trips %.2f/s, acquisitions %d, renewals %d, losses %d, releases %d, 429s %d, cuts %d, pauses %d\n",
		name, float64(s.StoreCalls)/el, s.Acquisitions, s.Renewals, s.Losses, s.Releases, s.Throttled, s.Cuts, s.Pauses)
}
