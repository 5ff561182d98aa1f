package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// This file holds a reconciliation's trip to Redis: the hits of an
// approximate replica's entries (approximate.go) sent under their push
// rules, and Redis's answers read back. pushAll does it in four steps:
// build the script calls, send them, parse their replies, and resend on
// its own each key the calls did not take.

// A push is one key's part of a reconciliation: the hits sent, and what
// Redis answered.
type push struct {
	e    *approximateEntry
	cost int64
	// Once answered without err: debt is the key's ResetAfter, counted
	// whether the hits were counted (if not, they were beyond even the
	// push rule's capacity, and nothing was written).
	debt    time.Duration
	counted bool
	err     error
}

// maxReconcileKeys bounds the keys of one reconciliation script call: the
// script reads their states with one MGET (Lua's unpack takes a few
// thousand values at most), and Redis serves no one else while it runs.
const maxReconcileKeys = 256

// reconcileCount, in argCount, marks decide.lua's reconciliation form.
const reconcileCount = "r"

// A pushGroup is keys that can share a reconciliation script call: of one
// GCRA rule within the script's doubles (its arguments) and, on a
// Cluster, of one slot.
type pushGroup struct {
	ra   *ruleArgs
	slot uint16
}

// A reconciliation is one pushAll: its pushes, the script calls that
// carry them, and the pushes decided by decideRedis instead.
type reconciliation struct {
	s        *Store
	ctx      context.Context
	deadline time.Time
	nowArg   any // argNow of every call
	ps       []push
	calls    []pushCall
	alone    []int // pushes, in ps, that resend decides one by one
	gates    []gate
	gateOf   []int // each push's gate, in gates
}

// A gate is the breaker of a node whose keys a reconciliation pushes (on a
// Cluster, one per master; else the Store's one), asked once whether they
// may go, and told once how their calls did.
type gate struct {
	brk    *breaker
	ok     bool  // what allow answered
	called bool  // a call of the node's pushes was sent
	failed error // a call's failure
}

// A pushCall is one script call of a reconciliation: a group's keys
// (decide.lua's reconciliation form: req.whole), or one key's request as
// build makes it.
type pushCall struct {
	c   *call
	idx []int // its pushes, in ps
}

// pushAll sends every push's hits to Redis under its key's push rule, and
// sets each push's answer. The keys of a pushGroup go in script calls of
// up to maxReconcileKeys keys each (decide.lua's reconciliation form),
// any other key (a LeakyBucket rule, one beyond the script's doubles) as
// a request of its own; all in one pipeline when the Store coalesces
// (on a Cluster, one per node), else one call after the other. A key the
// reconciliation form does not take (a stored state it does not read,
// written under another rule, or too far from now) is sent again on its
// own, after the pipeline.
//
// A key whose node's breaker lets nothing through gets errUnavailable;
// the other nodes' keys are sent.
func (s *Store) pushAll(ctx context.Context, ps []push) {
	rc := &reconciliation{s: s, ctx: ctx, ps: ps}
	if !rc.admit() {
		return
	}
	rc.deadline, rc.nowArg = s.deadline(ctx, time.Now()), ""
	if s.now != nil {
		rc.nowArg = formatNano(s.now())
	}
	rc.build()
	rc.send()
	rc.parse()
	rc.resend()
}

// admit asks the breaker of each push's node, once per node, whether
// its pushes may go; those that may not get errUnavailable. It reports
// whether any may.
func (rc *reconciliation) admit() bool {
	rc.gateOf = make([]int, len(rc.ps))
	some := false
	for i := range rc.ps {
		b := rc.s.brks.forKey(rc.ctx, rc.ps[i].e.rkey)
		g := slices.IndexFunc(rc.gates, func(g gate) bool { return g.brk == b })
		if g < 0 {
			g = len(rc.gates)
			rc.gates = append(rc.gates, gate{brk: b, ok: b.allow()})
		}
		rc.gateOf[i] = g
		if rc.gates[g].ok {
			some = true
		} else {
			rc.ps[i].err = errUnavailable
		}
	}
	return some
}

