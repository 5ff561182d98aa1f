package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// e2eRules is the rule file of the end-to-end test; %d is the per-user limit.
const e2eRules = `domain: e2e
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: %d, name: per_user}
`

// logRecord is one line of serve's JSON log.
type logRecord map[string]any

func (r logRecord) str(k string) string { s, _ := r[k].(string); return s }

// sluiceProcess is a running sluice binary and its log.
type sluiceProcess struct {
	cmd    *exec.Cmd
	logs   chan logRecord
	exit   chan error
	exited bool
	panics atomic.Int64 // "panic recovered" records seen in its log
}

// buildSluice builds the binary into a temporary directory, static as the
// container image's (deploy/container/build.sh): the tests run the code
// the image ships, and the image's build reuses their compiled packages.
func buildSluice(t *testing.T) string {
	t.Helper()
	start := time.Now()
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built in %v", time.Since(start).Round(time.Millisecond))
	return bin
}

// startSluice starts bin with args, env added to this process's
// environment, and reads its JSON log. When the test ends, a process that
// has not exited is killed, and its whole log is shown if the test failed.
func startSluice(t *testing.T, bin string, env []string, args ...string) *sluiceProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &sluiceProcess{cmd: cmd, logs: make(chan logRecord, 256), exit: make(chan error, 1)}
	var (
		logMu   sync.Mutex
		logText strings.Builder
	)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(p.logs)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logMu.Lock()
			logText.Write(sc.Bytes())
			logText.WriteByte('\n')
			logMu.Unlock()
			var r logRecord
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				if r.str("msg") == "panic recovered" {
					p.panics.Add(1)
				}
				p.logs <- r
			}
		}
	}()
	go func() {
		<-readDone // Wait closes the pipe: read it to its end first
		p.exit <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if !p.exited {
			_ = cmd.Process.Kill() // only the process this test started
			for range p.logs {
			}
			<-p.exit
		}
		// Containment must not hide bugs: no test expects a panic of a
		// binary it started.
		if n := p.panics.Load(); n > 0 {
			t.Errorf("sluice recovered %d panics (a bug each; see the log)", n)
		}
		if t.Failed() {
			logMu.Lock()
			t.Log(logText.String())
			logMu.Unlock()
		}
	})
	return p
}

// waitExit waits for the process to exit, within d, and returns how it
// exited. At most 256 log records may wait unread meanwhile.
func (p *sluiceProcess) waitExit(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-p.exit:
		p.exited = true
		return err
	case <-time.After(d):
		t.Fatalf("sluice did not exit within %v", d)
		return nil
	}
}

// next waits for the next log record with message msg and returns it.
func (p *sluiceProcess) next(t *testing.T, msg string, within time.Duration) logRecord {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case r, ok := <-p.logs:
			if !ok {
				t.Fatalf("sluice exited before logging %q", msg)
			}
			if r.str("msg") == msg {
				return r
			}
		case <-deadline:
			t.Fatalf("no %q log record within %v", msg, within)
		}
	}
}

// all waits for one record of each message, in any order.
func (p *sluiceProcess) all(t *testing.T, within time.Duration, msgs ...string) map[string]logRecord {
	t.Helper()
	got := map[string]logRecord{}
	deadline := time.After(within)
	for len(got) < len(msgs) {
		select {
		case r, ok := <-p.logs:
			if !ok {
				t.Fatalf("sluice exited before logging %q", msgs)
			}
			for _, m := range msgs {
				if r.str("msg") == m {
					got[m] = r
				}
			}
		case <-deadline:
			t.Fatalf("not all of %q logged within %v", msgs, within)
		}
	}
	return got
}

