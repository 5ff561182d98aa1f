package admit

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func TestBound(t *testing.T) {
	long := "name|" + strings.Repeat("v", MaxKeyLen) // MaxLen+5 bytes
	sum := sha256.Sum256([]byte(long))
	tests := []struct {
		name, key, want string
	}{
		{"short", "name|v", "name|v"},
		{"at the bound", "name|" + strings.Repeat("v", MaxKeyLen-5), "name|" + strings.Repeat("v", MaxKeyLen-5)},
		{"over the bound", long, "name|#" + hex.EncodeToString(sum[:])},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(bound([]byte(tt.key), len("name"))); got != tt.want {
				t.Errorf("Bound(%d bytes) = %q, want %q", len(tt.key), got, tt.want)
			}
		})
	}
	a := bound([]byte(long), len("name"))
	b := bound([]byte(long[:len(long)-1]+"w"), len("name"))
	if string(a) == string(b) {
		t.Error("two long keys that differ in their last byte collided")
	}
}

// parts returns a part function appending vals[i], or reporting false for
// an empty one.
func parts(vals ...string) func([]byte, int) ([]byte, bool) {
	return func(dst []byte, i int) ([]byte, bool) {
		if vals[i] == "" {
			return dst, false
		}
		return append(dst, vals[i]...), true
	}
}

func TestAppendKey(t *testing.T) {
	long := strings.Repeat("v", MaxKeyLen)
	sum := sha256.Sum256([]byte("rule|a|" + long))
	tests := []struct {
		name   string
		prefix string
		vals   []string
		want   string
		ok     bool
	}{
		{"no parts", "", nil, "rule", true},
		{"parts", "", []string{"acme", "/pkg.Svc/Get"}, "rule|acme|/pkg.Svc/Get", true},
		{"after what dst holds", "xyz", []string{"acme"}, "xyzrule|acme", true},
		{"a part that does not apply", "", []string{"acme", ""}, "", false},
		{"long", "", []string{"a", long}, "rule|#" + hex.EncodeToString(sum[:]), true},
		{"long after what dst holds", "xyz", []string{"a", long}, "xyzrule|#" + hex.EncodeToString(sum[:]), true},
		{"delimiters escaped", "", []string{"a|b", "#1%"}, "rule|a%7Cb|%231%25", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, ok := AppendKey([]byte(tt.prefix), "rule", len(tt.vals), parts(tt.vals...))
			if ok != tt.ok || (ok && string(b) != tt.want) {
				t.Errorf("AppendKey = %q, %v; want %q, %v", b, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestAppendKeyAllocs: with room in dst, a key costs no allocation, a
// closure over the request included.
func TestAppendKeyAllocs(t *testing.T) {
	buf := make([]byte, 0, 512)
	vals := []string{"acme", "/pkg.Svc/Get"}
	long := strings.Repeat("v", 300)
	allocs := testing.AllocsPerRun(100, func() {
		for _, v := range [...]string{vals[0], long} {
			b, ok := AppendKey(buf[:0], "rule", 2, func(dst []byte, i int) ([]byte, bool) {
				if i == 0 {
					return append(dst, v...), true
				}
				return append(dst, vals[i]...), true
			})
			if !ok || len(b) == 0 {
				t.Fatal("no key")
			}
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run, want 0", allocs)
	}
}

// FuzzAppendKey: whatever the parts, a key is the escaped join when it
// fits MaxKeyLen, and otherwise the escaped rule name, "|#" and 64 hex
// digits.
func FuzzAppendKey(f *testing.F) {
	f.Add("rule", "acme", "/pkg.Svc/Get")
	f.Add("r", strings.Repeat("x", 300), "")
	f.Add("", "|", "#")
	f.Add("a|b", "%7C", "%")
	f.Fuzz(func(t *testing.T, name, a, b string) {
		vals := []string{a, b}
		key, ok := AppendKey(nil, name, 2, func(dst []byte, i int) ([]byte, bool) {
			return append(dst, vals[i]...), true
		})
		if !ok {
			t.Fatal("a part that applies was refused")
		}
		esc := strings.NewReplacer("%", "%25", "|", "%7C", "#", "%23")
		plain := esc.Replace(name) + "|" + esc.Replace(a) + "|" + esc.Replace(b)
		if len(plain) <= MaxKeyLen {
			if string(key) != plain {
				t.Fatalf("key %q, want %q", key, plain)
			}
			return
		}
		sum := sha256.Sum256([]byte(plain))
		if want := esc.Replace(name) + "|#" + hex.EncodeToString(sum[:]); string(key) != want {
			t.Fatalf("key of %d bytes = %q, want %q", len(plain), key, want)
		}
	})
}

// FuzzAppendKeyInjective: two policies' keys are equal only when their
// names and parts are: no value a client sends, delimiters and digests
// included, puts it on another's counter.
func FuzzAppendKeyInjective(f *testing.F) {
	sum := sha256.Sum256([]byte("r|" + strings.Repeat("x", 300)))
	f.Add("r", "a|b", "c", "r", "a", "b|c")
	f.Add("r|a", "b", "", "r", "a|b", "")
	f.Add("r", "#"+hex.EncodeToString(sum[:]), "", "r", strings.Repeat("x", 300), "")
	f.Add("r", "%7C", "", "r", "|", "")
	f.Fuzz(func(t *testing.T, n1, a1, b1, n2, a2, b2 string) {
		key := func(name string, vals ...string) string {
			k, _ := AppendKey(nil, name, len(vals), func(dst []byte, i int) ([]byte, bool) {
				return append(dst, vals[i]...), true
			})
			return string(k)
		}
		// One part and two: a policy with fewer parts never meets one with
		// more on a key either.
		if k1, k2 := key(n1, a1, b1), key(n2, a2, b2); k1 == k2 && (n1 != n2 || a1 != a2 || b1 != b2) {
			t.Fatalf("(%q, %q, %q) and (%q, %q, %q) share the key %q", n1, a1, b1, n2, a2, b2, k1)
		}
		if k1, k2 := key(n1, a1), key(n2, a2, b2); k1 == k2 {
			t.Fatalf("(%q, %q) and (%q, %q, %q) share the key %q", n1, a1, n2, a2, b2, k1)
		}
	})
}

// TestAppendKeyLongName: a rule name so long that name|#digest outgrows
// the key it replaces (ratelimit does not bound names) still gives
// name|#digest, after what dst holds.
func TestAppendKeyLongName(t *testing.T) {
	name := strings.Repeat("n", MaxKeyLen+1)
	sum := sha256.Sum256([]byte(name + "|v"))
	want := "xyz" + name + "|#" + hex.EncodeToString(sum[:])
	b, ok := AppendKey([]byte("xyz"), name, 1, parts("v"))
	if !ok || string(b) != want {
		t.Errorf("AppendKey = %q, %v; want %q", b, ok, want)
	}
}
