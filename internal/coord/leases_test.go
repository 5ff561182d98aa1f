package coord

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/lease"
)

// newLeaseService returns a Service holding leases on memory stores, one per
// service name, and the stores it opened.
func newLeaseService(t *testing.T, l Limits) (*Service, map[string]*lease.MemoryStore) {
	t.Helper()
	var mu sync.Mutex
	stores := map[string]*lease.MemoryStore{}
	s, err := New(Options{Store: concurrency.NewMemoryStore(), Limits: l, Leases: func(name string) (lease.Store, error) {
		mu.Lock()
		defer mu.Unlock()
		m := lease.NewMemoryStore()
		stores[name] = m
		return m, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return s, stores
}

// beat states a holder's demand every period until stop is closed,
// acknowledging the version of each answer.
func beat(t *testing.T, s *Service, service, id string, backlog int64, period time.Duration, stop <-chan struct{}) {
	var ver uint64
	for {
		g, err := s.Demand(context.Background(), DemandRequest{Service: service, HolderID: id, Backlog: backlog, Version: ver})
		if err != nil {
			t.Errorf("demand of a live holder: %v", err)
			return
		}
		ver = g.Version
		select {
		case <-stop:
			return
		case <-time.After(period):
		}
	}
}

// watchFor long-polls a holder until its answer satisfies ok, within
// twenty polls of at most a second, and returns that answer.
func watchFor(t *testing.T, s *Service, service, id string, ok func(LeaseGrant) bool) LeaseGrant {
	t.Helper()
	var g LeaseGrant
	for range 20 {
		var err error
		g, err = s.Watch(context.Background(), service, id, g.Version, time.Second)
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if ok(g) {
			return g
		}
	}
	t.Fatalf("no answer as wanted within 20 polls; the last: %+v", g)
	return g
}

// TestLeasesShareAndSilence: two remote holders with backlogs share a
// service evenly; answers carry the bucket, the window, a validity within
// the TTL, the leases and a version that grows; one that goes silent is
// ended after its TTL without releasing (its leases stay valid in the
// store until they expire), and the other then takes the whole capacity.
func TestLeasesShareAndSilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, stores := newLeaseService(t, Limits{})
		defer s.Shutdown()
		ctx := context.Background()
		const ttl = 3 * time.Second
		join := JoinRequest{Service: "db", Capacity: 1000, Partitions: 10, TTL: ttl, Backlog: 1000}
		a, err := s.Join(ctx, join)
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.Join(ctx, join)
		if err != nil {
			t.Fatal(err)
		}
		if checkID("holder_id", a.HolderID) != nil || a.HolderID == b.HolderID || a.Version != 1 || a.Rate != 0 {
			t.Fatalf("joined %+v and %+v: want distinct well-formed ids, version 1, no rate yet", a, b)
		}
		stopA, stopB := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { beat(t, s, "db", a.HolderID, 1000, time.Second, stopA) })
		wg.Go(func() { beat(t, s, "db", b.HolderID, 1000, time.Second, stopB) })
		half := func(g LeaseGrant) bool { return g.Rate == 500 }
		ga := watchFor(t, s, "db", a.HolderID, half)
		gb := watchFor(t, s, "db", b.HolderID, half)
		limit, burst := 500-(5/1.0+0.01*500), 5 // lease's pacing of 500/s in 1 s windows
		for _, g := range []LeaseGrant{ga, gb} {
			if g.Version <= 1 || math.Abs(g.PaceRate-limit) > 1e-9 || g.Burst != burst || g.Window != time.Second ||
				g.ValidFor <= 0 || g.ValidFor > ttl || len(g.Leases) != 5 {
				t.Errorf("answer %+v: want version > 1, limit %v, burst %d, 1s window, valid within (0, %v], 5 leases", g, limit, burst, ttl)
			}
		}
		// B goes silent.
		close(stopB)
		last := watchFor(t, s, "db", b.HolderID, func(g LeaseGrant) bool { return len(g.Leases) == 5 })
		silent := time.Now()
		for s.LeaseHolders() == 2 {
			time.Sleep(10 * time.Millisecond)
		}
		if gone := time.Since(silent); gone > ttl+time.Second {
			t.Errorf("B ended %v after its last heartbeat, want within its TTL %v and a period", gone, ttl)
		}
		// Not released: B's leases are still valid in the store, and
		// will expire by themselves.
		valid := 0
		for _, l := range last.Leases {
			if ok, _ := stores["db"].Valid(ctx, l); ok {
				valid++
			}
		}
		if valid == 0 {
			t.Error("the silent holder's leases were released at its end; want them left to expire")
		}
		if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: b.HolderID}); code(t, err) != NotFound {
			t.Errorf("demand of the silent holder: %v, want NotFound", err)
		}
		full := watchFor(t, s, "db", a.HolderID, func(g LeaseGrant) bool { return g.Rate == 1000 })
		if took := time.Since(silent); took > 2*ttl+time.Second {
			t.Errorf("A had the whole capacity %v after B's last heartbeat, want within 2 TTL (%v) and a period", took, 2*ttl)
		}
		if len(full.Leases) != 10 {
			t.Errorf("A's answer at the full rate: %d leases, want 10", len(full.Leases))
		}
		close(stopA)
		wg.Wait()
	})
}

