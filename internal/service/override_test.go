package service

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
)

const runtimeOverrideRules = `domain: o
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 10, name: fw}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 5, burst: 8, name: g}
  - key: u
    rate_limit: {unlimited: true, name: u}
`

func overrideSet(t *testing.T, src string) *rules.Set {
	t.Helper()
	d, err := rules.Parse("o.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func specRule(t *testing.T, set *rules.Set, name string) *ratelimit.Rule {
	t.Helper()
	d, _ := set.Domain("o")
	return d.Spec(name).Rule
}

func TestOverrideCheck(t *testing.T) {
	set := overrideSet(t, runtimeOverrideRules)
	now := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name string
		o    Override
		want error // nil: valid
	}{
		{"fixed window limit", Override{Domain: "o", Rule: "fw", Quota: 100, Expires: now.Add(time.Hour)}, nil},
		{"gcra burst", Override{Domain: "o", Rule: "g", Quota: 1, Burst: 3, Expires: now.Add(time.Hour)}, nil},
		{"limit 0 blocks", Override{Domain: "o", Rule: "fw", Quota: 0, Expires: now.Add(time.Minute)}, nil},
		{"max ttl", Override{Domain: "o", Rule: "fw", Quota: 1, Expires: now.Add(MaxOverrideTTL)}, nil},
		{"unknown domain", Override{Domain: "x", Rule: "fw", Quota: 1, Expires: now.Add(time.Hour)}, ErrNoSuchRule},
		{"unknown rule", Override{Domain: "o", Rule: "x", Quota: 1, Expires: now.Add(time.Hour)}, ErrNoSuchRule},
		{"unlimited", Override{Domain: "o", Rule: "u", Quota: 1, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"negative", Override{Domain: "o", Rule: "fw", Quota: -1, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"too large", Override{Domain: "o", Rule: "fw", Quota: ratelimit.MaxQuota + 1, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"burst on a window", Override{Domain: "o", Rule: "fw", Quota: 1, Burst: 2, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"expired", Override{Domain: "o", Rule: "fw", Quota: 1, Expires: now}, ErrInvalidOverride},
		{"too long", Override{Domain: "o", Rule: "fw", Quota: 1, Expires: now.Add(MaxOverrideTTL + time.Second)}, ErrInvalidOverride},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := tt.o.Check(set, now)
			if tt.want == nil {
				if err != nil || r.Quota != tt.o.Quota || r.Burst != tt.o.Burst {
					t.Fatalf("Check = %+v, %v", r, err)
				}
				orig := specRule(t, set, tt.o.Rule)
				if r.Algorithm != orig.Algorithm || r.Period != orig.Period || r.Name != orig.Name {
					t.Errorf("override changed more than the quantities: %+v vs %+v", r, orig)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("Check error %v, want %v", err, tt.want)
			}
		})
	}
}

// recorder is a Store that admits everything and records the rules seen.
type recorder struct{ rules []*ratelimit.Rule }

func (r *recorder) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	for _, it := range items {
		r.rules = append(r.rules, it.Rule)
		dst = append(dst, ratelimit.Decision{Allowed: true, Capacity: it.Rule.Capacity()})
	}
	return dst, nil
}

func TestServiceAppliesOverrides(t *testing.T) {
	set := overrideSet(t, runtimeOverrideRules)
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	o := NewOverrides(set, clock)
	rec := &recorder{}
	svc, err := New(Options{Store: rec, Rules: set, Overrides: o})
	if err != nil {
		t.Fatal(err)
	}
	fw, g := specRule(t, set, "fw"), specRule(t, set, "g")
	req := Request{Domain: "o", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "fw", Value: "a"}}}, {Entries: []rules.Entry{{Key: "g", Value: "b"}}}}}
	var resp Response
	// decide returns the rules the store was asked to decide with, and
	// checks that the statuses report the same.
	decide := func() []*ratelimit.Rule {
		t.Helper()
		rec.rules = rec.rules[:0]
		if err := svc.Decide(t.Context(), &req, &resp); err != nil {
			t.Fatal(err)
		}
		for i, st := range resp.Statuses {
			if st.Rule != rec.rules[i] {
				t.Errorf("status %d reports rule %+v, decided with %+v", i, st.Rule, rec.rules[i])
			}
		}
		return rec.rules
	}
	if got := decide(); got[0] != fw || got[1] != g {
		t.Fatal("rules substituted with no override")
	}
	if err := o.Replace([]Override{{Domain: "o", Rule: "fw", Quota: 99, Expires: now.Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	got := decide()
	if got[0].Quota != 99 || got[0].Name != "fw" || got[1] != g {
		t.Errorf("with an override: %+v, %+v", got[0], got[1])
	}
	if list := o.List(); len(list) != 1 {
		t.Errorf("List = %+v", list)
	}

	// A reload: the new set's rule is overridden too, and during the switch
	// both the old and the new rules are.
	next := overrideSet(t, runtimeOverrideRules)
	nextFW := specRule(t, next, "fw")
	if err := o.setRules(next, true); err != nil { // SetRules's first step
		t.Fatal(err)
	}
	for _, r := range []*ratelimit.Rule{fw, nextFW} {
		if or, _, ok := o.Lookup(r); !ok || or.Quota != 99 {
			t.Errorf("during the switch, Lookup(%p) = %v, %v", r, or, ok)
		}
	}
	if err := svc.SetRules(next); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := o.Lookup(fw); ok {
		t.Error("the old set's rule is still overridden after the switch")
	}
	if or, _, ok := o.Lookup(nextFW); !ok || or.Quota != 99 {
		t.Errorf("after the switch, the new set's rule is not overridden: %v, %v", or, ok)
	}

	now = now.Add(time.Minute) // expired
	if _, _, ok := o.Lookup(nextFW); ok {
		t.Error("expired override still applies")
	}
	if got := decide(); got[0] != nextFW {
		t.Errorf("expired override used by Decide: %+v", got[0])
	}
	if len(o.List()) != 0 {
		t.Error("expired override listed")
	}
}

func TestOverridesNoAllocWhenEmpty(t *testing.T) {
	o := NewOverrides(overrideSet(t, runtimeOverrideRules), nil)
	r := specRule(t, o.set, "fw")
	if allocs := testing.AllocsPerRun(100, func() { o.Lookup(r) }); allocs != 0 {
		t.Errorf("Lookup with no overrides allocates %v times", allocs)
	}
}

// TestSetRulesReportsOverridesThatNoLongerApply: a reload that drops an
// overridden rule reports the override, keeps it, and applies it again
// once a reload brings the rule back.
func TestSetRulesReportsOverridesThatNoLongerApply(t *testing.T) {
	set := overrideSet(t, runtimeOverrideRules)
	now := time.Unix(1_800_000_000, 0)
	o := NewOverrides(set, func() time.Time { return now })
	svc, err := New(Options{Store: &recorder{}, Rules: set, Overrides: o})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Replace([]Override{
		{Domain: "o", Rule: "fw", Quota: 99, Expires: now.Add(time.Hour)},
		{Domain: "o", Rule: "gone", Quota: 1, Expires: now.Add(-time.Second)}, // expired: never reported
	}); err != nil {
		t.Fatalf("Replace = %v; an expired override is no error", err)
	}
	without := overrideSet(t, "domain: o\ndescriptors:\n  - key: g\n    rate_limit: {unit: second, requests_per_unit: 5, name: g}\n")
	err = svc.SetRules(without)
	if !errors.Is(err, ErrNoSuchRule) || !strings.Contains(err.Error(), "override of o/fw") || strings.Contains(err.Error(), "gone") {
		t.Fatalf("SetRules without the overridden rule = %v; want the override of o/fw reported, and nothing of the expired one", err)
	}
	if len(o.List()) != 1 {
		t.Errorf("the override was dropped: %+v", o.List())
	}
	back := overrideSet(t, runtimeOverrideRules)
	if err := svc.SetRules(back); err != nil {
		t.Fatalf("SetRules with the rule back = %v", err)
	}
	if r, _, ok := o.Lookup(specRule(t, back, "fw")); !ok || r.Quota != 99 {
		t.Errorf("the override does not apply again: %v, %v", r, ok)
	}
}
