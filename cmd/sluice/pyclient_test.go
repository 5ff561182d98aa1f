package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/fence"
)

// needPython returns the path of python3, skipping the test when it is
// absent, but failing it under CI, which installs it.
func needPython(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 is not installed; .ci/run installs it")
		}
		t.Skip("python3 is not installed")
	}
	return p
}

// pyProcess is a running Python worker (testdata/semaphore_worker.py) and
// the lines it prints.
type pyProcess struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	lines     chan string
	exit      chan error
	stderr    lockedWriter // writes to stderrBuf, from os/exec's goroutine
	stderrBuf bytes.Buffer
}

// startPython runs python3 with the repository's client on its path, and
// kills it, if it still runs, when the test ends.
func startPython(t *testing.T, ctx context.Context, python string, args ...string) *pyProcess {
	t.Helper()
	client, err := filepath.Abs(filepath.Join("..", "..", "clients", "python"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+client, "PYTHONDONTWRITEBYTECODE=1")
	p := &pyProcess{cmd: cmd, lines: make(chan string, 64), exit: make(chan error, 1)}
	p.stderr.w = &p.stderrBuf
	cmd.Stderr = &p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.stdin = stdin
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	go func() {
		<-readDone
		p.exit <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // only the process this test started; an error if it has exited
		_ = stdin.Close()
	})
	return p
}

func (p *pyProcess) stderrText() string {
	p.stderr.mu.Lock()
	defer p.stderr.mu.Unlock()
	return p.stderrBuf.String()
}

// line waits for the next line the worker prints, which must be prefix
// and n fields, and returns the fields.
func (p *pyProcess) line(t *testing.T, prefix string, n int, within time.Duration) []string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("the worker exited before printing %q: %v\n%s", prefix, <-p.exit, p.stderrText())
		}
		f := strings.Fields(strings.TrimPrefix(l, prefix))
		if !strings.HasPrefix(l, prefix) || len(f) != n {
			t.Fatalf("the worker printed %q, want %q and %d fields\n%s", l, prefix, n, p.stderrText())
		}
		return f
	case <-time.After(within):
		t.Fatalf("the worker printed no %q within %v\n%s", prefix, within, p.stderrText())
		return nil
	}
}

// wait waits for the worker to exit, within d, and fails the test unless
// it exited 0.
func (p *pyProcess) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case err := <-p.exit:
		if err != nil {
			t.Errorf("the worker: %v\n%s", err, p.stderrText())
		}
	case <-time.After(d):
		t.Fatalf("the worker did not exit within %v\n%s", d, p.stderrText())
	}
}

