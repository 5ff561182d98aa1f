package coord

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestLeaseStatus: the status lists the leased services with remote
// holders, the most recently joined first and at most MaxSeen of them
// (and of each one's holders, counting them all), each holder by its
// member id with its weight, time since joining, rate, stated demand,
// leases, validity and time since its heartbeat; no holder id appears in
// it, and a service whose holders all left is no longer listed.
func TestLeaseStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newLeaseService(t, Limits{MaxSeen: 2})
		defer s.Shutdown()
		ctx := context.Background()
		if st := s.Status(ctx); st.Leases == nil || len(st.Leases) != 0 {
			t.Fatalf("leases of a fresh service: %#v, want an empty list", st.Leases)
		}
		var ids []string
		join := func(req JoinRequest) LeaseGrant {
			t.Helper()
			g, err := s.Join(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, g.HolderID)
			return g
		}
		join(JoinRequest{Service: "old", Capacity: 10, Partitions: 2, TTL: 10 * time.Second})
		first := join(JoinRequest{Service: "db", Capacity: 100, Partitions: 4, Weight: 2, TTL: 10 * time.Second})
		join(JoinRequest{Service: "db", Capacity: 100, Partitions: 4, TTL: 10 * time.Second})
		last := join(JoinRequest{Service: "db", Capacity: 100, Partitions: 4, TTL: 5 * time.Second})
		join(JoinRequest{Service: "api", Capacity: 50, Partitions: 5, TTL: 10 * time.Second})
		time.Sleep(3 * time.Second) // fake time: the holders' ages, within their TTL
		if _, err := s.Demand(ctx, DemandRequest{Service: "db", HolderID: last.HolderID, Rate: 40, Backlog: 7}); err != nil {
			t.Fatal(err)
		}
		g := watchFor(t, s, "db", last.HolderID, func(g LeaseGrant) bool { return g.Rate > 0 })
		synctest.Wait()
		st := s.Status(ctx)
		if len(st.Leases) != 2 || st.Leases[0].Service != "api" || st.Leases[1].Service != "db" {
			t.Fatalf("leased services %+v, want api then db (old beyond MaxSeen)", st.Leases)
		}
		db := st.Leases[1]
		if db.Capacity != 100 || db.Partitions != 4 || db.HolderCount != 3 || len(db.Holders) != 2 {
			t.Fatalf("db: %+v, want capacity 100 in 4, 3 holders, 2 listed", db)
		}
		h := db.Holders[0] // the last joined
		if !strings.HasPrefix(h.Member, "remote-") || h.Weight != 1 || h.JoinedForMS < 3000 || h.DemandRate != 40 || h.Backlog != 7 ||
			h.Rate != g.Rate || h.Leases != len(g.Leases) || h.Leases == 0 || h.ValidForMS <= 0 || h.ValidForMS > 5000 || h.HeartbeatAgoMS > h.JoinedForMS-3000 {
			t.Errorf("the last holder of db: %+v, want its demand (40, 7), its grant %+v, joined 3 s before its heartbeat", h, g)
		}
		if o := db.Holders[1]; o.Member == h.Member || !strings.HasPrefix(o.Member, "remote-") || o.HeartbeatAgoMS < 3000 || o.DemandRate != 0 {
			t.Errorf("the second holder of db: %+v", o)
		}
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if strings.Contains(string(b), id) {
				t.Errorf("the status shows holder id %s: %s", id, b)
			}
		}
		if !strings.Contains(string(b), `"heartbeat_ago_ms"`) || !strings.Contains(string(b), `"holder_count":3`) {
			t.Errorf("status JSON: %s", b)
		}
		// The first joined of db leaves; api's only holder too.
		if err := s.Leave(ctx, "db", first.HolderID); err != nil {
			t.Fatal(err)
		}
		if err := s.Leave(ctx, "api", ids[4]); err != nil {
			t.Fatal(err)
		}
		st = s.Status(ctx)
		if len(st.Leases) != 2 || st.Leases[0].Service != "db" || st.Leases[0].HolderCount != 2 || len(st.Leases[0].Holders) != 2 || st.Leases[1].Service != "old" {
			t.Errorf("after the leaves: %+v, want db with 2 holders, then old", st.Leases)
		}
	})
}