// TestLeasesReleaseAfterAck: the partitions a holder gives up are kept in
// the store until its client acknowledges the answer without them, so
// that no other holder uses them while the client may still be sending at
// the rate it was told.
func TestLeasesReleaseAfterAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newLeaseService(t, Limits{})
		defer s.Shutdown()
		ctx := context.Background()
		join := JoinRequest{Service: "db", Capacity: 1000, Partitions: 10, TTL: 3 * time.Second, Backlog: 1000}
		a, err := s.Join(ctx, join)
		if err != nil {
			t.Fatal(err)
		}
		ga := watchFor(t, s, "db", a.HolderID, func(g LeaseGrant) bool { return g.Rate == 1000 })
		b, err := s.Join(ctx, join)
		if err != nil {
			t.Fatal(err)
		}
		// A's heartbeats acknowledge only what A saw at full rate; the
		// Holder yields half to B, but the store keeps them A's.
		for range 2 {
			if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: a.HolderID, Backlog: 1000, Version: ga.Version}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: b.HolderID, Backlog: 1000}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
		}
		synctest.Wait()
		now, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: b.HolderID, Backlog: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if now.Rate != 0 {
			t.Fatalf("B has %v/s before A acknowledged giving them up, want 0", now.Rate)
		}
		cut, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: a.HolderID, Backlog: 1000, Version: ga.Version})
		if err != nil {
			t.Fatal(err)
		}
		if cut.Rate != 500 {
			t.Fatalf("A's answer: %v/s, want 500 (it yielded half)", cut.Rate)
		}
		// A version not handed out yet acknowledges nothing.
		if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: a.HolderID, Backlog: 1000, Version: cut.Version + 1000}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if g, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: b.HolderID, Backlog: 1000}); err != nil || g.Rate != 0 {
			t.Fatalf("B after A acknowledged a version never handed out: %+v, %v; want 0/s", g, err)
		}
		// A acknowledges the answer at 500/s: released, and B takes them
		// within a round trip.
		acked := time.Now()
		if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: a.HolderID, Backlog: 1000, Version: cut.Version}); err != nil {
			t.Fatal(err)
		}
		watchFor(t, s, "db", b.HolderID, func(g LeaseGrant) bool { return g.Rate == 500 })
		if took := time.Since(acked); took > 100*time.Millisecond {
			t.Errorf("B had its share %v after A's acknowledgement, want within 100ms", took)
		}
	})
}

