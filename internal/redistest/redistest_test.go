package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStandaloneStopStart(t *testing.T) {
	s := Standalone(t)
	if s.Port() == 6379 {
		t.Fatal("harness chose the shared port 6379")
	}
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := c.Ping(cctx).Err(); err == nil {
		t.Fatal("PING succeeded on a stopped server")
	}
	s.Start()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("restarted server kept data: n=%d err=%v", n, err)
	}
}

func TestCluster(t *testing.T) {
	cl := Cluster(t)
	if len(cl.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(cl.Nodes))
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	masters := map[string]bool{}
	for i := range 50 {
		k := string(rune('a'+i%26)) + string(rune('a'+i/26))
		if err := c.Set(ctx, k, i, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		m, err := c.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("keys landed on %d masters, want 3", len(masters))
	}
	// A node restarts empty and rejoins.
	cl.Nodes[1].Stop()
	cl.Nodes[1].Start()
}

func TestSentinelFailover(t *testing.T) {
	ss := Sentinel(t)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: ss.Addrs()})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "WAIT", 1, 5000).Err(); err != nil { // the replica has it
		t.Fatal(err)
	}
	old := ss.Master.Port()
	ss.Failover()
	if ss.Master.Port() == old || ss.Replica.Port() != old {
		t.Fatalf("after failover the master is on %d and the replica on %d; the master was on %d", ss.Master.Port(), ss.Replica.Port(), old)
	}
	// The new master holds what the old one had, and takes writes.
	m := ss.Master.Client()
	if v, err := m.Get(ctx, "k").Result(); err != nil || v != "before" {
		t.Fatalf("new master: k = %q, %v", v, err)
	}
	if err := m.Set(ctx, "k", "after", 0).Err(); err != nil {
		t.Fatalf("write on the new master: %v", err)
	}
}

func TestStandaloneTLS(t *testing.T) {
	s := StandaloneTLS(t)
	ctx := context.Background()
	if err := s.Client().Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer plain.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := plain.Ping(cctx).Err(); err == nil {
		t.Fatal("PING without TLS succeeded")
	}
	if s.CAFile() == "" {
		t.Fatal("no CA file")
	}
}

// TestFreezeThaw: a frozen server answers nothing but keeps its data;
// thawed, it serves again, a call in flight across the thaw included.
func TestFreezeThaw(t *testing.T) {
	s := Standalone(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Freeze()
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := c.Ping(cctx).Err(); err == nil {
		t.Fatal("PING succeeded on a frozen server")
	}
	// Started while frozen (sent before or after the thaw: either way it
	// must be served), with no deadline.
	late := s.Client()
	done := make(chan error, 1)
	go func() { done <- late.Set(ctx, "late", "1", 0).Err() }()
	s.Thaw()
	if err := <-done; err != nil {
		t.Fatalf("SET sent while frozen: %v", err)
	}
	for _, k := range []string{"k", "late"} {
		if n, err := c.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("after thaw, key %q: n=%d err=%v", k, n, err)
		}
	}
}
