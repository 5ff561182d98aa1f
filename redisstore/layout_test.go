package redisstore

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// layoutBlock returns the block at the top of decide.lua that declares the
// layout.
func layoutBlock(t *testing.T) string {
	t.Helper()
	start := strings.Index(decideSource, layoutStart)
	end := strings.Index(decideSource, layoutEnd)
	if start < 0 || end < start {
		t.Fatal("decide.lua has no layout block")
	}
	return decideSource[start:end]
}

// TestScriptLayout runs decide.lua's layout block in Redis's Lua and
// requires the values Go encodes and decodes with: the same names, the
// same numbers, none missing on either side.
func TestScriptLayout(t *testing.T) {
	block := layoutBlock(t)
	// Every name the block declares must be one Go knows.
	known := map[string]bool{}
	for _, l := range scriptLayout {
		known[l.name] = true
	}
	decl := regexp.MustCompile(`(?m)^local ([A-Za-z_][\w, ]*?) =`)
	n := 0
	for _, m := range decl.FindAllStringSubmatch(block, -1) {
		for name := range strings.SplitSeq(m[1], ",") {
			name = strings.TrimSpace(name)
			n++
			if !known[name] {
				t.Errorf("decide.lua declares %s, which script.go does not", name)
			}
		}
	}
	if n != len(scriptLayout) {
		t.Errorf("decide.lua declares %d layout names, script.go %d", n, len(scriptLayout))
	}

	// Their values, as Lua computes them (a name Lua lacks is "nil").
	var b strings.Builder
	b.WriteString(block)
	b.WriteString("\nlocal function v(x) if x == nil then return 'nil' end return string.format('%.0f', x) end\nreturn {")
	for i, l := range scriptLayout {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("v(" + l.name + ")")
	}
	b.WriteString("}\n")
	srv := redistest.Standalone(t)
	got, err := srv.Client().Eval(t.Context(), b.String(), nil).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(scriptLayout) {
		t.Fatalf("the layout block returned %d values for %d names", len(got), len(scriptLayout))
	}
	for i, l := range scriptLayout {
		if want := strconv.FormatInt(l.value, 10); got[i] != want {
			t.Errorf("%s is %s in decide.lua and %s in script.go", l.name, got[i], want)
		}
	}
}

// TestInlineLayout: the script as loaded has the values where decide.lua
// has the names, on the same lines, and decide.lua never rebinds a layout
// name (a local, a parameter, an assignment or a table field of that name
// would make the substitution change what the file means).
func TestInlineLayout(t *testing.T) {
	if got, want := strings.Count(decideLua, "\n"), strings.Count(decideSource, "\n"); got != want {
		t.Errorf("the loaded script has %d lines, decide.lua %d", got, want)
	}
	start := strings.Index(decideSource, layoutStart)
	loaded := decideLua[start:] // the header comment before the block is left as it is
	end := strings.Index(decideSource, layoutEnd) + len(layoutEnd)
	rest := decideSource[end:]
	for _, l := range scriptLayout {
		n := regexp.QuoteMeta(l.name)
		if regexp.MustCompile(`\b` + n + `\b`).MatchString(loaded) {
			t.Errorf("%s is still in the loaded script", l.name)
		}
		for _, bad := range []string{
			`(?m)^\s*local\b[^=\n]*\b` + n + `\b`, // a local of that name
			`function\b[^)]*\b` + n + `\b[^)]*\)`, // a parameter
			`[.:]` + n + `\b`,                     // a field or method
			`\b` + n + `\s*=[^=]`,                 // an assignment or table key
		} {
			if m := regexp.MustCompile(bad).FindString(rest); m != "" {
				t.Errorf("decide.lua rebinds layout name %s: %q", l.name, m)
			}
		}
	}
}
