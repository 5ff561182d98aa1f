package redisstore

import (
	"context"
	"errors"
	"github.com/redis/go-redis/v9"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// nasty are keys and tags a caller might send, hostile or not.
var nasty = []string{
	"", "a", "{", "}", "{}", "{a}", "a{b}c", "}{", "{a}{b}", "{{a}}",
	"a\nb", "a\r\n", "\x00", "\xff\xfe", "a:b", ":", "|l", "a|l", "~", "~abc",
	"YQ", "sluice:{YQ}", "{YQ}:YQ", strings.Repeat("x", maxRaw), strings.Repeat("x", maxRaw+1),
	strings.Repeat("x", maxRaw+1) + "y", strings.Repeat("{", 1000), strings.Repeat("é", 4096),
}

// TestKeyEncodingInjective checks that distinct (tag, key) pairs never
// share a Redis key (nor a sliding log's list), and that the Cluster slot
// of a key depends on its tag only.
func TestKeyEncodingInjective(t *testing.T) {
	seen := map[string][2]string{}
	for _, tag := range nasty {
		for _, k := range nasty {
			rk := string(appendKey(nil, "p:", tag, k))
			for _, name := range []string{rk, rk + logSuffix} {
				if prev, dup := seen[name]; dup {
					t.Fatalf("(%q, %q) and (%q, %q) share Redis key %q", prev[0], prev[1], tag, k, name)
				}
				seen[name] = [2]string{tag, k}
			}
			if len(rk) > 2*maxRaw+100 {
				t.Errorf("key of (%d-byte tag, %d-byte key) is %d bytes", len(tag), len(k), len(rk))
			}
			// Redis Cluster hashes the text between the first { and the
			// next }: it must be exactly the encoded tag.
			want := string(appendTag(nil, tag))
			if got := HashTag(rk); got != want {
				t.Fatalf("(%q, %q): Redis would hash %q, want %q", tag, k, got, want)
			}
		}
	}
}

// nopClient returns a client that is never used to connect.
func nopClient(t testing.TB) redis.UniversalClient {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestPrefixWithBraceRejected(t *testing.T) {
	for _, p := range []string{"a{", "}b", "{x}"} {
		if _, err := New(nopClient(t), Options{Prefix: p}); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
}

func TestHashTag(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"plain", "plain"},
		{"{acme}user:1", "acme"},
		{"user:{acme}:1", "acme"},
		{"{}x", "{}x"},
		{"{a", "{a"},
		{"a}{b}", "b"},
		{"{a}{b}", "a"},
	} {
		if got := HashTag(tc.key); got != tc.want {
			t.Errorf("HashTag(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestSlot checks slot against Redis Cluster's own examples: CRC16
// (XMODEM) of "123456789" is 0x31C3, and keys that share a tag share a slot.
func TestSlot(t *testing.T) {
	if got := slot("123456789"); got != 0x31C3 {
		t.Errorf("slot(123456789) = %#x, want 0x31c3", got)
	}
	if a, b := slot("{user1000}.following"), slot("{user1000}.followers"); a != b || a != slot("user1000") {
		t.Errorf("slots of one tag differ: %d, %d, %d", a, b, slot("user1000"))
	}
	if a, b := slot("foo{}{bar}"), slot("foo{}{bar}x"); a == b {
		t.Errorf("keys whose first braces are empty share slot %d: the whole key is hashed", a)
	}
}

// TestHostileKeys decides requests whose keys and tags are arbitrary bytes on
// a Cluster: none may fail (CROSSSLOT, a broken script), and tenants stay
// isolated: exhausting one tenant's keys leaves every other key full.
func TestHostileKeys(t *testing.T) {
	cl := redistest.Cluster(t)
	ctx := context.Background()
	r := &ratelimit.Rule{Name: "r", Quota: 2, Period: time.Hour}
	log := &ratelimit.Rule{Name: "log", Algorithm: ratelimit.SlidingLog, Quota: 2, Period: time.Hour}
	// Each test tenant's keys are "tenant\x00rest"; the tag is the tenant.
	tenantOf := func(k string) string { t, _, _ := strings.Cut(k, "\x00"); return t }
	s := newTestStore(t, cl.Addrs(), nil, func(o *testConfig) { o.HashTag = tenantOf })
	victim := []ratelimit.Item{{Key: "victim\x00a", Rule: r, Cost: 2}, {Key: "victim\x00log", Rule: log, Cost: 2}}
	if ds, err := s.Decide(ctx, nil, victim); err != nil || !ratelimit.Allowed(ds) {
		t.Fatalf("victim: %v %+v", err, ds)
	}
	for _, tenant := range nasty {
		items := make([]ratelimit.Item, 0, len(nasty)+1)
		for _, k := range nasty {
			items = append(items, ratelimit.Item{Key: tenant + "\x00" + k, Rule: r, Cost: 1})
		}
		items = append(items, ratelimit.Item{Key: tenant + "\x00log", Rule: log, Cost: 1})
		ds, err := s.Decide(ctx, nil, items)
		if err != nil {
			t.Fatalf("tenant %q: %v", tenant, err)
		}
		for i, d := range ds {
			if !d.Allowed {
				t.Fatalf("tenant %q item %d (%q) denied: %+v", tenant, i, items[i].Key, d)
			}
		}
	}
	// With the default tags, any single key works, and so do keys that
	// share a "{tag}".
	def := newTestStore(t, cl.Addrs(), nil, nil)
	for _, k := range nasty {
		items := []ratelimit.Item{{Key: k, Rule: r, Cost: 1}}
		if tag := HashTag(k); tag != k {
			items = append(items, ratelimit.Item{Key: "{" + tag + "}other", Rule: log, Cost: 1})
		}
		if _, err := def.Decide(ctx, nil, items); err != nil {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	// Keys of two tags on a Cluster: decided tag by tag, still all or
	// nothing in outcome.
	two := &ratelimit.Rule{Name: "two", Algorithm: ratelimit.FixedWindow, Quota: 2, Period: time.Hour}
	cross := func(ca, cb int64) []ratelimit.Decision {
		t.Helper()
		ds, err := def.Decide(ctx, nil, []ratelimit.Item{{Key: "cross-a", Rule: two, Cost: ca}, {Key: "cross-b", Rule: two, Cost: cb}})
		if err != nil || len(ds) != 2 {
			t.Fatalf("cross-slot request: %v %+v", err, ds)
		}
		return ds
	}
	if ds := cross(1, 1); !ratelimit.Allowed(ds) || ds[0].Remaining != 1 || ds[1].Remaining != 1 {
		t.Fatalf("cross-slot 1+1: %+v", ds)
	}
	if ds := cross(1, 2); ratelimit.Allowed(ds) || !ds[0].Allowed || ds[1].Allowed || ds[0].Remaining != 1 {
		t.Fatalf("cross-slot 1+2 (b over): %+v", ds)
	}
	if ds := cross(0, 0); ds[0].Remaining != 1 || ds[1].Remaining != 1 {
		t.Fatalf("the denied cross-slot request consumed: %+v", ds)
	}
	if ds := cross(2, 1); ratelimit.Allowed(ds) || ds[0].Allowed || !ds[1].Allowed || ds[1].Remaining != 1 {
		t.Fatalf("cross-slot 2+1 (a over): %+v", ds)
	}
	// Every rule of a cross-slot request is checked before any group is
	// decided.
	for _, bad := range []*ratelimit.Rule{nil, {Name: "bad", Quota: -1, Period: time.Second}} {
		_, err := def.Decide(ctx, nil, []ratelimit.Item{{Key: "cross-a", Rule: two, Cost: 1}, {Key: "cross-b", Rule: bad, Cost: 1}})
		if !errors.Is(err, ratelimit.ErrInvalidRule) {
			t.Fatalf("cross-slot request with rule %v: error %v, want ErrInvalidRule", bad, err)
		}
	}
	if ds := cross(0, 0); ds[0].Remaining != 1 || ds[1].Remaining != 1 {
		t.Fatalf("the cross-slot requests with an invalid rule consumed: %+v", ds)
	}
	ds, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "victim\x00a", Rule: r, Cost: 0}, {Key: "victim\x00log", Rule: log, Cost: 0}})
	if err != nil || ds[0].Remaining != 0 || ds[1].Remaining != 0 {
		t.Fatalf("victim after the others: %v %+v", err, ds)
	}
	// A one-megabyte key is hashed, not stored.
	big := strings.Repeat("\n{}", 1<<18)
	if ds, err := def.Decide(ctx, nil, []ratelimit.Item{{Key: big, Rule: r, Cost: 1}}); err != nil || !ds[0].Allowed {
		t.Fatalf("1 MB key: %v %+v", err, ds)
	}
}

// TestAppend pins the encoding: it is part of the keys in deployed Redis
// servers, so every output here is a fixed literal, not recomputed.
func TestAppendEncoded(t *testing.T) {
	x128 := strings.Repeat("x", maxRaw)
	tests := []struct{ name, in, want string }{
		{"empty", "", ""},
		{"open brace", "{", "ew"},
		{"close brace", "}", "fQ"},
		{"empty tag", "{}", "e30"},
		{"newline", "\n", "Cg"},
		{"braces inside", "a}{b", "YX17Yg"},
		{"plain", "api", "YXBp"},
		{"invalid UTF-8", "\xff\xfe", "__4"},
		{"tilde", "~", "fg"},
		{"exactly MaxRaw bytes", x128, strings.Repeat("eHh4", 42) + "eHg"},
		{"MaxRaw+1 bytes", x128 + "x", "~DsnrM-dFELzdHy6lUgboLyFknFwr7L8rQz60dbNMAb0"},
		{"MaxRaw+1 bytes, last differs", x128 + "y", "~CwOJGktzBXu2ongjQ8Kk4ud18TQ1CfsrNGcYtuXykzo"},
		{"one megabyte", strings.Repeat("\n{}", 1<<18), "~i1fIpxP9FBHli0Obvs1uhqp1Q6WdLkhjNbUvdzOVneY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(appendEncoded(nil, tt.in)); got != tt.want {
				t.Errorf("appendEncoded(%d bytes) = %q, want %q", len(tt.in), got, tt.want)
			}
			if got := string(appendEncoded([]byte("p:{"), tt.in)); got != "p:{"+tt.want {
				t.Errorf("appendEncoded(\"p:{\", %d bytes) = %q, want %q", len(tt.in), got, "p:{"+tt.want)
			}
			if got := encodedLen(len(tt.in)); got != len(tt.want) {
				t.Errorf("encodedLen(%d) = %d, want %d", len(tt.in), got, len(tt.want))
			}
		})
	}
}