// TestPythonClient runs the built binary's serve and Python processes
// using clients/python/sluice.py against it: each error answer raises its
// exception, and hold renews and releases; six workers share a semaphore
// of limit 3 in front of a stub service that never sees more than 3 of
// their requests at once, each grant with a fence of its own that only
// grows per worker; and a worker SIGKILLed while it holds a
// semaphore of limit 1 loses it within its TTL to a waiting worker with a
// larger fence, whose requests a fence.Guard admits while it refuses the
// killed worker's fence; one acquire more than --coord-max-waiters is
// refused (429), and the waiters are answered 503 when serve stops.
func TestPythonClient(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	python := needPython(t)
	const maxWaiters = 4 // above the 3 waiters of "limit"
	bin := buildSluice(t)
	tokenFile := filepath.Join(t.TempDir(), "coord-token")
	if err := os.WriteFile(tokenFile, []byte(coordToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, bin, []string{"SLUICE_COORD_TOKEN="}, "serve", "--rules", rulesDir(t, map[string]string{"st.yaml": testRuleFile}),
		"--log-format", "json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--coord-token-file", tokenFile,
		"--coord-max-waiters", strconv.Itoa(maxWaiters))
	base := "http://" + p.next(t, "sluice serving", 10*time.Second).str("http")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // no worker outlives the test
	defer cancel()
	worker, err := filepath.Abs(filepath.Join("testdata", "semaphore_worker.py"))
	if err != nil {
		t.Fatal(err)
	}
	py := func(t *testing.T, mode, name string, limit int, ttl string, args ...string) *pyProcess {
		return startPython(t, ctx, python, append([]string{worker, mode, base, coordToken, name, strconv.Itoa(limit), ttl}, args...)...)
	}

	t.Run("errors", func(t *testing.T) {
		w := py(t, "errors", "py-errors", 2, "5")
		w.line(t, "errors ok", 0, 20*time.Second)
		w.wait(t, 10*time.Second)
	})

	t.Run("limit", func(t *testing.T) {
		// The name has a space, a slash and a non-ASCII letter: the
		// client must percent-encode the fencing resource as fence reads it.
		const (
			name              = "py workers/é"
			limit             = 3
			workers           = 6
			rounds, requests  = 3, 4
			wantRequestsTotal = workers * rounds * requests
		)
		var (
			inFlight, most, total atomic.Int64
			mu                    sync.Mutex
			last                  = map[string]uint64{} // each worker's latest fence
			grants                = map[uint64]string{} // each fence's worker
			fenceErrs             []string
		)
		stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			total.Add(1)
			resource, token, err := fence.Parse(r.Header)
			mu.Lock()
			switch id := r.Header.Get("X-Worker"); {
			case err != nil:
				fenceErrs = append(fenceErrs, err.Error())
			case resource != name:
				fenceErrs = append(fenceErrs, fmt.Sprintf("resource %q, want %q", resource, name))
			case token < last[id]:
				fenceErrs = append(fenceErrs, fmt.Sprintf("worker %s sent fence %d after %d", id, token, last[id]))
			case grants[token] != "" && grants[token] != id:
				fenceErrs = append(fenceErrs, fmt.Sprintf("fence %d sent by workers %s and %s", token, grants[token], id))
			default:
				last[id], grants[token] = token, id
			}
			mu.Unlock()
			// The protected service's work, during which the request is
			// in flight (not a synchronisation: nothing waits for it).
			time.Sleep(5 * time.Millisecond)
		}))
		defer stub.Close()

		start := time.Now()
		ws := make([]*pyProcess, workers)
		for i := range ws {
			ws[i] = py(t, "work", name, limit, "2", strconv.Itoa(i), stub.URL, strconv.Itoa(rounds), strconv.Itoa(requests))
		}
		for i, w := range ws {
			if got := w.line(t, "done", 1, 30*time.Second); got[0] != strconv.Itoa(i) {
				t.Errorf("worker %d printed done %q", i, got)
			}
			w.wait(t, 10*time.Second)
		}
		t.Logf("%d workers, %d requests in %v; at most %d in flight", workers, total.Load(), time.Since(start).Round(time.Millisecond), most.Load())
		if m := most.Load(); m > limit || m < 1 {
			t.Errorf("at most %d requests in flight at once; the limit is %d", m, limit)
		}
		if n := total.Load(); n != wantRequestsTotal {
			t.Errorf("the stub served %d requests, want %d", n, wantRequestsTotal)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(fenceErrs) > 0 {
			t.Errorf("fencing header fields: %q", fenceErrs)
		}
		if len(last) != workers || len(grants) != workers*rounds {
			t.Errorf("%d fences of %d workers seen, want one per grant, %d of %d", len(grants), len(last), workers*rounds, workers)
		}
	})

	t.Run("killed holder", func(t *testing.T) {
		const (
			name = "py-crash"
			ttl  = time.Second
		)
		var guard fence.Guard
		stub := httptest.NewServer(guard.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
		defer stub.Close()
		ttlArg := strconv.FormatFloat(ttl.Seconds(), 'f', -1, 64)

		holder := py(t, "hold", name, 1, ttlArg, stub.URL)
		held, err := strconv.ParseUint(holder.line(t, "holding", 1, 20*time.Second)[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		taker := py(t, "take", name, 1, ttlArg, stub.URL, "8")
		taker.line(t, "waiting", 0, 20*time.Second)
		killed := time.Now()
		if err := holder.cmd.Process.Kill(); err != nil { // SIGKILL: it renews no more, releases nothing
			t.Fatal(err)
		}
		got := taker.line(t, "acquired", 2, 10*time.Second)
		after := time.Since(killed)
		t.Logf("the killed holder's permit (fence %d) came back after %v (TTL %v) with fence %s", held, after.Round(time.Millisecond), ttl, got[0])
		if after > ttl+2*time.Second {
			t.Errorf("the killed holder's permit came back after %v; TTL %v", after, ttl)
		}
		if fenced, err := strconv.ParseUint(got[0], 10, 64); err != nil || fenced <= held {
			t.Errorf("fence after the kill %q, want above %d", got[0], held)
		}
		if got[1] != "200" {
			t.Errorf("the guard answered the new holder %s, want 200", got[1])
		}
		taker.wait(t, 10*time.Second)

		// The killed holder's fence, sent late, is refused.
		req, err := http.NewRequestWithContext(ctx, "POST", stub.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		fence.Set(req.Header, name, held)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict {
			t.Errorf("the killed holder's fence: %d, want 409", resp.StatusCode)
		}
		if s := guard.Stats(); s.Refused != 1 {
			t.Errorf("the guard refused %d requests, want 1 (the killed holder's late one)", s.Refused)
		}
	})

	// Last: it stops serve.
	t.Run("crowd and shutdown", func(t *testing.T) {
		w := py(t, "crowd", "py-crowd", 1, "30", strconv.Itoa(maxWaiters))
		w.line(t, "crowded", 0, 20*time.Second)
		if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		w.line(t, "unavailable ok", 0, 20*time.Second)
		w.wait(t, 10*time.Second)
		if err := p.waitExit(t, 15*time.Second); err != nil {
			t.Errorf("serve exited with %v", err)
		}
	})
}
