package rules

import (
	"os"
	"testing"
)

func benchSet(b *testing.B) *Set {
	b.Helper()
	data, err := os.ReadFile("../../examples/rules/demo.yaml")
	if err != nil {
		b.Fatal(err)
	}
	return mustSet(b, mustParse(b, "demo.yaml", string(data)), mustParse(b, "m.yaml", matchRules))
}

// BenchmarkMatch measures matching one request of the shapes a proxy
// sends, then building the storage key of every limit.
func BenchmarkMatch(b *testing.B) {
	s := benchSet(b)
	cases := []struct {
		name    string
		domain  string
		entries []Entry
	}{
		{"key-only", "demo", e("remote_address", "203.0.113.7")},
		{"wildcard", "demo", e("api_key", "premium-0123456789abcdef")},
		{"nested", "demo", e("tenant", "acme", "user", "alice")},
		{"two-limits", "demo", e("user", "alice")},
		{"no-match", "demo", e("unknown", "x")},
		{"unknown-domain", "nope", e("remote_address", "203.0.113.7")},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]Match, 0, 8)
				buf := make([]byte, 0, 256)
				for pb.Next() {
					dst = s.Match(c.domain, c.entries, dst[:0])
					dst = ApplyReplaces(dst)
					for i := range dst {
						buf = dst[i].AppendKey(buf[:0], c.entries)
					}
				}
			})
		})
	}
}

// BenchmarkRequest measures a whole request of three descriptors: bounds
// check, match, replaces and keys.
func BenchmarkRequest(b *testing.B) {
	s := benchSet(b)
	req := [][]Entry{
		e("remote_address", "203.0.113.7"),
		e("tenant", "acme", "user", "alice"),
		e("user", "alice"),
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]Match, 0, 16)
		buf := make([]byte, 0, 1024)
		for pb.Next() {
			d, _ := s.Domain("demo")
			dst = dst[:0]
			for i, entries := range req {
				dst = d.Match(i, entries, dst)
			}
			dst = ApplyReplaces(dst)
			buf = buf[:0]
			for i := range dst {
				buf = dst[i].AppendKey(buf, req[dst[i].Descriptor])
			}
		}
	})
}

func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile("../../examples/rules/demo.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("demo.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}
