// Package faultnet builds, for one test, a network of hosts on this
// machine and the faults between them: each host is a Linux network
// namespace with one address in a private /24, joined to the others by a
// veth pair to a bridge that sits in a namespace of its own, so that
// nothing is added to the machine's own network and two tests never see
// each other's hosts. Processes run inside a host (`ip netns exec`) and
// are stopped by the process id they were given; the test process itself
// dials and listens inside a host (a goroutine locked to a thread that
// enters the namespace for the one call, so the socket belongs to the
// host).
//
// Faults:
//   - Partition cuts two hosts apart (nftables drop rules in both, for
//     every packet between their addresses; Heal removes them): packets
//     vanish, as on a real partition, so connections time out rather
//     than being refused.
//   - Proc.Pause and Proc.Resume stop and resume a process (SIGSTOP,
//     SIGCONT), as a long GC pause or a frozen VM would.
//   - Host.Netem shapes a host's link with tc netem (delay, jitter,
//     loss), where the kernel has it (NetemSupported); where it has not,
//     Host.Relay is a TCP relay on a host that delays each direction
//     (with jitter: Relay.SetJitter), and Net.Loss drops a random share
//     of the packets between two hosts (nftables, on the bridge).
//
// Every namespace is named with the package's prefix, this process's id
// and a counter ("sfn-PID-N-host"), and removed in t.Cleanup after the
// host's processes are killed; a namespace left by a process that died
// before its cleanups (its id no longer runs) is removed by the next New.
//
// New needs root (namespaces, nftables): without it the test is skipped,
// except under CI=true, where it fails, as when ip or nft is missing.
// History and the checkers beside it record and judge what clients saw.
//
// The package imports testing, so import rule 9 keeps it out of the
// binary; it is named for what it builds (a network whose faults a test
// controls) rather than "faulttest", since its scenarios are the tests
// beside it.
package faultnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// prefix begins the name of every namespace this package makes.
const prefix = "sfn-"

// counter numbers the networks of this process.
var counter atomic.Int64

// staleOnce removes the namespaces of dead processes once per process.
var staleOnce sync.Once

// A Net is the network of one test: a bridge and the hosts joined to it.
type Net struct {
	t      testing.TB
	name   string // sfn-PID-N
	bridge string // the bridge's namespace
	subnet [3]byte
	dir    string

	mu    sync.Mutex
	added int // hosts numbered so far
	hosts []*Host
}

// New makes an empty network for t, removed when t ends. It skips t
// (fails it under CI=true) when not run as root or without ip and nft.
func New(t testing.TB) *Net {
	t.Helper()
	need(t)
	staleOnce.Do(removeStale)
	k := counter.Add(1)
	n := &Net{
		t:      t,
		name:   fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), k),
		subnet: [3]byte{10, 213, byte(k % 250)},
		dir:    t.TempDir(),
	}
	n.bridge = n.name + "-br"
	if err := ipNetns("add", n.bridge); err != nil {
		t.Fatalf("faultnet: %v", err)
	}
	t.Cleanup(n.close)
	n.must(run("ip", "-n", n.bridge, "link", "add", "br0", "type", "bridge"))
	n.must(run("ip", "-n", n.bridge, "link", "set", "br0", "up"))
	return n
}

// need skips or fails t when the harness cannot run here.
func need(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root (network namespaces, nftables)"
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil && why == "" {
			why = fmt.Sprintf("%s not found (.ci/run installs it): %v", bin, err)
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("faultnet: %s", why)
	}
	t.Skipf("faultnet: %s", why)
}

// removeStale deletes the namespaces of processes that no longer run.
func removeStale() {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, os.ErrNotExist) {
			_ = ipNetns("del", e.Name()) // best effort: the next run tries again
		}
	}
}

func (n *Net) must(err error) {
	n.t.Helper()
	if err != nil {
		n.t.Fatalf("faultnet: %v", err)
	}
}

// close kills the hosts' processes and deletes every namespace.
func (n *Net) close() {
	n.mu.Lock()
	hosts := n.hosts
	n.mu.Unlock()
	for _, h := range hosts {
		h.killAll()
		if err := ipNetns("del", h.ns); err != nil {
			n.t.Errorf("faultnet: %v", err)
		}
	}
	if err := ipNetns("del", n.bridge); err != nil {
		n.t.Errorf("faultnet: %v", err)
	}
}

// A Host is one network namespace joined to the Net's bridge, with one
// address.
type Host struct {
	net   *Net
	name  string
	ns    string
	ip    netip.Addr
	index int

	mu    sync.Mutex
	procs []*Proc
	cuts  map[*Host]bool // hosts this one is partitioned from
}

