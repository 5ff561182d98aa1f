package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/lease"
)

//go:embed lease.lua
var leaseLua string

// DefaultLeasePrefix starts the keys of lease stores.
const DefaultLeasePrefix = "sluice:lease:"

// A LeaseStore is a lease.Store on Redis, shared by processes on many
// machines.
// Each operation is one Lua script call (EVALSHA), atomic in the server and
// timed by the server's clock (TIME), so the members' clocks never meet.
//
// A service's state lives in three keys sharing the hash tag {service}, so
// that Redis Cluster keeps them in one slot: a ZSET of member ids scored
// by the expiry of their presence, a hash of their weights and wants, and
// a hash of the partitions, each "epoch expiry owner". Expired presences
// are removed by the next heartbeat; an expired partition stays in the
// hash, with its epoch, until it is leased again, so epochs only grow.
//
// It is a lease.Notifier: the scripts PUBLISH a member's id on the
// service's channel (Prefix + "{service}:events") when it joins, raises
// its need, releases partitions or leaves, and Watch SUBSCRIBEs to it.
// Pub/sub delivers at most once, to the subscribers connected then: a
// message lost to a reconnection is made good by the holders' periodic
// looks. On a Cluster, PUBLISH reaches the subscribers of every node.
//
// An acquire with a deadline (the context's, the store's Timeout or the
// client's read timeout) carries a cutoff in the server's clock, as Store's
// decisions do (see Deadlines in the package documentation): one that Redis
// runs only after its caller gave up grants nothing, so that no partition
// is leased to a member that does not know it holds it. Its first call on
// a node, and one a second, takes a TIME round trip more. The other
// operations carry none: a late renewal extends only a lease its member
// held, a late release or leave gives up, a late heartbeat records a
// presence that the next one renews or that expires.
//
// A LeaseStore is safe for concurrent use. The zero value is not usable:
// call NewLeaseStore.
type LeaseStore struct {
	c       redis.UniversalClient
	keys    []string
	script  *redis.Script
	timeout time.Duration
	sclock  *serverClock
	repl    Replicated
}

var (
	_ lease.Store    = (*LeaseStore)(nil)
	_ lease.Notifier = (*LeaseStore)(nil)
)

// LeaseOptions configure NewLeaseStore.
type LeaseOptions struct {
	// Prefix starts every key; it must not contain '{' or '}'.
	// DefaultLeasePrefix when empty.
	Prefix string
	// Timeout bounds each call when the context has no earlier deadline;
	// 0 means no bound of its own.
	Timeout time.Duration
	// Replicated, when it asks for replicas, counts a lease granted or
	// renewed only once that many replicas acknowledged it (see
	// Replicated). The zero value waits for none.
	Replicated Replicated
}

// NewLeaseStore returns the lease store of service on client, which the
// caller owns and closes. service must not be empty nor contain '{' or '}'.
func NewLeaseStore(client redis.UniversalClient, service string, opts LeaseOptions) (*LeaseStore, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", lease.ErrBadArgument)
	}
	if service == "" || strings.ContainsAny(service, "{}") {
		return nil, fmt.Errorf("%w: service name %q (empty, or has a brace)", lease.ErrBadArgument, service)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultLeasePrefix
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		// A brace would change the hash tag Redis Cluster reads: "x{}"
		// leaves none, scattering a service's keys over three slots.
		return nil, fmt.Errorf("%w: key prefix %q has a brace", lease.ErrBadArgument, opts.Prefix)
	}
	repl, err := opts.Replicated.check()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", lease.ErrBadArgument, err)
	}
	base := opts.Prefix + "{" + service + "}:"
	return &LeaseStore{
		c:       client,
		keys:    []string{base + "members", base + "info", base + "parts", base + "events"},
		script:  redis.NewScript(leaseLua),
		sclock:  newServerClock(client, redis.NewScript(timeLua)),
		timeout: opts.Timeout,
		repl:    repl,
	}, nil
}

// bound returns ctx bounded by the store's timeout, if it has one.
func (r *LeaseStore) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.timeout > 0 {
		return context.WithTimeout(ctx, r.timeout)
	}
	return ctx, func() {}
}

// run runs lease.lua's operation op.
func (r *LeaseStore) run(ctx context.Context, op, id string, ttl time.Duration, args ...any) (any, error) {
	v, _, err := r.runReplicated(ctx, Replicated{}, op, id, ttl, args...)
	return v, err
}

