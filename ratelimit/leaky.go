package ratelimit

import "time"

// leakyBucket decides with a leaky bucket used as a meter. s.N is the level
// in units of cost and s.T the instant of the last whole unit leaked; one
// unit leaks every interval. A cost that would overflow the capacity is
// rejected. For a fixed rule it decides exactly as gcra does.
func (r *Rule) leakyBucket(s *State, now, cost int64, commit bool, d *Decision) {
	c := r.Capacity()
	iv := r.interval()
	level, last := s.N, s.T
	if level > 0 && now > last {
		leaked := (now - last) / iv
		if leaked >= level {
			level = 0
		} else {
			level -= leaked
			last += leaked * iv
		}
	}
	if level <= 0 {
		level, last = 0, now
	}
	// progress is the time already spent leaking the next unit.
	progress := max(0, now-last)
	if cost >= 0 && level+cost > c {
		d.RetryAfter = time.Duration((level+cost-c)*iv - progress)
		d.Remaining = max(0, c-level)
		d.ResetAfter = time.Duration(max(0, level*iv-progress))
		return
	}
	level = max(0, level+cost)
	if level == 0 {
		last = now
	}
	d.Allowed = true
	d.Remaining = max(0, c-level)
	d.ResetAfter = time.Duration(max(0, level*iv-progress))
	if commit && cost != 0 {
		s.T, s.N = last, level
	}
}
