package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher coalesces concurrent requests into pipelines. Each of its workers
// waits for a request, takes every other request already waiting (up to
// size), waits at most window for more, and sends them all in one pipeline
// whose deadline is the earliest of theirs (on a Cluster, one pipeline per
// node, in goroutines of their own: see send).
type batcher struct {
	s      *Store
	ch     chan *call
	size   int
	window time.Duration
	quit   chan struct{} // closed by stop: workers take no more requests
	// stopped is closed by stop once every request that was taken has its
	// answer; a request queued after that is never taken.
	stopped chan struct{}
	wg      sync.WaitGroup

	pending            atomic.Int64 // requests in do
	pipelines, batched atomic.Uint64
}

// A call is one request waiting for its reply, until deadline.
type call struct {
	ctx      context.Context
	deadline time.Time
	req      *request
	res      []any
	err      error
	done     chan struct{} // one send, when res and err are set
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// answer hands c its reply.
func (c *call) answer(res []any, err error) {
	c.res, c.err = res, err
	c.done <- struct{}{}
}

func newBatcher(s *Store, size int, window time.Duration, workers int) *batcher {
	b := &batcher{
		s:       s,
		ch:      make(chan *call, size*workers),
		size:    size,
		window:  window,
		quit:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	b.wg.Add(workers)
	for range workers {
		go b.work()
	}
	return b
}

// stop ends the workers; requests still queued fail with ErrClosed.
func (b *batcher) stop() {
	close(b.quit)
	b.wg.Wait()
	for {
		select {
		case c := <-b.ch:
			c.answer(nil, ErrClosed)
		default:
			close(b.stopped)
			return
		}
	}
}

// do queues req and waits for its reply, for ctx's end or for the Store to
// close, whichever comes first; the pipeline that carries req ends by
// deadline. A caller alone (no other request pending) sends its request
// itself: a hand-off to a worker would only add latency.
//
// Workers take requests in order and every request gets the Store's
// timeout, so a request is taken before its deadline or answered at once:
// it needs no timer of its own (one for ctx's own deadline, if earlier).
func (b *batcher) do(ctx context.Context, deadline time.Time, req *request) ([]any, error) {
	defer b.pending.Add(-1)
	if b.pending.Add(1) == 1 {
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		return b.s.script.Run(ctx, b.s.c, req.keys, req.args...).Slice()
	}
	c := callPool.Get().(*call)
	c.ctx, c.deadline, c.req = ctx, deadline, req
	select {
	case b.ch <- c:
	case <-ctx.Done():
		b.recycle(c)
		return nil, ctx.Err()
	case <-b.quit:
		b.recycle(c)
		return nil, ErrClosed
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		req.abandoned = true // a worker may still read it, and answer c
		return nil, ctx.Err()
	case <-b.stopped:
		select {
		case <-c.done: // taken before stop drained the queue
		default: // queued after it: nothing will ever take c
			return nil, ErrClosed
		}
	}
	res, err := c.res, c.err
	b.recycle(c)
	return res, err
}

func (b *batcher) recycle(c *call) {
	done := c.done
	*c = call{done: done}
	callPool.Put(c)
}

func (b *batcher) work() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.size)
	var timer *time.Timer
	for {
		batch = batch[:0]
		select {
		case <-b.quit:
			return
		case c := <-b.ch:
			batch = append(batch, c)
		}
	fill:
		for len(batch) < b.size {
			select {
			case c := <-b.ch:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		if b.window > 0 && len(batch) < b.size {
			if timer == nil {
				timer = time.NewTimer(b.window)
			} else {
				timer.Reset(b.window)
			}
		wait:
			for len(batch) < b.size {
				select {
				case c := <-b.ch:
					batch = append(batch, c)
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		b.send(batch)
	}
}

// send runs batch as one pipeline (on a Cluster, one per node, which it
// does not wait for) and hands each call its reply. Calls whose context has
// ended are answered at once and not sent.
func (b *batcher) send(batch []*call) {
	live := batch[:0]
	var deadline time.Time
	now := time.Now()
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.answer(nil, err)
			continue
		}
		if !c.deadline.After(now) {
			c.answer(nil, context.DeadlineExceeded)
			continue
		}
		if deadline.IsZero() || c.deadline.Before(deadline) {
			deadline = c.deadline
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	b.pipelines.Add(1)
	b.batched.Add(uint64(len(live)))
	if b.s.sclock.cluster == nil {
		b.pipeline(now, deadline, live)
		return
	}
	// On a Cluster, a node that does not answer must not hold the others'
	// calls: neither in the pipeline (when its commands time out, go-redis
	// retries them and, once the deadline ends the retry, fails every
	// command of the pipeline, answered or not) nor in the worker, which
	// would take no more requests until the deadline. So one pipeline per
	// node, each in a goroutine of its own, which the worker does not wait
	// for (stop does): a pipeline's calls are each in no other, so they
	// bound the goroutines.
	for _, p := range b.byNode(live) {
		dl := p[0].deadline
		for _, c := range p[1:] {
			if c.deadline.Before(dl) {
				dl = c.deadline
			}
		}
		b.wg.Add(1) // the worker's own count is held: stop's Wait waits for this one
		go func() {
			defer b.wg.Done()
			b.pipeline(now, dl, p)
		}()
	}
}

// byNode splits calls by the Cluster master that holds their keys, in
// order of first appearance, in new slices.
func (b *batcher) byNode(calls []*call) [][]*call {
	var parts [][]*call
	var addrs []string
	for _, c := range calls {
		addr := "" // unknown: the pipeline finds it
		if m, err := b.s.sclock.cluster.MasterForKey(c.ctx, c.req.keys[0]); err == nil {
			addr = m.Options().Addr
		}
		i := slices.Index(addrs, addr)
		if i < 0 {
			i = len(addrs)
			addrs = append(addrs, addr)
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], c)
	}
	return parts
}

// pipeline sends calls, taken at now, in one pipeline that ends at
// deadline, and hands each its reply.
func (b *batcher) pipeline(now, deadline time.Time, live []*call) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if len(live) == 1 {
		c := live[0]
		c.answer(b.s.script.Run(ctx, b.s.c, c.req.keys, c.req.args...).Slice())
		return
	}
	groups := b.group(live)
	b.setCutoffs(ctx, groups, now, deadline)
	b.exec(ctx, groups)
	for _, g := range groups {
		g.answer()
	}
}

// A scriptCall is one EVALSHA of a pipeline: the calls it decides, and
// their request (combined when there are several).
type scriptCall struct {
	calls []*call
	req   *request
	cmd   *redis.Cmd
	err   error // the cutoff could not be computed: not sent
}

// group makes the pipeline's script calls. Requests at the same instant
// ("": the server's) share one EVALSHA, decided one after the other
// inside the script; on a Cluster, whose requests live in different
// slots, each is its own EVALSHA, and so is a reconciliation (whole).
func (b *batcher) group(live []*call) []*scriptCall {
	var groups []*scriptCall
	if b.s.cluster {
		for _, c := range live {
			groups = append(groups, &scriptCall{calls: []*call{c}, req: c.req})
		}
		return groups
	}
	byNow := map[any]*scriptCall{}
	for _, c := range live {
		if c.req.whole {
			groups = append(groups, &scriptCall{calls: []*call{c}})
			continue
		}
		g := byNow[c.req.args[argNow]]
		if g == nil || len(g.calls) >= b.size { // a script call decides at most size requests
			g = &scriptCall{}
			byNow[c.req.args[argNow]] = g
			groups = append(groups, g)
		}
		g.calls = append(g.calls, c)
	}
	for _, g := range groups {
		if len(g.calls) == 1 {
			g.req = g.calls[0].req
		} else {
			g.req = b.combine(g.calls)
		}
	}
	return groups
}

// setCutoffs sets the cutoff of every script call that takes. Every call
// of the pipeline is abandoned at its deadline, the earliest of theirs:
// so is every cutoff (each call's own, set by run, may be later). One
// cutoff for a single server, one per node on a Cluster.
func (b *batcher) setCutoffs(ctx context.Context, groups []*scriptCall, now, deadline time.Time) {
	var cut int64
	var cutErr error
	have := false
	for _, g := range groups {
		if !g.req.takes {
			continue
		}
		if !have || b.s.cluster {
			cut, cutErr = b.s.sclock.cutoff(ctx, g.req.keys[0], now, deadline)
			have = true
		}
		g.err = cutErr
		g.req.setCutoff(cut)
	}
}

// exec sends the script calls in one pipeline. A node that does not know
// the script yet answers NOSCRIPT: those calls are sent again, in a second
// pipeline, with the script's source.
func (b *batcher) exec(ctx context.Context, groups []*scriptCall) {
	sha := b.s.script.Hash()
	pipe := b.s.c.Pipeline()
	for _, g := range groups {
		if g.err == nil {
			g.cmd = pipe.EvalSha(ctx, sha, g.req.keys, g.req.args...)
		}
	}
	pipe.Exec(ctx) //nolint:errcheck // each command carries its own error
	var retry redis.Pipeliner
	for _, g := range groups {
		if g.err != nil {
			continue
		}
		if err := g.cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			if retry == nil {
				retry = b.s.c.Pipeline()
			}
			g.cmd = retry.Eval(ctx, decideLua, g.req.keys, g.req.args...)
		}
	}
	if retry != nil {
		retry.Exec(ctx) //nolint:errcheck // as above
	}
}

// answer hands each call of g its part of g's reply.
func (g *scriptCall) answer() {
	var res []any
	err := g.err
	if err == nil {
		res, err = g.cmd.Slice()
	}
	if len(g.calls) == 1 {
		g.calls[0].answer(res, err)
		return
	}
	if err == nil && len(res) == 1 && res[0] == int64(replyExpired) { // the whole batch did nothing
		err = errExpired
	}
	// Per request: the number of its values, then the values.
	pos := 0
	for _, c := range g.calls {
		if err != nil {
			c.answer(nil, err)
			continue
		}
		if l, ok := res[pos].(int64); ok && l >= 0 && pos+batchReqHeader+int(l) <= len(res) {
			c.answer(res[pos+batchReqHeader:pos+batchReqHeader+int(l)], nil)
			pos += batchReqHeader + int(l)
		} else {
			c.answer(nil, errors.New("redisstore: malformed batch reply"))
		}
	}
}

// combine makes one batch request of several, as decide.lua reads it: the
// header, then per request its number of items and their fields, with key
// indices shifted to the batch's KEYS.
func (b *batcher) combine(calls []*call) *request {
	nk, na, mask, takes := 0, argHeader, 0, false
	for _, c := range calls {
		nk += len(c.req.keys)
		na += batchReqHeader + len(c.req.args) - argHeader
		mask |= c.req.mask
		takes = takes || c.req.takes
	}
	r := &request{keys: make([]string, 0, nk), args: make([]any, argHeader, na), takes: takes}
	r.args[argNow], r.args[argSlack] = calls[0].req.args[argNow], calls[0].req.args[argSlack]
	r.args[argDeadline] = "" // set by send when a request takes
	r.args[argCount] = "-" + strconv.Itoa(len(calls))
	r.args[argMask] = b.s.small(int64(mask))
	for _, c := range calls {
		off := len(r.keys)
		r.keys = append(r.keys, c.req.keys...)
		r.args = append(r.args, c.req.args[argCount]) // batchReqHeader: its number of items
		items := c.req.args[argHeader:]
		for i, ki := range c.req.kis {
			base := len(r.args)
			r.args = append(r.args, items[itemFields*i:itemFields*(i+1)]...)
			r.args[base+fieldKey] = b.s.small(int64(ki + off))
		}
	}
	return r
}
