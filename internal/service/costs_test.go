package service

import (
	"context"
	"maps"
	"testing"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/ratelimit"
)

// recordingStore admits everything and keeps the costs of the last call,
// by rule name.
type recordingStore struct{ costs map[string]int64 }

func (s *recordingStore) Decide(_ context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	for _, it := range items {
		s.costs[it.Rule.Name] = it.Cost
		dst = append(dst, ratelimit.Decision{Allowed: true, Capacity: it.Rule.Capacity(), Remaining: it.Rule.Capacity(), Rule: it.Rule.Name})
	}
	return dst, nil
}

// TestCostsReachTheirLimits: each limit takes the cost of its unit, 0
// when the descriptor's costs give none, the descriptor's Cost without a
// unit; without costs every limit takes Cost; an inline limit takes Cost.
func TestCostsReachTheirLimits(t *testing.T) {
	set := overrideSet(t, `domain: c
descriptors:
  - key: model
    limits:
      - {unit: minute, requests_per_unit: 10, name: requests}
      - {unit: minute, requests_per_unit: 1000, cost_unit: input_tokens, name: input}
      - {unit: minute, requests_per_unit: 1000, cost_unit: output_tokens, name: output}
`)
	st := &recordingStore{}
	svc, err := New(Options{Store: st, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	model := []rules.Entry{{Key: "model", Value: "m"}}
	for _, tt := range []struct {
		name string
		d    Descriptor
		want map[string]int64
	}{
		{"no costs", Descriptor{Entries: model, Cost: 5}, map[string]int64{"requests": 5, "input": 5, "output": 5}},
		{"costs", Descriptor{Entries: model, Cost: 1, Costs: []UnitCost{{"input_tokens", 700}, {"ru", 3}}}, map[string]int64{"requests": 1, "input": 700, "output": 0}},
		{"refund", Descriptor{Entries: model, Cost: 0, Costs: []UnitCost{{"output_tokens", -40}}}, map[string]int64{"requests": 0, "input": 0, "output": -40}},
		{"inline", Descriptor{Entries: model, Cost: 2, Costs: []UnitCost{{"input_tokens", 700}}, InlineLimit: &InlineLimit{RequestsPerUnit: 9, Unit: rules.Minute}},
			map[string]int64{"inline_9_per_1xminute": 2}},
	} {
		st.costs = map[string]int64{}
		var resp Response
		if err := svc.Decide(context.Background(), &Request{Domain: "c", Descriptors: []Descriptor{tt.d}}, &resp); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(st.costs, tt.want) {
			t.Errorf("%s: costs %v, want %v", tt.name, st.costs, tt.want)
		}
	}
}
