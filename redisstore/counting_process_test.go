package redisstore

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// The replicas as OS processes: this test binary again, running
// TestCountingReplicaProcess with replicaEnv set to a replicaJob.

const replicaEnv = "SLUICE_COUNTING_REPLICA"

// A replicaJob is what a replica process is told: its Redis, its Store's
// prefix, which replica of the load it is, and the file it writes its
// loadResult to.
type replicaJob struct {
	Addr, Prefix string
	Replica      int
	Load         load
	Out          string
}

// replicaReady is the line a replica process prints once its Store is
// ready; it then reads the load's origin from stdin, in Unix nanoseconds.
const replicaReady = "counting replica ready"

// replicaStart bounds how long the replica processes may take to be ready.
const replicaStart = time.Minute

// TestCountingReplicaProcess is one replica of TestCountingProcesses, in
// a process of its own; run otherwise, it skips.
func TestCountingReplicaProcess(t *testing.T) {
	v := os.Getenv(replicaEnv)
	if v == "" {
		t.Skip("a replica process of TestCountingProcesses")
	}
	var job replicaJob
	if err := json.Unmarshal([]byte(v), &job); err != nil {
		t.Fatal(err)
	}
	s := countingStore(t, job.Addr, job.Prefix, job.Load.Replicas)
	warmStores(t, []*Store{s})
	fmt.Println(replicaReady)
	var ns int64
	if _, err := fmt.Fscan(os.Stdin, &ns); err != nil {
		t.Fatal(err)
	}
	// The origin on this process's monotonic clock: the processes share
	// the machine's wall clock, read once here.
	now := time.Now()
	origin := now.Add(time.Unix(0, ns).Sub(now))
	b, err := json.Marshal(job.Load.replica(t, s, job.Replica, origin))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(job.Out, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// processLoad runs l with each replica in a process of its own, its Store
// on srv. Once every replica is ready it hands them all one origin, a
// little ahead, and gathers what they saw when they have exited. A
// replica process dies with the test (redistest.DieWithParent), ends by
// its own -test.timeout if nothing else stops it, and is killed and waited
// for when the test ends.
func processLoad(t *testing.T, srv *redistest.Server, prefix string, l load) loadResult {
	t.Helper()
	dir := t.TempDir()
	type replica struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   string
		ready chan struct{} // closed when it printed replicaReady
		done  chan struct{} // closed when its stdout is closed
		lines []string      // the rest of its stdout, read once done is closed
	}
	rs := make([]*replica, l.Replicas)
	for i := range rs {
		r := &replica{out: filepath.Join(dir, fmt.Sprintf("replica%d.json", i)), ready: make(chan struct{}), done: make(chan struct{})}
		rs[i] = r
		job, err := json.Marshal(replicaJob{Addr: srv.Addr(), Prefix: prefix, Replica: i, Load: l, Out: r.out})
		if err != nil {
			t.Fatal(err)
		}
		r.cmd = exec.Command(os.Args[0], "-test.run=^TestCountingReplicaProcess$", "-test.count=1",
			fmt.Sprintf("-test.timeout=%v", l.Run+replicaStart))
		r.cmd.Env = append(os.Environ(), replicaEnv+"="+string(job))
		r.cmd.Stderr = os.Stderr
		redistest.DieWithParent(r.cmd)
		if r.stdin, err = r.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		stdout, err := r.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { // owned by the replica: ends when its stdout closes
			defer close(r.done)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if sc.Text() == replicaReady {
					close(r.ready)
					continue
				}
				r.lines = append(r.lines, sc.Text())
			}
		}()
		t.Cleanup(func() {
			r.cmd.Process.Kill() //nolint:errcheck // it has usually exited
			<-r.done
			r.cmd.Wait() //nolint:errcheck // waited for already, or killed
		})
	}
	failed := func(i int, what string, err error) {
		t.Helper()
		t.Fatalf("replica %d %s: %v\n%s", i, what, err, strings.Join(rs[i].lines, "\n"))
	}
	deadline := time.NewTimer(replicaStart)
	defer deadline.Stop()
	for i, r := range rs {
		select {
		case <-r.ready:
		case <-r.done:
			failed(i, "exited before it was ready", r.cmd.Wait())
		case <-deadline.C:
			t.Fatalf("replica %d not ready after %v", i, replicaStart)
		}
	}
	origin := time.Now().Add(50 * time.Millisecond)
	for _, r := range rs {
		fmt.Fprintln(r.stdin, origin.UnixNano())
		r.stdin.Close()
	}
	res := newLoadResult(l.Keys)
	for i, r := range rs {
		<-r.done
		if err := r.cmd.Wait(); err != nil {
			failed(i, "failed", err)
		}
		b, err := os.ReadFile(r.out)
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		var o loadResult
		if err := json.Unmarshal(b, &o); err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		t.Logf("replica %d: %d calls, %d admitted, Redis calls %d, leases %d, stranded %d, given back %d, run %v", i, o.Calls, total(o.Admitted), o.Stats.Requests, o.Stats.Leases, o.Stats.Stranded, o.Stats.GivenBack, o.Run)
		res.add(o)
	}
	return res
}

// TestCountingProcesses is TestCountingAccuracy, even and skewed, with
// the 4 replicas as 4 OS processes (processLoad), each with its Store on
// the one redis-server, their admissions timed from a common origin.
func TestCountingProcesses(t *testing.T) {
	longtest.Run(t)
	srv := redistest.Standalone(t)
	for _, mode := range []ratelimit.Counting{ratelimit.Strict, ratelimit.Batched, ratelimit.Approximate} {
		for _, shape := range accuracyShapes[:2] {
			t.Run(mode.String()+"/"+shape.name, func(t *testing.T) {
				l := accuracyLoad(mode, shape.skew, shape.bursty)
				checkAccuracy(t, l, shape.least, processLoad(t, srv, fmt.Sprintf("proc%d%s:", mode, shape.name), l))
			})
		}
	}
}
