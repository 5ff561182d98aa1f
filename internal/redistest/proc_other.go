//go:build !linux

package redistest

import (
	"os"
	"os/exec"
)

// Freeze and Thaw are Linux only (skipped elsewhere).
var freezeSignal, thawSignal os.Signal

// DieWithParent does nothing where the kernel has no parent-death signal;
// t.Cleanup still stops the server (and a test its children).
func DieWithParent(*exec.Cmd) {}
