package httpapi

import (
	"net/http"
	"strings"
	"testing"
)

// TestCheckCosts: one descriptor limited in requests, input tokens and
// output tokens at once, each limit charged the cost of its unit, all or
// nothing; the answer names the unit of the limit it reports.
func TestCheckCosts(t *testing.T) {
	f := newFixture(t, Options{})
	check := func(body string) (reply, checkResponse) {
		t.Helper()
		r := do(t, "POST", f.srv.URL+"/v1/check", body)
		var cr checkResponse
		decodeStrict(t, r.body, &cr)
		return r, cr
	}
	model := func(costs string) string {
		return `{"domain":"t","descriptors":[{"entries":[{"key":"model","value":"m"}]` + costs + `}]}`
	}
	steps := []struct {
		name, body string
		status     int
		rule, unit string
		remaining  int64
	}{
		// requests 2/3 left, input 40/100, output 50/50: the least remaining is requests'.
		{"tokens and a request", model(`,"costs":{"input_tokens":60}`), 200, "model_requests", "", 2},
		// 60 + 50 > 100: denied by its input tokens, and nothing taken.
		{"over the input tokens", model(`,"costs":{"input_tokens":50,"output_tokens":1}`), 429, "model_input", "input_tokens", 40},
		// The output limit takes its own cost: 45 of 50.
		{"output tokens", model(`,"costs":{"input_tokens":40,"output_tokens":45}`), 200, "model_input", "input_tokens", 0},
		{"over the output tokens", model(`,"costs":{"output_tokens":6}`), 429, "model_output", "output_tokens", 5},
		// A unit no limit counts is ignored; a unit left out costs 0.
		{"unknown unit", model(`,"cost":0,"costs":{"ru":7}`), 200, "model_input", "input_tokens", 0},
		// Without costs every limit takes the cost, whatever its unit
		// (as Envoy's hits_addend): 1 input token is over.
		{"no costs", model(``), 429, "model_input", "input_tokens", 0},
		{"no costs, cost 0", model(`,"cost":0`), 200, "model_input", "input_tokens", 0},
		// The request's costs apply to every descriptor without its own;
		// it takes the third request, which the denials left.
		{"request costs", `{"domain":"t","costs":{"output_tokens":5},"descriptors":[{"entries":[{"key":"model","value":"m"}]}]}`, 200, "model_requests", "", 0},
		{"no request left", model(`,"costs":{"output_tokens":0}`), 429, "model_requests", "", 0},
	}
	for _, st := range steps {
		r, cr := check(st.body)
		if r.status != st.status || len(cr.Descriptors) != 1 {
			t.Fatalf("%s: status %d, want %d: %s", st.name, r.status, st.status, r.body)
		}
		d := cr.Descriptors[0]
		if d.Rule != st.rule || d.CostUnit != st.unit || d.Remaining != st.remaining {
			t.Errorf("%s: rule %q unit %q remaining %d, want %q %q %d", st.name, d.Rule, d.CostUnit, d.Remaining, st.rule, st.unit, st.remaining)
		}
		policy := r.header.Get("RateLimit-Policy")
		if st.unit != "" && !strings.Contains(policy, `;qu="`+st.unit+`"`) || st.unit == "" && strings.Contains(policy, ";qu=") {
			t.Errorf("%s: RateLimit-Policy %q, want the quota unit %q", st.name, policy, st.unit)
		}
	}
}

// TestCheckCostsBad: costs that are not an object of valid units to
// integer costs within the bounds are refused, naming what is wrong.
func TestCheckCostsBad(t *testing.T) {
	f := newFixture(t, Options{})
	desc := func(costs string) string {
		return `{"domain":"t","descriptors":[{"entries":[{"key":"model","value":"m"}],"costs":` + costs + `}]}`
	}
	for _, tt := range []struct{ name, body, want string }{
		{"not an object", desc(`[1]`), `field "costs": want an object`},
		{"empty", desc(`{}`), `field "costs": empty object`},
		{"fraction", desc(`{"input_tokens":1.5}`), `unit "input_tokens": want an integer cost`},
		{"string", desc(`{"input_tokens":"1"}`), `unit "input_tokens": want an integer cost`},
		{"null cost", desc(`{"input_tokens":null}`), `unit "input_tokens": want an integer cost`},
		{"overflow", desc(`{"input_tokens":99999999999999999999}`), `unit "input_tokens": want an integer cost`},
		{"beyond MaxQuota", desc(`{"input_tokens":1099511627777}`), "descriptor 0: cost 1099511627777 of unit input_tokens is beyond"},
		{"bad unit", desc(`{"Input":1}`), `descriptor 0: costs: invalid cost unit "Input"`},
		{"empty unit", desc(`{"":1}`), "descriptor 0: costs: empty cost unit"},
		{"long unit", desc(`{"` + strings.Repeat("u", 33) + `":1}`), "MaxCostUnitBytes"},
		{"too many units", desc(`{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"i":1}`), "costs for 9 units; at most 8 (MaxCostUnits)"},
		{"a unit twice", desc(`{"a":1,"a":2}`), `field "descriptors[0].costs.a": given twice`},
		{"request costs", `{"domain":"t","costs":{"A":1},"descriptors":[{"entries":[{"key":"model","value":"m"}]}]}`, `invalid cost unit "A"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assertProblem(t, do(t, "POST", f.srv.URL+"/v1/check", tt.body), http.StatusBadRequest, tt.want)
		})
	}
}
