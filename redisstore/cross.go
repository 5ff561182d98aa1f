package redisstore

import (
	"context"
	"slices"

	"github.com/sluicehq/sluice/ratelimit"
)

// decideAcross decides, on a Cluster, a request whose keys have different
// hash tags: one group of items per tag, in order of first appearance, each
// group in one script. When a group is denied, the groups before it are
// refunded; the groups after it are not asked, and report a check (cost 0)
// of their keys, Allowed when their cost would fit.
func (s *Store) decideAcross(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	var tags []string
	group := make([]int, len(items)) // item → index in tags
	for i := range items {
		t := s.tagOf(items[i].Key)
		g := slices.Index(tags, t)
		if g < 0 {
			g = len(tags)
			tags = append(tags, t)
		}
		group[i] = g
	}
	out := make([]ratelimit.Decision, len(items))
	members := func(g int, cost func(int64) int64) (idx []int, sub []ratelimit.Item) {
		for i := range items {
			if group[i] == g {
				it := items[i]
				it.Cost = cost(it.Cost)
				idx, sub = append(idx, i), append(sub, it)
			}
		}
		return idx, sub
	}
	same := func(c int64) int64 { return c }
	for g := range tags {
		idx, sub := members(g, same)
		ds, err := s.Decide(ctx, nil, sub)
		if err == nil && ratelimit.Allowed(ds) {
			for j, i := range idx {
				out[i] = ds[j]
			}
			continue
		}
		// Undo the groups already taken, whatever happened to this one.
		for u := range g {
			uidx, refund := members(u, func(c int64) int64 { return -c })
			rds, rerr := s.Decide(context.WithoutCancel(ctx), nil, refund)
			for j, i := range uidx {
				if rerr == nil {
					out[i] = rds[j]
					out[i].Allowed = true // it was admitted; nothing stays taken
				}
			}
		}
		if err != nil {
			return dst, err
		}
		for j, i := range idx {
			out[i] = ds[j]
		}
		for rest := g + 1; rest < len(tags); rest++ {
			ridx, check := members(rest, func(int64) int64 { return 0 })
			cds, cerr := s.Decide(ctx, nil, check)
			if cerr != nil {
				return dst, cerr
			}
			for j, i := range ridx {
				out[i] = cds[j]
				out[i].Allowed = items[i].Cost <= cds[j].Remaining
			}
		}
		break
	}
	return append(dst, out...), nil
}
