package redisstore

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// goLayout is store.go's layout of decide.lua's ARGV and reply, by the
// names decide.lua gives the same facts.
var goLayout = []struct {
	name  string
	value int64
}{
	{"argNow", argNow}, {"argSlack", argSlack}, {"argCount", argCount}, {"argMask", argMask},
	{"argHeader", argHeader},
	{"fieldKey", fieldKey}, {"fieldAlg", fieldAlg}, {"fieldCost", fieldCost},
	{"fieldQuota", fieldQuota}, {"fieldCapacity", fieldCapacity},
	{"fieldInterval", fieldInterval}, {"fieldCapT", fieldCapT}, {"fieldPeriod", fieldPeriod},
	{"fieldWinStart", fieldWinStart}, {"fieldWinEnd", fieldWinEnd}, {"itemFields", itemFields},
	{"batchReqHeader", batchReqHeader},
	{"replyAllowed", replyAllowed}, {"replyReason", replyReason}, {"replyRemaining", replyRemaining},
	{"replyReset", replyReset}, {"replyRetry", replyRetry}, {"replyFields", replyFields},
	{"replyFar", replyFar},
	{"reasonOK", reasonOK}, {"reasonLimited", reasonLimited}, {"reasonExceeds", reasonExceeds},
	{"maxDuration", maxDuration},
}

// scriptLayout returns the block at the top of decide.lua that declares the
// layout.
func scriptLayout(t *testing.T) string {
	t.Helper()
	start := strings.Index(decideLua, "\n-- Layout of ARGV")
	end := strings.Index(decideLua, "\n-- End of the layout.")
	if start < 0 || end < start {
		t.Fatal("decide.lua has no layout block (\"-- Layout of ARGV\" … \"-- End of the layout.\")")
	}
	return decideLua[start:end]
}

// TestScriptLayout runs decide.lua's layout block in Redis's Lua and
// requires the values Go encodes and decodes with: the same names, the
// same numbers, none missing on either side.
func TestScriptLayout(t *testing.T) {
	block := scriptLayout(t)
	// Every name the block declares must be one Go knows.
	known := map[string]bool{}
	for _, l := range goLayout {
		known[l.name] = true
	}
	decl := regexp.MustCompile(`(?m)^local ([A-Za-z_][\w, ]*?) =`)
	n := 0
	for _, m := range decl.FindAllStringSubmatch(block, -1) {
		for name := range strings.SplitSeq(m[1], ",") {
			name = strings.TrimSpace(name)
			n++
			if !known[name] {
				t.Errorf("decide.lua declares %s, which store.go does not", name)
			}
		}
	}
	if n != len(goLayout) {
		t.Errorf("decide.lua declares %d layout names, store.go %d", n, len(goLayout))
	}

	// Their values, as Lua computes them (a name Lua lacks is "nil").
	var b strings.Builder
	b.WriteString(block)
	b.WriteString("\nlocal function v(x) if x == nil then return 'nil' end return string.format('%.0f', x) end\nreturn {")
	for i, l := range goLayout {
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
	if len(got) != len(goLayout) {
		t.Fatalf("the layout block returned %d values for %d names", len(got), len(goLayout))
	}
	for i, l := range goLayout {
		if want := strconv.FormatInt(l.value, 10); got[i] != want {
			t.Errorf("%s is %s in decide.lua and %s in store.go", l.name, got[i], want)
		}
	}
}
