package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/storetest"
)

func TestStoretestSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a Sentinel")
	}
	ss := redistest.Sentinel(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) ratelimit.Store {
		return newTestStore(t, ss.Addrs(), now, func(o *testConfig) { o.Client.MasterName = redistest.SentinelMaster })
	})
}

// TestSentinelFailover: when the Sentinel promotes the replica, decisions
// follow it to the new master by themselves and go on from the replicated
// state; meanwhile they get the rule's failure policy, never an error.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a Sentinel")
	}
	ss := redistest.Sentinel(t)
	s := newTestStore(t, ss.Addrs(), nil, func(o *testConfig) {
		o.Client.MasterName = redistest.SentinelMaster
		o.BreakerCooldown = 100 * time.Millisecond
	})
	r := &ratelimit.Rule{Name: "r", Quota: 10, Period: time.Hour, Failure: ratelimit.FailClosed}
	ctx := context.Background()
	decide := func() ratelimit.Decision {
		t.Helper()
		ds, err := s.Decide(ctx, nil, []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}})
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		return ds[0]
	}
	for want := int64(9); want >= 7; want-- {
		if d := decide(); d.Reason != ratelimit.ReasonOK || d.Remaining != want {
			t.Fatalf("before the failover: %+v, want remaining %d", d, want)
		}
	}
	if err := ss.Master.Client().Do(ctx, "WAIT", 1, 5000).Err(); err != nil { // the replica has the state
		t.Fatal(err)
	}
	ss.Failover()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	failClosed := 0
	for {
		d := decide()
		if d.Reason == ratelimit.ReasonOK {
			if d.Remaining != 6 {
				t.Fatalf("first decision on the new master: %+v, want remaining 6", d)
			}
			break
		}
		if d.Reason != ratelimit.ReasonFailClosed {
			t.Fatalf("during the failover: %+v, want ok or fail_closed", d)
		}
		failClosed++
		if time.Now().After(deadline) {
			t.Fatalf("decisions never reached the new master (%d fail_closed)", failClosed)
		}
		<-tick.C
	}
	t.Logf("%d decisions by the failure policy during the failover", failClosed)
}

// TestSentinelAuth: a Sentinel that requires a password is reached with
// SentinelPassword, apart from the data nodes' credentials; without it the
// store cannot find the master and the rule's failure policy decides.
func TestSentinelAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a Sentinel")
	}
	ss := redistest.SentinelAuth(t, "sentinel-s3cret")
	r := &ratelimit.Rule{Name: "r", Quota: 10, Period: time.Hour, Failure: ratelimit.FailClosed}
	items := []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}
	for _, c := range []struct {
		password string
		want     ratelimit.Reason
	}{{"sentinel-s3cret", ratelimit.ReasonOK}, {"", ratelimit.ReasonFailClosed}, {"wrong", ratelimit.ReasonFailClosed}} {
		s := newTestStore(t, ss.Addrs(), nil, func(o *testConfig) {
			o.Client.MasterName, o.Client.SentinelPassword = redistest.SentinelMaster, c.password
		})
		ds, err := s.Decide(t.Context(), nil, items)
		if err != nil {
			t.Fatalf("Sentinel password %q: %v", c.password, err)
		}
		if ds[0].Reason != c.want {
			t.Errorf("Sentinel password %q: %+v, want %v", c.password, ds[0], c.want)
		}
		if errs := s.Stats().Errors; (errs > 0) != (c.want != ratelimit.ReasonOK) {
			t.Errorf("Sentinel password %q: %d errors", c.password, errs)
		}
	}
}
