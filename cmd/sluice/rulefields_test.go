package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// servedInProcess is serve run in this process by run, its JSON log read line
// by line.
type servedInProcess struct {
	up   map[string]any // the "sluice serving" record
	logs chan map[string]any
	done chan error
}

// startServed runs `sluice serve --log-format json args...` until the
// test ends, and waits for it to serve.
func startServed(t *testing.T, args ...string) *servedInProcess {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(t.Context())
	p := &servedInProcess{logs: make(chan map[string]any, 256), done: make(chan error, 1)}
	go func() {
		err := run(ctx, append([]string{"serve", "--log-format", "json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...), io.Discard, pw)
		pw.Close()
		p.done <- err
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var r map[string]any
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				select {
				case p.logs <- r:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-p.done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	})
	p.up = p.next(t, "sluice serving")
	return p
}

// next waits for the log record whose message is msg.
func (p *servedInProcess) next(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-p.logs:
			if r["msg"] == msg {
				return r
			}
		case err := <-p.done:
			t.Fatalf("serve returned: %v", err)
		case <-deadline:
			t.Fatalf("no log %q within 10s", msg)
		}
	}
}

func (p *servedInProcess) post(t *testing.T, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+p.up["http"].(string)+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (p *servedInProcess) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.up["http"].(string) + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const quotaRuleFile = `domain: q
descriptors:
  - key: backend
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
`

// TestServeRuntimeLayoutQuotaMode runs serve on Envoy's runtime layout
// from the RUNTIME_* variables: quota_mode over gRPC, /json and
// /v1/check, then a swap of RUNTIME_ROOT's symlink reloads the rules.
func TestServeRuntimeLayoutQuotaMode(t *testing.T) {
	base := t.TempDir()
	for v, content := range map[string]string{"v1": quotaRuleFile, "v2": strings.Replace(quotaRuleFile, "domain: q", "domain: q2", 1)} {
		dir := filepath.Join(base, v, "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(base, "current")
	if err := os.Symlink(filepath.Join(base, "v1"), root); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RUNTIME_ROOT", root)
	t.Setenv("RUNTIME_SUBDIRECTORY", "ratelimit")
	t.Setenv("RUNTIME_IGNOREDOTFILES", "true")
	p := startServed(t)
	if p.up["domains"] != "q" || p.up["rules_root"] != root {
		t.Fatalf("start-up line %v; want domain q from the runtime layout", p.up)
	}

	// gRPC: a over its quota, b within: OK, a OVER_LIMIT, named in the metadata.
	conn, err := grpc.NewClient(p.up["grpc"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	desc := func(v string) *commonv3.RateLimitDescriptor {
		return &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "backend", Value: v}}}
	}
	if _, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonv3.RateLimitDescriptor{desc("a")}}); err != nil {
		t.Fatal(err)
	}
	out, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonv3.RateLimitDescriptor{desc("a"), desc("b")}})
	if err != nil {
		t.Fatal(err)
	}
	v := out.GetDynamicMetadata().GetFields()["quotaModeViolations"].GetListValue().GetValues()
	if out.OverallCode != rlsv3.RateLimitResponse_OK || out.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || len(v) != 1 || v[0].GetNumberValue() != 0 {
		t.Fatalf("gRPC: %v; want OK, descriptor 0 OVER_LIMIT and named in quotaModeViolations", out)
	}
	// /json: the same answer in proto3 JSON.
	code, body := p.post(t, "/json", `{"domain":"q","descriptors":[{"entries":[{"key":"backend","value":"a"}]},{"entries":[{"key":"backend","value":"c"}]}]}`)
	if code != 200 || !strings.Contains(body, `"quotaModeViolations":[0]`) || !strings.Contains(body, `"quotaModeEnabled":true`) {
		t.Errorf("/json: %d %s; want 200 naming descriptor 0", code, body)
	}
	// /v1/check: quota_exceeded on the descriptor of an allowed request.
	code, body = p.post(t, "/v1/check", `{"domain":"q","descriptors":[{"entries":[{"key":"backend","value":"a"}]},{"entries":[{"key":"backend","value":"d"}]}]}`)
	if code != 200 || !strings.Contains(body, `"allowed":true,"code":"OK"`) || !strings.Contains(body, `"quota_exceeded":true`) {
		t.Errorf("/v1/check: %d %s; want 200 with a quota exceeded", code, body)
	}
	// Every quota descriptor over: 429.
	if code, body = p.post(t, "/v1/check", `{"domain":"q","descriptors":[{"entries":[{"key":"backend","value":"a"}]}]}`); code != 429 {
		t.Errorf("/v1/check, every quota over: %d %s; want 429", code, body)
	}

	// A new version published by swapping the root's symlink.
	tmp := root + ".new"
	if err := os.Symlink(filepath.Join(base, "v2"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, root); err != nil {
		t.Fatal(err)
	}
	p.next(t, "rules loaded; domains removed, their requests are no longer limited")
	if code, body = p.post(t, "/v1/check", `{"domain":"q2","descriptors":[{"entries":[{"key":"backend","value":"a"}]}]}`); code != 200 || !strings.Contains(body, `"matched":true`) {
		t.Errorf("after the swap: %d %s; want domain q2 matched", code, body)
	}
}

