package lease_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/storetest"
)

// TestMemoryStore runs the lease store conformance suite on MemoryStore,
// on a fake clock.
func TestMemoryStore(t *testing.T) {
	storetest.RunLeases(t, func(t *testing.T) (storetest.FencedLeaseStore, func(time.Duration)) {
		clk := storetest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		return lease.NewMemoryStoreClock(clk.Now), clk.Advance
	})
}

func BenchmarkMemoryStorePeriod(b *testing.B) {
	storetest.BenchmarkLeasePeriod(b, lease.NewMemoryStore())
}
