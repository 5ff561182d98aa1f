package adaptive

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestPriority(t *testing.T) {
	for p := Sheddable; p <= Critical; p++ {
		got, err := ParsePriority(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePriority(%q) = %v, %v", p.String(), got, err)
		}
	}
	if p, err := ParsePriority("CRITICAL"); p != Critical || err != nil {
		t.Errorf("ParsePriority(CRITICAL) = %v, %v", p, err)
	}
	for _, s := range []string{"", " normal", "2", "ſheddable", "urgent"} {
		if _, err := ParsePriority(s); !errors.Is(err, ErrUnknownPriority) {
			t.Errorf("ParsePriority(%q) error %v, want ErrUnknownPriority", s, err)
		}
	}
	if PriorityFrom(context.Background()) != Normal || PriorityFrom(WithPriority(context.Background(), High)) != High ||
		PriorityFrom(WithPriority(context.Background(), 9)) != Normal {
		t.Error("PriorityFrom does not return what WithPriority carries, or Normal")
	}
}

// FuzzParsePriority: whatever the input, ParsePriority either fails with
// ErrUnknownPriority or returns a valid priority whose name folds to it.
func FuzzParsePriority(f *testing.F) {
	for _, s := range []string{"critical", "High", "normal", "low", "sheddable", "", "x", "criticalx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePriority(s)
		if err != nil {
			if !errors.Is(err, ErrUnknownPriority) || p != Normal {
				t.Fatalf("ParsePriority(%q) = %v, %v", s, p, err)
			}
			return
		}
		if !p.Valid() || !equalFoldASCII(s, p.String()) {
			t.Fatalf("ParsePriority(%q) = %v", s, p)
		}
	})
}

// TestTrustedPriority: the first value names the priority, lowered to
// what is trusted; none, or a name of no priority, is Normal and unset;
// and nothing allocates, not even for a megabyte of nonsense.
func TestTrustedPriority(t *testing.T) {
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
		if p, ok := TrustedPriority(tt.values, tt.max); p != tt.want || ok != tt.set {
			t.Errorf("TrustedPriority(%.20q, %v) = %v, %v; want %v, %v", tt.values, tt.max, p, ok, tt.want, tt.set)
		}
	}
	if n := testing.AllocsPerRun(100, func() { TrustedPriority([]string{junk}, Critical) }); n != 0 {
		t.Errorf("%v allocations for a value that names no priority", n)
	}
}
