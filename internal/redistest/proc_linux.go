package redistest

import (
	"os/exec"
	"syscall"
)

// The signals of Freeze and Thaw.
const (
	freezeSignal = syscall.SIGSTOP
	thawSignal   = syscall.SIGCONT
)

// DieWithParent makes the kernel kill cmd's process if the test process
// dies without running its cleanups (a panic in another goroutine, a
// timeout, a kill): no redis-server, and no child a test starts with it,
// outlives the test that started it. Call it before cmd.Start.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
