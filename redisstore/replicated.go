package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultReplicaTimeout is the default Replicated.Timeout.
const DefaultReplicaTimeout = 100 * time.Millisecond

// Replicated asks a SemaphoreStore or LeaseStore to count a grant only
// once Replicas replicas of the primary have acknowledged it: the script
// that grants (an acquire, a renewal that extends, a lease grant) is sent
// with WAIT Replicas Timeout behind it, on the same connection, in one
// round trip (on a Cluster, to the node that serves the key). A grant that
// fewer replicas acknowledge within Timeout is released (best effort) and
// answered as a transient error, so that a blocked acquire waits and asks
// again (see concurrency.Transient); a renewal so answered extends nothing
// for its holder, whose permit or lease ends with its validity unless a
// later renewal is acknowledged.
//
// What it buys: a grant acknowledged by Replicas replicas survives a
// failover that promotes one of them, so that its fence is not handed out
// again. What it does not: WAIT is not consensus. A failover may promote a
// replica that had not acknowledged (Sentinel prefers the most up-to-date
// one, but does not insist), a replica that acknowledged may lose the
// write if it restarts without persistence, and a grant released after a
// short WAIT may still have reached a replica. Its cost is a replica's
// acknowledgement on every grant (and, since WAIT counts every earlier
// write on the connection, on every other acquire attempt too), and its
// failure mode is availability: with fewer than Replicas replicas in reach,
// nothing is granted.
//
// The zero value (Replicas 0) waits for nothing, as before.
type Replicated struct {
	// Replicas is how many replicas must acknowledge a grant; 0: none.
	Replicas int
	// Timeout bounds each WAIT; default DefaultReplicaTimeout. (WAIT
	// with 0 would block for ever, so 0 means the default.) Keep it below
	// the client's read timeout and the calls' deadlines: the WAIT rides
	// in the grant's call, and a call that times out leaves the grant
	// unknown to its caller (it expires with its TTL).
	Timeout time.Duration
}

// errUnreplicated answers a grant that too few replicas acknowledged.
var errUnreplicated = errors.New("grant not acknowledged by enough replicas within the timeout; released")

// check validates r and fills in its default timeout.
func (r Replicated) check() (Replicated, error) {
	if r.Replicas < 0 || r.Timeout < 0 {
		return r, fmt.Errorf("redisstore: replicas %d, timeout %v: negative", r.Replicas, r.Timeout)
	}
	if r.Timeout == 0 {
		r.Timeout = DefaultReplicaTimeout
	}
	r.Timeout = max(r.Timeout, time.Millisecond) // WAIT counts in milliseconds; 0 is for ever
	return r, nil
}

// run runs s on c (on a Cluster, on the node serving keys[0], the slot of
// them all) and, when r asks for replicas, WAIT behind it on the same
// connection. It returns the script's reply and whether enough replicas
// acknowledged (always true without replicas asked for).
func (r Replicated) run(ctx context.Context, c redis.UniversalClient, s *redis.Script, keys []string, args ...any) (*redis.Cmd, bool) {
	if r.Replicas == 0 {
		return s.Run(ctx, c, keys, args...), true
	}
	var node redis.Cmdable = c
	if cc, ok := c.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd, false
		}
		node = n
	}
	send := func(eval func(redis.Pipeliner) *redis.Cmd) (*redis.Cmd, *redis.Cmd) {
		p := node.Pipeline()
		cmd := eval(p)
		w := p.Do(ctx, "WAIT", r.Replicas, r.Timeout.Milliseconds())
		_, _ = p.Exec(ctx) // each command carries its own error
		return cmd, w
	}
	cmd, w := send(func(p redis.Pipeliner) *redis.Cmd { return s.EvalSha(ctx, p, keys, args...) })
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd, w = send(func(p redis.Pipeliner) *redis.Cmd { return s.Eval(ctx, p, keys, args...) })
	}
	n, err := w.Int64()
	return cmd, err == nil && n >= int64(r.Replicas)
}
