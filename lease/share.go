package lease

import (
	"math"
	"sort"
)

// shares returns each member's aim, in partitions, out of p. Needs come
// first: p is divided among the members' Need by weighted max-min fairness
// (water-filling: a member that needs less than its part leaves the rest
// to the others); what is left then goes to their headroom, Want − Need,
// the same way. The sum of both parts is rounded up. With every member
// needing at least its part, member i aims at ceil(p × weight_i / total
// weight). Members of weight ≤ 0 aim at 0. Because of the rounding up,
// aims may add up to a little more than p: that margin keeps members
// from taking partitions back and forth.
func shares(ms []Member, p int) []int {
	need := make([]float64, len(ms))
	extra := make([]float64, len(ms))
	for i, m := range ms {
		need[i] = float64(max(0, m.Need))
		extra[i] = float64(max(0, m.Want-max(0, m.Need)))
	}
	base, left := waterfill(ms, need, float64(p))
	top, _ := waterfill(ms, extra, left)
	out := make([]int, len(ms))
	for i, m := range ms {
		out[i] = min(max(0, m.Want, m.Need), int(math.Ceil(base[i]+top[i]-1e-9)))
	}
	return out
}

// waterfill divides p among the members, weighted, giving none more than
// its demand d[i], and returns the division and what is left.
func waterfill(ms []Member, d []float64, p float64) (alloc []float64, left float64) {
	alloc = make([]float64, len(ms))
	idx := make([]int, 0, len(ms))
	var wsum float64
	for i, m := range ms {
		if m.Weight > 0 && !math.IsInf(m.Weight, 0) && d[i] > 0 {
			idx = append(idx, i)
			wsum += m.Weight
		}
	}
	// In order of demand per unit of weight: whoever asks less than its
	// part of what remains is satisfied, and the rest shared again.
	sort.SliceStable(idx, func(a, b int) bool {
		return d[idx[a]]/ms[idx[a]].Weight < d[idx[b]]/ms[idx[b]].Weight
	})
	left = p
	for _, i := range idx {
		give := min(d[i], left*ms[i].Weight/wsum)
		alloc[i] = give
		left = max(0, left-give)
		wsum -= ms[i].Weight
	}
	return alloc, left
}
