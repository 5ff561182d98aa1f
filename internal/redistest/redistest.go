// Package redistest starts real redis-server processes for tests: a
// standalone server (plain or TLS), a three-master Redis Cluster, or a
// master with a replica and a Sentinel, each on free loopback ports, in a
// temporary directory, without persistence. Every process is
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
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
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

// startTimeout bounds how long a server may take to answer PING (or a
// replica or Sentinel to be ready), clusterTimeout a cluster to report
// cluster_state:ok; poll asks every pollEvery.
const (
	startTimeout   = 10 * time.Second
	clusterTimeout = 30 * time.Second
	pollEvery      = 5 * time.Millisecond
)

// A Server is one redis-server process owned by a test.
type Server struct {
	t      testing.TB
	port   int
	dir    string
	kind   kind
	extra  []string    // more arguments; a Sentinel's configuration lines
	tls    *tls.Config // a TLS server's clients' configuration: its CA
	caFile string
	pass   string // the password Client authenticates with

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has been waited for
}

// Addr is the server's address, 127.0.0.1:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// kind is what a Server runs as.
type kind int

const (
	standalone kind = iota
	clusterNode
	sentinel
)

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
	return StandaloneWith(t)
}

// StandaloneWith starts a standalone redis-server with more command-line
// arguments, such as "--requirepass", "secret". A server that requires a
// password is ready when it answers, even to refuse PING.
func StandaloneWith(t testing.TB, args ...string) *Server {
	t.Helper()
	need(t, "redis-server")
	return start(t, standalone, args, nil)
}

// StandaloneTLS starts a standalone redis-server that speaks only TLS, with
// a certificate for 127.0.0.1 from a CA made for the test (CAFile, and
// TLSConfig for clients). Clients need no certificate of their own.
func StandaloneTLS(t testing.TB) *Server {
	t.Helper()
	need(t, "redis-server")
	dir := t.TempDir()
	cfg, err := writeCerts(dir)
	if err != nil {
		t.Fatalf("redistest: certificates: %v", err)
	}
	return start(t, standalone, nil, func(s *Server) {
		s.tls, s.caFile = cfg, filepath.Join(dir, "ca.pem")
		s.extra = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", filepath.Join(dir, "server.pem"), "--tls-key-file", filepath.Join(dir, "server.key"),
			"--tls-ca-cert-file", s.caFile, "--tls-auth-clients", "no"}
	})
}

// CAFile is the PEM file of the CA that signed a TLS server's certificate.
func (s *Server) CAFile() string { return s.caFile }

// TLSConfig returns a client configuration for a TLS server (nil for
// others).
func (s *Server) TLSConfig() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.Clone()
}

