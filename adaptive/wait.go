package adaptive

import (
	"context"
	"sync/atomic"
	"time"
)

// A request's latency, as the Concurrency and the Shedder measure it, is
// the server's own: the time it spent waiting on something outside the
// server — a store across the network, a downstream service — is not
// overload of the server, and a server whose store is 10ms away is no
// more loaded than one whose store is 0.1ms away. A slow or distant
// dependency is governed by its own timeout and failure policy; were its
// round trip counted, it would shrink the limit and make the Shedder shed
// while the server idles. So an edge gives each request a wait account
// (WithWaitAccount) before Guard.Acquire, the code that calls the
// dependency adds each wait to it (AddWait), and the permit's latency
// sample is its duration less the waits. The permit still holds its slot
// while it waits: the limit bounds what the server holds in memory, and
// Max is that bound.

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
	if w, ok := ctx.Value(waitKey{}).(*waitAccount); ok && d > 0 {
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
