package draintest

import (
	"syscall"
	"testing"
	"time"
)

// CPUTime is the CPU time (user and system) this process has used, for
// the benchmarks that compare a Drainer on a Source with a bare loop on
// the same queue.
func CPUTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
