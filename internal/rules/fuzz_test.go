package rules

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value_to_metric: true\n    descriptors:\n      - key: b\n        value: x*\n        share_threshold: true\n        detailed_metric: true\n        quota_mode: true\n        rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: d\nmetadata: {a: 1}\ndescriptors: []\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: m\n    limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: minute, requests_per_unit: 9, cost_unit: tokens}\n      - {period: 60s, requests_per_unit: 9, cost_unit: x_2}\n"))
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
			if s.CostUnit != "" && (s.Unlimited || CheckCostUnit(s.CostUnit) != nil) {
				t.Fatalf("Parse accepted cost unit %q on %s (unlimited %v)", s.CostUnit, s.Name, s.Unlimited)
			}
			entries := make([]Entry, s.Depth())
			for i := range entries {
				entries[i] = Entry{Key: "k", Value: "v"}
			}
			dst = d.Match(0, entries, dst[:0])
			keys := map[string]string{} // two limits of one descriptor never share a counter
			for _, l := range ApplyReplaces(dst) {
				buf = l.AppendKey(buf[:0], entries)
				if other, dup := keys[string(buf)]; dup && len(buf) > 0 {
					t.Fatalf("limits %s and %s share the storage key %q", other, l.Name, buf)
				}
				keys[string(buf)] = l.Name
				if mk := string(l.AppendMetricKey(buf[:0], entries)); !strings.HasPrefix(mk, d.Name()+".") {
					t.Fatalf("metric key %q of %s does not start with its domain", mk, l.Name)
				}
			}
		}
	})
}
