package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill a demo's child process when the demo
// dies without stopping it (a kill, a crash): no child outlives the demo.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
