// Package redistest starts real redis-server processes for tests: a
// standalone server or a three-master Redis Cluster, each on free loopback
// ports, in a temporary directory, without persistence. Every process is
// started by the test that asks for it and stopped, by the process id it
// was given, in t.Cleanup. Tests never use a Redis they did not start: in
// particular nothing here ever talks to a shared server on port 6379.
//
// When redis-server (or, for a cluster, redis-cli) is not installed the test
// is skipped, except under CI=true, where it fails: CI must install it.
//
// Stop and Start let fault tests kill a server and bring it back on the same
// port. Readiness is awaited by polling PING with a bounded deadline.
//
// Launch starts the same standalone server outside a test, for load
// generators such as bench/redisload.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a server may take to answer PING, and a
// cluster to report cluster_state:ok.
const (
	startTimeout   = 10 * time.Second
	clusterTimeout = 30 * time.Second
	pollEvery      = 5 * time.Millisecond
)

// A Server is one redis-server process owned by a test.
type Server struct {
	t       testing.TB
	port    int
	dir     string
	cluster bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has been waited for
}

// Addr is the server's address, 127.0.0.1:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// need skips or fails t when a binary is missing.
func need(t testing.TB, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("redistest: %s not found (CI must install Redis): %v", b, err)
			}
			t.Skipf("redistest: %s not found: %v", b, err)
		}
	}
}

// Standalone starts a standalone redis-server for the test and stops it when
// the test ends.
func Standalone(t testing.TB) *Server {
	t.Helper()
	need(t, "redis-server")
	return start(t, false)
}

// Launch starts a standalone redis-server outside a test (a load generator's
// own server), as Standalone does, in a new temporary directory. It returns
// the server's address and a function that stops the server, by the process
// id it was given, and removes the directory.
func Launch() (addr string, stop func(), err error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		return "", nil, err
	}
	s, err := launchFree(func() string { return dir }, false)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return s.Addr(), func() { s.kill(); os.RemoveAll(dir) }, nil
}

func start(t testing.TB, cluster bool) *Server {
	t.Helper()
	s, err := launchFree(t.TempDir, cluster)
	if err != nil {
		t.Fatalf("redistest: cannot start redis-server: %v", err)
	}
	s.t = t
	t.Cleanup(s.kill)
	return s
}

// launchFree starts a server on a free port, in a directory that dir
// returns, trying another port when one fails.
func launchFree(dir func() string, cluster bool) (*Server, error) {
	var last error
	for range 5 { // a free port may be taken by someone else before we bind it
		port, err := freePort(cluster)
		if err != nil {
			return nil, err
		}
		s := &Server{port: port, dir: dir(), cluster: cluster}
		if last = s.launch(); last == nil {
			return s, nil
		}
	}
	return nil, last
}

// freePort returns a loopback port that was free a moment ago; for a cluster
// node, its bus port (port+10000) was free too.
func freePort(cluster bool) (int, error) {
	for range 100 {
		p := 20000 + rand.IntN(20000)
		if p == 6379 || !portFree(p) || (cluster && !portFree(p+10000)) {
			continue
		}
		return p, nil
	}
	return 0, errors.New("no free loopback port")
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func (s *Server) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--enable-debug-command", "local", // DEBUG SLEEP for slow-server tests
	}
	if s.cluster {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
			// Keep the other masters serving while one is stopped.
			"--cluster-require-full-coverage", "no",
		)
	}
	return a
}

// launch starts the process and waits for PING to succeed.
func (s *Server) launch() error {
	cmd := exec.Command("redis-server", s.args()...)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exit := make(chan struct{})
	go func() { cmd.Wait(); close(exit) }() //nolint:errcheck // exit status of a killed server is uninteresting
	s.mu.Lock()
	s.cmd, s.exit = cmd, exit
	s.mu.Unlock()
	if err := s.waitReady(exit); err != nil {
		s.kill()
		return fmt.Errorf("%w; log: %s", err, s.logTail())
	}
	return nil
}

func (s *Server) waitReady(exit chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %d not ready after %v: %w", s.port, startTimeout, err)
		}
		select {
		case <-exit:
			return fmt.Errorf("redis-server on port %d exited", s.port)
		case <-tick.C:
		}
	}
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// kill stops the process this Server started, if it runs, and waits for it.
func (s *Server) kill() {
	s.mu.Lock()
	cmd, exit := s.cmd, s.exit
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill() //nolint:errcheck // it may have exited already
	<-exit
}

// Stop kills the server (as a crash would: no shutdown, nothing saved).
func (s *Server) Stop() {
	s.t.Helper()
	s.kill()
}

// Start starts a stopped server again on the same port and waits until it
// answers; a cluster node also waits until its cluster state is ok.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
	if s.cluster {
		if err := waitClusterOK([]*Server{s}); err != nil {
			s.t.Fatalf("redistest: restart: %v", err)
		}
	}
}

// Client returns a new go-redis client of this server, closed when the test
// ends. It is meant for test set-up and fault injection.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// A ClusterSet is a Redis Cluster of three masters without replicas.
type ClusterSet struct {
	Nodes []*Server
}

// Addrs returns the addresses of the cluster's nodes.
func (c *ClusterSet) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr()
	}
	return a
}

// Cluster starts three cluster-enabled redis-server processes, joins them
// into a cluster with redis-cli --cluster create (one third of the slots
// each, no replicas), waits until every node reports cluster_state:ok, and
// stops them when the test ends.
func Cluster(t testing.TB) *ClusterSet {
	t.Helper()
	need(t, "redis-server", "redis-cli")
	c := &ClusterSet{}
	for range 3 {
		c.Nodes = append(c.Nodes, start(t, true))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if err := waitClusterOK(c.Nodes); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// waitClusterOK polls CLUSTER INFO on every node until each says
// cluster_state:ok and knows all 16384 slots.
func waitClusterOK(nodes []*Server) error {
	deadline := time.Now().Add(clusterTimeout)
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		err := func() error {
			defer c.Close()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			var last string
			for {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				info, err := c.ClusterInfo(ctx).Result()
				cancel()
				if err == nil && clusterOK(info) {
					return nil
				}
				last = info
				if err != nil {
					last = err.Error()
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("cluster node %s not ok after %v: %s", n.Addr(), clusterTimeout, last)
				}
				<-tick.C
			}
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

func clusterOK(info string) bool {
	var ok, slots bool
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		switch strings.TrimSpace(sc.Text()) {
		case "cluster_state:ok":
			ok = true
		case "cluster_slots_ok:16384":
			slots = true
		}
	}
	return ok && slots
}
