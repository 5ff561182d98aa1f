package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// This file holds one call of decide.lua: a request built from the items
// (build, with each rule's arguments formatted once), sent with its
// instant, calendar windows and cutoff filled in (run), and its reply read
// back as decisions (parse).

// request is one EVALSHA: keys and arguments of decide.lua. Decide takes
// one from reqPool and gives it back when it is done with it.
type request struct {
	keys []string
	args []any
	mask int   // algorithms present
	kis  []int // each item's first key, in keys (from 1)
	// exact is set when a rule without a calendar is beyond the script's
	// doubles, calendar when a rule has a calendar window.
	exact, calendar bool
	// abandoned is set when the caller stopped waiting while a pipeline
	// may still read the request: it must not be reused.
	abandoned bool
	// takes is set when an item has a positive cost: only then does the
	// request carry a cutoff (a late refund only gives back).
	takes bool
	// rescaled is set by run when Redis denied an item on a GCRA state
	// written at another interval (see parse).
	rescaled bool
	// whole is set on a reconciliation (decide.lua's reconciliation
	// form, made by pushRequest, not pooled): a pipeline sends it as it is,
	// never combined with other requests.
	whole bool
	// cut holds the cutoff's digits and cutArg them boxed once (a []byte
	// over cut's array), so that setting a cutoff allocates nothing.
	cut    [19]byte
	cutArg any
}

var reqPool = sync.Pool{New: func() any {
	r := new(request)
	r.cutArg = r.cut[:]
	return r
}}

// setCutoff sets the request's cutoff, ns in the server's clock.
func (r *request) setCutoff(ns int64) {
	if ns < 1e18 || r.cutArg == nil { // not 19 digits (before 2001): rare enough to allocate
		r.args[argDeadline] = strconv.FormatInt(max(ns, 1e9), 10)
		return
	}
	strconv.AppendInt(r.cut[:0], ns, 10)
	r.args[argDeadline] = r.cutArg
}

// maxPooledArgs bounds the requests kept for reuse.
const maxPooledArgs = 256

func (r *request) release() {
	if r.abandoned || cap(r.args) > maxPooledArgs {
		return
	}
	clear(r.keys)
	clear(r.args)
	reqPool.Put(r)
}

// build encodes items as decide.lua's KEYS and ARGV; ARGV's instant and
// calendar windows are filled in by run. It is also where rules are
// checked: an item without a rule, or the first invalid rule in order, is
// the error (ruleArgs validates a rule once, when it is first seen). On a
// Cluster, a request whose keys have different hash tags is errCrossSlot,
// once every rule has been checked.
func (s *Store) build(items []ratelimit.Item) (*request, error) {
	req := reqPool.Get().(*request)
	req.keys, req.kis = req.keys[:0], req.kis[:0]
	req.exact, req.calendar, req.takes, req.rescaled = false, false, false, false
	req.args = append(req.args[:0], make([]any, argHeader)...)
	req.args[argSlack] = s.slackMS
	req.args[argDeadline] = ""
	req.args[argCount] = s.small(int64(len(items)))
	mask := 0
	cross := false
	var buf [128]byte
	tag0 := s.tagOf(items[0].Key)
	for i := range items {
		it := &items[i]
		r := it.Rule
		if r == nil {
			req.release()
			return nil, fmt.Errorf("%w: item %q has no rule", ratelimit.ErrInvalidRule, it.Key)
		}
		ra, err := s.ruleArgs(r)
		if err != nil {
			req.release()
			return nil, err
		}
		if cross {
			continue // decided group by group: only the rules are checked
		}
		tag := tag0
		if i > 0 {
			if tag = s.tagOf(it.Key); tag != tag0 && s.cluster {
				cross = true
				continue
			}
		}
		key := string(appendKey(buf[:0], s.prefix, tag, it.Key))
		ki := len(req.keys) + 1
		req.kis = append(req.kis, ki)
		req.keys = append(req.keys, key)
		if r.Algorithm == ratelimit.SlidingLog {
			req.keys = append(req.keys, key+logSuffix)
		}
		mask |= 1 << r.Algorithm
		req.exact = req.exact || ra.exact
		req.calendar = req.calendar || r.Calendar != ratelimit.NoCalendar
		base := len(req.args)
		req.args = append(req.args, ra.fields[:]...)
		f := req.args[base : base+itemFields]
		f[fieldKey] = s.small(int64(ki))
		f[fieldCost] = s.small(max(it.Cost, -ra.capacity))
		req.takes = req.takes || it.Cost > 0
	}
	if cross {
		req.release()
		return nil, errCrossSlot
	}
	req.args[argMask] = s.small(int64(mask))
	req.mask = mask
	req.abandoned = false
	return req, nil
}

