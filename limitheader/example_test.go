package limitheader_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/limitheader"
)

// A response of an Anthropic-style API that has used up its output tokens:
// the budgets it announces, with resets relative to its Date.
func ExampleParseAnnouncement() {
	h := http.Header{}
	h.Set("Date", "Mon, 07 Dec 2026 09:30:00 GMT")
	h.Set("Anthropic-Ratelimit-Requests-Limit", "50")
	h.Set("Anthropic-Ratelimit-Requests-Remaining", "41")
	h.Set("Anthropic-Ratelimit-Requests-Reset", "2026-12-07T09:30:11Z")
	h.Set("Anthropic-Ratelimit-Output-Tokens-Limit", "8000")
	h.Set("Anthropic-Ratelimit-Output-Tokens-Remaining", "0")
	h.Set("Anthropic-Ratelimit-Output-Tokens-Reset", "2026-12-07T09:31:00Z")
	h.Set("Retry-After", "8")
	a, err := limitheader.ParseAnnouncement(h, time.Now())
	if err != nil {
		fmt.Println(err)
	}
	for _, b := range a.Budgets {
		fmt.Printf("%s %s: %d of %d left, whole in %v\n", b.Dialect, b.Name, b.Remaining, b.Limit, b.Reset)
	}
	fmt.Println("retry after", a.RetryAfter, "charge known:", a.Charge != limitheader.Unknown)
	// Output:
	// anthropic requests: 41 of 50 left, whole in 11s
	// anthropic output-tokens: 0 of 8000 left, whole in 1m0s
	// retry after 8s charge known: false
}
