//go:build !linux

package redistest

import (
	"os"
	"os/exec"
)

// Freeze and Thaw are Linux only (skipped elsewhere).
var freezeSignal, thawSignal os.Signal

// dieWithParent does nothing where the kernel has no parent-death signal;
// t.Cleanup still stops the server.
func dieWithParent(*exec.Cmd) {}
