package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

// A tenant and one of its users, decided together on a Redis Cluster: the
// keys share the tag {acme}, so they live in one slot and the request is
// all or nothing. When Redis is down, the tenant limit fails open and the
// user limit is kept in process at this replica's share (3 replicas).
func Example() {
	c, err := redisstore.NewClient(redisstore.ClientOptions{
		Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	s, err := redisstore.New(c, redisstore.Options{Replicas: 3})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	tenant := &ratelimit.Rule{Name: "tenant", Quota: 1000, Period: time.Second, Failure: ratelimit.FailOpen}
	user := &ratelimit.Rule{Name: "user", Quota: 10, Period: time.Second, Failure: ratelimit.FailLocal}
	ds, err := s.Decide(context.Background(), nil, []ratelimit.Item{
		{Key: "{acme}tenant", Rule: tenant, Cost: 1},
		{Key: "{acme}user:42", Rule: user, Cost: 1},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ratelimit.Allowed(ds), ds[1].Remaining, ds[1].Reason)
}
