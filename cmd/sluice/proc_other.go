//go:build !linux

package main

import "os/exec"

// dieWithParent does nothing where there is no parent-death signal; the
// demo stops its children itself.
func dieWithParent(*exec.Cmd) {}
