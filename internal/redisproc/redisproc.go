// Package redisproc starts and stops redis-server processes: each on a free
// loopback port (never 6379, the port of a shared server), in a directory
// of its own, without persistence, and stopped by the process id it was
// given. Readiness is awaited by polling PING with a bounded deadline.
//
// It is real code, not test code: `sluice demo ingest` and the load
// generator bench/redisload start their servers with Launch. Package
// internal/redistest wraps it for tests (testing.TB, t.Cleanup, skipping
// or failing when redis-server is missing) and builds a Cluster and a
// Sentinel set on it.
package redisproc

import (
	"context"
	"crypto/tls"
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
	"time"

	"github.com/redis/go-redis/v9"
)

// StartTimeout bounds how long a server may take to answer PING; Poll asks
// every pollEvery.
const (
	StartTimeout = 10 * time.Second
	pollEvery    = 5 * time.Millisecond
)

// Kind is what a Process runs as.
type Kind int

const (
	Standalone  Kind = iota
	ClusterNode      // cluster-enabled; its bus port (port+10000) is free too
	Sentinel
)

// Options say what to start.
type Options struct {
	Kind Kind
	// Dir is the parent directory of the process's own: each attempt runs
	// in a new directory under it (its log, a cluster node's nodes.conf, a
	// Sentinel's configuration file). Required; the caller removes it.
	Dir string
	// Args returns more command-line arguments for a server on port, such
	// as "--requirepass", "secret"; for a Sentinel, the lines of its
	// configuration file. Nil: none.
	Args func(port int) []string
	// TLS is the client configuration of a server that speaks only TLS:
	// readiness is checked with it.
	TLS *tls.Config
	// Host, when set, runs the server on another host than this
	// process's loopback (a network namespace of internal/faultnet): on
	// Host's address and port Port, started through Host's Command and
	// checked for readiness through its Dial. Nil: 127.0.0.1 and a free
	// port.
	Host Host
	// Port is the port on Host (required with it, ignored without).
	Port int
}

