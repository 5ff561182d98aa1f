package httplimit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/httplimit"
)

// Pacing calls to an LLM API to the budgets it announces (requests, input
// and output tokens a minute, per model): each call reserves its prompt's
// tokens and its max_tokens before it is sent, and is settled with the
// usage its answer reports.
func ExampleBudgets() {
	client := &httplimit.Client{
		Budgets: &httplimit.Budgets{}, // one per provider account, shared
		Usage: func(resp *http.Response, body []byte) map[string]int64 {
			var a struct {
				Usage struct {
					InputTokens  int64 `json:"input_tokens"`
					OutputTokens int64 `json:"output_tokens"`
				} `json:"usage"`
			}
			if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
				return nil // the estimate stands
			}
			in, out := a.Usage.InputTokens, a.Usage.OutputTokens
			return map[string]int64{"input-tokens": in, "output-tokens": out, "tokens": in + out}
		},
	}
	model, prompt, maxTokens := "claude-sonnet-4-5", "Summarise …", int64(1024)
	promptTokens := int64(len(prompt)+3) / 4 // or the provider's token counter
	ctx := httplimit.WithEstimate(context.Background(), httplimit.Estimate{Key: model, Cost: map[string]int64{
		"input-tokens": promptTokens, "output-tokens": maxTokens, "tokens": promptTokens + maxTokens}})
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, model, maxTokens, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.anthropic.com/v1/messages", strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	_ = req // resp, err := client.Do(req): waits until every announced budget covers the call
	_ = client
}

// Pacing writes to Azure Cosmos DB, whose answers say only what a write
// cost (x-ms-request-charge): the container's throughput paces the
// request units, each write reserves an estimate, and the Client settles
// it with the charge.
func ExampleBudgets_SetCapacity() {
	budgets := &httplimit.Budgets{}
	budgets.SetCapacity("orders", httplimit.RequestUnits, 20000, time.Second, time.Now()) // 20,000 RU/s, counted per second
	client := &httplimit.Client{Budgets: budgets}
	ctx := httplimit.WithEstimate(context.Background(), httplimit.Estimate{Key: "orders",
		Cost: map[string]int64{httplimit.RequestUnits: 10}}) // a write's usual charge
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"https://account.documents.azure.com/dbs/shop/colls/orders/docs", strings.NewReader(`{"id":"1"}`))
	if err != nil {
		log.Fatal(err)
	}
	resp, err := client.Do(req) // settled with the answer's x-ms-request-charge
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
}
