package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientOptions say how to reach Redis. Every store of this package is built
// on a redis.UniversalClient; NewClient makes one with the settings the
// stores expect (bounded calls, no retries), but any client works.
type ClientOptions struct {
	// Addrs are the Redis addresses: one for a standalone server, the
	// Sentinels with MasterName, or any Cluster nodes (two or more select
	// Cluster mode, as go-redis's UniversalClient does). Required.
	Addrs []string
	// MasterName selects Sentinel mode: the name of the monitored master.
	MasterName string
	// Username and Password authenticate (ACL user, or Password alone).
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels,
	// when they require it (their own requirepass or ACL user): Sentinels
	// do not share the data nodes' credentials.
	SentinelUsername, SentinelPassword string
	// TLS, when not nil, is used for every connection.
	TLS *tls.Config
	// PoolSize is the connection pool size per node; 0 is go-redis's default.
	PoolSize int
	// Timeout bounds dialling, each read and write, and the wait for a
	// pooled connection; default DefaultTimeout. A store's own Timeout
	// bounds each of its calls as a whole.
	Timeout time.Duration
}

// NewClient returns a client for o. It does not contact Redis: a client
// made while Redis is down connects when Redis answers. The caller closes
// it, after the stores built on it.
func NewClient(o ClientOptions) (redis.UniversalClient, error) {
	if len(o.Addrs) == 0 {
		return nil, errors.New("redisstore: no Redis address (ClientOptions.Addrs)")
	}
	for _, a := range o.Addrs {
		if strings.TrimSpace(a) == "" {
			return nil, fmt.Errorf("redisstore: empty Redis address in %q", o.Addrs)
		}
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	u := &redis.UniversalOptions{
		Addrs:      o.Addrs,
		MasterName: o.MasterName,
		Username:   o.Username,
		Password:   o.Password,
		// Only a failover client reads these.
		SentinelUsername: o.SentinelUsername,
		SentinelPassword: o.SentinelPassword,
		TLSConfig:        o.TLS,
		PoolSize:         o.PoolSize,
		// Latency is bounded by Timeout; retries would only spend it.
		MaxRetries:            -1,
		DialTimeout:           o.Timeout,
		ReadTimeout:           o.Timeout,
		WriteTimeout:          o.Timeout,
		PoolTimeout:           o.Timeout,
		ContextTimeoutEnabled: true,
		// RESP2: RESP3's push notifications cost a socket poll per call.
		Protocol: 2,
	}
	if o.MasterName == "" && len(o.Addrs) > 1 {
		// A Cluster: as NewUniversalClient would, but with
		// ClusterStateReloadInterval, which UniversalOptions lacks.
		c := u.Cluster()
		c.ClusterStateReloadInterval = clusterReloadInterval
		return redis.NewClusterClient(c), nil
	}
	return redis.NewUniversalClient(u), nil
}

// clusterReloadInterval is how often a Cluster client made by NewClient
// asks for the slots' owners again (one CLUSTER SLOTS, while it is used).
// A MOVED answer makes go-redis ask at once, but a master that hangs
// (frozen, or cut off) answers nothing: after the Cluster promotes its
// replica, the client learns of it only at this interval. go-redis's
// default, 60 s, kept serve deciding the hanging master's keys by its
// failure mode for 20 s and more after the promotion
// (internal/faultnet's TestFaultClusterFailover).
const clusterReloadInterval = time.Second

// LogTo sends go-redis's own log lines (a failed dial, a pool problem) to
// l at level Debug, instead of go-redis's default of plain text on
// standard error. go-redis has one logger for the whole process, so this
// is a process-wide setting, for a program's main to make once; the
// stores log what matters to an operator (an outage starting and ending)
// through their own Options.Logger.
func LogTo(l *slog.Logger) {
	redis.SetLogger(slogAdapter{l})
}

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Printf(ctx context.Context, format string, v ...any) {
	if a.l.Enabled(ctx, slog.LevelDebug) {
		a.l.DebugContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "go-redis")
	}
}
