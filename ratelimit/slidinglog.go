package ratelimit

import "time"

// slidingLog keeps every admitted request of the last Period in s.Log and
// their total cost in s.N; it admits a cost when the total of the entries
// younger than Period plus the cost is at most Quota. Entries are pruned by
// reslicing.
func (r *Rule) slidingLog(s *State, now, cost int64, commit bool, d *Decision) {
	p := int64(r.Period)
	log, used := s.Log, s.N
	// Entries at or before now-p have left the window.
	k := 0
	for k < len(log) && log[k].At <= now-p {
		used -= log[k].Cost
		k++
	}
	log = log[k:]
	if cost >= 0 && used+cost > r.Quota {
		// The earliest instant at which enough old entries have left.
		left := used + cost - r.Quota
		for _, e := range log {
			left -= e.Cost
			if left <= 0 {
				d.RetryAfter = time.Duration(e.At + p - now)
				break
			}
		}
		d.Remaining = max(0, r.Quota-used)
		d.ResetAfter = time.Duration(log[len(log)-1].At + p - now)
		return
	}
	d.Allowed = true
	d.Remaining = max(0, r.Quota-max(0, used+cost))
	// newest is the index of the newest entry left after the decision, or
	// -1; a positive cost adds an entry at now.
	newest := len(log) - 1
	if cost < 0 { // a refund takes back the newest entries first
		for refund := -cost; refund > 0 && newest >= 0 && log[newest].Cost <= refund; newest-- {
			refund -= log[newest].Cost
		}
	}
	switch {
	case cost > 0:
		d.ResetAfter = time.Duration(p)
	case newest >= 0:
		d.ResetAfter = time.Duration(log[newest].At + p - now)
	}
	if !commit || cost == 0 {
		return
	}
	switch {
	case cost > 0 && len(log) > 0 && log[len(log)-1].At == now:
		log[len(log)-1].Cost += cost // same instant: one entry
	case cost > 0:
		log = append(log, LogEntry{At: now, Cost: cost})
	default:
		partial := max(0, used+cost) // what the surviving entries must sum to
		log = log[:newest+1]
		for _, e := range log {
			partial -= e.Cost
		}
		if partial < 0 { // the newest survivor is refunded in part
			log[newest].Cost += partial
		}
	}
	if len(log) == 0 {
		log = nil
	}
	s.Log, s.N = log, max(0, used+cost)
}