// build makes the script calls: the keys of each pushGroup in calls of up
// to maxReconcileKeys keys, every other key in a call of its own, or in
// alone. A push whose rule is invalid gets the error; one already
// answered (its node's breaker is open) is skipped.
func (rc *reconciliation) build() {
	groups := map[pushGroup][]int{}
	for i := range rc.ps {
		if rc.ps[i].err != nil {
			continue
		}
		e := rc.ps[i].e
		ra, err := rc.s.ruleArgs(e.rule.push)
		switch {
		case err != nil:
			rc.ps[i].err = err
		case e.rule.push.Algorithm == ratelimit.GCRA && !ra.exact:
			g := pushGroup{ra: ra}
			if rc.s.cluster {
				g.slot = e.slot
			}
			groups[g] = append(groups[g], i)
		default:
			rc.buildOne(i)
		}
	}
	for g, idx := range groups {
		for len(idx) > 0 {
			n := min(len(idx), maxReconcileKeys)
			rc.add(rc.s.pushRequest(g, rc.ps, idx[:n], rc.nowArg), idx[:n])
			idx = idx[n:]
		}
	}
}

// buildOne makes push i's call as a request of its own, for the pipeline;
// without one, or when the request is not the script's to decide, push i
// goes to alone.
func (rc *reconciliation) buildOne(i int) {
	if rc.s.batch == nil {
		rc.alone = append(rc.alone, i)
		return
	}
	p := &rc.ps[i]
	req, err := rc.s.build([]ratelimit.Item{{Key: p.e.key, Rule: p.e.rule.push, Cost: p.cost}})
	if err != nil || req.exact || req.calendar {
		if err == nil {
			req.release()
		}
		rc.alone = append(rc.alone, i) // decideRedis reports the error, or decides it apart
		return
	}
	req.args[argNow] = rc.nowArg
	rc.add(req, []int{i})
}

// add makes req the call of the pushes idx.
func (rc *reconciliation) add(req *request, idx []int) {
	c := &call{ctx: rc.ctx, deadline: rc.deadline, req: req, done: make(chan struct{}, 1)}
	rc.calls = append(rc.calls, pushCall{c: c, idx: idx})
}

// pushRequest makes the reconciliation call of the pushes idx, all of
// group g.
func (s *Store) pushRequest(g pushGroup, ps []push, idx []int, nowArg any) *request {
	req := &request{keys: make([]string, len(idx)), args: make([]any, argHeader+itemFields+len(idx)), whole: true}
	req.args[argNow], req.args[argSlack], req.args[argCount] = nowArg, s.slackMS, reconcileCount
	req.args[argMask], req.args[argDeadline] = s.small(1<<ratelimit.GCRA), ""
	copy(req.args[argHeader:], g.ra.fields[:])
	req.args[argHeader+fieldKey], req.args[argHeader+fieldCost] = s.small(0), s.small(0)
	for j, i := range idx {
		req.keys[j] = ps[i].e.rkey
		req.args[argHeader+itemFields+j] = s.small(ps[i].cost)
		req.takes = req.takes || ps[i].cost > 0
	}
	return req
}

// send sends the calls: in one pipeline when the Store coalesces (on a
// Cluster, one per node), else one after the other. Every call that takes
// carries its cutoff, so that one answered late is not counted (and its
// hits, kept, not counted twice): the batcher sets the pipeline's own over
// it when it combines calls, not for a lone one.
func (rc *reconciliation) send() {
	s := rc.s
	calls := make([]*call, 0, len(rc.calls))
	for _, pc := range rc.calls {
		c := pc.c
		if c.req.takes {
			cut, err := s.sclock.cutoff(rc.ctx, c.req.keys[0], time.Now(), rc.deadline)
			if err != nil {
				c.answer(nil, err)
				continue
			}
			c.req.setCutoff(cut)
		}
		calls = append(calls, c)
	}
	if s.batch != nil {
		s.batch.send(calls)
		return
	}
	for _, c := range calls { // whole ones only: every other is alone
		c.answer(s.script.Run(rc.ctx, s.c, c.req.keys, c.req.args...).Slice())
	}
}

