package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/lease"
)

// A FencedLeaseStore is a lease.Store that also checks fencing tokens, as a
// protected service would: Valid reports whether a grant is the current,
// unexpired lease of its partition.
type FencedLeaseStore interface {
	lease.Store
	Valid(ctx context.Context, g lease.Grant) (bool, error)
}

// NewLeaseStore returns a new lease store holding no state for the
// calling test, and advance, which lets d pass on the store's clock (a
// fake clock's Advance, or a real wait for a store on a server's clock).
type NewLeaseStore func(t *testing.T) (s FencedLeaseStore, advance func(d time.Duration))

// The TTLs of the lease tests: long enough for a slow machine's round
// trips, short enough that waiting for them on a real server is cheap.
const (
	cTTL   = 400 * time.Millisecond
	cShort = 100 * time.Millisecond
)

// RunLeases runs the conformance suite of lease.Store against the stores
// that newStore returns, one per subtest: presence and its expiry, epochs
// that only grow (a release keeps the epoch, a re-acquire fences the old
// grant), renewal and expiry by the store's clock, stale holders refused,
// ErrBadArgument for bad arguments, and, for a store that is a
// lease.Notifier, the notifications of members that join, raise their
// need, release or leave, and none otherwise.
func RunLeases(t *testing.T, newStore NewLeaseStore) {
	ctx := context.Background()
	t.Run("presence", func(t *testing.T) {
		c, advance := newStore(t)
		if _, err := c.Heartbeat(ctx, lease.Member{ID: "b", Weight: 2, Need: 2, Want: 3}, cShort, 4); err != nil {
			t.Fatal(err)
		}
		v, err := c.Heartbeat(ctx, lease.Member{ID: "a", Weight: 1.5, Want: 0}, cTTL, 4)
		if err != nil {
			t.Fatal(err)
		}
		want := []lease.Member{{ID: "a", Weight: 1.5, Need: 0, Want: 0}, {ID: "b", Weight: 2, Need: 2, Want: 3}}
		if !slices.Equal(v.Members, want) || len(v.Partitions) != 4 {
			t.Fatalf("view = %+v, want members %+v and 4 partitions", v, want)
		}
		advance(cShort + 20*time.Millisecond)
		v, err = c.Heartbeat(ctx, lease.Member{ID: "a", Weight: 1, Need: 2, Want: 2}, cTTL, 4)
		if err != nil {
			t.Fatal(err)
		}
		if want := []lease.Member{{ID: "a", Weight: 1, Need: 2, Want: 2}}; !slices.Equal(v.Members, want) {
			t.Fatalf("after b's ttl: members %+v, want %+v", v.Members, want)
		}
		if err := c.Leave(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		v, err = c.Heartbeat(ctx, lease.Member{ID: "c", Weight: 1}, cTTL, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := []lease.Member{{ID: "c", Weight: 1, Need: 0, Want: 0}}; !slices.Equal(v.Members, want) {
			t.Fatalf("after a left: members %+v, want %+v", v.Members, want)
		}
	})
	t.Run("epochs", func(t *testing.T) {
		c, _ := newStore(t)
		g, err := c.Acquire(ctx, "a", []int{0, 1}, cTTL)
		if err != nil {
			t.Fatal(err)
		}
		if want := []lease.Grant{{Partition: 0, Epoch: 1}, {Partition: 1, Epoch: 1}}; !slices.Equal(g, want) {
			t.Fatalf("acquire = %v, want %v", g, want)
		}
		// Held partitions are not granted to another member.
		g, err = c.Acquire(ctx, "b", []int{1, 2}, cTTL)
		if err != nil {
			t.Fatal(err)
		}
		if want := []lease.Grant{{Partition: 2, Epoch: 1}}; !slices.Equal(g, want) {
			t.Fatalf("b's acquire = %v, want %v", g, want)
		}
		// Releasing someone else's lease, or a wrong epoch, does nothing.
		if err := c.Release(ctx, "b", []lease.Grant{{Partition: 0, Epoch: 1}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, "a", []lease.Grant{{Partition: 0, Epoch: 7}}); err != nil {
			t.Fatal(err)
		}
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 1}, true)
		// Release keeps the epoch: the next lease gets 2.
		if err := c.Release(ctx, "a", []lease.Grant{{Partition: 0, Epoch: 1}}); err != nil {
			t.Fatal(err)
		}
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 1}, false)
		g, err = c.Acquire(ctx, "b", []int{0}, cTTL)
		if err != nil {
			t.Fatal(err)
		}
		if want := []lease.Grant{{Partition: 0, Epoch: 2}}; !slices.Equal(g, want) {
			t.Fatalf("re-acquire = %v, want %v", g, want)
		}
		// Acquiring one's own partition fences the old grant.
		g, err = c.Acquire(ctx, "b", []int{0}, cTTL)
		if err != nil {
			t.Fatal(err)
		}
		if want := []lease.Grant{{Partition: 0, Epoch: 3}}; !slices.Equal(g, want) {
			t.Fatalf("own re-acquire = %v, want %v", g, want)
		}
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 2}, false)
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 3}, true)
		ok, err := c.Renew(ctx, "b", []lease.Grant{{Partition: 0, Epoch: 2}, {Partition: 0, Epoch: 3}, {Partition: 1, Epoch: 1}}, cTTL)
		if err != nil {
			t.Fatal(err)
		}
		if want := []bool{false, true, false}; !slices.Equal(ok, want) {
			t.Fatalf("renew = %v, want %v", ok, want)
		}
		v, err := c.Heartbeat(ctx, lease.Member{ID: "b", Weight: 1}, cTTL, 3)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range v.Partitions {
			if p.TTL <= cTTL/2 || p.TTL > cTTL {
				t.Errorf("partition %d: ttl left %v, want about %v", i, p.TTL, cTTL)
			}
		}
		want := []lease.PartitionState{{Owner: "b", Epoch: 3, TTL: 0}, {Owner: "a", Epoch: 1, TTL: 0}, {Owner: "b", Epoch: 1, TTL: 0}}
		if !slices.Equal(withoutTTL(v.Partitions), want) {
			t.Fatalf("partitions %+v, want %+v", v.Partitions, want)
		}
	})
	t.Run("expiry fences stale holders", func(t *testing.T) {
		c, advance := newStore(t)
		if _, err := c.Acquire(ctx, "a", []int{0}, cShort); err != nil {
			t.Fatal(err)
		}
		advance(cShort / 2)
		// A renewal extends from the store's now.
		ok, err := c.Renew(ctx, "a", []lease.Grant{{Partition: 0, Epoch: 1}}, cShort)
		if err != nil || !ok[0] {
			t.Fatalf("renew = %v, %v; want true", ok, err)
		}
		advance(cShort*3/4 + 10*time.Millisecond)
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 1}, true)
		advance(cShort/4 + 20*time.Millisecond)
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 1}, false)
		v, err := c.Heartbeat(ctx, lease.Member{ID: "b", Weight: 1}, cTTL, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := []lease.PartitionState{{Owner: "", Epoch: 1, TTL: 0}}; !slices.Equal(v.Partitions, want) {
			t.Fatalf("expired partition %+v, want %+v", v.Partitions, want)
		}
		// An expired lease is not renewed, even when nobody took it.
		ok, err = c.Renew(ctx, "a", []lease.Grant{{Partition: 0, Epoch: 1}}, cTTL)
		if err != nil || ok[0] {
			t.Fatalf("renew after expiry = %v, %v; want false", ok, err)
		}
		g, err := c.Acquire(ctx, "b", []int{0}, cTTL)
		if err != nil || !slices.Equal(g, []lease.Grant{{Partition: 0, Epoch: 2}}) {
			t.Fatalf("acquire after expiry = %v, %v; want epoch 2", g, err)
		}
		// The stale holder is refused everything.
		ok, err = c.Renew(ctx, "a", []lease.Grant{{Partition: 0, Epoch: 1}}, cTTL)
		if err != nil || ok[0] {
			t.Fatalf("stale renew = %v, %v; want false", ok, err)
		}
		if err := c.Release(ctx, "a", []lease.Grant{{Partition: 0, Epoch: 1}}); err != nil {
			t.Fatal(err)
		}
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 2}, true)
		mustValid(t, c, lease.Grant{Partition: 0, Epoch: 1}, false)
	})
	t.Run("bad arguments", func(t *testing.T) {
		c, _ := newStore(t)
		for name, err := range map[string]error{
			"empty id":      func() error { _, err := c.Heartbeat(ctx, lease.Member{}, cTTL, 1); return err }(),
			"zero ttl":      func() error { _, err := c.Acquire(ctx, "a", []int{0}, 0); return err }(),
			"negative part": func() error { _, err := c.Acquire(ctx, "a", []int{-1}, cTTL); return err }(),
			"renew no id":   func() error { _, err := c.Renew(ctx, "", nil, cTTL); return err }(),
			"release no id": c.Release(ctx, "", nil),
			"leave no id":   c.Leave(ctx, ""),
		} {
			if !errors.Is(err, lease.ErrBadArgument) {
				t.Errorf("%s: err = %v, want lease.ErrBadArgument", name, err)
			}
		}
	})
	t.Run("notifications", func(t *testing.T) {
		c, _ := newStore(t)
		n, ok := c.(lease.Notifier)
		if !ok {
			t.Skip("not a lease.Notifier")
		}
		wctx, cancel := context.WithCancel(ctx)
		notes, err := n.Watch(wctx)
		if err != nil {
			t.Fatal(err)
		}
		// expect reads the next notification: each step's, in order, so
		// a step that must not notify is followed by one that must.
		expect := func(step, id string) {
			t.Helper()
			select {
			case got, ok := <-notes:
				if !ok || got != id {
					t.Fatalf("after %s: notification %q (open %v), want %q", step, got, ok, id)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("after %s: no notification in 2 s, want %q", step, id)
			}
		}
		hb := func(id string, need int) {
			t.Helper()
			if _, err := c.Heartbeat(ctx, lease.Member{ID: id, Weight: 1, Need: need, Want: need}, cTTL, 2); err != nil {
				t.Fatal(err)
			}
		}
		hb("b", 1)
		expect("b joined", "b")
		hb("b", 1) // the same need: nothing
		hb("b", 0) // a lower need: nothing
		hb("c", 0)
		expect("c joined (b's heartbeats of the same and a lower need tell nothing)", "c")
		gs, err := c.Acquire(ctx, "b", []int{0}, cTTL) // an acquire tells nothing
		if err != nil || len(gs) != 1 {
			t.Fatalf("acquire: %v %v", gs, err)
		}
		if err := c.Release(ctx, "b", []lease.Grant{{Partition: 0, Epoch: gs[0].Epoch + 1}}); err != nil {
			t.Fatal(err) // a stale release frees nothing: nothing
		}
		if err := c.Release(ctx, "b", gs); err != nil {
			t.Fatal(err)
		}
		expect("b released", "b")
		hb("c", 2)
		expect("c raised its need", "c")
		if err := c.Leave(ctx, "c"); err != nil {
			t.Fatal(err)
		}
		expect("c left", "c")
		cancel()
		for range notes { // closed once ctx is done
		}
	})
}

