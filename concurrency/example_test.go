package concurrency_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/concurrency"
)

func ExampleSemaphore() {
	ctx := context.Background()
	sem := concurrency.NewSemaphore(10) // at most 10 units of work at once

	if err := sem.Acquire(ctx, 4); err != nil { // a heavy job: 4 units
		fmt.Println(err)
		return
	}
	fmt.Println("held:", sem.Held())
	fmt.Println("7 more fit:", sem.TryAcquire(7))
	sem.Release(4)
	fmt.Println("held:", sem.Held())
	// Output:
	// held: 4
	// 7 more fit: false
	// held: 0
}

func ExampleDistributed() {
	// With redisstore.SemaphoreStore instead, the limit holds across
	// processes.
	store := concurrency.NewMemoryStore()
	sem, err := concurrency.NewDistributed(store, "billing-api", 50, concurrency.DistributedOptions{TTL: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	permit, err := sem.Acquire(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer permit.Release(context.Background())

	// Stop the work if the permit is lost (the store forgot it, or this
	// process could not renew it in time).
	work, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-permit.Lost():
			stop()
		case <-work.Done():
		}
	}()
	fmt.Println("calling the billing API; permit held:", permit.Err() == nil)
	// Output:
	// calling the billing API; permit held: true
}
