package overrides

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// testRules define the rule per_user of domain t that the replicas
// test overrides.
const testRules = `domain: t
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
`

// loadSet parses rule files into a set.
func loadSet(t testing.TB, files ...string) *rules.Set {
	t.Helper()
	var ds []*rules.Domain
	for i, f := range files {
		d, err := rules.Parse(fmt.Sprintf("rules%d.yaml", i), []byte(f))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	set, err := rules.NewSet(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// testStore runs the Store contract against s.
func testStore(t *testing.T, s Store) {
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

func TestMemoryStore(t *testing.T) {
	testStore(t, &MemoryStore{})

	c := storetest.NewClock(time.Unix(1_800_000_000, 0))
	m := &MemoryStore{Now: c.Now}
	_ = m.Put(t.Context(), service.Override{Domain: "t", Rule: "r", Quota: 1}, time.Minute)
	c.Advance(time.Minute)
	if list, _ := m.List(t.Context()); len(list) != 0 {
		t.Errorf("expired override listed: %+v", list)
	}
}

// redisOverrides returns a RedisStore in the hash prefix+"overrides".
func redisOverrides(t *testing.T, c redis.UniversalClient, prefix string) *RedisStore {
	t.Helper()
	h, err := redisstore.NewExpiringHash(c, prefix+"overrides")
	if err != nil {
		t.Fatal(err)
	}
	return NewRedisStore(h)
}

func TestRedisStore(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	testStore(t, redisOverrides(t, c, "test:"))

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

// TestRedisStoreInvalidUTF8: names that JSON would turn into U+FFFD
// are refused, so deleting "\xff" cannot remove the override of "\ufffd"
// and putting one cannot replace it.
func TestRedisStoreInvalidUTF8(t *testing.T) {
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

// TestRedisStoreReachesEveryReplica: an override set through one replica
// applies on another at its next poll.
func TestRedisStoreReachesEveryReplica(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	set := loadSet(t, testRules)
	replica := func() (*service.Overrides, *Sync) {
		ov := service.NewOverrides(set, nil)
		return ov, &Sync{Store: redisOverrides(t, c, "shared:"), Overrides: ov, Every: 10 * time.Millisecond}
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

// FuzzRedisOverrideEncoding: an override is either refused by the Redis
// encoding with an error, or decoded back as it was; two distinct targets
// never share a hash field.
func FuzzRedisOverrideEncoding(f *testing.F) {
	f.Add("a/b", "c", "a", "b/c", int64(7), int64(0), "alice (127.0.0.1:1)", "why")
	f.Add("a", "b", "a", "b", int64(1), int64(2), "", "")
	f.Add("\xff", "r", "\xfe", "r", int64(1), int64(0), "", "")
	f.Add("\ufffd", "r", "\xff", "r", int64(1), int64(0), "", "")
	f.Add(`a","b`, "c", "a", `b","c`, int64(1), int64(0), "\xff", "x")
	f.Add("d", "r", "d", "r", int64(-5), int64(1<<40), "by", "\x00\u2028")
	f.Fuzz(func(t *testing.T, d1, r1, d2, r2 string, limit, burst int64, by, reason string) {
		exp := time.Unix(1_900_000_000, 0)
		o1 := service.Override{Domain: d1, Rule: r1, Quota: limit, Burst: burst, By: by, Reason: reason, Expires: exp}
		o2 := o1
		o2.Domain, o2.Rule = d2, r2
		f1, v1, err1 := encodeOverride(&o1)
		f2, _, err2 := encodeOverride(&o2)
		if err1 == nil {
			back, err := decodeOverride(v1, exp)
			if err != nil || back != o1 {
				t.Fatalf("decoded %+v, %v; encoded %+v as %s", back, err, o1, v1)
			}
		}
		if err1 == nil && err2 == nil && (f1 == f2) != (d1 == d2 && r1 == r2) {
			t.Fatalf("targets %q/%q and %q/%q: fields %s and %s", d1, r1, d2, r2, f1, f2)
		}
		// Refused exactly when a string is not UTF-8, saying so.
		valid := func(o *service.Override) bool {
			return utf8.ValidString(o.Domain) && utf8.ValidString(o.Rule) && utf8.ValidString(o.By) && utf8.ValidString(o.Reason)
		}
		if (err1 == nil) != valid(&o1) || (err2 == nil) != valid(&o2) {
			t.Fatalf("encodeOverride: %v, %v; want an error exactly when a string is not UTF-8", err1, err2)
		}
		if err1 != nil && !strings.Contains(err1.Error(), "UTF-8") {
			t.Errorf("error %q does not say why", err1)
		}
	})
}
