package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// One call limits an LLM caller in requests, input tokens and output
// tokens per minute at once: an Item per dimension, each with its own key,
// rule and cost, decided all or nothing.
func ExampleStore_dimensions() {
	now := time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC)
	store := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	defer store.Close()
	perMinute := func(name string, quota int64) *ratelimit.Rule {
		return &ratelimit.Rule{Name: name, Algorithm: ratelimit.FixedWindow, Quota: quota, Period: time.Minute}
	}
	requests, input, output := perMinute("requests", 3), perMinute("input_tokens", 1000), perMinute("output_tokens", 500)

	// A call's input tokens are known before it is sent; its output
	// tokens only after, so they cost 0 here: a check, which denies only
	// a caller already over its output budget.
	call := func(inputTokens int64) {
		ds, err := store.Decide(context.Background(), nil, []ratelimit.Item{
			{Key: "acme/requests", Rule: requests, Cost: 1},
			{Key: "acme/input", Rule: input, Cost: inputTokens},
			{Key: "acme/output", Rule: output, Cost: 0},
		})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d input tokens: allowed %v; left: requests %d, input tokens %d, output tokens %d\n",
			inputTokens, ratelimit.Allowed(ds), ds[0].Remaining, ds[1].Remaining, ds[2].Remaining)
	}
	call(600)
	call(500) // over the input tokens: denied, and no request is taken either
	// The answer of the first call used 450 output tokens.
	if _, err := store.Decide(context.Background(), nil, []ratelimit.Item{{Key: "acme/output", Rule: output, Cost: 450}}); err != nil {
		panic(err)
	}
	call(400)
	// Output:
	// 600 input tokens: allowed true; left: requests 2, input tokens 400, output tokens 500
	// 500 input tokens: allowed false; left: requests 2, input tokens 400, output tokens 500
	// 400 input tokens: allowed true; left: requests 1, input tokens 0, output tokens 50
}
