package concurrency_test

import (
	"testing"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/storetest"
)

// TestMemoryStore runs the conformance suite of stores on MemoryStore, in
// fake time.
func TestMemoryStore(t *testing.T) {
	storetest.RunSemaphores(t, func(*testing.T) concurrency.Store { return concurrency.NewMemoryStore() }, true)
}