func mustValid(t *testing.T, c interface {
	Valid(context.Context, lease.Grant) (bool, error)
}, g lease.Grant, want bool) {
	t.Helper()
	ok, err := c.Valid(context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	if ok != want {
		t.Fatalf("Valid(%+v) = %v, want %v", g, ok, want)
	}
}

func withoutTTL(ps []lease.PartitionState) []lease.PartitionState {
	out := slices.Clone(ps)
	for i := range out {
		out[i].TTL = 0
	}
	return out
}

// BenchmarkLeasePeriod measures one renewal period's store work of a
// holder of 10 leases among 20 partitions: a heartbeat and a renewal.
func BenchmarkLeasePeriod(b *testing.B, s lease.Store) {
	ctx := context.Background()
	parts := make([]int, 10)
	for i := range parts {
		parts[i] = i
	}
	gs, err := s.Acquire(ctx, "a", parts, time.Minute)
	if err != nil || len(gs) != 10 {
		b.Fatalf("acquire: %v %v", gs, err)
	}
	if _, err := s.Heartbeat(ctx, lease.Member{ID: "b", Weight: 1, Want: 10}, time.Minute, 20); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Heartbeat(ctx, lease.Member{ID: "a", Weight: 1, Want: 10}, time.Minute, 20); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Renew(ctx, "a", gs, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
