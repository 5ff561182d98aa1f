package redisproc

import (
	"os"
	"os/exec"
	"syscall"
)

// FreezeSignal stops a process as a long pause would (SIGSTOP), and
// ThawSignal resumes it (SIGCONT).
var (
	FreezeSignal os.Signal = syscall.SIGSTOP
	ThawSignal   os.Signal = syscall.SIGCONT
)

// DieWithParent makes the kernel kill cmd's process if the process that
// started it dies without stopping it (a panic in another goroutine, a
// timeout, a kill): no redis-server, and no child a test starts with it,
// outlives its starter. Call it before cmd.Start.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
