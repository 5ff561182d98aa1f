package adaptive

import (
	"context"
	"sync/atomic"
	"time"
)

// The wait account: see the package documentation.

type waitKey struct{}

// waitAccount is the time one request waited outside the server, in
// nanoseconds; atomic, as waits may be added from several goroutines.
type waitAccount struct{ ns atomic.Int64 }

// WithWaitAccount returns a copy of ctx with a wait account for its
// request (see AddWait); Guard.Acquire with the returned context gives the
// permit the account, whose total its latency sample then excludes.
func WithWaitAccount(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitKey{}, &waitAccount{})
}

// AddWait adds d to the wait account of ctx, if it has one: d is time the
// request spent waiting on something outside the server (a store's round
// trip), which is no sign of the server's overload. It does not allocate.
func AddWait(ctx context.Context, d time.Duration) {
	if w := waitsOf(ctx); w != nil && d > 0 {
		w.ns.Add(int64(d))
	}
}

// waitsOf returns the wait account of ctx, or nil.
func waitsOf(ctx context.Context) *waitAccount {
	w, _ := ctx.Value(waitKey{}).(*waitAccount)
	return w
}

// excluded returns the time to take from a latency sample: the waits
// accounted, at most lat.
func (w *waitAccount) excluded(lat int64) int64 {
	if w == nil {
		return 0
	}
	return min(w.ns.Load(), lat)
}