// runReplicated is run with WAIT behind the script as repl asks (see
// Replicated.run); acked reports whether enough replicas acknowledged.
func (r *LeaseStore) runReplicated(ctx context.Context, repl Replicated, op, id string, ttl time.Duration, args ...any) (v any, acked bool, err error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	a := append([]any{op, id, max(1, ttl.Milliseconds())}, args...)
	cmd, acked := repl.run(ctx, r.c, r.script, r.keys, a...)
	v, err = cmd.Result()
	if err != nil {
		return nil, false, fmt.Errorf("redisstore: lease %s: %w", op, err)
	}
	return v, acked, nil
}

// Heartbeat implements lease.Store.
func (r *LeaseStore) Heartbeat(ctx context.Context, m lease.Member, ttl time.Duration, partitions int) (lease.View, error) {
	if err := lease.CheckArgs(m.ID, ttl, true); err != nil {
		return lease.View{}, err
	}
	partitions = max(0, partitions)
	v, err := r.run(ctx, "heartbeat", m.ID, ttl,
		strconv.FormatFloat(m.Weight, 'g', -1, 64), m.Need, m.Want, partitions)
	if err != nil {
		return lease.View{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 1 {
		return lease.View{}, fmt.Errorf("redisstore: lease heartbeat: unexpected reply %T", v)
	}
	n, _ := a[0].(int64)
	if len(a) != 1+4*int(n)+3*partitions {
		return lease.View{}, fmt.Errorf("redisstore: lease heartbeat: reply of %d values", len(a))
	}
	view := lease.View{Members: make([]lease.Member, n), Partitions: make([]lease.PartitionState, partitions)}
	for i := range view.Members {
		f := a[1+4*i:]
		id, _ := f[0].(string)
		ws, _ := f[1].(string)
		needs, _ := f[2].(string)
		wants, _ := f[3].(string)
		w, err := strconv.ParseFloat(ws, 64)
		if err != nil {
			return lease.View{}, fmt.Errorf("redisstore: lease heartbeat: weight of %q: %w", id, err)
		}
		need, err := strconv.Atoi(needs)
		if err != nil {
			return lease.View{}, fmt.Errorf("redisstore: lease heartbeat: need of %q: %w", id, err)
		}
		want, err := strconv.Atoi(wants)
		if err != nil {
			return lease.View{}, fmt.Errorf("redisstore: lease heartbeat: want of %q: %w", id, err)
		}
		view.Members[i] = lease.Member{ID: id, Weight: w, Need: need, Want: want}
	}
	f := a[1+4*int(n):]
	for i := range view.Partitions {
		owner, _ := f[3*i].(string)
		epoch, _ := f[3*i+1].(int64)
		left, _ := f[3*i+2].(int64)
		view.Partitions[i] = lease.PartitionState{Owner: owner, Epoch: uint64(epoch), TTL: time.Duration(left) * time.Millisecond}
	}
	return view, nil
}

// Acquire implements lease.Store.
func (r *LeaseStore) Acquire(ctx context.Context, id string, parts []int, ttl time.Duration) ([]lease.Grant, error) {
	if err := lease.CheckArgs(id, ttl, true); err != nil {
		return nil, err
	}
	if err := lease.CheckPartitions(parts); err != nil {
		return nil, err
	}
	if len(parts) == 0 {
		return nil, nil
	}
	args := make([]any, 1+len(parts))
	args[0] = "" // the cutoff
	for i, p := range parts {
		args[1+i] = p
	}
	ctx, cancel := r.bound(ctx)
	defer cancel()
	now := time.Now()
	if d, ok := ctx.Deadline(); ok || r.sclock.readTimeout > 0 {
		if !ok {
			d = now.Add(r.sclock.readTimeout)
		}
		cut, err := r.sclock.cutoff(ctx, r.keys[0], now, d)
		if err != nil {
			return nil, fmt.Errorf("redisstore: lease acquire: reading the server's clock: %w", err)
		}
		args[0] = strconv.FormatInt(max(cut, 1e9), 10)
	}
	v, acked, err := r.runReplicated(ctx, r.repl, "acquire", id, ttl, args...)
	if n, ok := v.(int64); err == nil && ok && n == -1 {
		if d, ok := ctx.Deadline(); ok && time.Now().Before(d) {
			r.sclock.expired(ctx, r.keys[0])
		}
		err = fmt.Errorf("redisstore: lease acquire: %w", errExpired)
	}
	if err != nil {
		return nil, err
	}
	a, _ := v.([]any)
	out := make([]lease.Grant, 0, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		p, _ := a[i].(int64)
		e, _ := a[i+1].(int64)
		out = append(out, lease.Grant{Partition: int(p), Epoch: uint64(e)})
	}
	if len(out) > 0 && !acked {
		_ = r.Release(context.WithoutCancel(ctx), id, out) // best effort: a lease not released expires with its TTL
		return nil, fmt.Errorf("redisstore: lease acquire: %w", transientError{errUnreplicated})
	}
	return out, nil
}

func grantArgs(leases []lease.Grant) []any {
	args := make([]any, 0, 2*len(leases))
	for _, g := range leases {
		args = append(args, g.Partition, g.Epoch)
	}
	return args
}

// Renew implements lease.Store.
func (r *LeaseStore) Renew(ctx context.Context, id string, leases []lease.Grant, ttl time.Duration) ([]bool, error) {
	if err := lease.CheckArgs(id, ttl, true); err != nil {
		return nil, err
	}
	ok := make([]bool, len(leases))
	if len(leases) == 0 {
		return ok, nil
	}
	v, acked, err := r.runReplicated(ctx, r.repl, "renew", id, ttl, grantArgs(leases)...)
	if err != nil {
		return nil, err
	}
	a, _ := v.([]any)
	if len(a) != len(leases) {
		return nil, fmt.Errorf("redisstore: lease renew: %d replies for %d leases", len(a), len(leases))
	}
	for i := range a {
		n, _ := a[i].(int64)
		ok[i] = n == 1
		if ok[i] && !acked { // extends nothing for the holder: its lease ends with its validity
			return nil, fmt.Errorf("redisstore: lease renew: %w", transientError{errUnreplicated})
		}
	}
	return ok, nil
}

// Release implements lease.Store.
func (r *LeaseStore) Release(ctx context.Context, id string, leases []lease.Grant) error {
	if err := lease.CheckArgs(id, 0, false); err != nil {
		return err
	}
	if len(leases) == 0 {
		return nil
	}
	_, err := r.run(ctx, "release", id, 0, grantArgs(leases)...)
	return err
}

// Leave implements lease.Store.
func (r *LeaseStore) Leave(ctx context.Context, id string) error {
	if err := lease.CheckArgs(id, 0, false); err != nil {
		return err
	}
	_, err := r.run(ctx, "leave", id, 0)
	return err
}

// Watch implements lease.Notifier: it subscribes to the service's channel
// (one connection of the client's pool, held until ctx is done) and
// returns once Redis has confirmed the subscription, within the store's
// Timeout (watchTimeout without one). The channel receives the ids
// published and is closed when ctx is done; messages that find it full
// are dropped. The subscription's goroutine ends with ctx.
func (r *LeaseStore) Watch(ctx context.Context) (<-chan string, error) {
	return subscribe(ctx, r.c, r.keys[3], r.timeout, "lease")
}

// Valid reports whether g is the current, unexpired lease of its
// partition by the server's clock: the check a protected service makes on
// a fencing token.
func (r *LeaseStore) Valid(ctx context.Context, g lease.Grant) (bool, error) {
	v, err := r.run(ctx, "valid", "-", 0, g.Partition, g.Epoch)
	if err != nil {
		return false, err
	}
	n, _ := v.(int64)
	return n == 1, nil
}

// watchTimeout bounds a watch's subscription when the store has no
// timeout of its own.
const watchTimeout = 5 * time.Second

// subscribe subscribes to channel on a connection of its own, held until
// ctx is done, and returns once Redis has confirmed it, within wait
// (watchTimeout when wait is not positive), with relay's channel of the
// messages. what names the watch in errors.
func subscribe(ctx context.Context, c redis.UniversalClient, channel string, wait time.Duration, what string) (<-chan string, error) {
	if wait <= 0 {
		wait = watchTimeout
	}
	ps := c.Subscribe(ctx, channel)
	cctx, cancel := context.WithTimeout(ctx, wait)
	_, err := ps.Receive(cctx)
	cancel()
	if err != nil {
		ps.Close()
		return nil, fmt.Errorf("redisstore: %s watch: %w", what, err)
	}
	return relay(ctx, ps), nil
}

// relay passes on the payloads of the messages ps receives until ctx is
// done, then closes ps and the channel it returns; a message that finds the
// channel full is dropped (a notification only wakes a poller early).
func relay(ctx context.Context, ps *redis.PubSub) <-chan string {
	out := make(chan string, 16)
	msgs := ps.Channel()
	go func() {
		defer close(out)
		defer ps.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case out <- m.Payload:
				default:
				}
			}
		}
	}()
	return out
}
