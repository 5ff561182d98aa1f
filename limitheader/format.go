package limitheader

import (
	"strconv"
	"time"
)

// PolicyWindow is the w parameter of a RateLimit-Policy item for a quota
// measured over window (for a rule, ratelimit.Rule.QuotaWindow): whole
// seconds, rounded up, at least one.
func PolicyWindow(window time.Duration) int64 {
	return max(1, ceilSeconds(window))
}

// ceilSeconds rounds d up to whole seconds; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ResetSeconds is the number of seconds until a quota resets that the t
// parameter of a RateLimit item (and X-RateLimit-Reset) carries for d, a
// Decision's ResetAfter: rounded up, 0 when d is not positive.
func ResetSeconds(d time.Duration) int64 { return ceilSeconds(d) }

// RetryAfterSeconds is the delay-seconds value of Retry-After for d: rounded
// up, and never 0 for a request that was denied (d > 0).
func RetryAfterSeconds(d time.Duration) int64 {
	return max(1, ceilSeconds(d))
}

// AppendPolicyItem appends one member of a RateLimit-Policy list:
// "name";q=quota;w=window, the window in PolicyWindow's seconds. For a rule
// r: AppendPolicyItem(b, r.Name, r.Capacity(), r.QuotaWindow()).
func AppendPolicyItem(b []byte, name string, quota int64, window time.Duration) []byte {
	b = AppendPolicyName(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, quota, 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, PolicyWindow(window), 10)
}

// AppendQuotaUnit appends the qu parameter of a RateLimit-Policy item,
// ";qu=" and unit as a Structured Field String: what the policy's quota
// counts. The draft registers "requests" (the meaning of an item without
// qu), "content-bytes" and "concurrent-requests"; a client that does not
// know a unit should take the policy as not about requests.
func AppendQuotaUnit(b []byte, unit string) []byte {
	return AppendPolicyName(append(b, ";qu="...), unit)
}

// AppendLimitItem appends one member of a RateLimit list:
// "name";r=remaining;t=seconds-until-reset (remaining below 0 is written
// 0). For a decision d: AppendLimitItem(b, d.Rule, d.Remaining, d.ResetAfter).
func AppendLimitItem(b []byte, name string, remaining int64, resetAfter time.Duration) []byte {
	b = AppendPolicyName(b, name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(0, remaining), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, ResetSeconds(resetAfter), 10)
}

// AppendPolicyName appends a policy's name as the items of both fields
// carry it: a Structured Field String (RFC 9651 §3.3.3), quoted, with '"'
// and '\' escaped. Bytes outside printable ASCII have no representation
// there and are each replaced by '?'.
func AppendPolicyName(b []byte, name string) []byte {
	b = append(b, '"')
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
