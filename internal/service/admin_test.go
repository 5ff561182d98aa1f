package service

import (
	"context"
	"errors"
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

func TestRuleOverrideCheck(t *testing.T) {
	set := overrideSet(t, runtimeOverrideRules)
	now := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name string
		o    RuleOverride
		want error // nil: valid
	}{
		{"fixed window limit", RuleOverride{Domain: "o", Rule: "fw", Limit: 100, Expires: now.Add(time.Hour)}, nil},
		{"gcra burst", RuleOverride{Domain: "o", Rule: "g", Limit: 1, Burst: 3, Expires: now.Add(time.Hour)}, nil},
		{"limit 0 blocks", RuleOverride{Domain: "o", Rule: "fw", Limit: 0, Expires: now.Add(time.Minute)}, nil},
		{"max ttl", RuleOverride{Domain: "o", Rule: "fw", Limit: 1, Expires: now.Add(MaxOverrideTTL)}, nil},
		{"unknown domain", RuleOverride{Domain: "x", Rule: "fw", Limit: 1, Expires: now.Add(time.Hour)}, ErrNoSuchRule},
		{"unknown rule", RuleOverride{Domain: "o", Rule: "x", Limit: 1, Expires: now.Add(time.Hour)}, ErrNoSuchRule},
		{"unlimited", RuleOverride{Domain: "o", Rule: "u", Limit: 1, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"negative", RuleOverride{Domain: "o", Rule: "fw", Limit: -1, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"too large", RuleOverride{Domain: "o", Rule: "fw", Limit: ratelimit.MaxQuota + 1, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"burst on a window", RuleOverride{Domain: "o", Rule: "fw", Limit: 1, Burst: 2, Expires: now.Add(time.Hour)}, ErrInvalidOverride},
		{"expired", RuleOverride{Domain: "o", Rule: "fw", Limit: 1, Expires: now}, ErrInvalidOverride},
		{"too long", RuleOverride{Domain: "o", Rule: "fw", Limit: 1, Expires: now.Add(MaxOverrideTTL + time.Second)}, ErrInvalidOverride},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := tt.o.Check(set, now)
			if tt.want == nil {
				if err != nil || r.Quota != tt.o.Limit || r.Burst != tt.o.Burst {
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
		if err := svc.ShouldRateLimit(t.Context(), &req, &resp); err != nil {
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
	if err := o.Replace([]RuleOverride{{Domain: "o", Rule: "fw", Limit: 99, Expires: now.Add(time.Minute)}}); err != nil {
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
	if err := o.SetRules(next, true); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*ratelimit.Rule{fw, nextFW} {
		if or, _, ok := o.Lookup(r); !ok || or.Quota != 99 {
			t.Errorf("during the switch, Lookup(%p) = %v, %v", r, or, ok)
		}
	}
	_ = o.SetRules(next, false)
	if _, _, ok := o.Lookup(fw); ok {
		t.Error("the old set's rule is still overridden after the switch")
	}

	now = now.Add(time.Minute) // expired
	if _, _, ok := o.Lookup(nextFW); ok {
		t.Error("expired override still applies")
	}
	svc.SetRules(next)
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
