package lease

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/redistest"
)

// A coordCase is one coordinator under test with its way of letting store
// time pass.
type coordCase struct {
	name string
	// make returns a fresh coordinator and advance, which lets d pass on
	// the store's clock.
	make func(t *testing.T) (c fencedCoordinator, advance func(d time.Duration))
}

// fencedCoordinator is a Coordinator that also checks fencing tokens, as
// Memory and Redis do.
type fencedCoordinator interface {
	Store
	Valid(context.Context, Grant) (bool, error)
}

// coordCases returns the coordinators under test: Memory on a fake clock,
// Redis on a standalone server per test, and Redis on one three-master
// Cluster started lazily for the whole of parent (a service per test).
func coordCases(parent *testing.T) []coordCase {
	var cluster *redistest.ClusterSet
	return []coordCase{
		{"memory", func(t *testing.T) (c fencedCoordinator, advance func(time.Duration)) {
			clk := fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			return NewMemoryStoreClock(clk.Now), clk.Advance
		}},
		{"redis", func(t *testing.T) (c fencedCoordinator, advance func(time.Duration)) {
			srv := redistest.Standalone(t)
			r, err := NewRedis(srv.Client(), "svc:"+t.Name(), RedisOptions{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// The server's clock cannot be moved: let the time pass.
			return r, func(d time.Duration) { <-time.After(d) }
		}},
		{"redis-cluster", func(t *testing.T) (c fencedCoordinator, advance func(time.Duration)) {
			if cluster == nil {
				cluster = redistest.Cluster(parent)
			}
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
			t.Cleanup(func() { cc.Close() })
			r, err := NewRedis(cc, "svc:"+t.Name(), RedisOptions{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return r, func(d time.Duration) { <-time.After(d) }
		}},
	}
}

// The TTLs of the contract tests: long enough for a slow CI machine's
// round trips, short enough that waiting for them on Redis is cheap.
const (
	cTTL   = 400 * time.Millisecond
	cShort = 100 * time.Millisecond
)

func TestCoordinatorContract(t *testing.T) {
	ctx := context.Background()
	for _, cc := range coordCases(t) {
		t.Run(cc.name, func(t *testing.T) {
			t.Run("presence", func(t *testing.T) {
				c, advance := cc.make(t)
				if _, err := c.Heartbeat(ctx, Member{ID: "b", Weight: 2, Need: 2, Want: 3}, cShort, 4); err != nil {
					t.Fatal(err)
				}
				v, err := c.Heartbeat(ctx, Member{ID: "a", Weight: 1.5, Want: 0}, cTTL, 4)
				if err != nil {
					t.Fatal(err)
				}
				want := []Member{{"a", 1.5, 0, 0}, {"b", 2, 2, 3}}
				if !slices.Equal(v.Members, want) || len(v.Partitions) != 4 {
					t.Fatalf("view = %+v, want members %+v and 4 partitions", v, want)
				}
				advance(cShort + 20*time.Millisecond)
				v, err = c.Heartbeat(ctx, Member{ID: "a", Weight: 1, Need: 2, Want: 2}, cTTL, 4)
				if err != nil {
					t.Fatal(err)
				}
				if want := []Member{{"a", 1, 2, 2}}; !slices.Equal(v.Members, want) {
					t.Fatalf("after b's ttl: members %+v, want %+v", v.Members, want)
				}
				if err := c.Leave(ctx, "a"); err != nil {
					t.Fatal(err)
				}
				v, err = c.Heartbeat(ctx, Member{ID: "c", Weight: 1}, cTTL, 0)
				if err != nil {
					t.Fatal(err)
				}
				if want := []Member{{"c", 1, 0, 0}}; !slices.Equal(v.Members, want) {
					t.Fatalf("after a left: members %+v, want %+v", v.Members, want)
				}
			})
			t.Run("epochs", func(t *testing.T) {
				c, _ := cc.make(t)
				g, err := c.Acquire(ctx, "a", []int{0, 1}, cTTL)
				if err != nil {
					t.Fatal(err)
				}
				if want := []Grant{{0, 1}, {1, 1}}; !slices.Equal(g, want) {
					t.Fatalf("acquire = %v, want %v", g, want)
				}
				// Held partitions are not granted to another member.
				g, err = c.Acquire(ctx, "b", []int{1, 2}, cTTL)
				if err != nil {
					t.Fatal(err)
				}
				if want := []Grant{{2, 1}}; !slices.Equal(g, want) {
					t.Fatalf("b's acquire = %v, want %v", g, want)
				}
				// Releasing someone else's lease, or a wrong epoch, does nothing.
				if err := c.Release(ctx, "b", []Grant{{0, 1}}); err != nil {
					t.Fatal(err)
				}
				if err := c.Release(ctx, "a", []Grant{{0, 7}}); err != nil {
					t.Fatal(err)
				}
				mustValid(t, c, Grant{0, 1}, true)
				// Release keeps the epoch: the next lease gets 2.
				if err := c.Release(ctx, "a", []Grant{{0, 1}}); err != nil {
					t.Fatal(err)
				}
				mustValid(t, c, Grant{0, 1}, false)
				g, err = c.Acquire(ctx, "b", []int{0}, cTTL)
				if err != nil {
					t.Fatal(err)
				}
				if want := []Grant{{0, 2}}; !slices.Equal(g, want) {
					t.Fatalf("re-acquire = %v, want %v", g, want)
				}
				// Acquiring one's own partition fences the old grant.
				g, err = c.Acquire(ctx, "b", []int{0}, cTTL)
				if err != nil {
					t.Fatal(err)
				}
				if want := []Grant{{0, 3}}; !slices.Equal(g, want) {
					t.Fatalf("own re-acquire = %v, want %v", g, want)
				}
				mustValid(t, c, Grant{0, 2}, false)
				mustValid(t, c, Grant{0, 3}, true)
				ok, err := c.Renew(ctx, "b", []Grant{{0, 2}, {0, 3}, {1, 1}}, cTTL)
				if err != nil {
					t.Fatal(err)
				}
				if want := []bool{false, true, false}; !slices.Equal(ok, want) {
					t.Fatalf("renew = %v, want %v", ok, want)
				}
				v, err := c.Heartbeat(ctx, Member{ID: "b", Weight: 1}, cTTL, 3)
				if err != nil {
					t.Fatal(err)
				}
				for i, p := range v.Partitions {
					if p.TTL <= cTTL/2 || p.TTL > cTTL {
						t.Errorf("partition %d: ttl left %v, want about %v", i, p.TTL, cTTL)
					}
				}
				want := []PartitionState{{"b", 3, 0}, {"a", 1, 0}, {"b", 1, 0}}
				if !slices.Equal(withoutTTL(v.Partitions), want) {
					t.Fatalf("partitions %+v, want %+v", v.Partitions, want)
				}
			})
			t.Run("expiry fences stale holders", func(t *testing.T) {
				c, advance := cc.make(t)
				if _, err := c.Acquire(ctx, "a", []int{0}, cShort); err != nil {
					t.Fatal(err)
				}
				advance(cShort / 2)
				// A renewal extends from the store's now.
				ok, err := c.Renew(ctx, "a", []Grant{{0, 1}}, cShort)
				if err != nil || !ok[0] {
					t.Fatalf("renew = %v, %v; want true", ok, err)
				}
				advance(cShort*3/4 + 10*time.Millisecond)
				mustValid(t, c, Grant{0, 1}, true)
				advance(cShort/4 + 20*time.Millisecond)
				mustValid(t, c, Grant{0, 1}, false)
				v, err := c.Heartbeat(ctx, Member{ID: "b", Weight: 1}, cTTL, 1)
				if err != nil {
					t.Fatal(err)
				}
				if want := []PartitionState{{"", 1, 0}}; !slices.Equal(v.Partitions, want) {
					t.Fatalf("expired partition %+v, want %+v", v.Partitions, want)
				}
				// An expired lease is not renewed, even when nobody took it.
				ok, err = c.Renew(ctx, "a", []Grant{{0, 1}}, cTTL)
				if err != nil || ok[0] {
					t.Fatalf("renew after expiry = %v, %v; want false", ok, err)
				}
				g, err := c.Acquire(ctx, "b", []int{0}, cTTL)
				if err != nil || !slices.Equal(g, []Grant{{0, 2}}) {
					t.Fatalf("acquire after expiry = %v, %v; want epoch 2", g, err)
				}
				// The stale holder is refused everything.
				ok, err = c.Renew(ctx, "a", []Grant{{0, 1}}, cTTL)
				if err != nil || ok[0] {
					t.Fatalf("stale renew = %v, %v; want false", ok, err)
				}
				if err := c.Release(ctx, "a", []Grant{{0, 1}}); err != nil {
					t.Fatal(err)
				}
				mustValid(t, c, Grant{0, 2}, true)
				mustValid(t, c, Grant{0, 1}, false)
			})
			t.Run("bad arguments", func(t *testing.T) {
				c, _ := cc.make(t)
				for name, err := range map[string]error{
					"empty id":      func() error { _, err := c.Heartbeat(ctx, Member{}, cTTL, 1); return err }(),
					"zero ttl":      func() error { _, err := c.Acquire(ctx, "a", []int{0}, 0); return err }(),
					"negative part": func() error { _, err := c.Acquire(ctx, "a", []int{-1}, cTTL); return err }(),
					"renew no id":   func() error { _, err := c.Renew(ctx, "", nil, cTTL); return err }(),
					"release no id": c.Release(ctx, "", nil),
					"leave no id":   c.Leave(ctx, ""),
				} {
					if !errors.Is(err, ErrBadArgument) {
						t.Errorf("%s: err = %v, want ErrBadArgument", name, err)
					}
				}
			})
		})
	}
}

func TestNewRedisRejects(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, name := range []string{"", "a{b", "c}"} {
		if _, err := NewRedis(srv.Client(), name, RedisOptions{}); !errors.Is(err, ErrBadArgument) {
			t.Errorf("NewRedis(%q): err = %v, want ErrBadArgument", name, err)
		}
	}
	for _, prefix := range []string{"x{}", "{a}:"} {
		if _, err := NewRedis(srv.Client(), "svc", RedisOptions{Prefix: prefix}); !errors.Is(err, ErrBadArgument) {
			t.Errorf("NewRedis(prefix %q): err = %v, want ErrBadArgument", prefix, err)
		}
	}
	if _, err := NewRedis(nil, "x", RedisOptions{}); !errors.Is(err, ErrBadArgument) {
		t.Errorf("NewRedis(nil): err = %v, want ErrBadArgument", err)
	}
}

// TestRedisUnreachable checks that a stopped server gives errors bounded
// by the timeout, and that the state is back once it runs again (here:
// empty, since the test server keeps nothing).
func TestRedisUnreachable(t *testing.T) {
	srv := redistest.Standalone(t)
	r, err := NewRedis(srv.Client(), "svc", RedisOptions{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	start := time.Now()
	if _, err := r.Heartbeat(context.Background(), Member{ID: "a", Weight: 1}, cTTL, 2); err == nil {
		t.Fatal("heartbeat on a stopped server succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("failed call took %v", d)
	}
	srv.Start()
	if _, err := r.Heartbeat(context.Background(), Member{ID: "a", Weight: 1}, cTTL, 2); err != nil {
		t.Fatalf("heartbeat after restart: %v", err)
	}
}

func mustValid(t *testing.T, c interface {
	Valid(context.Context, Grant) (bool, error)
}, g Grant, want bool) {
	t.Helper()
	ok, err := c.Valid(context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	if ok != want {
		t.Fatalf("Valid(%+v) = %v, want %v", g, ok, want)
	}
}

func withoutTTL(ps []PartitionState) []PartitionState {
	out := slices.Clone(ps)
	for i := range out {
		out[i].TTL = 0
	}
	return out
}
