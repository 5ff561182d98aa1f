//go:build !linux

package redisproc

import (
	"os"
	"os/exec"
)

// FreezeSignal and ThawSignal are nil: stopping and resuming a process is
// Linux only.
var FreezeSignal, ThawSignal os.Signal

// DieWithParent does nothing where the kernel has no parent-death signal;
// the starter still stops its processes itself (Kill).
func DieWithParent(*exec.Cmd) {}
