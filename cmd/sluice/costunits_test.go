package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// costUnitsRules limit one model in requests, input tokens and output
// tokens per minute at once: three dimensions of one descriptor.
const costUnitsRules = `domain: llm
descriptors:
  - key: model
    limits:
      - {requests_per_unit: 45, unit: minute, algorithm: fixed_window, name: rpm}
      - {requests_per_unit: 2500, unit: minute, algorithm: fixed_window, cost_unit: input_tokens, name: itpm}
      - {requests_per_unit: 800, unit: minute, algorithm: fixed_window, cost_unit: output_tokens, name: otpm}
`

// TestCostUnits drives serve's /v1/check, on the memory store and on
// Redis, with requests that each cost one request and random input and
// output tokens (some refunds, some units left out), against a model of
// the three limits: a request is admitted only if every limit has room
// for its cost (a cost of 0 only if the limit is not in debt), and then
// takes every cost (a refund gives back at most the limit); denied, it
// takes none. Serve's clock stands still, so
// the windows never roll. Half-way, an override lowers the output tokens'
// limit below what was taken: that limit is in debt, and denies even the
// requests that give it no cost, until refunds pay the debt back.
func TestCostUnits(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			mc, addr := modelConfig{name: store}, ""
			if store == "redis" {
				mc.redis, addr = true, redistest.Standalone(t).Addr()
			}
			ms := startModelServe(t, mc, addr)
			if err := ms.load(costUnitsRules); err != nil {
				t.Fatal(err)
			}
			runCostUnits(t, ms)
		})
	}
}

func runCostUnits(t *testing.T, ms *modelServer) {
	names := []string{"rpm", "itpm", "otpm"}
	units := []string{"", "input_tokens", "output_tokens"}
	limit := []int64{45, 2500, 800}
	var used [3]int64
	rng := rand.New(rand.NewPCG(30, 2))
	admitted, denied, inDebt := 0, 0, 0
	for step := range 80 {
		if step == 30 {
			// Lower the output tokens' limit below what was taken: debt.
			limit[2] = used[2] / 2
			code, body, err := ms.admin("PUT", "/admin/v1/overrides/llm/otpm", fmt.Sprintf(`{"limit":%d,"ttl":"10m","reason":"cost units test"}`, limit[2]))
			if err != nil || code != http.StatusOK {
				t.Fatalf("override: %d %s %v", code, body, err)
			}
		}
		// The costs of this step: a request, input tokens (a refund now
		// and then), output tokens (left out now and then: 0).
		cost := [3]int64{1, rng.Int64N(200), rng.Int64N(80)}
		costs := fmt.Sprintf(`{"input_tokens":%d`, cost[1])
		switch rng.IntN(4) {
		case 0: // output tokens left out: a check of that limit
			cost[2] = 0
		case 1: // a refund, as a settlement of an overestimate would give
			cost[2] = -rng.Int64N(120)
			fallthrough
		default:
			costs += fmt.Sprintf(`,"output_tokens":%d`, cost[2])
		}
		costs += "}"
		if rng.IntN(8) == 0 {
			cost[1] = -cost[1]
			costs = strings.Replace(costs, `"input_tokens":`, `"input_tokens":-`, 1)
		}

		// The model: every limit with room for its cost, or none taken.
		ok, first := true, -1
		for i := range used {
			if cost[i] >= 0 && used[i]+cost[i] > limit[i] {
				ok = false
				if first < 0 {
					first = i
				}
			}
		}
		var remaining [3]int64
		for i := range used {
			if ok { // a refund gives back at most the capacity
				used[i] = max(0, used[i]+max(cost[i], -limit[i]))
			}
			remaining[i] = max(0, limit[i]-used[i])
		}
		if ok { // the answer reports the limit with least remaining
			first = 0
			for i := range remaining {
				if remaining[i] < remaining[first] {
					first = i
				}
			}
			admitted++
		} else {
			denied++
			if cost[2] == 0 && used[2] > limit[2] {
				inDebt++ // denied by a limit it gives no cost
			}
		}

		body := `{"domain":"llm","descriptors":[{"entries":[{"key":"model","value":"m"}],"costs":` + costs + `}]}`
		resp, err := ms.http.Post("http://"+ms.up["http"]+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Allowed     bool `json:"allowed"`
			Descriptors []struct {
				Rule      string `json:"rule"`
				CostUnit  string `json:"cost_unit"`
				Remaining int64  `json:"remaining"`
			} `json:"descriptors"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || len(out.Descriptors) != 1 {
			t.Fatalf("step %d: %v, %+v", step, err, out)
		}
		got := out.Descriptors[0]
		if out.Allowed != ok || (resp.StatusCode == 200) != ok || got.Rule != names[first] || got.CostUnit != units[first] || (ok && got.Remaining != remaining[first]) {
			t.Fatalf("step %d, costs %s (used %v of %v): %d %+v; the model says allowed %v, rule %s, remaining %d",
				step, costs, used, limit, resp.StatusCode, out, ok, names[first], remaining[first])
		}
	}
	if admitted < 10 || denied < 10 || inDebt == 0 {
		t.Errorf("%d admitted, %d denied, %d by a limit in debt at cost 0: the sequence should exercise each", admitted, denied, inDebt)
	}
	t.Logf("%d admitted, %d denied, %d by a limit in debt at cost 0", admitted, denied, inDebt)
}
