package ratelimit

import (
	"math"
	"time"
)

// gcra decides with the generic cell rate algorithm. s.T is the theoretical
// arrival time (TAT): the instant at which the key is back to full capacity.
// s.N is the emission interval the TAT was computed with; when the rule's
// rate changes, the outstanding debt is rescaled so that the cost already
// consumed, not the time owed, carries over.
func (r *Rule) gcra(s *State, now, cost int64, commit bool, d *Decision) {
	iv := r.interval()
	capT := r.Capacity() * iv // Validate keeps this below MaxInt64/2; 0 when Limit is 0.
	var debt int64
	if s.T > now {
		debt = s.T - now
		if s.N != 0 && s.N != iv {
			debt = min(mulDiv(debt, iv, s.N), math.MaxInt64/4)
		}
	}
	if cost >= 0 {
		next := satAdd(debt, cost*iv)
		if next > capT {
			d.RetryAfter = time.Duration(next - capT)
			d.Remaining = max(0, (capT-debt)/iv)
			d.ResetAfter = time.Duration(debt)
			return
		}
		debt = next
	} else {
		debt = max(0, debt+cost*iv)
	}
	d.Allowed = true
	d.Remaining = max(0, (capT-debt)/iv)
	d.ResetAfter = time.Duration(debt)
	if commit && cost != 0 {
		s.T = satAdd(now, debt)
		s.N = iv
	}
}
