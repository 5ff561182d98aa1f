package faultnet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
)

// A Proc is a process running inside a host, started by Host.Start. Its
// output goes to a log file; it is killed by its process id when the
// test ends, if it has not exited.
type Proc struct {
	h    *Host
	name string
	cmd  *exec.Cmd
	log  string
	exit chan struct{} // closed once the process has been waited for

	mu      sync.Mutex
	exitErr error
}

// Start runs name with args inside the host. The process dies with the
// test process (Pdeathsig), and is killed when the test ends.
func (h *Host) Start(name string, args ...string) *Proc {
	t := h.net.t
	t.Helper()
	cmd := h.Command(name, args...)
	return h.StartCmd(filepath.Base(name), cmd)
}

// StartCmd starts cmd, made by Host.Command and perhaps given an
// environment, as Start does; label names its log.
func (h *Host) StartCmd(label string, cmd *exec.Cmd) *Proc {
	t := h.net.t
	t.Helper()
	log, err := os.CreateTemp(h.net.dir, h.name+"-"+label+"-*.log")
	if err != nil {
		t.Fatalf("faultnet: %v", err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("faultnet: start %s on %s: %v", label, h.name, err)
	}
	p := &Proc{h: h, name: label, cmd: cmd, log: log.Name(), exit: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.exit)
	}()
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	return p
}

// PID is the process's id (ip netns exec replaces itself with the
// command, so it is the command's).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exit }

// Err is how the process exited; nil while it runs.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// Pause stops the process (SIGSTOP): it keeps its sockets and state and
// runs nothing until Resume.
func (p *Proc) Pause() { p.signal(syscall.SIGSTOP) }

// Resume resumes a paused process (SIGCONT).
func (p *Proc) Resume() { p.signal(syscall.SIGCONT) }

// Signal sends sig to the process, by its id.
func (p *Proc) Signal(sig syscall.Signal) { p.signal(sig) }

func (p *Proc) signal(sig syscall.Signal) {
	t := p.h.net.t
	t.Helper()
	select {
	case <-p.exit:
		t.Fatalf("faultnet: %s on %s exited (%v); cannot send %v\n%s", p.name, p.h.name, p.Err(), sig, p.LogTail())
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("faultnet: %v to %s on %s: %v", sig, p.name, p.h.name, err)
	}
}

// Kill kills the process (SIGKILL, which ends a stopped one too) if it
// runs, and waits for it.
func (p *Proc) Kill() {
	select {
	case <-p.exit:
		return
	default:
	}
	_ = p.cmd.Process.Kill() // it may have exited meanwhile
	<-p.exit
}

// Log is the process's output so far.
func (p *Proc) Log() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// LogTail is the last 4,000 bytes of the process's output.
func (p *Proc) LogTail() string {
	s := p.Log()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return fmt.Sprintf("--- %s on %s ---\n%s", p.name, p.h.name, s)
}

// killAll kills the host's processes, showing their logs if the test
// failed.
func (h *Host) killAll() {
	h.mu.Lock()
	procs := h.procs
	h.mu.Unlock()
	for _, p := range procs {
		p.Kill()
		if h.net.t.Failed() {
			h.net.t.Log(p.LogTail())
		}
	}
}
