package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Deadlines. A call that the client gives up on (its timeout passed) is
// answered by the failure mode, but its command may still be in a socket
// buffer, or in a server that was stopped (SIGSTOP, a long fork, a VM
// pause), and run when the server resumes: a denied decision would then
// consume capacity after all. So every script that consumes carries a
// cutoff, an instant of the server's own clock (Unix ns) no later than the
// moment the client gives up; the script reads TIME and, past the cutoff,
// does nothing and answers replyExpired.
//
// The cutoff is the client's give-up instant mapped to the server's clock
// by serverClock: a lower bound of the server's clock, never an estimate
// that could be late.

// Settings of serverClock.
const (
	// clockRefresh is how old a node's sample may get before a caller
	// takes a new one (one TIME round trip, by that caller, before its
	// own call).
	clockRefresh = time.Second
	// clockDriftDiv bounds how fast the two clocks may drift apart: one
	// part in clockDriftDiv (1000 ppm, beyond any working oscillator) of
	// the time since the sample.
	clockDriftDiv = 1000
	// clockMargin is taken off every cutoff, for rounding.
	clockMargin = 100 * time.Microsecond
)

// clockSample is one TIME round trip: sent at client instant sent, answered
// at recv (both with Go's monotonic reading), the server's clock read as
// server (Unix ns, truncated to the microsecond TIME reports).
type clockSample struct {
	sent, recv time.Time
	server     int64
}

// lower is a lower bound of the server's clock at client instant x. TIME
// was read at some instant r in [sent, recv], so the server's clock at x is
// server + (x - r) ≥ server + (x - recv), less what drift may take.
func (c *clockSample) lower(x time.Time) int64 {
	d := x.Sub(c.recv)
	return c.server + int64(d) - int64(absDur(d)/clockDriftDiv) - int64(clockMargin)
}

// upper is an upper bound of the server's clock at client instant x.
func (c *clockSample) upper(x time.Time) int64 {
	d := x.Sub(c.sent)
	return c.server + int64(time.Microsecond) + int64(d) + int64(absDur(d)/clockDriftDiv)
}

// replaces reports whether c, the newer sample, is to be kept rather than
// old: when it bounds the server's clock more tightly, or when old's lower
// bound is past c's upper one (the server's clock stepped back, or the
// node is another one).
func (c *clockSample) replaces(old *clockSample) bool {
	lo := old.lower(c.recv)
	return lo <= c.lower(c.recv) || lo > c.upper(c.recv)
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// nodeClock is what serverClock knows of one node's clock.
type nodeClock struct {
	// measure reads the node's TIME; key names the node, for a client of
	// an unknown type.
	measure func(ctx context.Context, key string) (time.Time, error)
	best    atomic.Pointer[clockSample]
	// refreshing is held by the caller that takes a new sample; stale asks
	// the next caller to take one whatever the age of best.
	refreshing, stale atomic.Bool
}

// sample takes one TIME round trip and keeps it if it bounds the server's
// clock more tightly than the sample kept, or if it contradicts it (the
// server's clock stepped back, or the node is another one now).
func (n *nodeClock) sample(ctx context.Context, key string) (*clockSample, error) {
	sent := time.Now()
	t, err := n.measure(ctx, key)
	if err != nil {
		return nil, err
	}
	s := &clockSample{sent: sent, recv: time.Now(), server: t.UnixNano()}
	for {
		old := n.best.Load()
		if old != nil && !s.replaces(old) {
			return old, nil
		}
		if n.best.CompareAndSwap(old, s) {
			return s, nil
		}
	}
}

// serverClock maps client instants to the clocks of the Redis nodes a
// client reaches, one estimate per node: the server behind a *redis.Client
// (standalone, or Sentinel's current master), each master of a
// *redis.ClusterClient, or, for a client of another type, one estimate
// taken through the node of the key of the call that takes the sample. It
// is safe for concurrent use.
type serverClock struct {
	single  *nodeClock
	cluster *redis.ClusterClient
	nodes   sync.Map // address → *nodeClock, on a Cluster
	// readTimeout is the client's own bound on a reply (0: none): the
	// client gives up then if the caller's deadline is later.
	readTimeout time.Duration
}

// newServerClock returns the clock of c's nodes; timeScript reads TIME
// through a client of an unknown type.
func newServerClock(c redis.UniversalClient, timeScript *redis.Script) *serverClock {
	sc := &serverClock{}
	switch c := c.(type) {
	case *redis.Client:
		sc.readTimeout = c.Options().ReadTimeout
		sc.single = &nodeClock{measure: func(ctx context.Context, _ string) (time.Time, error) { return c.Time(ctx).Result() }}
	case *redis.ClusterClient:
		sc.readTimeout = c.Options().ReadTimeout
		sc.cluster = c
	default:
		sc.single = &nodeClock{measure: func(ctx context.Context, key string) (time.Time, error) {
			v, err := timeScript.Run(ctx, c, []string{key}).Slice()
			if err != nil {
				return time.Time{}, err
			}
			return parseTime(v)
		}}
	}
	sc.readTimeout = max(sc.readTimeout, 0) // -1 and -2: none
	return sc
}

// node returns the estimate of the node that holds key.
func (sc *serverClock) node(ctx context.Context, key string) (*nodeClock, error) {
	if sc.cluster == nil {
		return sc.single, nil
	}
	m, err := sc.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := m.Options().Addr
	if n, ok := sc.nodes.Load(addr); ok {
		return n.(*nodeClock), nil
	}
	n, _ := sc.nodes.LoadOrStore(addr, &nodeClock{measure: func(ctx context.Context, _ string) (time.Time, error) { return m.Time(ctx).Result() }})
	return n.(*nodeClock), nil
}

// cutoff returns the cutoff, in the clock of the node that holds key, of a
// call made at client instant now that the caller abandons at deadline:
// a lower bound of the server's clock at the earlier of deadline and now +
// the client's read timeout. It takes a sample first when the node has
// none yet, or when the one it has is older than clockRefresh or stale
// (one caller at a time does; the others use the sample there is).
func (sc *serverClock) cutoff(ctx context.Context, key string, now, deadline time.Time) (int64, error) {
	if sc.readTimeout > 0 {
		if t := now.Add(sc.readTimeout); t.Before(deadline) {
			deadline = t
		}
	}
	n, err := sc.node(ctx, key)
	if err != nil {
		return 0, err
	}
	best := n.best.Load()
	if best == nil || ((now.Sub(best.recv) > clockRefresh || n.stale.Load()) && n.refreshing.CompareAndSwap(false, true)) {
		sctx, cancel := context.WithDeadline(ctx, deadline)
		s, err := n.sample(sctx, key)
		cancel()
		if best != nil {
			n.refreshing.Store(false)
		}
		if err != nil {
			return 0, err
		}
		n.stale.Store(false)
		best = s
	}
	return best.lower(deadline), nil
}

// expired records that the node of key answered replyExpired before the
// caller's deadline: its clock is not where the estimate has it, so the
// next call takes a new sample.
func (sc *serverClock) expired(ctx context.Context, key string) {
	if n, err := sc.node(ctx, key); err == nil {
		n.stale.Store(true)
	}
}
