package httpapi

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// testOverrideStore runs the OverrideStore contract against s.
func testOverrideStore(t *testing.T, s OverrideStore) {
	ctx := t.Context()
	list, err := s.List(ctx)
	if err != nil || len(list) != 0 {
		t.Fatalf("empty List = %v, %v", list, err)
	}
	before := time.Now()
	if err := s.Put(ctx, service.Override{Domain: "t", Rule: "per_user", Quota: 10, By: "alice", Reason: "why"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, service.Override{Domain: "a|b", Rule: "x\"y", Quota: 1, Burst: 2}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Replacing keeps one entry per rule.
	if err := s.Put(ctx, service.Override{Domain: "t", Rule: "per_user", Quota: 20, By: "bob"}, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	list, err = s.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %+v, %v; want 2 entries", list, err)
	}
	if o := list[0]; o.Domain != "a|b" || o.Rule != "x\"y" || o.Quota != 1 || o.Burst != 2 {
		t.Errorf("first = %+v", o)
	}
	o := list[1]
	if o.Domain != "t" || o.Rule != "per_user" || o.Quota != 20 || o.By != "bob" {
		t.Errorf("second = %+v", o)
	}
	if ttl := o.Expires.Sub(before); ttl < 2*time.Hour-5*time.Second || ttl > 2*time.Hour+5*time.Second {
		t.Errorf("expires in %v, want about 2h", ttl)
	}
	if found, err := s.Delete(ctx, "a|b", "x\"y"); err != nil || !found {
		t.Errorf("Delete = %v, %v", found, err)
	}
	if found, err := s.Delete(ctx, "a|b", "x\"y"); err != nil || found {
		t.Errorf("second Delete = %v, %v", found, err)
	}
	list, _ = s.List(ctx)
	if len(list) != 1 {
		t.Errorf("after Delete: %+v", list)
	}
}

func TestMemoryOverrides(t *testing.T) {
	testOverrideStore(t, &MemoryOverrides{})

	c := storetest.NewClock(time.Unix(1_800_000_000, 0))
	m := &MemoryOverrides{Now: c.Now}
	_ = m.Put(t.Context(), service.Override{Domain: "t", Rule: "r", Quota: 1}, time.Minute)
	c.Advance(time.Minute)
	if list, _ := m.List(t.Context()); len(list) != 0 {
		t.Errorf("expired override listed: %+v", list)
	}
}

// redisOverrides returns a RedisOverrides in the hash prefix+"overrides".
func redisOverrides(t *testing.T, c redis.UniversalClient, prefix string) *RedisOverrides {
	t.Helper()
	h, err := redisstore.NewExpiringHash(c, prefix+"overrides")
	if err != nil {
		t.Fatal(err)
	}
	return NewRedisOverrides(h)
}

func TestRedisOverrides(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	testOverrideStore(t, redisOverrides(t, c, "test:"))

	// Expiry is measured on the Redis server's clock: a 1 ms override
	// is gone once the server's clock has moved past it.
	s := redisOverrides(t, c, "exp:")
	if err := s.Put(t.Context(), service.Override{Domain: "t", Rule: "r", Quota: 1}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		list, err := s.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a 1 ms override still listed: %+v", list)
		}
	}
	if n, _ := c.HLen(t.Context(), "exp:overrides").Result(); n != 0 {
		t.Errorf("expired field not deleted: %d left", n)
	}
}

// TestRedisOverridesInvalidUTF8: names that JSON would turn into U+FFFD
// are refused, so deleting "\xff" cannot remove the override of "\ufffd"
// and putting one cannot replace it.
func TestRedisOverridesInvalidUTF8(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	s := redisOverrides(t, c, "utf8:")
	ctx := t.Context()
	if err := s.Put(ctx, service.Override{Domain: "\ufffd", Rule: "r", Quota: 1}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, service.Override{Domain: "\xff", Rule: "r", Quota: 2}, time.Hour); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("Put of domain \\xff: %v, want an error naming UTF-8", err)
	}
	if found, err := s.Delete(ctx, "\xff", "r"); err == nil || found {
		t.Errorf("Delete of domain \\xff = %v, %v; want an error", found, err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 1 || list[0].Domain != "\ufffd" || list[0].Quota != 1 {
		t.Errorf("List = %+v, %v; want the override of \\ufffd untouched", list, err)
	}
}

// TestRedisOverridesReachEveryReplica: an override set through one replica
// applies on another at its next poll.
func TestRedisOverridesReachEveryReplica(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	set := loadSet(t, testRules)
	replica := func() (*service.Overrides, *OverrideSync) {
		ov := service.NewOverrides(set, nil)
		return ov, &OverrideSync{Store: redisOverrides(t, c, "shared:"), Overrides: ov, Every: 10 * time.Millisecond}
	}
	_, syncA := replica()
	ovB, syncB := replica()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- syncB.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	if err := syncA.Store.Put(t.Context(), service.Override{Domain: "t", Rule: "per_user", Quota: 42}, time.Hour); err != nil {
		t.Fatal(err)
	}
	d, _ := set.Domain("t")
	rule := d.Spec("per_user").Rule
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r, _, ok := ovB.Lookup(rule); ok {
			if r.Quota != 42 {
				t.Fatalf("replica B applies limit %d, want 42", r.Quota)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replica B never applied the override")
		}
		runtime.Gosched()
	}
}
