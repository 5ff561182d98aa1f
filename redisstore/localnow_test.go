package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// TestLocalNow: Options.LocalNow moves the clock of what the store
// decides itself, never Redis's. A fixed window of 10 an hour decided
// by Redis ends where the server's clock says; with Redis stopped, the
// local failure mode decides it at LocalNow's instant, 37 min 13 s into
// an hour, so the window ends exactly 22 min 47 s later.
func TestLocalNow(t *testing.T) {
	srv := redistest.Standalone(t)
	const timeout = 50 * time.Millisecond
	at := time.Unix(1_800_000_000+37*60+13, 0) // 1,800,000,000 is a whole hour
	s := newStoreOn(t, ClientOptions{Addrs: []string{srv.Addr()}, Timeout: timeout}, Options{
		Timeout: timeout, BreakerThreshold: 1, BreakerCooldown: time.Hour,
		LocalNow: func() time.Time { return at },
	})
	r := &ratelimit.Rule{Name: "local", Algorithm: ratelimit.FixedWindow, Quota: 10, Period: time.Hour, Failure: ratelimit.FailLocal}
	item := []ratelimit.Item{{Key: "k", Rule: r, Cost: 1}}

	now := time.Now()
	ds, err := s.Decide(context.Background(), nil, item)
	if err != nil || ds[0].Reason != ratelimit.ReasonOK {
		t.Fatalf("with Redis up: %+v, %v", ds, err)
	}
	_, end := r.Window(now)
	if want := end.Sub(now); ds[0].ResetAfter < want-5*time.Second || ds[0].ResetAfter > want+5*time.Second {
		t.Errorf("Redis's window ends in %v, want about %v (the server's clock, not LocalNow's)", ds[0].ResetAfter, want)
	}

	srv.Stop()
	for range 3 {
		if ds, err = s.Decide(context.Background(), nil, item); err == nil && ds[0].Reason == ratelimit.ReasonLocal {
			break
		}
	}
	if err != nil || ds[0].Reason != ratelimit.ReasonLocal {
		t.Fatalf("with Redis stopped: %+v, %v", ds, err)
	}
	if want := 22*time.Minute + 47*time.Second; ds[0].ResetAfter != want {
		t.Errorf("local's window ends in %v, want %v (LocalNow's instant)", ds[0].ResetAfter, want)
	}
}
