package redisstore

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestSemaphoreReplicated: with Replicated asking for one replica, a grant
// the live replica acknowledges is granted; with the replica frozen
// (SIGSTOP), the grant is answered as a transient error and released, a
// renewal that extended is answered likewise, and a store that asks for no
// replica grants as before. Thawed, the replica acknowledges again.
func TestSemaphoreReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a Sentinel")
	}
	ss := redistest.Sentinel(t)
	c := ss.Master.Client()
	replicaSynced(t, c)
	waiting, err := NewSemaphoreStore(c, SemaphoreOptions{Replicated: Replicated{Replicas: 1, Timeout: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewSemaphoreStore(c, SemaphoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	holders := func() int {
		t.Helper()
		l, err := plain.Holders(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Holders)
	}
	if f, err := waiting.Acquire(ctx, "s", "a", 3, time.Minute, 0); err != nil || f == 0 {
		t.Fatalf("acquire with the replica live: fence %d, %v", f, err)
	}
	if r, f, err := waiting.AcquireFair(ctx, "s", "f", 1, 3, time.Minute, 0); err != nil || r != concurrency.Granted || f == 0 {
		t.Fatalf("fair acquire with the replica live: %v, fence %d, %v", r, f, err)
	}
	ss.Replica.Freeze()
	f, err := waiting.Acquire(ctx, "s", "b", 3, time.Minute, 0)
	if err == nil || !errors.Is(err, errUnreplicated) || !concurrency.Transient(err) {
		t.Fatalf("acquire with the replica frozen: fence %d, %v; want a transient errUnreplicated", f, err)
	}
	if _, _, err := waiting.AcquireFair(ctx, "s", "g", 1, 3, time.Minute, 0); !errors.Is(err, errUnreplicated) {
		t.Fatalf("fair acquire with the replica frozen: %v; want errUnreplicated", err)
	}
	if n := holders(); n != 2 {
		t.Fatalf("%d holders after the unacknowledged grants; want 2 (they were released)", n)
	}
	if ok, err := waiting.Renew(ctx, "s", "a", time.Minute); ok || !errors.Is(err, errUnreplicated) || !concurrency.Transient(err) {
		t.Fatalf("renew with the replica frozen: %v, %v; want a transient errUnreplicated", ok, err)
	}
	if f, err := plain.Acquire(ctx, "s", "p", 3, time.Minute, 0); err != nil || f == 0 {
		t.Fatalf("acquire asking for no replica, the replica frozen: fence %d, %v", f, err)
	}
	ss.Replica.Thaw()
	if ok, err := waiting.Renew(ctx, "s", "a", time.Minute); !ok || err != nil {
		t.Fatalf("renew with the replica thawed: %v, %v", ok, err)
	}
}

// TestLeaseReplicated: as TestSemaphoreReplicated, for leases: a grant
// acknowledged by the live replica is granted; with the replica frozen, a
// grant is answered as a transient error and released (the partition is
// free for another member), and a renewal likewise. Thawed, the replica
// acknowledges again.
func TestLeaseReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a Sentinel")
	}
	ss := redistest.Sentinel(t)
	c := ss.Master.Client()
	replicaSynced(t, c)
	waiting, err := NewLeaseStore(c, "svc", LeaseOptions{Timeout: 5 * time.Second, Replicated: Replicated{Replicas: 1, Timeout: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewLeaseStore(c, "svc", LeaseOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	g, err := waiting.Acquire(ctx, "a", []int{0}, time.Minute)
	if err != nil || len(g) != 1 {
		t.Fatalf("acquire with the replica live: %v, %v", g, err)
	}
	ss.Replica.Freeze()
	if g, err := waiting.Acquire(ctx, "a", []int{1}, time.Minute); !errors.Is(err, errUnreplicated) || !concurrency.Transient(err) {
		t.Fatalf("acquire with the replica frozen: %v, %v; want a transient errUnreplicated", g, err)
	}
	if _, err := waiting.Renew(ctx, "a", g, time.Minute); !errors.Is(err, errUnreplicated) {
		t.Fatalf("renew with the replica frozen: %v; want errUnreplicated", err)
	}
	// The unacknowledged grant of partition 1 was released: another
	// member (asking for no replica) gets it at once.
	if g, err := plain.Acquire(ctx, "b", []int{1}, time.Minute); err != nil || len(g) != 1 {
		t.Fatalf("partition 1 after the released grant: %v, %v; want it granted to b", g, err)
	}
	ss.Replica.Thaw()
	if ok, err := waiting.Renew(ctx, "a", g, time.Minute); err != nil || len(ok) != 1 || !ok[0] {
		t.Fatalf("renew with the replica thawed: %v, %v", ok, err)
	}
}

// TestSemaphoreReplicatedCluster: on a Cluster, the script and its WAIT
// go to the node that serves the name (elsewhere, the script would be
// answered MOVED); the Cluster has no replicas, so every grant goes
// unacknowledged, is answered errUnreplicated, and is released.
func TestSemaphoreReplicatedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cs := redistest.Cluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cs.Addrs()})
	t.Cleanup(func() { c.Close() })
	s, err := NewSemaphoreStore(c, SemaphoreOptions{Replicated: Replicated{Replicas: 1, Timeout: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	nodes := map[string]bool{}
	for i := range 16 {
		name := "r" + strconv.Itoa(i)
		n, err := c.MasterForKey(ctx, s.Key(name))
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.Options().Addr] = true
		if f, err := s.Acquire(ctx, name, "a", 1, time.Minute, 0); !errors.Is(err, errUnreplicated) {
			t.Fatalf("%s: fence %d, %v; want errUnreplicated", name, f, err)
		}
		if l, err := s.Holders(ctx, name); err != nil || len(l.Holders) != 0 {
			t.Fatalf("%s: holders %+v, %v; want none (the grant released)", name, l, err)
		}
	}
	if len(nodes) < 2 {
		t.Fatalf("the names reached %d node(s); want more than one", len(nodes))
	}
}

// TestReplicatedCheck: negative counts or timeouts are refused; a zero
// timeout takes the default and a sub-millisecond one is rounded up, since
// WAIT 0 would block for ever.
func TestReplicatedCheck(t *testing.T) {
	for _, r := range []Replicated{{Replicas: -1}, {Replicas: 1, Timeout: -time.Second}} {
		if _, err := r.check(); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
	if r, err := (Replicated{Replicas: 1}).check(); err != nil || r.Timeout != DefaultReplicaTimeout {
		t.Errorf("zero timeout: %+v, %v", r, err)
	}
	if r, err := (Replicated{Replicas: 1, Timeout: time.Microsecond}).check(); err != nil || r.Timeout != time.Millisecond {
		t.Errorf("1µs timeout: %+v, %v", r, err)
	}
}

// BenchmarkSemaphoreReplicated measures acquire + release on a master with
// one live replica, asking for no replica and for one: the cost of WAIT.
func BenchmarkSemaphoreReplicated(b *testing.B) {
	ss := redistest.Sentinel(b)
	c := redis.NewClient(&redis.Options{Addr: ss.Master.Addr(), PoolSize: 64})
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	var seq atomic.Int64
	for _, replicas := range []int{0, 1} {
		be, err := NewSemaphoreStore(c, SemaphoreOptions{Replicated: Replicated{Replicas: replicas, Timeout: time.Second}})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("replicas="+strconv.Itoa(replicas), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					tok := "t" + strconv.FormatInt(seq.Add(1), 10)
					if f, err := be.Acquire(ctx, "bench", tok, 1<<30, time.Minute, 0); err != nil || f == 0 {
						b.Errorf("acquire: fence %d, %v", f, err)
						return
					}
					if _, err := be.Release(ctx, "bench", tok); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// replicaSynced waits until the master's replica has acknowledged its
// writes (WAIT, up to 10 s). Even then, the first grant's WAIT took more
// than 200 ms now and then (2 of 10 runs, on an idle machine; the cause
// not found), so the tests wait 2 s for an acknowledgement.
func replicaSynced(t *testing.T, c *redis.Client) {
	t.Helper()
	if n, err := c.Do(t.Context(), "WAIT", 1, 10000).Int(); err != nil || n < 1 {
		t.Fatalf("the replica did not acknowledge within 10 s: %d, %v", n, err)
	}
}
