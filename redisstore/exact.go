package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// The exact path. decide.lua computes in doubles, exact while the durations
// involved stay below 2^52 ns (about 52 days). A request with a rule beyond
// that (a period of months, one unit per year, Quota 0), or whose stored
// state is that far from now, is decided here instead, with ratelimit's own
// integer code: read the states (readLua), decide in Go, and write them back
// only if none changed meanwhile (casLua compares each state's value, which
// holds a generation that every write increments). A conflict retries.
// Two round trips instead of one, for rules that are rarely hot.

// bigNS is where doubles stop being exact enough.
const bigNS = 1 << 52

// exactRetries bounds the compare-and-set attempts of one request; after a
// conflict, an attempt waits a random time of up to exactBackoff << attempt
// (at most exactMaxBackoff), so that contending replicas spread out.
const (
	exactRetries    = 64
	exactBackoff    = 20 * time.Microsecond
	exactMaxBackoff = 2 * time.Millisecond
)

var errContention = errors.New("redisstore: state kept changing under the exact path")

// readLua returns the server's TIME and, for each KEYS[i], its value
// (ARGV[i] = "s") or its list (ARGV[i] = "l").
const readLua = `
local out = redis.call('TIME')
for i = 1, #KEYS do
  if ARGV[i] == 'l' then out[#out + 1] = redis.call('LRANGE', KEYS[i], 0, -1)
  else out[#out + 1] = redis.call('GET', KEYS[i]) end
end
return out`

// casLua checks that every state key still holds its expected value ("" for
// none) and, only then, writes them all. ARGV: the cutoff (see clock.go; ""
// for none), the number of keys, then per key: expected, new value (""
// deletes), TTL in ms, the number of log entries (-1: no log key follows in
// KEYS), and the entries. It returns 1 when written, 0 on a conflict, -1
// (having written nothing) past the cutoff.
const casLua = `
local cut = ARGV[1]
if cut ~= '' then
  local t = redis.call('TIME')
  if (string.sub(cut, 1, -10) - t[1]) * 1000000000 + (string.sub(cut, -9) - t[2] * 1000) < 0 then return -1 end
end
local n = tonumber(ARGV[2])
local a, k = 3, 1
local w = {}
for i = 1, n do
  local exp, new, ttl, nlog = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
  local cur = redis.call('GET', KEYS[k])
  if (cur or '') ~= exp then return 0 end
  local logkey = nil
  if nlog >= 0 then logkey = KEYS[k + 1] end
  w[i] = {key = KEYS[k], logkey = logkey, new = new, ttl = ttl, first = a + 4, nlog = nlog}
  a = a + 4 + math.max(nlog, 0)
  if logkey then k = k + 2 else k = k + 1 end
end
for i = 1, n do
  local x = w[i]
  if x.new == '' then
    redis.call('DEL', x.key)
    if x.logkey then redis.call('DEL', x.logkey) end
  else
    redis.call('SET', x.key, x.new, 'PX', x.ttl)
    if x.logkey then
      redis.call('DEL', x.logkey)
      local j = 0
      while j < x.nlog do
        local m = math.min(1000, x.nlog - j)
        redis.call('RPUSH', x.logkey, unpack(ARGV, x.first + j, x.first + j + m - 1))
        j = j + m
      end
      if x.nlog > 0 then redis.call('PEXPIRE', x.logkey, x.ttl) end
    end
  end
end
return 1`

// needsExact reports whether r has durations that doubles cannot hold
// exactly; win is the length of r's current calendar window, if any.
func needsExact(r *ratelimit.Rule, win int64) bool {
	switch r.Algorithm {
	case ratelimit.GCRA, ratelimit.LeakyBucket:
		if r.Quota == 0 {
			return true
		}
		iv := int64(r.Interval())
		return iv >= bigNS || r.Capacity()*iv >= bigNS
	case ratelimit.FixedWindow:
		if r.Calendar != ratelimit.NoCalendar {
			return win >= bigNS
		}
		return int64(r.Period) >= bigNS
	default: // sliding windows reach back two periods
		return int64(r.Period) >= bigNS/2
	}
}

// exactState is one key's state as read, and as decided.
type exactState struct {
	raw    string // the value read; "" when absent
	gen    int64
	orig   ratelimit.State
	cur    ratelimit.State
	logKey string
	rule   *ratelimit.Rule // the last rule that decided the key
	dirty  bool
}

