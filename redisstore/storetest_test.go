package redisstore

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

// Every subtest gets its own Store with its own key prefix on one shared
// server (or cluster), so no subtest sees another's keys.

func TestStoretestStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		return newTestStore(t, []string{srv.Addr()}, now, nil)
	})
}

func TestStoretestStandaloneNoCoalesce(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	srv := redistest.Standalone(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		return newTestStore(t, []string{srv.Addr()}, now, func(o *testConfig) { o.NoCoalesce = true })
	})
}

func TestStoretestTLS(t *testing.T) {
	srv := redistest.StandaloneTLS(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		return newTestStore(t, []string{srv.Addr()}, now, func(o *testConfig) { o.Client.TLS = srv.TLSConfig() })
	})
}

func TestStoretestCluster(t *testing.T) {
	cl := redistest.Cluster(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		// A subtest's keys are "<test name>/<key>": all of a subtest's
		// keys share a slot, as a tenant's would.
		return newTestStore(t, cl.Addrs(), now, func(o *testConfig) {
			o.HashTag = func(k string) string { return k[:strings.LastIndexByte(k, '/')+1] }
		})
	})
}

// TestStoretestCounting: n Stores on one server, each told there are n.
func TestStoretestCounting(t *testing.T) {
	srv := redistest.Standalone(t)
	storetest.RunCounting(t, func(t *testing.T, n int, now func() time.Time) []ratelimit.Store {
		prefix := fmt.Sprintf("c%d:", rand.Uint64())
		stores := make([]ratelimit.Store, n)
		for i := range stores {
			stores[i] = newTestStore(t, []string{srv.Addr()}, now, func(o *testConfig) { o.Prefix, o.Replicas = prefix, n })
		}
		return stores
	})
}

// expireReservation ends a reservation's record at once: the ledger
// expires by the Redis server's clock, which the suite's clock does not
// move.
func expireReservation(t *testing.T, l ratelimit.Ledger, id string) {
	s := l.(*Store)
	if err := s.c.Del(t.Context(), reservationKey(s.prefix, id)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestSettleStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	storetest.RunSettle(t, func(t *testing.T, now func() time.Time) (ratelimit.Store, ratelimit.Ledger) {
		s := newTestStore(t, []string{srv.Addr()}, now, nil)
		return s, s
	}, storetest.SettleOptions{Expire: expireReservation})
}

func TestSettleCluster(t *testing.T) {
	cl := redistest.Cluster(t)
	storetest.RunSettle(t, func(t *testing.T, now func() time.Time) (ratelimit.Store, ratelimit.Ledger) {
		s := newTestStore(t, cl.Addrs(), now, func(o *testConfig) {
			o.HashTag = func(k string) string { return k[:strings.LastIndexByte(k, '/')+1] }
		})
		return s, s
	}, storetest.SettleOptions{Expire: expireReservation})
}