// writeCerts writes ca.pem, server.pem and server.key in dir: a CA and a
// certificate it signs for 127.0.0.1, valid for a day. It returns a client
// configuration that trusts the CA.
func writeCerts(dir string) (*tls.Config, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(crand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		return nil, err
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(crand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	for name, block := range map[string]*pem.Block{
		"ca.pem":     {Type: "CERTIFICATE", Bytes: caDER},
		"server.pem": {Type: "CERTIFICATE", Bytes: srvDER},
		"server.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, err
		}
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
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
	s, err := launchFree(func() string { return dir }, standalone, nil, nil)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return s.Addr(), func() { s.kill(); os.RemoveAll(dir) }, nil
}

func start(t testing.TB, k kind, extra []string, prep func(*Server)) *Server {
	t.Helper()
	s, err := launchFree(t.TempDir, k, extra, prep)
	if err != nil {
		t.Fatalf("redistest: cannot start redis-server: %v", err)
	}
	s.t = t
	t.Cleanup(s.kill)
	return s
}

// launchFree starts a server on a free port, in a directory that dir
// returns, trying another port when one fails; prep, if not nil, completes
// the Server once its port is known.
func launchFree(dir func() string, k kind, extra []string, prep func(*Server)) (*Server, error) {
	var last error
	for range 5 { // a free port may be taken by someone else before we bind it
		port, err := freePort(k == clusterNode)
		if err != nil {
			return nil, err
		}
		s := &Server{port: port, dir: dir(), kind: k, extra: extra}
		if prep != nil {
			prep(s)
		}
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

func (s *Server) args() ([]string, error) {
	if s.kind == sentinel {
		// A Sentinel keeps its state in a configuration file it rewrites.
		conf := filepath.Join(s.dir, "sentinel.conf")
		if err := os.WriteFile(conf, []byte(strings.Join(s.extra, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
		return []string{conf, "--sentinel",
			"--port", strconv.Itoa(s.port),
			"--bind", "127.0.0.1",
			"--dir", s.dir,
			"--daemonize", "no",
			"--logfile", filepath.Join(s.dir, "redis.log"),
		}, nil
	}
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--enable-debug-command", "local", // DEBUG SLEEP for slow-server tests
		"--repl-diskless-sync-delay", "0", // a replica syncs at once, not after 5 s
	}
	if s.kind == clusterNode {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
			// Keep the other masters serving while one is stopped.
			"--cluster-require-full-coverage", "no",
		)
	}
	return append(a, s.extra...), nil
}

// launch starts the process and waits for PING to succeed.
func (s *Server) launch() error {
	args, err := s.args()
	if err != nil {
		return err
	}
	cmd := exec.Command("redis-server", args...)
	DieWithParent(cmd)
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

// waitReady polls PING until the server answers, it exits or startTimeout
// passes.
func (s *Server) waitReady(exit <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond, TLSConfig: s.TLSConfig()})
	defer c.Close()
	err := poll(startTimeout, exit, func(ctx context.Context) (bool, string, error) {
		err := c.Ping(ctx).Err()
		var rerr redis.Error
		return err == nil || errors.As(err, &rerr), "PING:", err // it answered, if only NOAUTH
	})
	if err != nil {
		return fmt.Errorf("redis-server on port %d: %w", s.port, err)
	}
	return nil
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

// Freeze stops the server's process with SIGSTOP, as a long pause would
// (a VM or container frozen, a stalled fork): it keeps its connections and
// its data, and reads what clients sent it once Thaw resumes it. A frozen
// server is killed at the end of the test as any other (SIGKILL ends a
// stopped process).
func (s *Server) Freeze() {
	s.t.Helper()
	s.signal(freezeSignal, "freeze")
}

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw() {
	s.t.Helper()
	s.signal(thawSignal, "thaw")
}

func (s *Server) signal(sig os.Signal, what string) {
	s.t.Helper()
	if sig == nil {
		s.t.Skipf("redistest: cannot %s a process on this system", what)
	}
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		s.t.Fatalf("redistest: %s: server on port %d is not running", what, s.port)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %s: %v", what, err)
	}
}

// Start starts a stopped server again on the same port and waits until it
// answers; a cluster node also waits until its cluster state is ok.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
	if s.kind == clusterNode {
		if err := waitClusterOK([]*Server{s}); err != nil {
			s.t.Fatalf("redistest: restart: %v", err)
		}
	}
}

// Client returns a new go-redis client of this server, closed when the test
// ends. It is meant for test set-up and fault injection.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.TLSConfig(), Password: s.pass})
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
		c.Nodes = append(c.Nodes, start(t, clusterNode, nil, nil))
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
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		err := poll(clusterTimeout, nil, func(ctx context.Context) (bool, string, error) {
			info, err := c.ClusterInfo(ctx).Result()
			return err == nil && clusterOK(info), info, err
		})
		c.Close()
		if err != nil {
			return fmt.Errorf("cluster node %s: %w", n.Addr(), err)
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

// SentinelMaster is the name under which a SentinelSet's Sentinel monitors
// its master.
const SentinelMaster = "sluice"

// A SentinelSet is a master, one replica of it, and one Sentinel that
// monitors them as SentinelMaster (a quorum of one).
type SentinelSet struct {
	t                         testing.TB
	Master, Replica, Sentinel *Server
}

// Addrs returns the Sentinel's address, as clients in Sentinel mode take it.
func (ss *SentinelSet) Addrs() []string { return []string{ss.Sentinel.Addr()} }

// Sentinel starts a master, a replica of it and a Sentinel, waits until the
// replica is in sync and the Sentinel knows it, and stops them all when the
// test ends.
func Sentinel(t testing.TB) *SentinelSet {
	t.Helper()
	return SentinelAuth(t, "")
}

// SentinelAuth is Sentinel with a Sentinel that requires password (none
// if empty); the master and replica require none.
func SentinelAuth(t testing.TB, password string) *SentinelSet {
	t.Helper()
	need(t, "redis-server")
	ss := &SentinelSet{t: t}
	ss.Master = start(t, standalone, nil, nil)
	ss.Replica = start(t, standalone, []string{"--replicaof", "127.0.0.1", strconv.Itoa(ss.Master.port)}, nil)
	if err := ss.Replica.waitInSync(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	conf := []string{
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1", SentinelMaster, ss.Master.port),
		fmt.Sprintf("sentinel down-after-milliseconds %s 1000", SentinelMaster),
		fmt.Sprintf("sentinel failover-timeout %s 10000", SentinelMaster),
	}
	if password != "" {
		conf = append(conf, "requirepass "+strconv.Quote(password))
	}
	ss.Sentinel = start(t, sentinel, conf, func(s *Server) { s.pass = password })
	if err := ss.waitMaster(ss.Master, true); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return ss
}

// Failover has the Sentinel promote the replica, waits until the Sentinel
// names it master and it reports the master role, then swaps Master and
// Replica. The old master becomes a replica when the Sentinel next looks
// at it (up to ten seconds later).
func (ss *SentinelSet) Failover() {
	ss.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c := ss.Sentinel.Client()
	if err := c.Do(ctx, "SENTINEL", "FAILOVER", SentinelMaster).Err(); err != nil {
		ss.t.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
	}
	if err := ss.waitMaster(ss.Replica, false); err != nil {
		ss.t.Fatalf("redistest: failover: %v", err)
	}
	ss.Master, ss.Replica = ss.Replica, ss.Master
}

// waitInSync polls until the replica s reports its link to its master up.
func (s *Server) waitInSync() error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	err := poll(startTimeout, nil, func(ctx context.Context) (bool, string, error) {
		info, err := c.Info(ctx, "replication").Result()
		return strings.Contains(info, "master_link_status:up"), info, err
	})
	if err != nil {
		return fmt.Errorf("replica %s not in sync: %w", s.Addr(), err)
	}
	return nil
}

// waitMaster polls until the Sentinel names m as master, m reports the
// master role and, when withReplica, the Sentinel knows one replica.
func (ss *SentinelSet) waitMaster(m *Server, withReplica bool) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: ss.Sentinel.Addr(), MaxRetries: -1, Password: ss.Sentinel.pass})
	defer c.Close()
	mc := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer mc.Close()
	return poll(startTimeout, nil, func(ctx context.Context) (bool, string, error) {
		addr, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		if err != nil {
			return false, "", err
		}
		if len(addr) != 2 || addr[1] != strconv.Itoa(m.port) {
			return false, fmt.Sprintf("master is %v", addr), nil
		}
		info, err := mc.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "role:master") {
			return false, info, err
		}
		if withReplica { // and has heard from it: one it could promote
			rs, err := c.Replicas(ctx, SentinelMaster).Result()
			if err != nil || len(rs) != 1 {
				return false, fmt.Sprintf("replicas %v", rs), err
			}
			refresh, _ := strconv.Atoi(rs[0]["info-refresh"])
			if rs[0]["flags"] != "slave" || rs[0]["master-link-status"] != "ok" || refresh <= 0 || refresh > 5000 {
				return false, fmt.Sprintf("replica %v", rs[0]), nil
			}
		}
		return true, "", nil
	})
}

// poll calls cond every pollEvery until it reports true, at most timeout
// long, or until exit (if not nil) is closed; an error says what cond last
// saw.
func poll(timeout time.Duration, exit <-chan struct{}, cond func(context.Context) (bool, string, error)) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok, state, err := cond(ctx)
		cancel()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %s %v", timeout, state, err)
		}
		select {
		case <-exit:
			return errors.New("exited")
		case <-tick.C:
		}
	}
}
