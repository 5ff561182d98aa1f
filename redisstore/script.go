package redisstore

import (
	_ "embed"
	"regexp"
	"strconv"
	"strings"
)

// This file holds decide.lua, the script of every Store decision, as it
// is loaded, and the layout of its ARGV and reply that Go and Lua share.

//go:embed decide.lua
var decideSource string

// decideLua is the script as it is loaded: decide.lua with its layout names
// replaced by their values (see inlineLayout).
var decideLua = inlineLayout(decideSource)

// timeLua reads the clock of the node that owns KEYS[1]'s slot.
const timeLua = "return redis.call('TIME')"

// The layout of decide.lua's ARGV and of its reply. decide.lua declares the
// same names with the same values in a block at its top; TestScriptLayout
// fails when the two disagree, and inlineLayout puts these values in place
// of the names when the script is loaded. Indices count from 0:
// request.args[x] is ARGV[1+x].
const (
	// The header, ahead of the items.
	argNow   = 0 // the instant in Unix ns, or "" for the server's TIME
	argSlack = 1 // milliseconds added to every TTL
	argCount = 2 // the number of items; "-n" for a batch of n requests
	argMask  = 3 // the algorithms present, a bit mask
	// argDeadline is the cutoff, Unix ns of the server's clock (TIME),
	// past which the script does nothing and answers replyExpired; "" for
	// none (a request that consumes nothing). See clock.go.
	argDeadline = 4
	argHeader   = 5 // values in the header

	// An item's fields, from its first one.
	fieldKey      = 0 // index of its state key in KEYS, from 1
	fieldAlg      = 1 // ratelimit.Algorithm
	fieldCost     = 2
	fieldQuota    = 3
	fieldCapacity = 4
	fieldInterval = 5 // ns
	fieldCapT     = 6 // capacity × interval, ns; 0 when Quota is 0
	fieldPeriod   = 7 // ns
	fieldWinStart = 8 // the calendar window in Unix ns; "" without a calendar
	fieldWinEnd   = 9
	itemFields    = 10 // fields per item

	// In a batch, each request is its number of items and then their
	// fields; its reply is its number of values and then the values.
	batchReqHeader = 1

	// The reply: replyFields values per item, or the one value replyFar
	// (a state too far from now for doubles: nothing written).
	replyAllowed   = 0 // 1 or 0
	replyReason    = 1 // one of reasonOK, reasonLimited, reasonExceeds, reasonRescaled
	replyRemaining = 2
	replyReset     = 3 // ns
	replyRetry     = 4 // ns
	replyFields    = 5 // values per item
	replyFar       = -1
	// replyExpired, alone, says that the script ran past argDeadline and
	// did nothing.
	replyExpired = -2

	reasonOK      = 0
	reasonLimited = 1
	reasonExceeds = 2 // cost beyond capacity
	// reasonRescaled is reasonLimited on a GCRA state written at another
	// interval, whose debt was rescaled to the rule's (see parse).
	reasonRescaled = 3

	// maxDuration is where the script saturates durations: the largest
	// double below 2^63 (2^63 - 1024), which parse reads as "never".
	maxDuration = 1<<63 - 1024
)

// scriptLayout names the layout constants as decide.lua does.
var scriptLayout = []struct {
	name  string
	value int64
}{
	{"argNow", argNow}, {"argSlack", argSlack}, {"argCount", argCount}, {"argMask", argMask},
	{"argDeadline", argDeadline}, {"argHeader", argHeader},
	{"fieldKey", fieldKey}, {"fieldAlg", fieldAlg}, {"fieldCost", fieldCost},
	{"fieldQuota", fieldQuota}, {"fieldCapacity", fieldCapacity},
	{"fieldInterval", fieldInterval}, {"fieldCapT", fieldCapT}, {"fieldPeriod", fieldPeriod},
	{"fieldWinStart", fieldWinStart}, {"fieldWinEnd", fieldWinEnd}, {"itemFields", itemFields},
	{"batchReqHeader", batchReqHeader},
	{"replyAllowed", replyAllowed}, {"replyReason", replyReason}, {"replyRemaining", replyRemaining},
	{"replyReset", replyReset}, {"replyRetry", replyRetry}, {"replyFields", replyFields},
	{"replyFar", replyFar}, {"replyExpired", replyExpired},
	{"reasonOK", reasonOK}, {"reasonLimited", reasonLimited}, {"reasonExceeds", reasonExceeds},
	{"reasonRescaled", reasonRescaled},
	{"maxDuration", maxDuration},
}

// The lines that open and close decide.lua's layout block.
const (
	layoutStart = "\n-- Layout of ARGV"
	layoutEnd   = "\n-- End of the layout.\n"
)

// inlineLayout returns the script src with its layout block blanked out
// (its lines kept, so that Lua's line numbers still match decide.lua's) and
// every layout name after it replaced by its value in scriptLayout.
//
// The script runs its whole chunk on every call, and a function that reads
// a local of the chunk captures it as an upvalue, which each call allocates,
// links and closes again: with the names left as locals, a lone GCRA
// decision cost Redis about 5 % more instructions, a general-path one 8 %
// (callgrind). Values in place cost nothing. TestScriptLayout checks that
// the block declares the same values, so the file reads, and runs, as what
// is loaded.
func inlineLayout(src string) string {
	start := strings.Index(src, layoutStart)
	end := strings.Index(src, layoutEnd)
	if start < 0 || end < start {
		panic("redisstore: decide.lua has no layout block")
	}
	end += len(layoutEnd)
	vals := make(map[string]string, len(scriptLayout))
	names := make([]string, 0, len(scriptLayout))
	for _, l := range scriptLayout {
		v := strconv.FormatInt(l.value, 10)
		if l.value < 0 {
			v = "(" + v + ")" // so that "- name" cannot become a comment
		}
		vals[l.name] = v
		names = append(names, l.name)
	}
	re := regexp.MustCompile(`\b(` + strings.Join(names, "|") + `)\b`)
	blank := strings.Repeat("\n", strings.Count(src[start:end], "\n"))
	return src[:start] + blank + re.ReplaceAllStringFunc(src[end:], func(n string) string { return vals[n] })
}