// A Host is where a server runs when it is not this process's loopback.
type Host interface {
	// IP is the address the server binds and clients reach.
	IP() string
	// Command returns the command that runs name with args on the host.
	Command(name string, args ...string) *exec.Cmd
	// DialContext connects from the host (to reach what only it reaches).
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// A Process is one redis-server process.
type Process struct {
	port  int
	host  Host // nil: loopback
	dir   string
	kind  Kind
	extra []string
	tls   *tls.Config

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has been waited for
}

// Addr is the server's address, 127.0.0.1:port (or its Host's).
func (p *Process) Addr() string { return net.JoinHostPort(p.ip(), strconv.Itoa(p.port)) }

func (p *Process) ip() string {
	if p.host == nil {
		return "127.0.0.1"
	}
	return p.host.IP()
}

// Port is the server's TCP port.
func (p *Process) Port() int { return p.port }

// Kind is what the process runs as.
func (p *Process) Kind() Kind { return p.kind }

// Start starts redis-server on a free loopback port and waits until it
// answers PING (a server that requires a password is ready when it
// answers, even to refuse PING). It tries another port when one fails: a
// free port may be taken by someone else before the server binds it.
func Start(o Options) (*Process, error) {
	if o.Dir == "" {
		return nil, errors.New("redisproc: Options.Dir is required")
	}
	if o.Host != nil && o.Port <= 0 {
		return nil, errors.New("redisproc: Options.Port is required with Options.Host")
	}
	var last error
	for range 5 {
		port, err := o.Port, error(nil)
		if o.Host == nil {
			port, err = freePort(o.Kind == ClusterNode)
		}
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp(o.Dir, "redis-")
		if err != nil {
			return nil, err
		}
		p := &Process{port: port, host: o.Host, dir: dir, kind: o.Kind, tls: o.TLS}
		if o.Args != nil {
			p.extra = o.Args(port)
		}
		if last = p.launch(); last == nil {
			return p, nil
		}
		if o.Host != nil {
			break // a Host's port is its own: another try would meet the same
		}
	}
	return nil, last
}

// Launch starts a standalone redis-server in a new temporary directory,
// for a program that needs one of its own (a demo, a load generator). It
// returns the server's address and a function that stops the server, by
// the process id it was given, and removes the directory.
func Launch() (addr string, stop func(), err error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "redisproc")
	if err != nil {
		return "", nil, err
	}
	p, err := Start(Options{Kind: Standalone, Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return p.Addr(), func() { p.Kill(); os.RemoveAll(dir) }, nil
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
	return 0, errors.New("redisproc: no free loopback port")
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func (p *Process) args() ([]string, error) {
	var open []string
	if p.host != nil {
		// Clients come from the Host's network, not loopback; protected
		// mode would refuse them.
		open = []string{"--protected-mode", "no"}
	}
	if p.kind == Sentinel {
		// A Sentinel keeps its state in a configuration file it rewrites.
		conf := filepath.Join(p.dir, "sentinel.conf")
		if err := os.WriteFile(conf, []byte(strings.Join(p.extra, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
		return append([]string{conf, "--sentinel",
			"--port", strconv.Itoa(p.port),
			"--bind", p.ip(),
			"--dir", p.dir,
			"--daemonize", "no",
			"--logfile", filepath.Join(p.dir, "redis.log"),
		}, open...), nil
	}
	a := []string{
		"--port", strconv.Itoa(p.port),
		"--bind", p.ip(),
		"--save", "",
		"--appendonly", "no",
		"--dir", p.dir,
		"--daemonize", "no",
		"--logfile", filepath.Join(p.dir, "redis.log"),
		"--enable-debug-command", "local", // DEBUG SLEEP for slow-server tests
		"--repl-diskless-sync-delay", "0", // a replica syncs at once, not after 5 s
	}
	a = append(a, open...)
	if p.kind == ClusterNode {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(p.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
			// Keep the other masters serving while one is stopped.
			"--cluster-require-full-coverage", "no",
		)
	}
	return append(a, p.extra...), nil
}

// Restart starts a killed server again on the same port, in the same
// directory, and waits until it answers PING.
func (p *Process) Restart() error { return p.launch() }

// launch starts the process and waits for PING to succeed.
func (p *Process) launch() error {
	args, err := p.args()
	if err != nil {
		return err
	}
	var cmd *exec.Cmd
	if p.host != nil {
		cmd = p.host.Command("redis-server", args...)
	} else {
		cmd = exec.Command("redis-server", args...)
	}
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exit := make(chan struct{})
	go func() { cmd.Wait(); close(exit) }() //nolint:errcheck // exit status of a killed server is uninteresting
	p.mu.Lock()
	p.cmd, p.exit = cmd, exit
	p.mu.Unlock()
	if err := p.waitReady(exit); err != nil {
		p.Kill()
		return fmt.Errorf("%w; log: %s", err, p.LogTail())
	}
	return nil
}

// waitReady polls PING until the server answers, it exits or StartTimeout
// passes.
func (p *Process) waitReady(exit <-chan struct{}) error {
	o := &redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond, TLSConfig: p.tlsConfig()}
	if p.host != nil {
		o.Dialer = p.host.DialContext
	}
	c := redis.NewClient(o)
	defer c.Close()
	err := Poll(StartTimeout, exit, func(ctx context.Context) (bool, string, error) {
		err := c.Ping(ctx).Err()
		var rerr redis.Error
		return err == nil || errors.As(err, &rerr), "PING:", err // it answered, if only NOAUTH
	})
	if err != nil {
		return fmt.Errorf("redis-server on port %d: %w", p.port, err)
	}
	return nil
}

func (p *Process) tlsConfig() *tls.Config {
	if p.tls == nil {
		return nil
	}
	return p.tls.Clone()
}

// LogTail returns the last 2,000 bytes of the server's log.
func (p *Process) LogTail() string {
	b, err := os.ReadFile(filepath.Join(p.dir, "redis.log"))
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Kill stops the process, if it runs, with SIGKILL (as a crash would: no
// shutdown, nothing saved), by the process id it was given, and waits for
// it. A stopped (frozen) process is killed too.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, exit := p.cmd, p.exit
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill() //nolint:errcheck // it may have exited already
	<-exit
}

// ErrNotRunning is returned by Signal when the process was killed.
var ErrNotRunning = errors.New("redisproc: server is not running")

// Signal sends sig to the running process, such as FreezeSignal or
// ThawSignal.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%w (port %d)", ErrNotRunning, p.port)
	}
	return cmd.Process.Signal(sig)
}

// Poll calls cond every few milliseconds until it reports true, at most
// timeout long, or until exit (if not nil) is closed; each call of cond
// gets a second. An error says what cond last saw: its state and error.
func Poll(timeout time.Duration, exit <-chan struct{}, cond func(context.Context) (ok bool, state string, err error)) error {
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
