package rules

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/*.good.yaml")

// describeDomain renders every limit of d, one a line, for golden files.
func describeDomain(d *Domain) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "domain %s\n", d.Name())
	for _, s := range d.Specs() {
		fmt.Fprintf(&sb, "%s %s", s.Source[strings.LastIndexByte(s.Source, ':')+1:], s.Name)
		if s.Unlimited {
			sb.WriteString(" unlimited")
		} else {
			r := s.Rule
			fmt.Fprintf(&sb, " %s limit=%d", r.Algorithm, r.Quota)
			if r.Period != 0 {
				fmt.Fprintf(&sb, " period=%v", r.Period)
			}
			if r.Burst != 0 {
				fmt.Fprintf(&sb, " burst=%d", r.Burst)
			}
			if r.Calendar != ratelimit.NoCalendar {
				fmt.Fprintf(&sb, " calendar=%s", r.Calendar)
			}
			if r.Location != nil {
				fmt.Fprintf(&sb, " tz=%s", r.Location)
			}
			if r.Failure != ratelimit.FailDefault {
				fmt.Fprintf(&sb, " failure=%s", r.Failure)
			}
			if r.Counting != ratelimit.Strict {
				fmt.Fprintf(&sb, " counting=%s", r.Counting)
			}
			fmt.Fprintf(&sb, " unit=%s", s.Unit)
			if s.CostUnit != "" {
				fmt.Fprintf(&sb, " cost_unit=%s", s.CostUnit)
			}
		}
		for _, f := range []struct {
			on   bool
			name string
		}{{s.Shadow, "shadow"}, {s.QuotaMode, "quota_mode"}, {s.DetailedMetric, "detailed_metric"}, {s.ValueToMetric, "value_to_metric"}} {
			if f.on {
				sb.WriteString(" " + f.name)
			}
		}
		if len(s.Replaces) > 0 {
			fmt.Fprintf(&sb, " replaces=%s", strings.Join(s.Replaces, ","))
		}
		entries := make([]Entry, s.Depth())
		for i := range entries {
			entries[i] = Entry{Key: "k", Value: "v"}
		}
		fmt.Fprintf(&sb, " key=%s\n", s.AppendKey(nil, entries))
	}
	return sb.String()
}

func TestGoodFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/*.good.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no good fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Parse(file, data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			for _, s := range d.Specs() {
				if s.Rule != nil {
					if err := s.Rule.Validate(); err != nil {
						t.Errorf("%s: %v", s.Name, err)
					}
					if s.Rule.Name != s.Name {
						t.Errorf("Rule.Name %q, Spec.Name %q", s.Rule.Name, s.Name)
					}
				}
			}
			got := describeDomain(d)
			golden := strings.TrimSuffix(file, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs (go test -update rewrites it):\ngot:\n%s\nwant:\n%s", golden, got, want)
			}
		})
	}
}

// TestBadFixtures parses every testdata/*.bad.yaml; each carries its
// expected errors as "# want: <substring>" lines, one per error, and must
// produce exactly that many errors, each an *Error with a line.
func TestBadFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/*.bad.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var wants []string
			for _, line := range strings.Split(string(data), "\n") {
				if w, ok := strings.CutPrefix(line, "# want: "); ok {
					wants = append(wants, w)
				}
			}
			if len(wants) == 0 {
				t.Fatal("fixture has no # want: line")
			}
			d, err := Parse(file, data)
			if err == nil {
				t.Fatalf("Parse succeeded (domain %q); want errors %q", d.Name(), wants)
			}
			errs := unjoin(err)
			if *update {
				rewriteWants(t, file, data, errs)
				return
			}
			for _, e := range errs {
				var re *Error
				if !errors.As(e, &re) || re.Line < 1 || re.File != file {
					t.Errorf("error %q is not an *Error naming %s and a line", e, file)
				}
			}
			if len(errs) != len(wants) {
				t.Errorf("got %d errors, want %d:\n%v", len(errs), len(wants), err)
			}
			for _, w := range wants {
				found := false
				for _, e := range errs {
					if strings.Contains(e.Error(), "testdata/"+w) {
						found = true
					}
				}
				if !found {
					t.Errorf("no error contains %q; got:\n%v", w, err)
				}
			}
		})
	}
}

// rewriteWants replaces the "# want:" lines of a bad fixture with the
// errors Parse gave, for go test -update; review the diff.
func rewriteWants(t *testing.T, file string, data []byte, errs []error) {
	t.Helper()
	var out []string
	done := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "# want: ") {
			if !done {
				for _, e := range errs {
					out = append(out, "# want: "+strings.TrimPrefix(e.Error(), "testdata/"))
				}
				done = true
			}
			continue
		}
		out = append(out, line)
	}
	if err := os.WriteFile(file, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
}

// unjoin returns the errors joined in err.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

func TestParseBounds(t *testing.T) {
	deep := func(n int) string {
		var sb strings.Builder
		sb.WriteString("domain: d\ndescriptors:\n")
		for i := range n {
			ind := strings.Repeat("  ", 2*i)
			fmt.Fprintf(&sb, "%s  - key: k%d\n", ind, i)
			if i < n-1 {
				fmt.Fprintf(&sb, "%s    descriptors:\n", ind)
			} else {
				fmt.Fprintf(&sb, "%s    rate_limit: {unit: second, requests_per_unit: 1}\n", ind)
			}
		}
		return sb.String()
	}
	many := func(n int) string {
		var sb strings.Builder
		sb.WriteString("domain: d\ndescriptors:\n")
		for i := range n {
			fmt.Fprintf(&sb, "  - {key: k, value: v%d}\n", i)
		}
		return sb.String()
	}
	long := strings.Repeat("x", MaxKeyValueBytes+1)
	tests := []struct {
		name, data, want string
	}{
		{"depth ok", deep(MaxDepth), ""},
		{"too deep", deep(MaxDepth + 1), "(MaxDepth)"},
		{"descriptors ok", many(MaxDescriptorsPerDomain), ""},
		{"too many descriptors", many(MaxDescriptorsPerDomain + 1), "(MaxDescriptorsPerDomain)"},
		{"long key", "domain: d\ndescriptors:\n  - key: " + long + "\n", "f.yaml:3: descriptors[0].key: key is 257 bytes; the bound is 256 (MaxKeyValueBytes)"},
		{"long value", "domain: d\ndescriptors:\n  - key: k\n    value: " + long + "\n", "f.yaml:4: descriptors[0].value: value is 257 bytes"},
		{"long domain", "domain: " + long + "\n", "f.yaml:1: domain: domain is 257 bytes"},
		{"too big", "domain: d\n#" + strings.Repeat("x", MaxFileBytes), "f.yaml:1: file is larger than 1048576 bytes (MaxFileBytes)"},
		{"too many limits", "domain: d\ndescriptors:\n  - key: k\n    limits: [" + strings.Repeat("{unit: second, requests_per_unit: 1},", MaxLimitsPerDescriptor+1) + "]\n", "(MaxLimitsPerDescriptor)"},
		{"alias bomb", "domain: d\ndescriptors:\n  - &a {key: k, descriptors: [*a, *a]}\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("f.yaml", []byte(tt.data))
			switch {
			case tt.want == "" && err != nil && tt.name != "alias bomb":
				t.Fatalf("Parse: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Parse error %v; want one containing %q", err, tt.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Run("examples", func(t *testing.T) {
		s, err := Load("../../examples/rules")
		if err != nil {
			t.Fatalf("the shipped example rules do not load: %v", err)
		}
		if len(s.Domains()) == 0 {
			t.Fatal("no domains in the example rules")
		}
		if _, err := Validate("../../examples/rules"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		dir := t.TempDir()
		write := func(name, data string) {
			t.Helper()
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("a.yaml", "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
		write("b.yml", "domain: b\n")
		write(".hidden.yaml", "not: [valid")
		write("notes.txt", "ignored")
		if err := os.Mkdir(filepath.Join(dir, "..data"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("a.yaml", filepath.Join(dir, "link.yaml")); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), `link.yaml:1: domain: duplicate domain "a" (also in `+filepath.Join(dir, "a.yaml")+":1)") {
			t.Fatalf("Load: %v; want a duplicate domain error naming both files", err)
		}
		if err := os.Remove(filepath.Join(dir, "link.yaml")); err != nil {
			t.Fatal(err)
		}
		s, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(s.Domains(), ","); got != "a,b" {
			t.Errorf("Domains() = %s, want a,b", got)
		}
		if got := strings.Join(s.Files(), ","); got != filepath.Join(dir, "a.yaml")+","+filepath.Join(dir, "b.yml") {
			t.Errorf("Files() = %s", got)
		}
		d, ok := s.Domain("a")
		if !ok || d.File() != filepath.Join(dir, "a.yaml") || d.Spec("a.k.second") == nil {
			t.Errorf("Domain(a) = %v, %v", d, ok)
		}
	})
	t.Run("duplicate domain fixture", func(t *testing.T) {
		_, err := Load("testdata/dup_domain")
		want := `testdata/dup_domain/two.yaml:1: domain: duplicate domain "shared" (also in testdata/dup_domain/one.yaml:2)`
		if err == nil || err.Error() != want {
			t.Fatalf("Load = %v, want %s", err, want)
		}
	})
	t.Run("all errors of all files", func(t *testing.T) {
		dir := t.TempDir()
		for name, data := range map[string]string{
			"a.yaml": "domain: a\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n",
			"b.yaml": "domain: b\nbogus: 1\n",
			"c.yaml": "domain: c\n",
		} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Load(dir)
		if err == nil {
			t.Fatal("Load succeeded")
		}
		for _, want := range []string{"a.yaml:2: descriptors[0].rate_limit.unit: invalid unit", "b.yaml:2: bogus: unknown key"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	})
	t.Run("empty directory", func(t *testing.T) {
		dir := t.TempDir()
		s, err := Load(dir)
		if err != nil || len(s.Domains()) != 0 {
			t.Fatalf("Load(empty) = %v, %v", s, err)
		}
		if _, err := Validate(dir); err == nil || !strings.Contains(err.Error(), "no rule files") {
			t.Fatalf("Validate(empty) = %v", err)
		}
		if _, err := Load(filepath.Join(dir, "missing")); err == nil {
			t.Fatal("Load(missing dir) succeeded")
		}
	})
}

func TestSpecFields(t *testing.T) {
	d, err := Parse("x.yaml", []byte(`domain: x
descriptors:
  - key: u
    limits:
      - {requests_per_unit: 10, unit: second, burst: 20}
      - {requests_per_unit: 100, period: 1h}
      - {requests_per_unit: 100, period: 90m}
`))
	if err != nil {
		t.Fatal(err)
	}
	specs := d.Specs()
	want := []struct {
		name   string
		unit   Unit
		period time.Duration
		burst  int64
	}{
		{"x.u.second", Second, time.Second, 20},
		{"x.u.hour", Hour, time.Hour, 0},
		{"x.u.1h30m0s", UnitUnknown, 90 * time.Minute, 0},
	}
	if len(specs) != len(want) {
		t.Fatalf("%d specs, want %d", len(specs), len(want))
	}
	for i, w := range want {
		s := specs[i]
		if s.Name != w.name || s.Unit != w.unit || s.Rule.Period != w.period || s.Rule.Burst != w.burst || s.Rule.Algorithm != ratelimit.GCRA {
			t.Errorf("spec %d = %s %s %v burst %d %s; want %s %s %v burst %d gcra", i, s.Name, s.Unit, s.Rule.Period, s.Rule.Burst, s.Rule.Algorithm, w.name, w.unit, w.period, w.burst)
		}
		if s.Source != fmt.Sprintf("x.yaml:%d", 5+i) {
			t.Errorf("spec %d Source = %s", i, s.Source)
		}
	}
	for u := Second; u < numUnits; u++ {
		if got := unitOf(u.Duration()); got != u {
			t.Errorf("unitOf(%v) = %v, want %v", u.Duration(), got, u)
		}
	}
}
