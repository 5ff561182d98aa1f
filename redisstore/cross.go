package redisstore

import (
	"context"
	"slices"

	"github.com/sluicehq/sluice/ratelimit"
)

// decideAcross decides, on a Cluster, a request whose keys have different
// hash tags: one group of items per tag, in order of first appearance, each
// group in one script. When a group is denied, the groups before it are
// refunded; the groups after it are not decided, and report what each of
// their items alone would get (Store.peek).
func (s *Store) decideAcross(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	groups := s.byTag(items)
	out := make([]ratelimit.Decision, len(items))
	for g, idx := range groups {
		ds, err := s.Decide(ctx, nil, withCost(items, idx, func(c int64) int64 { return c }))
		if err == nil && ratelimit.Allowed(ds) {
			setDecisions(out, idx, ds)
			continue
		}
		s.refundGroups(ctx, out, items, groups[:g]) // whatever happened to this one
		if err != nil {
			return dst, err
		}
		setDecisions(out, idx, ds)
		if err := s.checkGroups(ctx, out, items, groups[g+1:]); err != nil {
			return dst, err
		}
		break
	}
	return append(dst, out...), nil
}

// byTag groups the indices of items by hash tag, in order of first
// appearance.
func (s *Store) byTag(items []ratelimit.Item) [][]int {
	var tags []string
	var groups [][]int
	for i := range items {
		t := s.tagOf(items[i].Key)
		g := slices.Index(tags, t)
		if g < 0 {
			g = len(tags)
			tags = append(tags, t)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// withCost returns the items idx, each with its cost mapped by cost.
func withCost(items []ratelimit.Item, idx []int, cost func(int64) int64) []ratelimit.Item {
	sub := make([]ratelimit.Item, len(idx))
	for j, i := range idx {
		sub[j] = items[i]
		sub[j].Cost = cost(sub[j].Cost)
	}
	return sub
}

// setDecisions sets out[idx[j]] to ds[j].
func setDecisions(out []ratelimit.Decision, idx []int, ds []ratelimit.Decision) {
	for j, i := range idx {
		out[i] = ds[j]
	}
}

// refundGroups gives back what the groups, admitted, took; a refunded
// item reports the refund's decision, Allowed (nothing stays taken).
func (s *Store) refundGroups(ctx context.Context, out []ratelimit.Decision, items []ratelimit.Item, groups [][]int) {
	for _, idx := range groups {
		ds, err := s.Decide(context.WithoutCancel(ctx), nil, withCost(items, idx, func(c int64) int64 { return -c }))
		if err != nil {
			continue
		}
		setDecisions(out, idx, ds)
		for _, i := range idx {
			out[i].Allowed = true // it was admitted; nothing stays taken
		}
	}
}

// checkGroups answers the groups not decided, as the other items of a
// denied request (Store.peek): each item with what it alone would get.
func (s *Store) checkGroups(ctx context.Context, out []ratelimit.Decision, items []ratelimit.Item, groups [][]int) error {
	for _, idx := range groups {
		ds, err := s.peek(ctx, withCost(items, idx, func(c int64) int64 { return c }))
		if err != nil {
			return err
		}
		setDecisions(out, idx, ds)
	}
	return nil
}
