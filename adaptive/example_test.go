package adaptive_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/priority"
)

func ExampleGuard() {
	// At most 10 requests in flight; the limit starts at 10 (no warm-up)
	// and the Controller moves it by the latency it measures. With the
	// default shares, Sheddable work may fill only 80% of it.
	g, err := adaptive.NewGuard(adaptive.GuardOptions{
		Concurrency: adaptive.ConcurrencyOptions{Max: 10, Initial: 10},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// The *At forms take the instant, so the example does not depend on
	// the clock; an edge calls g.Acquire(ctx) with the priority in ctx.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var held []adaptive.Permit
	for range 8 {
		p, r := g.TryAcquireAt(now, priority.Sheddable)
		if r.Refused() {
			fmt.Println("refused early:", r)
			return
		}
		held = append(held, p)
	}
	_, r := g.TryAcquireAt(now, priority.Sheddable)
	fmt.Printf("9th sheddable: %v (overload: %v)\n", r.Reason, errors.Is(r, adaptive.ErrOverloaded))
	critical, r := g.TryAcquireAt(now, priority.Critical)
	fmt.Println("critical:", r.Reason)
	fmt.Println("in flight:", g.Stats().InFlight)

	// Each request ends with Done (its latency is a sample), Dropped or
	// Ignore; the slot is given back.
	later := now.Add(20 * time.Millisecond)
	critical.DoneAt(later)
	for i := range held {
		held[i].DoneAt(later)
	}
	fmt.Println("in flight:", g.Stats().InFlight)
	// Output:
	// 9th sheddable: concurrency limit reached (overload: true)
	// critical: admitted
	// in flight: 9
	// in flight: 0
}