// decideExact decides items on the exact path; keys are build's KEYS.
// rescaled is parse's: an item was limited on a GCRA state written at
// another interval.
func (s *Store) decideExact(ctx context.Context, items []ratelimit.Item, keys []string) (_ []ratelimit.Decision, rescaled bool, _ error) {
	// Which KEYS are state keys, and which item uses which.
	kinds := make([]any, len(keys))
	itemKey := make([]int, len(items))
	for i, k := 0, 0; i < len(items); i++ {
		itemKey[i] = k
		kinds[k] = "s"
		if items[i].Rule.Algorithm == ratelimit.SlidingLog {
			kinds[k+1] = "l"
			k += 2
		} else {
			k++
		}
	}
	for attempt := range exactRetries {
		if attempt > 0 {
			d := min(exactBackoff<<min(attempt, 16), exactMaxBackoff)
			t := time.NewTimer(rand.N(d) + 1)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, false, ctx.Err()
			case <-t.C:
			}
		}
		v, err := s.read.Run(ctx, s.c, keys, kinds...).Slice()
		if err != nil {
			return nil, false, err
		}
		if len(v) != 2+len(keys) {
			return nil, false, fmt.Errorf("redisstore: read returned %d values for %d keys", len(v), len(keys))
		}
		now, err := parseTime(v[:2])
		if err != nil {
			return nil, false, err
		}
		if s.now != nil {
			now = s.now()
		}
		states := map[string]*exactState{}
		its := make([]*exactState, len(items))
		for i := range items {
			k := itemKey[i]
			st := states[keys[k]]
			if st == nil {
				st = &exactState{}
				if raw, ok := v[2+k].(string); ok {
					st.raw = raw
					st.orig, st.gen, err = parseState(raw)
					if err != nil {
						return nil, false, err
					}
				}
				states[keys[k]] = st
			}
			its[i] = st
			if items[i].Rule.Algorithm == ratelimit.SlidingLog && st.logKey == "" { // its log is the next key
				st.logKey = keys[k+1]
				if st.orig.Algorithm == ratelimit.SlidingLog && st.raw != "" {
					st.orig.Log, err = parseLog(v[2+k+1])
					if err != nil {
						return nil, false, err
					}
				}
			}
		}
		ds, allowed := exactDecide(items, its, now)
		if !allowed {
			return ds, rescaledDenial(items, its, ds), nil
		}
		ok, err := s.exactWrite(ctx, states, now, takes(items))
		if err != nil {
			return nil, false, err
		}
		if ok {
			return ds, false, nil
		}
	}
	return nil, false, errContention
}

// rescaledDenial reports whether a GCRA item of a denied request was
// limited on a state, as read, written at another interval than its
// rule's (ratelimit rescales that state's debt). An item decided after
// another of its key is decided on what that one left; the denial cache
// keeps neither.
func rescaledDenial(items []ratelimit.Item, its []*exactState, ds []ratelimit.Decision) bool {
	for i := range ds {
		o := &its[i].orig
		if ds[i].Reason == ratelimit.ReasonLimited && items[i].Rule.Algorithm == ratelimit.GCRA &&
			o.Algorithm == ratelimit.GCRA && o.N != 0 && o.N != int64(items[i].Rule.Interval()) {
			return true
		}
	}
	return false
}

// exactDecide decides items all or nothing on the states read (see
// ratelimit.DecideMany); its[i] is the state of items[i]'s key, shared by
// the items of one key. When every item is admitted, it sets each state's
// cur to what its key's last item left and marks what the write must store.
func exactDecide(items []ratelimit.Item, its []*exactState, now time.Time) ([]ratelimit.Decision, bool) {
	kept := make([]*ratelimit.State, len(items))
	for i, st := range its {
		kept[i] = &st.orig
	}
	work := make([]ratelimit.State, len(items))
	ds, ok := ratelimit.DecideMany(make([]ratelimit.Decision, 0, len(items)), items, now, kept, work)
	if ok {
		for i := range items {
			its[i].cur = work[i]
			if items[i].Cost != 0 {
				its[i].dirty, its[i].rule = true, items[i].Rule
			}
		}
	}
	return ds, ok
}

// takes reports whether an item has a positive cost.
func takes(items []ratelimit.Item) bool {
	for i := range items {
		if items[i].Cost > 0 {
			return true
		}
	}
	return false
}

