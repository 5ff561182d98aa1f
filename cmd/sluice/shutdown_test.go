package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// waitServing waits for serve's start-up line and returns its attributes.
func waitServing(t *testing.T, h recordHandler, done <-chan error) map[string]string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r := <-h.ch:
			if r["msg"] == "sluice serving" {
				return r
			}
		case err := <-done:
			t.Fatalf("serve returned: %v", err)
		case <-timeout:
			t.Fatal("serve did not start")
		}
	}
}

// slowClients opens one client of each listener that sends its request a
// byte every 100 ms and would take minutes to finish it: a body on HTTP and
// on the admin API, a message on gRPC. Each has been accepted and its call
// started when it returns.
func slowClients(t *testing.T, up map[string]string) *trickle {
	t.Helper()
	httpConn := slowBody(t, up["http"], "POST", "/v1/check", "")
	adminConn := slowBody(t, up["admin"], "PUT", "/admin/v1/overrides/st/per_user", "Authorization: Bearer tok\r\n")
	grpcConn, streams, _ := slowStreams(t, up["grpc"], 1)
	return startTrickle(t, 100*time.Millisecond,
		slowConn{httpConn, byteStep}, slowConn{adminConn, byteStep}, slowConn{grpcConn, dataStep(streams)})
}

// TestServeShutdownCutsSlowClients: clients too slow to finish their
// requests get the whole --shutdown-timeout, then their connections are
// closed, and serve stops cleanly: they are no failure of the service's.
// (It used to wait for the full timeout and fail with "HTTP shutdown:
// context deadline exceeded", which made the process exit 1.)
func TestServeShutdownCutsSlowClients(t *testing.T) {
	const timeout = time.Second
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	h := recordHandler{ch: make(chan map[string]string, 64)}
	cfg := serveConfig{
		rulesDir: dir, store: "memory",
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", adminAddr: "127.0.0.1:0", adminToken: "tok",
		maxBodyBytes: 1 << 20, shutdownTimeout: timeout,
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(h)) }()
	up := waitServing(t, h, done)
	slowClients(t, up)

	cancel()
	start := time.Now()
	var err error
	select {
	case err = <-done:
	case <-time.After(timeout + 10*time.Second):
		t.Fatal("serve did not stop")
	}
	took := time.Since(start)
	t.Logf("serve stopped %v after the cancel, with slow clients on every listener", took.Round(time.Millisecond))
	if err != nil {
		t.Errorf("serve with slow clients at shutdown: %v; want a clean stop", err)
	}
	// The slow clients had the whole timeout; then closing them and their
	// calls returning takes far less than the second cutGrace allows.
	if took < timeout || took > timeout+time.Second {
		t.Errorf("serve stopped %v after the cancel; want between %v and %v", took, timeout, timeout+time.Second)
	}
	// The operator is told what was cut, listener by listener.
	for {
		select {
		case r := <-h.ch:
			if r["msg"] != "shutdown deadline passed; closing the connections still open" {
				continue
			}
			if r["level"] != "WARN" || r["http"] != "1" || r["admin"] != "1" || r["grpc"] != "1" {
				t.Errorf("the deadline's log record: %v; want a warning with one connection on each listener", r)
			}
		default:
			t.Error("nothing logged about the connections cut at the deadline")
		}
		return
	}
}

// TestSIGTERMWithSlowClients: the binary, sent SIGTERM while slow clients
// hold a call open on every listener, exits 0 within its shutdown timeout
// (and the time to close them). It used to exit 1 after the full timeout.
func TestSIGTERMWithSlowClients(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildSluice(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	p := startSluice(t, bin, nil, "serve", "--rules", dir, "--log-format", "json", "--shutdown-timeout", "1s",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokenFile)
	r := p.next(t, "sluice serving", 10*time.Second)
	slowClients(t, map[string]string{"http": r.str("http"), "grpc": r.str("grpc"), "admin": r.str("admin")})

	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range p.logs { // to its end, so that the exit is reported
	}
	err := p.waitExit(t, 10*time.Second)
	took := time.Since(sent)
	t.Logf("exited %v after SIGTERM: %v", took.Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("exit after SIGTERM with slow clients: %v; want 0", err)
	}
	if took > 2*time.Second {
		t.Errorf("exited %v after SIGTERM; want within the 1s timeout and the 1s to close the clients", took)
	}
}
