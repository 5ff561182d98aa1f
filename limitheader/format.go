package limitheader

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// PolicyWindow is the window that a RateLimit-Policy item announces for r:
// the period of a window algorithm, the nominal length of a calendar unit,
// or, for GCRA and LeakyBucket, the time an empty bucket takes to refill its
// whole capacity. It is rounded up to whole seconds, at least one.
func PolicyWindow(r *ratelimit.Rule) int64 {
	var w time.Duration
	switch {
	case r.Calendar != ratelimit.NoCalendar:
		w = calendarNominal[r.Calendar]
	case r.Algorithm == ratelimit.GCRA || r.Algorithm == ratelimit.LeakyBucket:
		if r.Quota > 0 {
			// capacity × Period / Quota, without overflow for any valid rule.
			w = time.Duration(float64(r.Capacity()) * float64(r.Period) / float64(r.Quota))
		}
	default:
		w = r.Period
	}
	return max(1, ceilSeconds(w))
}

var calendarNominal = [...]time.Duration{
	ratelimit.Minute: time.Minute,
	ratelimit.Hour:   time.Hour,
	ratelimit.Day:    24 * time.Hour,
	ratelimit.Week:   7 * 24 * time.Hour,
	ratelimit.Month:  30 * 24 * time.Hour,
	ratelimit.Year:   365 * 24 * time.Hour,
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

// AppendPolicyItem appends one member of a RateLimit-Policy list for the
// rule r: "name";q=quota;w=window, where the quota is r's capacity and the
// window is PolicyWindow(r).
func AppendPolicyItem(b []byte, r *ratelimit.Rule) []byte {
	b = AppendPolicyName(b, r.Name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, r.Capacity(), 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, PolicyWindow(r), 10)
}

// AppendLimitItem appends one member of a RateLimit list for d:
// "name";r=remaining;t=seconds-until-reset.
func AppendLimitItem(b []byte, d *ratelimit.Decision) []byte {
	b = AppendPolicyName(b, d.Rule)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(0, d.Remaining), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, ResetSeconds(d.ResetAfter), 10)
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
