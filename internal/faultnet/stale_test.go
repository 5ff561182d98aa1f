package faultnet

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// TestRemoveStale: a namespace named for a process that no longer runs
// is removed; one of a live process (this one) is kept.
func TestRemoveStale(t *testing.T) {
	need(t)
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	dead := prefix + strconv.Itoa(done.Process.Pid) + "-1-br"
	live := prefix + strconv.Itoa(os.Getpid()) + "-stale-test"
	for _, ns := range []string{dead, live} {
		if err := ipNetns("add", ns); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { ipNetns("del", live) }) //nolint:errcheck // best effort
	removeStale()
	if _, err := os.Stat("/run/netns/" + dead); err == nil {
		ipNetns("del", dead) //nolint:errcheck // best effort
		t.Errorf("%s, of a dead process, was kept", dead)
	}
	if _, err := os.Stat("/run/netns/" + live); err != nil {
		t.Errorf("%s, of this process, was removed: %v", live, err)
	}
}