// ruleArgs are a rule's fields as decide.lua reads them, formatted and boxed
// once. A Rule is immutable once in use, so the Store also validates it only
// once, when it builds them.
type ruleArgs struct {
	capacity int64
	exact    bool // no calendar, and beyond the script's doubles
	// fields are an item's fields under the rule; fieldKey and fieldCost
	// are left for build, the calendar window ("" here) for run.
	fields [itemFields]any
}

// maxRuleArgs bounds the cache of ruleArgs (callers that make a Rule per
// request only refill it).
const maxRuleArgs = 4096

// ruleArgs returns r's cached arguments, building them on first use after
// r.Validate; an invalid rule is not cached, and reports Validate's error
// on every call.
func (s *Store) ruleArgs(r *ratelimit.Rule) (*ruleArgs, error) {
	if ra, ok := s.rules.Load(r); ok {
		return ra.(*ruleArgs), nil
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	c := r.Capacity()
	iv := int64(r.Interval())
	capT := int64(0)
	if r.Quota > 0 {
		capT = c * iv
	}
	ra := &ruleArgs{
		capacity: c,
		exact:    r.Calendar == ratelimit.NoCalendar && needsExact(r, 0),
	}
	f := &ra.fields
	f[fieldAlg] = strconv.Itoa(int(r.Algorithm))
	f[fieldQuota] = strconv.FormatInt(r.Quota, 10)
	f[fieldCapacity] = strconv.FormatInt(c, 10)
	f[fieldInterval] = strconv.FormatInt(iv, 10)
	f[fieldCapT] = strconv.FormatInt(capT, 10)
	f[fieldPeriod] = strconv.FormatInt(int64(r.Period), 10)
	f[fieldWinStart], f[fieldWinEnd] = "", ""
	if s.nrules.Add(1) > maxRuleArgs {
		s.rules.Clear()
		s.nrules.Store(1)
	}
	s.rules.Store(r, ra)
	return ra, nil
}

// small returns n formatted and boxed, without allocating for small n.
func (s *Store) small(n int64) any {
	if n >= 0 && n < int64(len(s.smalls)) {
		return s.smalls[n]
	}
	return strconv.FormatInt(n, 10)
}

// run sends req, after filling in the instant and calendar windows, within
// the Store's timeout. A coalesced request carries its deadline to the
// pipeline instead of a context of its own.
func (s *Store) run(ctx context.Context, dst []ratelimit.Decision, req *request, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	start := time.Now()
	deadline := s.deadline(ctx, start)
	if req.exact || req.calendar || s.batch == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if req.exact {
		return s.exact(ctx, dst, req, items)
	}
	now, err := s.instant(ctx, req)
	if err != nil {
		return dst, err
	}
	req.args[argNow] = ""
	if !now.IsZero() {
		req.args[argNow] = strconv.FormatInt(now.UnixNano(), 10)
	}
	if req.calendar && !setWindows(req, items, now) {
		return s.exact(ctx, dst, req, items)
	}
	if req.takes {
		cut, err := s.sclock.cutoff(ctx, req.keys[0], start, deadline)
		if err != nil {
			return dst, err
		}
		req.setCutoff(cut)
	}
	res, err := s.send(ctx, deadline, req)
	if err = s.checkExpired(ctx, req.keys[0], deadline, res, err); err != nil {
		return dst, err
	}
	if len(res) == 1 && res[0] == int64(replyFar) { // a state too far from now for the script's doubles
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		return s.exact(ctx, dst, req, items)
	}
	dst, req.rescaled, err = parse(dst, items, res)
	return dst, err
}

// deadline is when a call made at start ends: after the Store's timeout,
// or at ctx's deadline if that is earlier.
func (s *Store) deadline(ctx context.Context, start time.Time) time.Time {
	deadline := start.Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return deadline
}

// instant is the instant req is decided at: Options.Now's, the server's
// TIME read first for a calendar window, or zero for the script to read
// TIME itself.
func (s *Store) instant(ctx context.Context, req *request) (time.Time, error) {
	switch {
	case s.now != nil:
		return s.now(), nil
	case req.calendar:
		// One round trip to the clock of the node that owns the slot.
		v, err := s.clock.Run(ctx, s.c, req.keys[:1]).Slice()
		if err != nil {
			return time.Time{}, err
		}
		return parseTime(v)
	}
	return time.Time{}, nil
}

// setWindows fills in the calendar windows of req's items at now. It
// reports false, having filled in what it had, when a window is beyond
// the script's doubles: the request is then the exact path's.
func setWindows(req *request, items []ratelimit.Item, now time.Time) bool {
	for i := range items {
		if r := items[i].Rule; r.Calendar != ratelimit.NoCalendar {
			ws, we := r.Window(now)
			start, end := ws.UnixNano(), we.UnixNano()
			if needsExact(r, end-start) {
				return false
			}
			f := req.args[argHeader+itemFields*i:][:itemFields]
			f[fieldWinStart] = strconv.FormatInt(start, 10)
			f[fieldWinEnd] = strconv.FormatInt(end, 10)
		}
	}
	return true
}

// send sends req to decide.lua, through the coalescer unless the Store
// has none, and returns the script's reply.
func (s *Store) send(ctx context.Context, deadline time.Time, req *request) ([]any, error) {
	if s.batch != nil {
		return s.batch.do(ctx, deadline, req)
	}
	return s.script.Run(ctx, s.c, req.keys, req.args...).Slice()
}

// checkExpired returns err, or errExpired when res says that the call
// reached Redis past its cutoff; a call answered so before deadline, yet
// past the cutoff, has the clock of key's node measured again.
func (s *Store) checkExpired(ctx context.Context, key string, deadline time.Time, res []any, err error) error {
	if err == nil && len(res) == 1 && res[0] == int64(replyExpired) {
		err = errExpired
	}
	if errors.Is(err, errExpired) && time.Now().Before(deadline) {
		s.sclock.expired(ctx, key) // answered in time, yet past the cutoff: measure again
	}
	return err
}

// exact decides req on the exact path (see exact.go).
func (s *Store) exact(ctx context.Context, dst []ratelimit.Decision, req *request, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	s.exacts.Add(1)
	ds, rescaled, err := s.decideExact(ctx, items, req.keys)
	if err != nil {
		return dst, err
	}
	req.rescaled = rescaled
	return append(dst, ds...), nil
}

func parseTime(v []any) (time.Time, error) {
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("redisstore: TIME returned %d values", len(v))
	}
	var f [2]int64
	for i, x := range v {
		switch x := x.(type) {
		case int64:
			f[i] = x
		case string: // TIME inside a script returns strings
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("redisstore: TIME returned %q", x)
			}
			f[i] = n
		default:
			return time.Time{}, fmt.Errorf("redisstore: TIME returned %T", x)
		}
	}
	return time.Unix(f[0], f[1]*1000), nil
}