// parse waits for every call's reply and sets its pushes' answers; a key
// that a call did not take goes to alone. Then it tells each node's
// breaker how its calls did (a node whose pushes all went to alone is
// told nothing here: decideRedis asks its breaker again for each).
func (rc *reconciliation) parse() {
	for _, pc := range rc.calls {
		<-pc.c.done
		g := &rc.gates[rc.gateOf[pc.idx[0]]] // a call's keys share a slot
		g.called = true
		if err := rc.parseCall(pc); err != nil {
			g.failed = err
		}
		if !pc.c.req.whole {
			pc.c.req.release()
		}
	}
	s, answered := rc.s, false
	for _, g := range rc.gates {
		switch {
		case !g.ok:
		case !g.called:
			g.brk.abandon() // a half-open breaker's probe goes with resend
		case g.failed != nil && !isScriptError(g.failed):
			s.errors.Add(1)
			g.brk.done(g.failed)
		default:
			g.brk.done(nil)
			answered = true
		}
	}
	if answered {
		s.requests.Add(1)
	}
}

// parseCall sets the answers of pc's pushes from its reply, and returns
// the call's failure, if it failed.
func (rc *reconciliation) parseCall(pc pushCall) (failed error) {
	res := pc.c.res
	err := rc.s.checkExpired(rc.ctx, pc.c.req.keys[0], rc.deadline, res, pc.c.err)
	switch {
	case err != nil:
		failed = err
		for _, i := range pc.idx {
			rc.ps[i].err = err
		}
	case pc.c.req.whole:
		failed = parsePushes(rc.ps, pc.idx, res, &rc.alone)
	case len(res) == 1 && res[0] == int64(replyFar):
		rc.alone = append(rc.alone, pc.idx[0]) // decided on the exact path
	default:
		p := &rc.ps[pc.idx[0]]
		ds, _, err := parse(nil, []ratelimit.Item{{Rule: p.e.rule.push}}, res) // not for the denial cache
		if err != nil {
			failed, p.err = err, err
		} else {
			p.setDecision(ds[0])
		}
	}
	return failed
}

// parsePushes sets the answers of the pushes idx from the reply of their
// reconciliation call, and adds those the call did not take to alone.
func parsePushes(ps []push, idx []int, res []any, alone *[]int) error {
	if len(res) != len(idx) {
		err := fmt.Errorf("redisstore: reconciliation returned %d values for %d keys", len(res), len(idx))
		for _, i := range idx {
			ps[i].err = err
		}
		return err
	}
	for j, i := range idx {
		v, ok := res[j].(int64)
		switch {
		case !ok:
			ps[i].err = fmt.Errorf("redisstore: reconciliation returned %T", res[j])
		case v >= 0:
			ps[i].debt, ps[i].counted = time.Duration(v), true
		case v == replyFar:
			*alone = append(*alone, i)
		default:
			ps[i].debt = time.Duration(-3 - v)
		}
	}
	return nil
}

// resend decides each push of alone by decideRedis, on its own.
func (rc *reconciliation) resend() {
	for _, i := range rc.alone {
		p := &rc.ps[i]
		if p.err != nil {
			continue
		}
		ds, err := rc.s.decideRedis(rc.ctx, nil, []ratelimit.Item{{Key: p.e.key, Rule: p.e.rule.push, Cost: p.cost}})
		if err != nil {
			p.err = err
		} else {
			p.setDecision(ds[0])
		}
	}
}

// setDecision sets p's answer from a decision of its push rule.
func (p *push) setDecision(d ratelimit.Decision) {
	if !d.Allowed && d.Reason != ratelimit.ReasonLimited {
		p.err = fmt.Errorf("redisstore: reconciliation refused: %s", d.Reason)
		return
	}
	p.debt, p.counted = d.ResetAfter, d.Allowed
}

func formatNano(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }
