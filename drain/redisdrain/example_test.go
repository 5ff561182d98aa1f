package redisdrain_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/redisdrain"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

// A drainer of the stream "records" at 2,000 a second into an HTTP
// endpoint, as one consumer of the group "writer", named after its host
// and process so that it is unique among the group's live consumers.
func Example() {
	ctx := context.Background()
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{"127.0.0.1:7000"}, Timeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	host, _ := os.Hostname()
	src, err := redisdrain.New(ctx, c, redisdrain.Options{
		Stream: "records", Group: "writer", Consumer: fmt.Sprintf("%s-%d", host, os.Getpid()),
		AckWait: 30 * time.Second, Window: 256,
	})
	if err != nil {
		log.Fatal(err)
	}
	sink := &drain.HTTPSink{URL: "http://db.internal/write"}
	d, err := drain.New(drain.Options{
		Inputs:  []drain.Input{{Source: src}},
		Sink:    sink.Send,
		Limiter: ratelimit.NewLimiter(2000, 20),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Run(ctx); err != nil { // until ctx ends; then every message is settled or handed back
		log.Fatal(err)
	}
	if err := src.Close(ctx); err != nil {
		log.Print(err)
	}
}

// A producer: the second Publish of the same key within two minutes adds
// nothing.
func ExamplePublish() {
	ctx := context.Background()
	c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{"127.0.0.1:7000"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	r := redisdrain.Record{Key: "order-1", Tenant: "acme", Partition: "eu", Data: []byte(`{"total":42}`)}
	for range 2 {
		added, err := redisdrain.Publish(ctx, c, "records", r)
		fmt.Println(added, err)
	}
}
