package httplimit

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/lease"
)

// Share paces key's budgets to the part of the service's announced budgets
// that h holds, until ctx is done: the processes that spend one account
// (an LLM API's key, shared by several workers) each run a lease.Holder of
// one service, all on one lease.Store, whose Capacity is the whole account
// (any unit: 1,000 for thousandths of it), and each process's Budgets
// paces every announced dimension to its holder's rate over that Capacity
// (SetShare), as the holders' leases change. The announced budget is
// thus the capacity the leases divide, per dimension, and each process
// still paces to the announced budget itself as well.
//
// A Holder run this way is told its demand by its caller, who knows its
// work (lease.Holder.SetDemand: the Capacity while work waits, and the
// work waiting as backlog, gives it its fair share at once); its Limiter
// is not used. Run h (its Run) beside Share; a process that leaves ends
// both, and the others' shares grow as its leases are released. Share
// returns ctx's error.
func (b *Budgets) Share(ctx context.Context, key string, h *lease.Holder) error {
	capacity := h.Options().Capacity
	for {
		now := time.Now()
		a := h.AllowanceAt(now)
		b.SetShare(key, a.Rate/capacity, now)
		var deadline <-chan time.Time
		var t *time.Timer
		if !a.Deadline.IsZero() {
			t = time.NewTimer(max(0, a.Deadline.Sub(now)))
			deadline = t.C
		}
		select {
		case <-a.Changed:
		case <-deadline:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
