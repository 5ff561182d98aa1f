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
// The processes themselves (ports, arguments, start, readiness, kill by
// process id) are package internal/redisproc's, which programs use outside
// tests; this package adds what a test needs on top.
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
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// startTimeout bounds how long a server may take to answer PING (or a
// replica or Sentinel to be ready), clusterTimeout a cluster to report
// cluster_state:ok.
const (
	startTimeout   = redisproc.StartTimeout
	clusterTimeout = 30 * time.Second
)

// A Server is one redis-server process owned by a test.
type Server struct {
	t      testing.TB
	p      *redisproc.Process
	tls    *tls.Config // a TLS server's clients' configuration: its CA
	caFile string
	pass   string // the password Client authenticates with
}

// Addr is the server's address, 127.0.0.1:port.
func (s *Server) Addr() string { return s.p.Addr() }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.p.Port() }

// DieWithParent makes the kernel kill cmd's process if the test process
// dies without running its cleanups (a panic in another goroutine, a
// timeout, a kill): no redis-server, and no child a test starts with it,
// outlives the test that started it. Call it before cmd.Start. It is
// redisproc.DieWithParent.
func DieWithParent(cmd *exec.Cmd) { redisproc.DieWithParent(cmd) }

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
	return start(t, redisproc.Options{Kind: redisproc.Standalone, Args: func(int) []string { return args }})
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
	caFile := filepath.Join(dir, "ca.pem")
	s := start(t, redisproc.Options{Kind: redisproc.Standalone, TLS: cfg, Args: func(port int) []string {
		return []string{"--port", "0", "--tls-port", strconv.Itoa(port),
			"--tls-cert-file", filepath.Join(dir, "server.pem"), "--tls-key-file", filepath.Join(dir, "server.key"),
			"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no"}
	}})
	s.caFile = caFile
	return s
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

// Launch starts a standalone redis-server outside a test, in a new
// temporary directory, and returns its address and a function that stops
// it and removes the directory. It is redisproc.Launch, which programs
// (demos, load generators) call directly.
func Launch() (addr string, stop func(), err error) { return redisproc.Launch() }

// start starts a server for t, in a directory of t's, and kills it when the
// test ends.
func start(t testing.TB, o redisproc.Options) *Server {
	t.Helper()
	o.Dir = t.TempDir()
	p, err := redisproc.Start(o)
	if err != nil {
		t.Fatalf("redistest: cannot start redis-server: %v", err)
	}
	t.Cleanup(p.Kill)
	return &Server{t: t, p: p, tls: o.TLS}
}

// Stop kills the server (as a crash would: no shutdown, nothing saved).
func (s *Server) Stop() {
	s.t.Helper()
	s.p.Kill()
}

// Freeze stops the server's process with SIGSTOP, as a long pause would
// (a VM or container frozen, a stalled fork): it keeps its connections and
// its data, and reads what clients sent it once Thaw resumes it. A frozen
// server is killed at the end of the test as any other (SIGKILL ends a
// stopped process).
func (s *Server) Freeze() {
	s.t.Helper()
	s.signal(redisproc.FreezeSignal, "freeze")
}

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw() {
	s.t.Helper()
	s.signal(redisproc.ThawSignal, "thaw")
}

func (s *Server) signal(sig os.Signal, what string) {
	s.t.Helper()
	if sig == nil {
		s.t.Skipf("redistest: cannot %s a process on this system", what)
	}
	if err := s.p.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %s: %v", what, err)
	}
}

// Start starts a stopped server again on the same port and waits until it
// answers; a cluster node also waits until its cluster state is ok.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.p.Restart(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
	if s.p.Kind() == redisproc.ClusterNode {
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
		c.Nodes = append(c.Nodes, start(t, redisproc.Options{Kind: redisproc.ClusterNode}))
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
		err := redisproc.Poll(clusterTimeout, nil, func(ctx context.Context) (bool, string, error) {
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
	ss.Master = start(t, redisproc.Options{Kind: redisproc.Standalone})
	replicaOf := []string{"--replicaof", "127.0.0.1", strconv.Itoa(ss.Master.Port())}
	ss.Replica = start(t, redisproc.Options{Kind: redisproc.Standalone, Args: func(int) []string { return replicaOf }})
	if err := ss.Replica.waitInSync(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	conf := []string{
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1", SentinelMaster, ss.Master.Port()),
		fmt.Sprintf("sentinel down-after-milliseconds %s 1000", SentinelMaster),
		fmt.Sprintf("sentinel failover-timeout %s 10000", SentinelMaster),
	}
	if password != "" {
		conf = append(conf, "requirepass "+strconv.Quote(password))
	}
	ss.Sentinel = start(t, redisproc.Options{Kind: redisproc.Sentinel, Args: func(int) []string { return conf }})
	ss.Sentinel.pass = password
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
	err := redisproc.Poll(startTimeout, nil, func(ctx context.Context) (bool, string, error) {
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
	return redisproc.Poll(startTimeout, nil, func(ctx context.Context) (bool, string, error) {
		addr, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		if err != nil {
			return false, "", err
		}
		if len(addr) != 2 || addr[1] != strconv.Itoa(m.Port()) {
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
