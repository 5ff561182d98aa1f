package priority

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestPriority(t *testing.T) {
	for p := Sheddable; p <= Critical; p++ {
		got, err := Parse(p.String())
		if err != nil || got != p {
			t.Errorf("Parse(%q) = %v, %v", p.String(), got, err)
		}
	}
	if p, err := Parse("CRITICAL"); p != Critical || err != nil {
		t.Errorf("Parse(CRITICAL) = %v, %v", p, err)
	}
	for _, s := range []string{"", " normal", "2", "ſheddable", "urgent"} {
		if _, err := Parse(s); !errors.Is(err, ErrUnknown) {
			t.Errorf("Parse(%q) error %v, want ErrUnknown", s, err)
		}
	}
	if FromContext(context.Background()) != Normal || FromContext(NewContext(context.Background(), High)) != High ||
		FromContext(NewContext(context.Background(), 9)) != Normal {
		t.Error("FromContext does not return what NewContext carries, or Normal")
	}
	for p := Sheddable; p <= Critical; p++ {
		if i := p.Index(); i != int(p-Sheddable) || i < 0 || i >= Levels {
			t.Errorf("%v.Index() = %d, want %d in [0, %d)", p, i, p-Sheddable, Levels)
		}
	}
}

// FuzzParse: whatever the input, Parse either fails with
// ErrUnknown or returns a valid priority whose name folds to it.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"critical", "High", "normal", "low", "sheddable", "", "x", "criticalx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrUnknown) || p != Normal {
				t.Fatalf("Parse(%q) = %v, %v", s, p, err)
			}
			return
		}
		if !p.Valid() || !equalFoldASCII(s, p.String()) {
			t.Fatalf("Parse(%q) = %v", s, p)
		}
	})
}

// TestTrusted: the first value names the priority, lowered to
// what is trusted; none, or a name of no priority, is Normal and unset;
// and nothing allocates, not even for a megabyte of nonsense.
func TestTrusted(t *testing.T) {
	junk := strings.Repeat("x", 1<<20)
	tests := []struct {
		values []string
		max    Priority
		want   Priority
		set    bool
	}{
		{nil, Critical, Normal, false},
		{[]string{"critical"}, Critical, Critical, true},
		{[]string{"CRITICAL"}, Normal, Normal, true},
		{[]string{"sheddable", "critical"}, Critical, Sheddable, true},
		{[]string{"urgent"}, Critical, Normal, false},
		{[]string{junk}, Critical, Normal, false},
	}
	for _, tt := range tests {
		if p, ok := Trusted(tt.values, tt.max); p != tt.want || ok != tt.set {
			t.Errorf("Trusted(%.20q, %v) = %v, %v; want %v, %v", tt.values, tt.max, p, ok, tt.want, tt.set)
		}
	}
	if n := testing.AllocsPerRun(100, func() { Trusted([]string{junk}, Critical) }); n != 0 {
		t.Errorf("%v allocations for a value that names no priority", n)
	}
}