// TestLeaseLeave: Leave releases the leases at once (the client has
// stopped), and the holder id is refused afterwards.
func TestLeaseLeave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, stores := newLeaseService(t, Limits{})
		defer s.Shutdown()
		ctx := context.Background()
		a, err := s.Join(ctx, JoinRequest{Service: "db", Capacity: 100, Partitions: 4, Backlog: 10})
		if err != nil {
			t.Fatal(err)
		}
		g := watchFor(t, s, "db", a.HolderID, func(g LeaseGrant) bool { return g.Rate == 100 })
		if err := s.Leave(ctx, "db", a.HolderID); err != nil {
			t.Fatal(err)
		}
		for _, l := range g.Leases {
			if ok, _ := stores["db"].Valid(ctx, l); ok {
				t.Errorf("lease %+v still valid after Leave", l)
			}
		}
		if s.LeaseHolders() != 0 {
			t.Errorf("%d holders after Leave, want 0", s.LeaseHolders())
		}
		if err := s.Leave(ctx, "db", a.HolderID); code(t, err) != NotFound {
			t.Errorf("second Leave: %v, want NotFound", err)
		}
	})
}

// TestLeaseHolderIDs: a holder id is the holder's alone: under another
// service, made up, or malformed, it is refused.
func TestLeaseHolderIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newLeaseService(t, Limits{})
		defer s.Shutdown()
		ctx := context.Background()
		a, err := s.Join(ctx, JoinRequest{Service: "db", Capacity: 100, Partitions: 4})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Join(ctx, JoinRequest{Service: "other", Capacity: 100, Partitions: 4}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			service, id string
			want        Code
		}{
			{"other", a.HolderID, NotFound},
			{"db", strings.Repeat("A", 26), NotFound},
			{"db", a.HolderID[:25], Invalid},
			{"db", strings.ToLower(a.HolderID), Invalid},
		} {
			if _, err := s.Demand(ctx, DemandRequest{Service: tc.service, HolderID: tc.id}); code(t, err) != tc.want {
				t.Errorf("Demand(%q, %q): %v, want %v", tc.service, tc.id, err, tc.want)
			}
			if _, err := s.Watch(ctx, tc.service, tc.id, 0, 0); code(t, err) != tc.want {
				t.Errorf("Watch(%q, %q): %v, want %v", tc.service, tc.id, err, tc.want)
			}
			if err := s.Leave(ctx, tc.service, tc.id); code(t, err) != tc.want {
				t.Errorf("Leave(%q, %q): %v, want %v", tc.service, tc.id, err, tc.want)
			}
		}
	})
}

