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

// dieWithParent makes the kernel kill the server if the test process dies
// without running its cleanups (a panic in another goroutine, a timeout, a
// kill): no redis-server outlives the test that started it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
