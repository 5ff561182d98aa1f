package service_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/topk"
)

const topRules = `domain: t
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, name: per_user}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10, name: per_ip}
  - key: model
    rate_limit: {unit: hour, requests_per_unit: 1000, name: tokens, cost_unit: tokens}
`

func newTopService(t *testing.T, src string) (*service.Service, *service.Top, *prometheus.Registry) {
	t.Helper()
	dom, err := rules.Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{JanitorInterval: -1})
	t.Cleanup(func() { st.Close() })
	top, err := service.NewTop(topk.Options{K: 5}, []string{"remote_address"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc, err := service.New(service.Options{Store: st, Rules: set, Metrics: service.NewMetrics(reg), Top: top})
	if err != nil {
		t.Fatal(err)
	}
	return svc, top, reg
}

func decide(t *testing.T, svc *service.Service, key, value string, n int) {
	t.Helper()
	req := service.Request{Domain: "t", Descriptors: []service.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}, Cost: 1}}}
	var resp service.Response
	for range n {
		if err := svc.Decide(context.Background(), &req, &resp); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTopAndUtilisation: each rule's tracker sees its decisions, with
// short keys (hashed for a secret descriptor key), keeps them across a
// reload that keeps the rule, and the utilisation histogram counts used ÷
// limit per rule.
func TestTopAndUtilisation(t *testing.T) {
	svc, top, reg := newTopService(t, topRules)
	decide(t, svc, "user", "ann", 12) // 10 admitted (0.1 … 1.0 used), 2 denied (1.0)
	decide(t, svc, "remote_address", "192.0.2.1", 3)

	ls := top.TopLimits()
	if len(ls) != 3 || ls[0].Name != "per_ip" || ls[1].Name != "per_user" || ls[1].Rule.Quota != 10 || ls[1].CostUnit != "" || ls[2].CostUnit != "tokens" {
		t.Fatalf("limits %+v", ls)
	}
	sn := ls[1].Tracker.Snapshot(0)
	if sn.Decisions != 12 || sn.Denied != 2 || len(sn.Hot) != 1 || sn.Hot[0].Key != "user:ann" || sn.MostDenied[0].Denied != 2 {
		t.Errorf("per_user: %+v", sn)
	}
	if ip := ls[0].Tracker.Snapshot(0); len(ip.Hot) != 1 || ip.Hot[0].Key[0] != '#' {
		t.Errorf("per_ip keys not hashed: %+v", ip.Hot)
	}

	// A reload with the same rules keeps the trackers; one without
	// per_ip drops its.
	dom, _ := rules.Parse("t.yaml", []byte(strings.Replace(topRules, "  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 10, name: per_ip}\n", "", 1)))
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.SetRules(set); err != nil {
		t.Fatal(err)
	}
	if ls := top.TopLimits(); len(ls) != 2 || ls[0].Tracker.Snapshot(0).Decisions != 12 {
		t.Errorf("after the reload: %+v", ls)
	}

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "sluice_utilisation_ratio" {
			continue
		}
		for _, m := range f.GetMetric() {
			rule := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" {
					rule = l.GetValue()
				}
			}
			if rule != "per_user" {
				continue
			}
			h := m.GetHistogram()
			below := map[float64]uint64{}
			for _, b := range h.GetBucket() {
				below[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			// 0.1, 0.2, …, 1.0, then 1.0 twice: five at most 0.5, eight at
			// most 0.8 (floating point puts 0.8 itself in le=0.8).
			if h.GetSampleCount() != 12 || below[0.5] != 5 || below[0.8] != 8 || below[1] != 12 {
				t.Errorf("per_user utilisation: count %d, buckets %v", h.GetSampleCount(), below)
			}
			return
		}
	}
	t.Error("no sluice_utilisation_ratio for per_user")
}
