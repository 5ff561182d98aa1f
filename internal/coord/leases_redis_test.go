package coord

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// TestLeasesRedisSharedPool: on a redis-server, a remote holder of the
// Service and a Go process's own lease.Holder on the same service's
// redisstore.LeaseStore share one pool: with backlogs each converges to
// half the capacity.
func TestLeasesRedisSharedPool(t *testing.T) {
	srv := redistest.Standalone(t)
	open := func(service string) (lease.Store, error) {
		return redisstore.NewLeaseStore(srv.Client(), service, redisstore.LeaseOptions{Prefix: "coord-test:", Timeout: time.Second})
	}
	s, err := New(Options{Store: concurrency.NewMemoryStore(), Leases: open})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const ttl = time.Second
	r, err := s.Join(ctx, JoinRequest{Service: "shared", Capacity: 100, Partitions: 10, TTL: ttl, Backlog: 1000})
	if err != nil {
		t.Fatal(err)
	}
	st, err := open("shared")
	if err != nil {
		t.Fatal(err)
	}
	h, err := lease.NewHolder(st, lease.Options{ID: "go-process", Capacity: 100, Partitions: 10, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	h.SetDemand(0, 1000)
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the Go holder's Run: %v", err)
		}
	}()
	// The remote holder heartbeats and long-polls until both are at half.
	g := r
	for h.AllowanceAt(time.Now()).Rate != 50 || g.Rate != 50 {
		if ctx.Err() != nil {
			t.Fatalf("remote %v/s, Go holder %v/s; want 50 each", g.Rate, h.AllowanceAt(time.Now()).Rate)
		}
		if _, err := s.Demand(ctx, DemandRequest{Service: "shared", HolderID: r.HolderID, Backlog: 1000, Version: g.Version}); err != nil {
			t.Fatal(err)
		}
		if g, err = s.Watch(ctx, "shared", r.HolderID, g.Version, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if len(g.Leases) != 5 {
		t.Errorf("the remote holder's grant at half: %+v, want 5 leases", g)
	}
}
