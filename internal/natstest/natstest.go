// Package natstest starts NATS servers with JetStream for tests: an
// embedded one in the test's own process (file storage in a temporary
// directory, restartable on the same port and data) and a cluster of
// real OS processes on loopback, each a copy of the test binary running
// the server (see ChildMain), stopped by the process id it was given.
// Tests never use a NATS server they did not start; nothing here talks to
// port 4222.
//
// The server is the nats-server Go module that go.mod names, so nothing
// needs installing.
package natstest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/sluicehq/sluice/internal/natsembed"
)

// startTimeout bounds how long a server may take to accept clients (a
// cluster node to be ready).
const startTimeout = natsembed.StartTimeout

// An Embedded is a JetStream server in the test's process.
type Embedded struct {
	t    testing.TB
	dir  string
	port int

	mu  sync.Mutex
	srv *server.Server
}

// Start starts an embedded JetStream server with file storage under a
// temporary directory, on a free loopback port; it is shut down in
// t.Cleanup.
func Start(t testing.TB) *Embedded {
	t.Helper()
	e := &Embedded{t: t, dir: t.TempDir(), port: -1}
	e.start()
	t.Cleanup(e.Shutdown)
	return e
}

func (e *Embedded) start() {
	e.t.Helper()
	s, err := natsembed.Start(e.dir, "127.0.0.1", e.port)
	if err != nil {
		e.t.Fatal(err)
	}
	e.port = s.Addr().(*net.TCPAddr).Port
	e.mu.Lock()
	e.srv = s
	e.mu.Unlock()
}

// URL is the client URL.
func (e *Embedded) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(e.port) }

// Shutdown stops the server (it may be called more than once).
func (e *Embedded) Shutdown() {
	e.mu.Lock()
	s := e.srv
	e.srv = nil
	e.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart stops the server and starts it again on the same port and data.
func (e *Embedded) Restart() {
	e.t.Helper()
	e.Shutdown()
	e.start()
}

// childEnv names the configuration file a child process serves.
const childEnv = "SLUICE_NATSTEST_CONFIG"

// ChildMain runs a cluster node when the process was started as one, and
// never returns then; otherwise it returns at once. Call it first in the
// TestMain of a package that uses StartCluster.
func ChildMain() {
	conf := os.Getenv(childEnv)
	if conf == "" {
		return
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "natstest child:", err)
		os.Exit(2)
	}
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "natstest child:", err)
		os.Exit(2)
	}
	s.Start()
	if !s.ReadyForConnections(startTimeout) {
		fmt.Fprintln(os.Stderr, "natstest child: not ready")
		os.Exit(2)
	}
	fmt.Println("READY")
	// Serve until stdin closes (the test ended) or the process is killed.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	s.Shutdown()
	os.Exit(0)
}

// A Cluster is n JetStream servers in a cluster, each its own process.
type Cluster struct {
	t     testing.TB
	ports []int
	nodes []*exec.Cmd
}

// StartCluster starts n cluster nodes (copies of the test binary, see
// ChildMain) on free loopback ports and waits until each accepts clients;
// they are killed in t.Cleanup. With n = 1 it is one server, not
// clustered, in its own process (so that a benchmark's CPU time is the
// client's alone).
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	routes := make([]int, n)
	c.ports = make([]int, n)
	for i := range n {
		c.ports[i], routes[i] = freePort(t), freePort(t)
	}
	var rs []string
	for _, p := range routes {
		rs = append(rs, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	dir := t.TempDir()
	for i := range n {
		nd := filepath.Join(dir, "n"+strconv.Itoa(i))
		conf := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\njetstream { store_dir: %q }\n", i, c.ports[i], nd)
		if n > 1 {
			conf += fmt.Sprintf("cluster { name: sluicetest, listen: 127.0.0.1:%d, routes: [%s] }\n", routes[i], strings.Join(rs, ", "))
		}
		path := filepath.Join(dir, "n"+strconv.Itoa(i)+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+path)
		cmd.Stderr = os.Stderr
		if _, err := cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		c.nodes = append(c.nodes, cmd)
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(out)
			ok := sc.Scan() && sc.Text() == "READY"
			ready <- ok
			for sc.Scan() {
			}
		}()
		c.waitReady(i, ready)
	}
	return c
}

func (c *Cluster) waitReady(i int, ready chan bool) {
	c.t.Helper()
	tm := time.NewTimer(startTimeout)
	defer tm.Stop()
	select {
	case ok := <-ready:
		if !ok {
			c.t.Fatalf("natstest: cluster node %d did not start", i)
		}
	case <-tm.C:
		c.t.Fatalf("natstest: cluster node %d not ready within %v", i, startTimeout)
	}
}

// URLs are the client URLs of the nodes, comma-separated, as nats.Connect
// takes them.
func (c *Cluster) URLs() string {
	var us []string
	for _, p := range c.ports {
		us = append(us, "nats://127.0.0.1:"+strconv.Itoa(p))
	}
	return strings.Join(us, ",")
}

// Kill kills node i with SIGKILL, by its process id, and waits for it.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	if err := c.nodes[i].Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
	_ = c.nodes[i].Wait()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