// exactWrite writes the changed states if none changed since they were
// read. When take is set, the write carries the cutoff of ctx's deadline
// (see clock.go).
func (s *Store) exactWrite(ctx context.Context, states map[string]*exactState, now time.Time, take bool) (bool, error) {
	var keys []string
	args := []any{"", 0}
	n := 0
	for key, st := range states {
		if !st.dirty {
			continue
		}
		n++
		keys = append(keys, key)
		fresh := freshAt(st.rule, &st.cur)
		ttl := fresh - now.UnixNano()
		var slack int64
		if s.now != nil {
			slack = clientClockSlack.Milliseconds()
		}
		newVal := ""
		if ttl > 0 || slack > 0 {
			ms := min((max(ttl, 0)+999_999)/1_000_000+slack, 5_000_000_000_000)
			newVal = formatState(&st.cur, (st.gen+1)%(1<<50))
			args = append(args, st.raw, newVal, strconv.FormatInt(ms, 10))
		} else {
			args = append(args, st.raw, "", "0")
		}
		if st.logKey == "" {
			args = append(args, "-1")
			continue
		}
		keys = append(keys, st.logKey)
		var log []ratelimit.LogEntry
		if newVal != "" && st.cur.Algorithm == ratelimit.SlidingLog {
			log = st.cur.Log
		}
		args = append(args, strconv.Itoa(len(log)))
		for _, e := range log {
			args = append(args, strconv.FormatInt(e.At, 10)+":"+strconv.FormatInt(e.Cost, 10))
		}
	}
	if n == 0 {
		return true, nil
	}
	args[1] = strconv.Itoa(n)
	if d, ok := ctx.Deadline(); ok && take {
		cut, err := s.sclock.cutoff(ctx, keys[0], time.Now(), d)
		if err != nil {
			return false, err
		}
		args[0] = strconv.FormatInt(max(cut, 1e9), 10)
	}
	r, err := s.cas.Run(ctx, s.c, keys, args...).Int()
	if err == nil && r == -1 {
		if d, ok := ctx.Deadline(); ok && time.Now().Before(d) {
			s.sclock.expired(ctx, keys[0])
		}
		return false, errExpired
	}
	return r == 1, err
}

// freshAt is the Unix ns instant from which st equals a fresh state of r.
func freshAt(r *ratelimit.Rule, st *ratelimit.State) int64 {
	switch st.Algorithm {
	case ratelimit.GCRA:
		return st.T
	case ratelimit.FixedWindow:
		if st.N > 0 {
			return windowEnd(r, st.T)
		}
	case ratelimit.SlidingWindow:
		if st.N > 0 {
			return satAdd(st.T, 2*int64(r.Period))
		}
		if st.Prev > 0 {
			return satAdd(st.T, int64(r.Period))
		}
	case ratelimit.SlidingLog:
		if len(st.Log) > 0 {
			return satAdd(st.Log[len(st.Log)-1].At, int64(r.Period))
		}
	case ratelimit.LeakyBucket:
		if st.N > 0 {
			iv := int64(r.Interval())
			if st.N > math.MaxInt64/iv {
				return math.MaxInt64
			}
			return satAdd(st.T, st.N*iv)
		}
	}
	return 0
}

// windowEnd is the end of r's fixed window that starts at start.
func windowEnd(r *ratelimit.Rule, start int64) int64 {
	if r.Calendar != ratelimit.NoCalendar {
		_, end := r.Window(time.Unix(0, start))
		return end.UnixNano()
	}
	return satAdd(start, int64(r.Period))
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// formatState writes st in decide.lua's format "alg|T|N|P|S|G".
func formatState(st *ratelimit.State, gen int64) string {
	return fmt.Sprintf("%d|%d|%d|%d|%d|%d", st.Algorithm, st.T, st.N, st.Prev, st.Seen, gen)
}

// parseState reads decide.lua's format.
func parseState(raw string) (ratelimit.State, int64, error) {
	f := strings.Split(raw, "|")
	if len(f) < 6 {
		return ratelimit.State{}, 0, fmt.Errorf("redisstore: malformed state %q", raw)
	}
	var v [6]int64
	for i := range f {
		if i >= len(v) {
			break
		}
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			// decide.lua prints doubles: 2^63 for MaxInt64.
			fl, ferr := strconv.ParseFloat(f[i], 64)
			if ferr != nil {
				return ratelimit.State{}, 0, fmt.Errorf("redisstore: malformed state %q: %w", raw, err)
			}
			x = int64(max(min(fl, math.MaxInt64), math.MinInt64))
			if fl >= math.MaxInt64 {
				x = math.MaxInt64
			}
		}
		v[i] = x
	}
	return ratelimit.State{Algorithm: ratelimit.Algorithm(v[0]), T: v[1], N: v[2], Prev: v[3], Seen: v[4]}, v[5], nil
}

func parseLog(v any) ([]ratelimit.LogEntry, error) {
	l, _ := v.([]any)
	var log []ratelimit.LogEntry
	for _, x := range l {
		s, _ := x.(string)
		at, cost, ok := strings.Cut(s, ":")
		a, err1 := strconv.ParseInt(at, 10, 64)
		c, err2 := strconv.ParseInt(cost, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("redisstore: malformed log entry %q", s)
		}
		log = append(log, ratelimit.LogEntry{At: a, Cost: c})
	}
	return log, nil
}