// Host adds a host named name (a short word: it names its namespace and
// its processes' logs) and brings its link up.
func (n *Net) Host(name string) *Host {
	n.t.Helper()
	n.mu.Lock()
	n.added++
	i := n.added
	n.mu.Unlock()
	if i > 250 {
		n.t.Fatal("faultnet: at most 250 hosts")
	}
	h := &Host{net: n, name: name, ns: fmt.Sprintf("%s-%d", n.name, i), index: i,
		ip: netip.AddrFrom4([4]byte{n.subnet[0], n.subnet[1], n.subnet[2], byte(i)}), cuts: map[*Host]bool{}}
	n.must(ipNetns("add", h.ns))
	n.mu.Lock()
	n.hosts = append(n.hosts, h) // deleted by close from now on
	n.mu.Unlock()
	port := "h" + strconv.Itoa(i)
	n.must(run("ip", "-n", h.ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", n.bridge))
	n.must(run("ip", "-n", n.bridge, "link", "set", port, "master", "br0"))
	n.must(run("ip", "-n", n.bridge, "link", "set", port, "up"))
	n.must(run("ip", "-n", h.ns, "addr", "add", h.ip.String()+"/24", "dev", "eth0"))
	n.must(run("ip", "-n", h.ns, "link", "set", "eth0", "up"))
	n.must(run("ip", "-n", h.ns, "link", "set", "lo", "up"))
	return h
}

// Name is the host's name, as given to Net.Host.
func (h *Host) Name() string { return h.name }

// IP is the host's address.
func (h *Host) IP() string { return h.ip.String() }

// Addr is the host's address with port.
func (h *Host) Addr(port int) string { return net.JoinHostPort(h.IP(), strconv.Itoa(port)) }

// Command returns a command that runs name with args inside the host. The
// caller starts it; Start also logs and stops it.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.ns, name}, args...)...)
}

// DialContext connects from inside the host: the socket is the host's,
// so a partition or a shaped link of the host applies to it. It fits
// go-redis's Options.Dialer, http.Transport.DialContext and gRPC's
// WithContextDialer (with a network of "tcp").
func (h *Host) DialContext(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = h.inside(func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside the host, on one of its addresses.
func (h *Host) Listen(network, addr string) (l net.Listener, err error) {
	err = h.inside(func() error {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket listens for datagrams (udp) inside the host.
func (h *Host) ListenPacket(network, addr string) (c net.PacketConn, err error) {
	err = h.inside(func() error {
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// inside runs f on a thread that has entered the host's namespace, in a
// goroutine of its own that waits for it. The thread goes back to this
// process's namespace afterwards; if it cannot, the thread is left locked
// and the runtime ends it with the goroutine.
func (h *Host) inside(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer back.Close()
		target, err := os.Open(filepath.Join("/run/netns", h.ns))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := setns(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("faultnet: enter %s: %w", h.ns, err)
			return
		}
		err = f()
		if setns(back) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// Partition cuts h from each of others: every packet between their
// addresses is dropped, both ways, until Heal.
func (h *Host) Partition(others ...*Host) {
	h.net.t.Helper()
	for _, o := range others {
		h.net.must(cut(h, o, true))
		h.net.must(cut(o, h, true))
	}
}

// Heal ends the partitions between h and each of others.
func (h *Host) Heal(others ...*Host) {
	h.net.t.Helper()
	for _, o := range others {
		h.net.must(cut(h, o, false))
		h.net.must(cut(o, h, false))
	}
}

// cut adds (or removes) the table that drops, in a's namespace, every
// packet to or from b.
func cut(a, b *Host, on bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cuts[b] == on {
		return nil
	}
	table := "faultnet_cut_" + strconv.Itoa(b.index)
	var script string
	if on {
		script = fmt.Sprintf(`table inet %[1]s {
	chain in { type filter hook input priority 0; policy accept; ip saddr %[2]s drop; }
	chain out { type filter hook output priority 0; policy accept; ip daddr %[2]s drop; }
}
`, table, b.IP())
	} else {
		script = "delete table inet " + table + "\n"
	}
	if err := nft(a.ns, script); err != nil {
		return err
	}
	a.cuts[b] = on
	return nil
}

// NetemSupported reports whether the kernel shapes links with tc netem
// (a kernel built without sch_netem refuses the qdisc).
func NetemSupported() bool {
	ns := fmt.Sprintf("%s%d-netem", prefix, os.Getpid())
	if ipNetns("add", ns) != nil {
		return false
	}
	defer ipNetns("del", ns) //nolint:errcheck // best effort
	return run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms") == nil
}

// Netem shapes the host's link (both directions of its traffic leave
// through it or its bridge port) with tc netem's arguments, such as
// "delay", "5ms", "1ms" (delay and jitter) or "loss", "1%"; no arguments
// remove the shaping. Each direction gets them, so a round trip through
// the link is delayed twice.
func (h *Host) Netem(args ...string) error {
	port := "h" + strconv.Itoa(h.index)
	for _, side := range [][2]string{{h.ns, "eth0"}, {h.net.bridge, port}} {
		var err error
		if len(args) == 0 {
			err = run("ip", "netns", "exec", side[0], "tc", "qdisc", "del", "dev", side[1], "root")
		} else {
			err = run("ip", append([]string{"netns", "exec", side[0], "tc", "qdisc", "replace", "dev", side[1], "root", "netem"}, args...)...)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func ipNetns(verb, name string) error { return run("ip", "netns", verb, name) }

// run runs a command and returns its output in the error when it fails.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
