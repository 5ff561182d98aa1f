package lease_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// One process of many sharing a service that allows 500 requests a
// second: it leases its part of the capacity through Redis and sends its
// queue at that rate.
func Example() {
	rc, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{"redis.internal:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer rc.Close()
	store, err := redisstore.NewLeaseStore(rc, "billing-api", redisstore.LeaseOptions{Timeout: 200 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	h, err := lease.NewHolder(store, lease.Options{
		Capacity:   500, // the service's limit, shared by every process
		Partitions: 20,  // leased 25 req/s at a time
		TTL:        3 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go h.Run(ctx) //nolint:errcheck // releases everything when ctx ends

	queue := []string{"https://billing.internal/charge/1", "https://billing.internal/charge/2"}
	h.SetBacklog(len(queue))
	lim := h.Limiter()
	for len(queue) > 0 {
		if err := lim.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		resp, err := http.Get(queue[0])
		if err != nil {
			continue
		}
		resp.Body.Close()
		// A 429's retry hint pauses the limiter; repeated 429s lower
		// its ceiling in proportion; RateLimit-Policy sets its window.
		h.Observe(resp.StatusCode, resp.Header)
		if resp.StatusCode == http.StatusTooManyRequests {
			continue
		}
		queue = queue[1:]
		h.SetBacklog(len(queue))
	}
}
