package service

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/topk"
)

func specSet(t *testing.T) (*rules.Set, *rules.Spec) {
	t.Helper()
	dom, err := rules.Parse("t.yaml", []byte("domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10, name: per_user}\n"))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := set.Domain("t")
	return set, d.Specs()[0]
}

// TestReloadRace: a decision made on the rule set a reload is replacing
// (SetRules prepares the new set before it is in use) still finds its
// rule's tracker and counters, the same ones the new set's rule has; two
// reloads later the old rule is forgotten.
func TestReloadRace(t *testing.T) {
	top, err := NewTop(topk.Options{K: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	set1, old := specSet(t)
	top.prepare(set1)
	m.prepare(set1)
	set2, cur := specSet(t)
	top.prepare(set2)
	m.prepare(set2)
	trOld, ok1 := top.byRule.load()[old]
	trCur, ok2 := top.byRule.load()[cur]
	if !ok1 || !ok2 || trOld != trCur {
		t.Errorf("tracker of the replaced set's rule %v (found %v), of the new %v (found %v): want the same", trOld, ok1, trCur, ok2)
	}
	rcOld, ok1 := m.byRule.load()[old]
	rcCur, ok2 := m.byRule.load()[cur]
	if !ok1 || !ok2 || rcOld.outcome[0] != rcCur.outcome[0] {
		t.Errorf("counters of the replaced set's rule found %v, of the new %v: want the same", ok1, ok2)
	}
	set3, _ := specSet(t)
	top.prepare(set3)
	m.prepare(set3)
	if _, ok := top.byRule.load()[old]; ok {
		t.Error("a rule two reloads old still has its tracker")
	}
	if _, ok := m.byRule.load()[old]; ok {
		t.Error("a rule two reloads old still has its counters")
	}
}
