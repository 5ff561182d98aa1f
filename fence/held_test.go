package fence_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/fence"
)

// heldIn is a HeldFunc on a MemoryStore at the instant *now, counting its
// calls: what a Go program sharing the store would write (with
// Store.Holders), on a clock the test steps.
func heldIn(s *concurrency.MemoryStore, now *time.Time, calls *atomic.Int64) fence.HeldFunc {
	return func(_ context.Context, resource string, token uint64) (bool, error) {
		calls.Add(1)
		for _, h := range s.ListAt(*now, resource).Holders {
			if h.Fence == token {
				return true, nil
			}
		}
		return false, nil
	}
}

func send(t *testing.T, h http.Handler, resource string, token uint64) int {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/write", nil)
	if token != 0 {
		fence.Set(r.Header, resource, token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK && w.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("answer %d without a problem+json body", w.Code)
	}
	return w.Code
}

// TestCheckerAdmitsEveryHolder: under a semaphore of limit 2, both
// holders are admitted (a Guard would refuse the older); a holder whose
// permit expired while it was paused is refused although nobody was
// granted after it, and so is a released one; a token never granted too.
func TestCheckerAdmitsEveryHolder(t *testing.T) {
	s := concurrency.NewMemoryStore()
	now := time.Unix(1000, 0)
	var calls atomic.Int64
	c := &fence.Checker{Held: heldIn(s, &now, &calls)}
	ran := 0
	h := c.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))

	a := s.AcquireAt(now, "api", "token-a", 2, 10*time.Second)
	b := s.AcquireAt(now.Add(time.Second), "api", "token-b", 2, 10*time.Second)
	if a == 0 || b != a+1 {
		t.Fatalf("fences %d, %d", a, b)
	}
	for _, tok := range []uint64{b, a, b} {
		if code := send(t, h, "api", tok); code != http.StatusOK {
			t.Errorf("token %d of a holder: %d, want 200", tok, code)
		}
	}
	if code := send(t, h, "other", a); code != http.StatusConflict {
		t.Errorf("token %d of another resource: %d, want 409", a, code)
	}
	// a pauses past its TTL; b renewed. Nobody else is granted.
	now = now.Add(10 * time.Second)
	if !s.RenewAt(now, "api", "token-b", 10*time.Second) {
		t.Fatal("renewal of b failed")
	}
	if code := send(t, h, "api", a); code != http.StatusConflict {
		t.Errorf("token of a permit expired: %d, want 409", code)
	}
	if code := send(t, h, "api", b); code != http.StatusOK {
		t.Errorf("token of a renewed permit: %d, want 200", code)
	}
	s.ReleaseToken("api", "token-b")
	if code := send(t, h, "api", b); code != http.StatusConflict {
		t.Errorf("token of a released permit: %d, want 409", code)
	}
	if code := send(t, h, "api", 99); code != http.StatusConflict {
		t.Errorf("token never granted: %d, want 409", code)
	}
	if code := send(t, h, "api", 0); code != http.StatusPreconditionRequired {
		t.Errorf("no token: %d, want 428", code)
	}
	if ran != 4 {
		t.Errorf("the handler ran %d times, want 4 (the admitted requests)", ran)
	}
	if got := calls.Load(); got != 8 {
		t.Errorf("Held was called %d times, want 8: once per check without CacheFor", got)
	}
}

// TestCheckerCache: with CacheFor, a token seen held is admitted without
// asking for CacheFor, and no longer: a permit that lapsed is admitted
// up to CacheFor late, then refused. A refusal is never cached.
func TestCheckerCache(t *testing.T) {
	s := concurrency.NewMemoryStore()
	now := time.Unix(1000, 0)
	var calls atomic.Int64
	c := &fence.Checker{Held: heldIn(s, &now, &calls), CacheFor: time.Second, Now: func() time.Time { return now }}
	ctx := context.Background()
	f := s.AcquireAt(now, "api", "token-a", 1, 2*time.Second)
	if err := c.Check(ctx, "api", f); err != nil {
		t.Fatal(err)
	}
	now = now.Add(500 * time.Millisecond)
	if err := c.Check(ctx, "api", f); err != nil || calls.Load() != 1 {
		t.Fatalf("Check within CacheFor = %v after %d calls of Held, want nil after 1", err, calls.Load())
	}
	s.ReleaseToken("api", "token-a")
	now = now.Add(400 * time.Millisecond) // released, but seen held 0.9 s ago
	if err := c.Check(ctx, "api", f); err != nil {
		t.Fatalf("Check within CacheFor of a permit released since = %v, want nil (the cache's cost)", err)
	}
	now = now.Add(100 * time.Millisecond) // CacheFor is over
	if err := c.Check(ctx, "api", f); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("Check past CacheFor of a released permit = %v, want ErrNotHeld", err)
	}
	if err := c.Check(ctx, "api", f); !errors.Is(err, fence.ErrNotHeld) || calls.Load() != 3 {
		t.Fatalf("Check again = %v after %d calls of Held, want ErrNotHeld after 3 (refusals are not cached)", err, calls.Load())
	}
}

// TestCheckerFailsClosed: when Held fails, the request is refused with
// 503 and the handler does not run.
func TestCheckerFailsClosed(t *testing.T) {
	c := &fence.Checker{Held: func(context.Context, string, uint64) (bool, error) { return false, errors.New("store unreachable") }}
	ran := false
	h := c.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	if code := send(t, h, "api", 3); code != http.StatusServiceUnavailable || ran {
		t.Errorf("Held failing: %d (handler ran: %v), want 503 and no handler", code, ran)
	}
	r := httptest.NewRequest(http.MethodPost, "/write", nil)
	r.Header.Set(fence.Header, "03")
	r.Header.Set(fence.ResourceHeader, "api")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest {
		t.Errorf("malformed token: %d, want 400", w.Code)
	}
}
