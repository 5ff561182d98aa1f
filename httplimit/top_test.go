package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/topk"
)

// TestTopAtStoreClock: with a memory store, the trackers record each
// decision at the instant the store decided it, read once from the store's
// clock, and read no clock of their own: a denied key shows as near its
// limit, whole again within the rule's period, and the trackers' clock is
// read only by Snapshot.
func TestTopAtStoreClock(t *testing.T) {
	clock := time.Now().Add(-24 * time.Hour)
	reads := 0
	now := func() time.Time { reads++; return clock }
	store := memstore.New(memstore.Options{JanitorInterval: -1, Now: func() time.Time { return clock }})
	defer store.Close()
	m, err := httplimit.New(httplimit.Options{
		Store:    store,
		Policies: []httplimit.Policy{{Rule: ratelimit.Rule{Name: "per_ip", Quota: 1, Period: time.Minute}, Keys: []httplimit.Key{httplimit.ByIP()}}},
		Top:      &topk.Options{Now: now},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	codes := []int{}
	for range 2 {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.7:4000"
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	if codes[0] != 200 || codes[1] != http.StatusTooManyRequests {
		t.Fatalf("answers %v, want 200 then 429", codes)
	}
	if reads != 0 {
		t.Errorf("the trackers read their clock %d times deciding 2 requests, want 0", reads)
	}
	ls := m.TopLimits()
	if len(ls) != 1 {
		t.Fatalf("%d limits tracked, want 1", len(ls))
	}
	sn := ls[0].Tracker.Snapshot(0)
	if len(sn.Near) != 1 || sn.Near[0].Key != "192.0.2.7" || sn.Near[0].WholeIn <= 0 || sn.Near[0].WholeIn > time.Minute+time.Millisecond {
		t.Errorf("near = %+v, want 192.0.2.7 whole again within the minute (to the millisecond)", sn.Near)
	}
	if sn.Decisions != 2 || sn.Denied != 1 {
		t.Errorf("%d decisions, %d denied; want 2 and 1", sn.Decisions, sn.Denied)
	}
}
