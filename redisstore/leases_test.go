package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/storetest"
)

// waitFor lets d pass on a Redis server's clock, which a test cannot move.
func waitFor(d time.Duration) { <-time.After(d) }

// TestLeaseStore runs the lease store conformance suite on a standalone
// server (a service per subtest) and on one three-master Cluster.
func TestLeaseStore(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Standalone(t)
		storetest.RunLeases(t, func(t *testing.T) (storetest.FencedLeaseStore, func(time.Duration)) {
			r, err := NewLeaseStore(srv.Client(), "svc:"+t.Name(), LeaseOptions{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return r, waitFor
		})
	})
	t.Run("cluster", func(t *testing.T) {
		cluster := redistest.Cluster(t)
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { cc.Close() })
		storetest.RunLeases(t, func(t *testing.T) (storetest.FencedLeaseStore, func(time.Duration)) {
			r, err := NewLeaseStore(cc, "svc:"+t.Name(), LeaseOptions{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return r, waitFor
		})
	})
}

func TestNewLeaseStoreRejects(t *testing.T) {
	c := nopClient(t)
	for _, name := range []string{"", "a{b", "c}"} {
		if _, err := NewLeaseStore(c, name, LeaseOptions{}); !errors.Is(err, lease.ErrBadArgument) {
			t.Errorf("NewLeaseStore(%q): err = %v, want ErrBadArgument", name, err)
		}
	}
	for _, prefix := range []string{"x{}", "{a}:"} {
		if _, err := NewLeaseStore(c, "svc", LeaseOptions{Prefix: prefix}); !errors.Is(err, lease.ErrBadArgument) {
			t.Errorf("NewLeaseStore(prefix %q): err = %v, want ErrBadArgument", prefix, err)
		}
	}
	if _, err := NewLeaseStore(nil, "x", LeaseOptions{}); !errors.Is(err, lease.ErrBadArgument) {
		t.Errorf("NewLeaseStore(nil): err = %v, want ErrBadArgument", err)
	}
}

// TestLeaseStoreUnreachable checks that a stopped server gives errors
// bounded by the timeout, and that the state is back once it runs again
// (here: empty, since the test server keeps nothing).
func TestLeaseStoreUnreachable(t *testing.T) {
	srv := redistest.Standalone(t)
	r, err := NewLeaseStore(srv.Client(), "svc", LeaseOptions{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 400 * time.Millisecond
	srv.Stop()
	start := time.Now()
	if _, err := r.Heartbeat(context.Background(), lease.Member{ID: "a", Weight: 1}, ttl, 2); err == nil {
		t.Fatal("heartbeat on a stopped server succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("failed call took %v", d)
	}
	srv.Start()
	if _, err := r.Heartbeat(context.Background(), lease.Member{ID: "a", Weight: 1}, ttl, 2); err != nil {
		t.Fatalf("heartbeat after restart: %v", err)
	}
}

// BenchmarkLeaseStorePeriod measures one renewal period's store work of a
// holder on a standalone server: two script calls.
func BenchmarkLeaseStorePeriod(b *testing.B) {
	srv := redistest.Standalone(b)
	s, err := NewLeaseStore(srv.Client(), fmt.Sprint("bench-", time.Now().UnixNano()), LeaseOptions{})
	if err != nil {
		b.Fatal(err)
	}
	storetest.BenchmarkLeasePeriod(b, s)
}