// TestServeNoDomain: serve with no domain warns and says so in /readyz,
// which stays 200.
func TestServeNoDomain(t *testing.T) {
	dir := t.TempDir()
	p := startServed(t, "--rules", dir)
	code, body := p.get(t, "/readyz")
	if code != 200 || !strings.Contains(body, "no domain loaded") {
		t.Errorf("/readyz: %d %q; want 200 saying no domain is loaded", code, body)
	}
}

// TestServeNoDomainWarns: the warning comes before serve serves.
func TestServeNoDomainWarns(t *testing.T) {
	_, stderr, err := runArgs(t, canceled(t), "serve", "--rules", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "level=WARN msg=\"no domain loaded: every request is allowed") {
		t.Errorf("serve log lacks the WARN:\n%s", stderr)
	}
}

// TestServeRulesConfigHint: a --rules directory whose rule files are in
// its config/ subdirectory is refused with the hint.
func TestServeRulesConfigHint(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config", "q.yaml"), []byte(quotaRuleFile), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runArgs(t, canceled(t), "serve", "--rules", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "runtime layout") {
		t.Errorf("serve = %v; want the runtime layout hint", err)
	}
}

func canceled(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	return ctx
}

// TestRuntimeResolve: flags win over the RUNTIME_* variables, and --rules
// over both.
func TestRuntimeResolve(t *testing.T) {
	env := map[string]string{"RUNTIME_ROOT": "/r", "RUNTIME_SUBDIRECTORY": "sub", "RUNTIME_WATCH_ROOT": "false"}
	getenv := func(k string) string { return env[k] }
	tests := []struct {
		name    string
		args    []string
		dir     string
		root    string
		dot     bool
		wantErr string
	}{
		{"environment", nil, "/r/sub/config", "", true, ""},
		{"flag wins", []string{"--runtime-subdirectory", "other", "--runtime-watch-root=true", "--runtime-ignoredotfiles"}, "/r/other/config", "/r", false, ""},
		{"--rules wins", []string{"--rules", "/x"}, "/x", "", false, ""},
		{"both", []string{"--rules", "/x", "--runtime-root", "/y"}, "", "", false, "not both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFlagSet("serve", "", io.Discard)
			cfg := serveConfig{}
			fs.StringVar(&cfg.rulesDir, "rules", "examples/rules", "")
			var rt runtimeFlags
			addRuntimeFlags(fs, &rt)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			given := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
			err := rt.resolve(&cfg, given, getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v; want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || cfg.rulesDir != tt.dir || cfg.rulesRoot != tt.root || cfg.rulesDotFiles != tt.dot {
				t.Errorf("resolve = %v: dir %q root %q dot %v; want %q %q %v", err, cfg.rulesDir, cfg.rulesRoot, cfg.rulesDotFiles, tt.dir, tt.root, tt.dot)
			}
		})
	}
}
