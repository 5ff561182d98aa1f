package memstore_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		s := memstore.New(memstore.Options{Now: now})
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return s
	})
}

// TestCountingConformance: the memory store is exact whatever the counting
// mode; n replicas are n handles on one store.
func TestCountingConformance(t *testing.T) {
	storetest.RunCounting(t, func(t *testing.T, n int, now func() time.Time) []ratelimit.Store {
		s := memstore.New(memstore.Options{Now: now})
		t.Cleanup(func() { s.Close() })
		stores := make([]ratelimit.Store, n)
		for i := range stores {
			stores[i] = s
		}
		return stores
	})
}

func TestSettleConformance(t *testing.T) {
	storetest.RunSettle(t, func(t *testing.T, now func() time.Time) (ratelimit.Store, ratelimit.Ledger) {
		s := memstore.New(memstore.Options{Now: now})
		t.Cleanup(func() { s.Close() })
		return s, s
	}, storetest.SettleOptions{})
}