// parse turns decide.lua's reply into decisions. rescaled reports an item
// limited on a GCRA state written at another interval (a rule whose rate
// changed), a denial the denial cache must not keep (see denialCache).
func parse(dst []ratelimit.Decision, items []ratelimit.Item, res []any) (_ []ratelimit.Decision, rescaled bool, _ error) {
	if len(res) != replyFields*len(items) {
		return dst, false, fmt.Errorf("redisstore: script returned %d values for %d items", len(res), len(items))
	}
	for i := range items {
		var f [replyFields]int64
		for j := range f {
			v, ok := res[replyFields*i+j].(int64)
			if !ok {
				return dst, false, fmt.Errorf("redisstore: script returned %T", res[replyFields*i+j])
			}
			f[j] = v
		}
		r := items[i].Rule
		d := ratelimit.Decision{
			Allowed:    f[replyAllowed] == 1,
			Capacity:   r.Capacity(),
			Remaining:  f[replyRemaining],
			ResetAfter: dur(f[replyReset]),
			RetryAfter: dur(f[replyRetry]),
			Rule:       r.Name,
		}
		switch f[replyReason] {
		case reasonOK:
			d.Reason = ratelimit.ReasonOK
		case reasonLimited, reasonRescaled:
			d.Reason = ratelimit.ReasonLimited
			rescaled = rescaled || f[replyReason] == reasonRescaled
		default: // reasonExceeds
			d.Reason, d.RetryAfter = ratelimit.ReasonExceedsCapacity, ratelimit.Never
		}
		dst = append(dst, d)
	}
	return dst, rescaled, nil
}

// dur maps the script's saturated durations back to MaxInt64.
func dur(ns int64) time.Duration {
	if ns >= maxDuration {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(ns)
}