// TestLeaseBounds: every request outside the bounds is refused with a
// message naming the bound.
func TestLeaseBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newLeaseService(t, Limits{MaxHolders: 2, MaxServices: 2, MaxPartitions: 64, MaxCapacity: 1e6, MaxTTL: time.Minute})
		defer s.Shutdown()
		ctx := context.Background()
		ok := JoinRequest{Service: "db", Capacity: 100, Partitions: 4}
		for _, tc := range []struct {
			name string
			edit func(r *JoinRequest)
			want string
		}{
			{"empty service", func(r *JoinRequest) { r.Service = "" }, "service is empty"},
			{"long service", func(r *JoinRequest) { r.Service = strings.Repeat("x", 257) }, "at most 256"},
			{"brace", func(r *JoinRequest) { r.Service = "a{b}" }, "brace"},
			{"not UTF-8", func(r *JoinRequest) { r.Service = "\xff" }, "UTF-8"},
			{"no capacity", func(r *JoinRequest) { r.Capacity = 0 }, "capacity 0"},
			{"NaN capacity", func(r *JoinRequest) { r.Capacity = math.NaN() }, "capacity NaN"},
			{"capacity too large", func(r *JoinRequest) { r.Capacity = 2e6 }, "at most 1e+06"},
			{"no partitions", func(r *JoinRequest) { r.Partitions = 0 }, "partitions 0: want 1 to 64"},
			{"too many partitions", func(r *JoinRequest) { r.Partitions = 65 }, "want 1 to 64"},
			{"short TTL", func(r *JoinRequest) { r.TTL = time.Millisecond }, "ttl 1ms"},
			{"long TTL", func(r *JoinRequest) { r.TTL = time.Hour }, "ttl 1h0m0s"},
			{"negative weight", func(r *JoinRequest) { r.Weight = -1 }, "weight -1"},
			{"heavy", func(r *JoinRequest) { r.Weight = 1001 }, "at most 1000"},
			{"short window", func(r *JoinRequest) { r.Window = time.Microsecond }, "window 1µs"},
			{"negative rate", func(r *JoinRequest) { r.Rate = -1 }, "rate -1"},
			{"infinite rate", func(r *JoinRequest) { r.Rate = math.Inf(1) }, "rate +Inf"},
			{"negative backlog", func(r *JoinRequest) { r.Backlog = -1 }, "backlog -1"},
		} {
			r := ok
			tc.edit(&r)
			_, err := s.Join(ctx, r)
			if code(t, err) != Invalid || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v; want Invalid naming %q", tc.name, err, tc.want)
			}
		}
		if s.LeaseHolders() != 0 {
			t.Fatalf("%d holders after refused joins", s.LeaseHolders())
		}
		a, err := s.Join(ctx, ok)
		if err != nil {
			t.Fatal(err)
		}
		other := ok
		other.Capacity = 200
		if _, err := s.Join(ctx, other); code(t, err) != Invalid || !strings.Contains(err.Error(), "capacity 100 in 4 partitions") {
			t.Errorf("a join at another capacity: %v, want Invalid naming the service's", err)
		}
		if _, err := s.Join(ctx, ok); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Join(ctx, ok); code(t, err) != TooMany || !strings.Contains(err.Error(), "at most 2 per service") {
			t.Errorf("a third holder: %v, want TooMany", err)
		}
		if _, err := s.Join(ctx, JoinRequest{Service: "b", Capacity: 1, Partitions: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Join(ctx, JoinRequest{Service: "c", Capacity: 1, Partitions: 1}); code(t, err) != TooMany || !strings.Contains(err.Error(), "at most 2") {
			t.Errorf("a third service: %v, want TooMany", err)
		}
		if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: a.HolderID, Rate: math.NaN()}); code(t, err) != Invalid {
			t.Errorf("a NaN rate: %v, want Invalid", err)
		}
		if _, err := s.Watch(ctx, "db", a.HolderID, 0, time.Hour); code(t, err) != Invalid || !strings.Contains(err.Error(), "wait 1h0m0s") {
			t.Errorf("a long wait: %v, want Invalid", err)
		}
	})
}

// TestLeaseShutdown: Shutdown ends the holders without releasing, answers
// a waiting Watch at once and refuses what comes after, as Unavailable.
func TestLeaseShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, stores := newLeaseService(t, Limits{})
		ctx := context.Background()
		a, err := s.Join(ctx, JoinRequest{Service: "db", Capacity: 100, Partitions: 4, Backlog: 10})
		if err != nil {
			t.Fatal(err)
		}
		g := watchFor(t, s, "db", a.HolderID, func(g LeaseGrant) bool { return g.Rate == 100 })
		watched := make(chan error, 1)
		go func() {
			_, err := s.Watch(ctx, "db", a.HolderID, g.Version, 10*time.Second)
			watched <- err
		}()
		synctest.Wait()
		s.Shutdown()
		if err := <-watched; code(t, err) != Unavailable {
			t.Errorf("a waiting Watch at shutdown: %v, want Unavailable", err)
		}
		if _, err := s.Join(ctx, JoinRequest{Service: "db", Capacity: 100, Partitions: 4}); code(t, err) != Unavailable {
			t.Errorf("Join after shutdown: %v, want Unavailable", err)
		}
		if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: a.HolderID}); code(t, err) != Unavailable {
			t.Errorf("Demand after shutdown: %v, want Unavailable", err)
		}
		for _, l := range g.Leases {
			if ok, _ := stores["db"].Valid(ctx, l); !ok {
				t.Errorf("lease %+v released at shutdown; want it left to expire", l)
			}
		}
	})
}
