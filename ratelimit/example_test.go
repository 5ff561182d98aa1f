package ratelimit_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

func ExampleLimiter() {
	// 10 events a second, in bursts of up to 3; the bucket starts full.
	lim := ratelimit.NewLimiter(10, 3)

	// The instants are explicit, so the example does not depend on the
	// clock; Allow and Reserve are the same calls at time.Now().
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 4 {
		fmt.Printf("event %d at 0ms: %v\n", i+1, lim.AllowN(start, 1))
	}
	// One token comes back every 100ms.
	fmt.Println("event 5 at 50ms:", lim.AllowN(start.Add(50*time.Millisecond), 1))
	fmt.Println("event 6 at 100ms:", lim.AllowN(start.Add(100*time.Millisecond), 1))

	// A reservation takes the tokens now and says how long to wait.
	r := lim.ReserveN(start.Add(100*time.Millisecond), 2)
	fmt.Println("2 reserved at 100ms, wait:", r.DelayFrom(start.Add(100*time.Millisecond)))
	// More than the burst can never be had.
	fmt.Println("4 at once ever possible:", lim.ReserveN(start, 4).OK())
	// Output:
	// event 1 at 0ms: true
	// event 2 at 0ms: true
	// event 3 at 0ms: true
	// event 4 at 0ms: false
	// event 5 at 50ms: false
	// event 6 at 100ms: true
	// 2 reserved at 100ms, wait: 200ms
	// 4 at once ever possible: false
}

func ExampleRule_Reserving() {
	// 10 a second, bursts of 2, on a key of any Store (here one State);
	// callers accept a wait of up to 300ms.
	rule := &ratelimit.Rule{Name: "api", Quota: 10, Period: time.Second, Burst: 2}
	reserving, _ := rule.Reserving(300 * time.Millisecond)
	var key ratelimit.State
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 6 {
		d := reserving.Decide(&key, now, 1)
		wait := rule.ReserveOutcome(&d) // d now in rule's own terms
		if d.Allowed {
			fmt.Printf("reservation %d: send after %v\n", i+1, wait)
		} else {
			fmt.Printf("reservation %d: refused, nothing taken; fits in %v\n", i+1, d.RetryAfter)
		}
	}
	// Output:
	// reservation 1: send after 0s
	// reservation 2: send after 0s
	// reservation 3: send after 100ms
	// reservation 4: send after 200ms
	// reservation 5: send after 300ms
	// reservation 6: refused, nothing taken; fits in 100ms
}
