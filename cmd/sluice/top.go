package main

import (
	"context"
	"flag"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/topk"
)

// topConfig is what serve's flags say of the top-K trackers.
type topConfig struct {
	k          int
	secretKeys []string
	secretFlag string
}

func addTopFlags(fs *flag.FlagSet, c *topConfig) {
	fs.IntVar(&c.k, "top-k", topk.DefaultK, "keys each rule's hottest, most denied and near-limit tables keep (admin API, dashboard); 0 turns the tracking off")
	fs.StringVar(&c.secretFlag, "top-secret-keys", "", "descriptor `keys`, comma-separated (such as remote_address,api_key), whose rules' keys the top tables show hashed")
}

func (c *topConfig) validate() error {
	if c.k < 0 || c.k > 1000 {
		return usagef("serve: --top-k %d: want 0 (off) to 1000", c.k)
	}
	for k := range strings.SplitSeq(c.secretFlag, ",") {
		if k = strings.TrimSpace(k); k != "" {
			c.secretKeys = append(c.secretKeys, k)
		}
	}
	return nil
}

// newTop returns the trackers, or nil when they are off.
func (c *topConfig) newTop() (*service.Top, error) {
	if c.k == 0 {
		return nil, nil
	}
	return service.NewTop(topk.Options{K: c.k}, c.secretKeys)
}

// memoryHealth reports the memory store's health: always up.
func memoryHealth(m *memstore.Store) func(context.Context) *dashboard.StoreStatus {
	return func(context.Context) *dashboard.StoreStatus {
		return &dashboard.StoreStatus{Kind: "memory", Healthy: true, Keys: m.Stats().Keys}
	}
}

// redisHealth reports Redis's health: a PING's round trip (bounded by the
// store's timeout), the breaker, and the failure modes' decisions.
func redisHealth(c redis.UniversalClient, rs *redisstore.Store, cfg *serveConfig) func(context.Context) *dashboard.StoreStatus {
	mode := "standalone"
	switch {
	case cfg.redisMaster != "":
		mode = "sentinel"
	case len(cfg.redisAddrs) > 1:
		mode = "cluster"
	}
	return func(ctx context.Context) *dashboard.StoreStatus {
		st := rs.Stats()
		s := &dashboard.StoreStatus{Kind: "redis", Mode: mode, Healthy: true, Breaker: "closed",
			Errors: st.Errors, FailOpen: st.FailOpen, FailClosed: st.FailClosed, Local: st.Local}
		if st.Open {
			s.Breaker = "open"
		}
		ctx, cancel := context.WithTimeout(ctx, cfg.redisTimeout)
		defer cancel()
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			s.Healthy, s.Error = false, err.Error()
		} else {
			s.LatencyMS = float64(time.Since(start).Microseconds()) / 1000
		}
		return s
	}
}
