package rules

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds random bytes to Parse as a rule file: it must never
// panic, every error must be an *Error naming the file and a line, and
// every rule of a file that parses must be valid and matchable.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	examples, _ := filepath.Glob("../../examples/rules/*.yaml")
	for _, file := range append(files, examples...) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - &a {key: k, descriptors: [*a]}\n"))
	f.Add([]byte("\x00"))
	f.Add([]byte("domain: [unclosed"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse("fuzz.yaml", data)
		if err != nil {
			if d != nil {
				t.Fatal("Parse returned a Domain with an error")
			}
			for _, e := range unjoin(err) {
				var re *Error
				if !errors.As(e, &re) || re.File != "fuzz.yaml" || re.Line < 1 {
					t.Fatalf("error %q is not an *Error naming the file and a line", e)
				}
			}
			return
		}
		var dst []Match
		buf := make([]byte, 0, 64)
		for _, s := range d.Specs() {
			if s.Rule != nil {
				if err := s.Rule.Validate(); err != nil {
					t.Fatalf("Parse accepted an invalid rule: %v", err)
				}
			}
			entries := make([]Entry, s.Depth())
			for i := range entries {
				entries[i] = Entry{Key: "k", Value: "v"}
			}
			dst = d.Match(0, entries, dst[:0])
			for _, l := range ApplyReplaces(dst) {
				buf = l.AppendKey(buf[:0], entries)
			}
		}
	})
}
