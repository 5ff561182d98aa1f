package ratelimit

import (
	"math"
	"math/bits"
	"time"
)

// Window returns the bounds [start, end) of the window of a FixedWindow or
// SlidingWindow rule that holds now: windows of Period aligned to the Unix
// epoch or, for FixedWindow with a Calendar, calendar units in the rule's
// Location (nil means UTC), whose length varies with months, leap years and
// DST changes. A SlidingWindow's window is the current of the two it weighs.
// Other algorithms have no windows; for them Window returns the Period
// aligned to the epoch that holds now, which means nothing to them. The
// bounds are in now's location, as time.Time.Truncate keeps it, and end is
// capped at the largest instant of Unix nanoseconds. r must be valid.
func (r *Rule) Window(now time.Time) (start, end time.Time) {
	s, e := r.window(now.UnixNano())
	loc := now.Location()
	return time.Unix(0, s).In(loc), time.Unix(0, e).In(loc)
}

// window is Window in Unix nanoseconds, as the algorithms compute with it.
func (r *Rule) window(now int64) (start, end int64) {
	if r.Calendar == NoCalendar {
		p := int64(r.Period)
		start = now - floorMod(now, p)
		return start, satAdd(start, p)
	}
	loc := r.Location
	if loc == nil {
		loc = time.UTC
	}
	t := time.Unix(0, now).In(loc)
	switch r.Calendar {
	case Minute, Hour:
		// Whole minutes and hours of local time; the offset is applied so
		// that zones with half-hour offsets align to their own hours.
		unit := int64(time.Minute)
		if r.Calendar == Hour {
			unit = int64(time.Hour)
		}
		_, off := t.Zone()
		start = now - floorMod(now+int64(off)*int64(time.Second), unit)
		return start, start + unit
	}
	y, m, d := t.Date()
	var s, e time.Time
	switch r.Calendar {
	case Day:
		s, e = time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case Week:
		d -= (int(t.Weekday()) + 6) % 7
		s, e = time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+7, 0, 0, 0, 0, loc)
	case Month:
		s, e = time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	default: // Year
		s, e = time.Date(y, 1, 1, 0, 0, 0, 0, loc), time.Date(y+1, 1, 1, 0, 0, 0, 0, loc)
	}
	return s.UnixNano(), e.UnixNano()
}

// fixedWindow counts cost in the current window: s.T is the window's start
// and s.N the cost counted in it.
func (r *Rule) fixedWindow(s *State, now, cost int64, commit bool, d *Decision) {
	start, end := r.window(now)
	var count int64
	if s.T == start {
		count = s.N
	}
	d.ResetAfter = time.Duration(max(0, end-now))
	if cost >= 0 && count+cost > r.Quota {
		d.RetryAfter = time.Duration(end - now)
		d.Remaining = max(0, r.Quota-count)
		return
	}
	count = max(0, count+cost)
	d.Allowed = true
	d.Remaining = max(0, r.Quota-count)
	if count == 0 {
		d.ResetAfter = 0
	}
	if commit && cost != 0 {
		s.T, s.N = start, count
	}
}

// slidingWindow estimates the cost of the sliding window ending now as the
// current fixed window's count plus the previous one's, weighted by the part
// of it that the sliding window still covers (rounded up). s.T is the current
// window's start, s.N its count and s.Prev the previous window's count.
func (r *Rule) slidingWindow(s *State, now, cost int64, commit bool, d *Decision) {
	p := int64(r.Period)
	start := now - floorMod(now, p)
	var cur, prev int64
	switch s.T {
	case start:
		cur, prev = s.N, s.Prev
	case start - p:
		prev = s.N
	}
	elapsed := now - start
	weighted := ceilMulDiv(prev, p-elapsed, p)
	used := cur + weighted
	end := start + p
	if cost >= 0 && used+cost > r.Quota {
		need := r.Quota - cost // what used must fall to
		if cur <= need {
			// Within this window, once prev's weight has faded enough.
			e := p - mulDiv(need-cur, p, prev)
			d.RetryAfter = time.Duration(start + e - now)
		} else {
			// In the next window, where cur becomes the previous count.
			e := p - mulDiv(need, p, cur)
			d.RetryAfter = time.Duration(end - now + e)
		}
		d.Remaining = max(0, r.Quota-used)
		d.ResetAfter = time.Duration(slidingReset(cur, prev, end-now, p))
		return
	}
	if cost < 0 { // refund the current window first, then the previous
		cur += cost
		if cur < 0 {
			prev = max(0, prev+cur)
			cur = 0
		}
	} else {
		cur += cost
	}
	d.Allowed = true
	d.Remaining = max(0, r.Quota-cur-ceilMulDiv(prev, p-elapsed, p))
	d.ResetAfter = time.Duration(slidingReset(cur, prev, end-now, p))
	if commit && cost != 0 {
		s.T, s.N, s.Prev = start, cur, prev
	}
}

// slidingReset is the time until a sliding window counter holds nothing.
func slidingReset(cur, prev, toEnd, p int64) int64 {
	switch {
	case cur > 0:
		return max(0, toEnd) + p
	case prev > 0:
		return max(0, toEnd)
	}
	return 0
}

// ceilMulDiv returns a*b/c rounded up, for a, b >= 0 and c > 0, saturated.
func ceilMulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if rem != 0 {
		q++
	}
	return int64(min(q, math.MaxInt64))
}
