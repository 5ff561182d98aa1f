package adaptive

import (
	"context"
	"errors"
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
