package dashboard

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/lease"
)

// A LeaseWatch is a lease.Store that keeps the last view each member's
// heartbeat returned, so that a Dashboard can show every member of the
// service: what each has, needs and wants, and when its leases expire.
// Give it to lease.NewHolder in place of the store it wraps; it changes
// nothing of what the store does. It keeps one view per member id that
// heartbeats through it. It is safe for concurrent use.
type LeaseWatch struct {
	lease.Store
	mu    sync.Mutex
	views map[string]seen
}

type seen struct {
	v  lease.View
	at time.Time
}

// WatchLeases returns s wrapped in a LeaseWatch.
func WatchLeases(s lease.Store) *LeaseWatch {
	return &LeaseWatch{Store: s, views: map[string]seen{}}
}

// Heartbeat implements lease.Store, keeping the view.
func (w *LeaseWatch) Heartbeat(ctx context.Context, m lease.Member, ttl time.Duration, partitions int) (lease.View, error) {
	v, err := w.Store.Heartbeat(ctx, m, ttl, partitions)
	if err == nil {
		w.mu.Lock()
		w.views[m.ID] = seen{v, time.Now()}
		w.mu.Unlock()
	}
	return v, err
}

// Leave implements lease.Store, forgetting the member's view.
func (w *LeaseWatch) Leave(ctx context.Context, id string) error {
	w.mu.Lock()
	delete(w.views, id)
	w.mu.Unlock()
	return w.Store.Leave(ctx, id)
}

// View returns the last view member id's heartbeat returned and when, or
// false before its first.
func (w *LeaseWatch) View(id string) (lease.View, time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.views[id]
	return s.v, s.at, ok
}
