package coord

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestHolders: Holders lists the permits held by fence, weight, time held
// and time left, never an id, and this process's waiters; a name out of
// bounds is Invalid.
func TestHolders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newService(t, Limits{})
		ctx := context.Background()
		g1, err := s.Acquire(ctx, AcquireRequest{Name: "api", Limit: 3, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // fake time: g1 is held 2 s longer than g2
		g2, err := s.Acquire(ctx, AcquireRequest{Name: "api", Limit: 3, Weight: 2, TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		waiter := make(chan error, 1)
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			_, err := s.Acquire(wctx, AcquireRequest{Name: "api", Limit: 3, Wait: 10 * time.Second})
			waiter <- err
		}()
		synctest.Wait()
		h, err := s.Holders(ctx, "api")
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "api" || len(h.Holders) != 2 || h.Waiting != 1 {
			t.Fatalf("Holders = %+v, want 2 holders and 1 waiting", h)
		}
		if p := h.Holders[0]; p.Fence != g1.Fence || p.Weight != 1 || p.HeldFor != 2*time.Second || p.ExpiresIn != 8*time.Second {
			t.Errorf("first holder = %+v, want fence %d, weight 1, held 2s, 8s left", p, g1.Fence)
		}
		if p := h.Holders[1]; p.Fence != g2.Fence || p.Weight != 2 || p.HeldFor != 0 || p.ExpiresIn != 5*time.Second {
			t.Errorf("second holder = %+v, want fence %d, weight 2, held 0, 5s left", p, g2.Fence)
		}
		if !h.Holds(g1.Fence) || !h.Holds(g2.Fence) || h.Holds(g2.Fence+1) {
			t.Errorf("Holds(%d, %d, %d) wrong for %+v", g1.Fence, g2.Fence, g2.Fence+1, h)
		}
		if shown := fmt.Sprintf("%+v", h); strings.Contains(shown, g1.PermitID) || strings.Contains(shown, g2.PermitID) {
			t.Errorf("Holders shows a permit id: %s", shown)
		}
		cancel()
		<-waiter
		time.Sleep(5 * time.Second) // g2 expires
		if h, err := s.Holders(ctx, "api"); err != nil || len(h.Holders) != 1 || h.Holds(g2.Fence) || h.Waiting != 0 {
			t.Errorf("Holders after g2 expired = %+v, %v; want g1 alone, nobody waiting", h, err)
		}
		if _, err := s.Holders(ctx, ""); code(t, err) != Invalid {
			t.Errorf("Holders of the empty name: %v, want Invalid", err)
		}
	})
}

// TestStatus: Status shows the names acquired through the Service, the
// most recently acquired first, at most MaxSeen, each with its limit,
// holders and waiters; a refused acquire counts as seen, an invalid one
// does not.
func TestStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newService(t, Limits{MaxSeen: 2})
		ctx := context.Background()
		if st := s.Status(ctx); len(st.Semaphores) != 0 {
			t.Fatalf("Status before any acquire = %+v", st)
		}
		for _, name := range []string{"a", "b", "c"} {
			if _, err := s.Acquire(ctx, AcquireRequest{Name: name, Limit: 1}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Acquire(ctx, AcquireRequest{Name: "b", Limit: 1}); code(t, err) != NoPermit {
			t.Fatalf("second acquire of b: %v, want NoPermit", err)
		}
		if _, err := s.Acquire(ctx, AcquireRequest{Name: "d", Limit: 0}); code(t, err) != Invalid {
			t.Fatalf("acquire of limit 0: %v, want Invalid", err)
		}
		go func() { _, _ = s.Acquire(ctx, AcquireRequest{Name: "b", Limit: 1, Wait: time.Second}) }()
		synctest.Wait()
		st := s.Status(ctx)
		if len(st.Semaphores) != 2 || st.Semaphores[0].Name != "b" || st.Semaphores[1].Name != "c" {
			t.Fatalf("Status = %+v, want b then c (a forgotten beyond MaxSeen, d never valid)", st)
		}
		b := st.Semaphores[0]
		if b.Limit != 1 || b.Held != 1 || len(b.Holders) != 1 || b.Holders[0].Fence != 1 || b.Waiting != 1 || b.Queued != 0 || b.Error != "" {
			t.Errorf("b = %+v, want limit 1, one holder of fence 1 (held 1), one waiting, none queued", b)
		}
		if h := b.Holders[0]; h.HeldForMS == nil || *h.HeldForMS != 0 || h.ExpiresInMS != DefaultTTL.Milliseconds() {
			t.Errorf("b's holder = %+v, want held 0 ms, expiring in the default TTL", h)
		}
		synctest.Wait()
		time.Sleep(time.Second) // the waiter gives up
		synctest.Wait()
	})
}
