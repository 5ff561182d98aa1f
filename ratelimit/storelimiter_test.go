package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestStoreLimiter: on a memory store, in fake time, 100/s with a burst of
// 10 admits 10 at once and then one every 10 ms; a cost above the burst
// fails at once; a wait past the deadline fails without waiting.
func TestStoreLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New(memstore.Options{})
		defer st.Close()
		l := &ratelimit.StoreLimiter{Store: st, Key: "k", Rule: &ratelimit.Rule{Name: "r", Quota: 100, Period: time.Second, Burst: 10}}
		ctx := context.Background()
		begin := time.Now()
		for i := range 30 {
			if err := l.WaitN(ctx, 1); err != nil {
				t.Fatal(err)
			}
			want := time.Duration(max(0, i-9)) * 10 * time.Millisecond
			if got := time.Since(begin); got != want {
				t.Fatalf("unit %d granted after %v, want %v", i, got, want)
			}
		}
		if err := l.WaitN(ctx, 11); !errors.Is(err, ratelimit.ErrExceedsBurst) {
			t.Fatalf("WaitN(11) with burst 10: %v, want ErrExceedsBurst", err)
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		defer cancel()
		before := time.Now()
		if err := l.WaitN(dctx, 1); !errors.Is(err, ratelimit.ErrWouldExceedDeadline) {
			t.Fatalf("WaitN past the deadline: %v", err)
		}
		if time.Since(before) != 0 {
			t.Fatalf("waited %v before refusing", time.Since(before))
		}
	})
}