// writeAtomic replaces path as an editor does: a new file renamed over it.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".edit.tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestEndToEnd builds the binary, serves a temporary rules directory on
// free loopback ports, and checks gRPC, JSON, hot reload (good and broken
// files), the admin API and a clean exit on SIGTERM.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	start := time.Now()
	bin := buildSluice(t)

	dir := t.TempDir()
	ruleFile := filepath.Join(dir, "e2e.yaml")
	if err := os.WriteFile(ruleFile, fmt.Appendf(nil, e2eRules, 3), 0o644); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	const token = "e2e-token"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	p := startSluice(t, bin, []string{"SLUICE_ADMIN_TOKEN="}, // the file wins anyway
		"serve", "--rules", dir, "--log-format", "json",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokenFile)

	// The start-up line, and the watcher's first load (from then on,
	// changes are seen), in either order.
	start1 := p.all(t, 10*time.Second, "sluice serving", "rules loaded")
	up := start1["sluice serving"]
	grpcAddr, httpAddr, adminAddr := up.str("grpc"), up.str("http"), up.str("admin")
	if up.str("domains") != "e2e" || up.str("store") != "memory" || up["rule_count"] != float64(1) {
		t.Errorf("start-up line = %v", up)
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health = %v, %v", hc, err)
	}
	rl := rlsv3.NewRateLimitServiceClient(conn)
	ask := func(user string) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		resp, err := rl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain:      "e2e",
			Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}},
		})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp.GetStatuses()[0]
	}
	for want := uint32(2); ; want-- {
		st := ask("ann")
		if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != want || st.GetCurrentLimit().GetRequestsPerUnit() != 3 {
			t.Fatalf("request with %d remaining: %v", want, st)
		}
		if want == 0 {
			break
		}
	}
	if st := ask("ann"); st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th request: %v", st)
	}

	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+httpAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("/json", `{"domain":"e2e","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}`); code != 429 || !strings.Contains(body, "OVER_LIMIT") {
		t.Errorf("/json over the limit: %d %s", code, body)
	}
	if code, body := post("/v1/check", `{"domain":"e2e","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`); code != 200 || !strings.Contains(body, `"remaining":2`) {
		t.Errorf("/v1/check: %d %s", code, body)
	}
	if resp, err := http.Get("http://" + httpAddr + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("readyz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// A valid edit applies at once, against what was consumed: ann has
	// used 3 of a limit now 10.
	writeAtomic(t, ruleFile, fmt.Sprintf(e2eRules, 10))
	p.next(t, "rules loaded", 10*time.Second)
	if st := ask("ann"); st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.GetLimitRemaining() != 6 {
		t.Fatalf("after the edit: %v", st)
	}

	// A broken edit keeps the last good rules and shows the error.
	writeAtomic(t, ruleFile, "domain: e2e\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	failed := p.next(t, "rules reload failed; keeping the last good rules", 10*time.Second)
	if !strings.Contains(failed.str("err"), "e2e.yaml:4") {
		t.Errorf("reload error %q does not name the file and line", failed.str("err"))
	}
	if st := ask("ann"); st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.GetLimitRemaining() != 5 {
		t.Fatalf("after the broken edit: %v", st)
	}
	req, _ := http.NewRequest("GET", "http://"+adminAddr+"/admin/v1/rules", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var rulesOut struct {
		Domains []struct {
			Rules []struct {
				Name  string `json:"name"`
				Limit int64  `json:"limit"`
			} `json:"rules"`
		} `json:"domains"`
		Reload struct {
			Failures  int    `json:"failures"`
			LastError string `json:"last_error"`
		} `json:"reload"`
	}
	err = json.NewDecoder(resp.Body).Decode(&rulesOut)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("admin rules: %d %v", resp.StatusCode, err)
	}
	if len(rulesOut.Domains) != 1 || rulesOut.Domains[0].Rules[0].Limit != 10 ||
		rulesOut.Reload.Failures < 1 || !strings.Contains(rulesOut.Reload.LastError, "e2e.yaml:4") {
		t.Errorf("admin rules = %+v", rulesOut)
	}

	// SIGTERM: readiness off, drain, exit 0 within a bound.
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.next(t, "sluice stopped", 10*time.Second)
	if err := p.waitExit(t, 10*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	t.Logf("stopped %v after SIGTERM; whole test %v", time.Since(sent).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
