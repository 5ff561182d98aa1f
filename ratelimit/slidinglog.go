package ratelimit

import "time"

// slidingLog keeps every admitted request of the last Period in s.Log and
// their total cost in s.N; it admits a cost when the total of the entries
// younger than Period plus the cost is at most Limit. Entries are pruned by
// reslicing.
func (r *Rule) slidingLog(s *State, now, cost int64, commit bool, d *Decision) {
	p := int64(r.Period)
	log, used := s.Log, s.N
	var newest int64
	if len(log) > 0 {
		newest = log[len(log)-1].At
	}
	if now < newest { // time went backwards: stay at the newest instant seen
		now = newest
	}
	// Entries at or before now-p have left the window.
	k := 0
	for k < len(log) && log[k].At <= now-p {
		used -= log[k].Cost
		k++
	}
	log = log[k:]
	if cost >= 0 && used+cost > r.Limit {
		// The earliest instant at which enough old entries have left.
		left := used + cost - r.Limit
		for _, e := range log {
			left -= e.Cost
			if left <= 0 {
				d.RetryAfter = time.Duration(e.At + p - now)
				break
			}
		}
		d.Remaining = max(0, r.Limit-used)
		d.ResetAfter = time.Duration(newest + p - now)
		return
	}
	d.Allowed = true
	used = max(0, used+cost)
	if commit {
		switch {
		case cost > 0 && len(log) > 0 && log[len(log)-1].At == now:
			log[len(log)-1].Cost += cost // same instant: one entry
		case cost > 0:
			log = append(log, LogEntry{At: now, Cost: cost})
		case cost < 0: // refund the newest entries first
			for refund := -cost; refund > 0 && len(log) > 0; {
				e := &log[len(log)-1]
				take := min(refund, e.Cost)
				refund -= take
				if e.Cost -= take; e.Cost == 0 {
					log = log[:len(log)-1]
				}
			}
		}
	}
	d.Remaining = r.Limit - used
	if len(log) > 0 {
		d.ResetAfter = time.Duration(log[len(log)-1].At + p - now)
	}
	if commit && cost != 0 {
		if len(log) == 0 {
			log = nil
		}
		s.Log, s.N = log, used
	}
}
