package httplimit

import (
	"context"
	"math"
	"testing"
)

func TestCosts(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		ctx  context.Context
		want int64
	}{
		{ctx, 1},
		{WithCost(ctx, 7), 7},
		{WithCost(ctx, 0), 0},
		{WithCost(ctx, -3), 0},
		{WithCost(ctx, math.MaxInt64), math.MaxInt64},
	} {
		if got := costOf(tt.ctx); got != tt.want {
			t.Errorf("costOf = %d, want %d", got, tt.want)
		}
	}
	// A Limiter's WaitN takes an int: the cost saturates where int is
	// narrower than int64, never wraps.
	for _, tt := range []struct {
		n    int64
		want int
	}{{0, 0}, {5, 5}, {math.MaxInt64, math.MaxInt}} {
		if got := waitCost(tt.n); got != tt.want {
			t.Errorf("waitCost(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}
