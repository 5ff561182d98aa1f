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
}
