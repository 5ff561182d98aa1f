// Package longtest marks the tests that hold bounds in real time, most of
// them across several OS processes (lease's published example, the
// ingestion demo, draining at 2,000 records a second, the counting modes'
// accuracy): beside other packages' tests they would measure the machine's
// load, not Sluice. `make test` skips them; `make test-long` runs them,
// with SLUICE_TEST_LONG=1, alone and one package at a time. CI runs both.
//
// A long test starts with longtest.Run(t). The Makefile's LONG names every
// such test; internal/deps checks that the two agree.
package longtest

import (
	"os"
	"testing"
)

// Env is the environment variable that lets long tests run.
const Env = "SLUICE_TEST_LONG"

// Run skips t unless the long tests were asked for (make test-long).
func Run(t testing.TB) {
	t.Helper()
	if os.Getenv(Env) == "" {
		t.Skip("holds bounds in real time: make test-long runs it")
	}
}
