//go:build !linux

package redistest

import "os/exec"

// dieWithParent does nothing where the kernel has no parent-death signal;
// t.Cleanup still stops the server.
func dieWithParent(*exec.Cmd) {}
