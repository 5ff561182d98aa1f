package faultnet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// The ports every host uses: each host is a namespace of its own, so
// they are never taken.
const (
	redisPort    = 7000
	sentinelPort = 7001
	httpPort     = 8080
	grpcPort     = 8081
)

// faultsEnv lets the scenarios run that `make test` leaves out, to stay
// within its time: `make faults` sets it.
const faultsEnv = "SLUICE_TEST_FAULTS"

// inMakeFaults skips t unless faultsEnv is set.
func inMakeFaults(t *testing.T) {
	t.Helper()
	if os.Getenv(faultsEnv) == "" {
		t.Skip("make faults runs it (" + faultsEnv + "=1)")
	}
}

var (
	buildOnce sync.Once
	binDir    string
	bin       string
	buildErr  error
)

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		os.Exit(holderMain())
	}
	if os.Getenv(leaseEnv) != "" {
		os.Exit(leaseMain())
	}
	if os.Getenv(natsEnv) != "" {
		os.Exit(natsMain())
	}
	if os.Getenv(nodeEnv) != "" {
		os.Exit(nodeMain())
	}
	if os.Getenv(drainerEnv) != "" {
		os.Exit(drainerMain())
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// sluiceBinary builds cmd/sluice once per test process, static as the
// container image's (as cmd/sluice's own tests do), and returns its path.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "faultnet-sluice"); buildErr != nil {
			return
		}
		start := time.Now()
		defer func() { t.Logf("built sluice in %v", time.Since(start).Round(time.Millisecond)) }()
		bin = filepath.Join(binDir, "sluice")
		build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/sluicehq/sluice/cmd/sluice")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// startRedis starts redis-server on h (more arguments in args) and kills
// it when the test ends.
func startRedis(t *testing.T, h *faultnet.Host, kind redisproc.Kind, port int, args ...string) *redisproc.Process {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found (CI must install it): %v", err)
		}
		t.Skipf("redis-server not found: %v", err)
	}
	p, err := redisproc.Start(redisproc.Options{Kind: kind, Dir: t.TempDir(), Host: h, Port: port,
		Args: func(int) []string { return args }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// serve is one `sluice serve` process on a host, asked from another.
type serve struct {
	host *faultnet.Host
	proc *faultnet.Proc
	url  string
	c    *http.Client
}

// startServe runs `sluice serve` on h with rules (one YAML file) and
// flags, and waits until it is ready, asked from the client host from.
func startServe(t *testing.T, h, from *faultnet.Host, rules string, flags ...string) *serve {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--rules", dir, "--log-format", "json",
		"--http-addr", h.Addr(httpPort), "--grpc-addr", h.Addr(grpcPort)}, flags...)
	s := &serve{host: h, proc: h.Start(sluiceBinary(t), args...), url: "http://" + h.Addr(httpPort),
		c: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: from.DialContext, MaxIdleConnsPerHost: 64}}}
	t.Cleanup(s.c.CloseIdleConnections)
	err := redisproc.Poll(30*time.Second, s.proc.Exited(), func(ctx context.Context) (bool, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/readyz", nil)
		resp, err := s.c.Do(req)
		if err != nil {
			return false, "readyz:", err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
	if err != nil {
		t.Fatalf("sluice serve on %s: %v\n%s", h.Name(), err, s.proc.LogTail())
	}
	return s
}

// shed is the Reason of a check serve's overload guard refused (503).
const shed = "shed"

// answer is what /v1/check said of a request of one descriptor.
type answer struct {
	Allowed     bool `json:"allowed"`
	Descriptors []struct {
		Reason    string `json:"reason"`
		Remaining int    `json:"remaining"`
	} `json:"descriptors"`
}

// ask asks /v1/check for cost units of key=value in domain. The error
// says why there is no decision: no answer, or serve's overload guard
// (shed), or any answer but 200 and 429.
func (s *serve) ask(domain, key, value string, cost int) (answer, error) {
	body := fmt.Sprintf(`{"domain":%q,"cost":%d,"descriptors":[{"entries":[{"key":%q,"value":%q}]}]}`, domain, cost, key, value)
	var a answer
	resp, err := s.c.Post(s.url+"/v1/check", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		return a, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return a, err
	case resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(b, []byte("temporary-reduced-capacity")):
		return a, errors.New(shed) // serve's overload guard refused it
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal(b, &a) != nil || len(a.Descriptors) != 1:
		return a, fmt.Errorf("%s: %.200s", resp.Status, b)
	}
	return a, nil
}

// check asks for one unit of key=value in domain and records the
// operation in hist as client's.
func (s *serve) check(hist *faultnet.History, client int, domain, key, value string) {
	op := faultnet.Op{Client: client, Start: time.Now(), Outcome: faultnet.Failed}
	a, err := s.ask(domain, key, value, 1)
	op.End = time.Now()
	switch {
	case err != nil:
		op.Reason = err.Error()
	case a.Allowed:
		op.Outcome, op.Reason = faultnet.Admitted, a.Descriptors[0].Reason
	default:
		op.Outcome, op.Reason = faultnet.Denied, a.Descriptors[0].Reason
	}
	hist.Add(op)
}

// load sends checks to each serve from workers goroutines per serve, one
// every every per worker, until stop is closed; the client of each
// operation is its serve's index. It returns when every worker is done.
func load(servers []*serve, workers int, every time.Duration, hist *faultnet.History, stop <-chan struct{}, domain, key, value string) {
	var wg sync.WaitGroup
	for i, s := range servers {
		for range workers {
			wg.Go(func() {
				tick := time.NewTicker(every)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						s.check(hist, i, domain, key, value)
					}
				}
			})
		}
	}
	wg.Wait()
}
