package fence

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// ErrNotHeld is returned (wrapped) by Checker.Check for a token whose
// permit is not held now.
var ErrNotHeld = errors.New("fence: fencing token not held")

// A HeldFunc reports whether the permit of fencing token token of a
// semaphore named resource is held now (granted, not expired, not
// released). It asks whoever keeps the permits: a concurrency.Store's
// Holders in a Go program that shares the store, or sluice serve's
// coordination API (POST /v1/semaphores/holders, gRPC
// SemaphoreService.Holders), whose answer lists the fences held. An error
// means it could not tell.
type HeldFunc func(ctx context.Context, resource string, token uint64) (bool, error)

// DefaultMaxCached is the number of answers a Checker caches when its
// MaxCached is 0.
const DefaultMaxCached = 10_000

// A Checker admits a request only while the permit whose fencing token it
// carries is held: the sequencer check of a lock service, for semaphores
// of any limit. Where a Guard keeps the highest token and so fences what
// one holder at a time may use, a Checker asks Held about each token, so
// every valid holder of a semaphore of limit n is admitted, and a holder
// whose permit expired (it paused past its TTL, its renewals failed) is
// refused as soon as the store has let it go, whether or not anyone was
// granted after it.
//
// # What it guarantees, and its limits
//
// A request is admitted only if Held reported its token held at some
// instant no more than CacheFor before the check (at the check itself
// when CacheFor is 0). So:
//
//   - it costs one round trip to Held per check, unless CacheFor lets it
//     reuse an answer: then a permit that lapses is still admitted for up
//     to CacheFor (what a cache costs), and the round trips fall to one
//     per token and CacheFor;
//   - the check comes before the handler and is not atomic with it: a
//     permit may lapse, and another be granted, while an admitted request
//     runs. A handler that must be exact compares in its write's own
//     transaction, or keeps its work shorter than the permits' TTL;
//   - a token is per resource, as for a Guard, and the resource must be
//     the semaphore's name;
//   - when Held fails, the request is refused (503 from Middleware):
//     a Checker fails closed;
//   - a store that loses its data (a Redis restart without persistence)
//     may grant a token again: a request of the old holder with that
//     number is then admitted while the new holder holds it.
//
// A "not held" answer is never cached: a token is granted once, so it
// cannot become held again, and refusing it costs one round trip.
//
// The zero value is not usable: set Held. A Checker is safe for
// concurrent use; MaxCached and CacheFor must not change once it is in
// use.
type Checker struct {
	// Held answers whether a token is held. Required.
	Held HeldFunc
	// CacheFor is how long a "held" answer is trusted without asking
	// again; 0 asks every time.
	CacheFor time.Duration
	// MaxCached bounds the answers cached (DefaultMaxCached when 0);
	// beyond it the cache is emptied.
	MaxCached int
	// Now is the cache's clock; nil means time.Now.
	Now func() time.Time

	mu     sync.Mutex
	cached map[cacheKey]time.Time // when each token was last seen held
}

type cacheKey struct {
	resource string
	token    uint64
}

// Check returns nil when the permit of token of resource is held (or was
// seen held within CacheFor), an error wrapping ErrNotHeld when it is
// not, and Held's error when Held fails.
func (c *Checker) Check(ctx context.Context, resource string, token uint64) error {
	now := c.now()
	k := cacheKey{resource, token}
	if c.CacheFor > 0 {
		c.mu.Lock()
		at, ok := c.cached[k]
		c.mu.Unlock()
		if ok && now.Sub(at) < c.CacheFor {
			return nil
		}
	}
	held, err := c.Held(ctx, resource, token)
	if err != nil {
		return fmt.Errorf("fence: is token %d of %q held? %w", token, resource, err)
	}
	if !held {
		c.forget(k)
		return fmt.Errorf("%w: token %d of resource %q: its permit expired or was released", ErrNotHeld, token, resource)
	}
	if c.CacheFor > 0 {
		c.remember(k, now)
	}
	return nil
}

func (c *Checker) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Checker) remember(k cacheKey, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.MaxCached
	if limit <= 0 {
		limit = DefaultMaxCached
	}
	if c.cached == nil || len(c.cached) >= limit {
		c.cached = make(map[cacheKey]time.Time)
	}
	c.cached[k] = at
}

func (c *Checker) forget(k cacheKey) {
	c.mu.Lock()
	delete(c.cached, k)
	c.mu.Unlock()
}

// Middleware returns a handler that calls next only for a request whose
// fencing token Check accepts. It answers the others itself, with a
// problem+json body: 428 when a field is missing, 400 when one is
// malformed, 409 Conflict when the token's permit is not held, and 503
// when Held failed (the request is not admitted).
func (c *Checker) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resource, token, err := Parse(r.Header)
		if err == nil {
			err = c.Check(r.Context(), resource, token)
		}
		switch {
		case err == nil:
			next.ServeHTTP(w, r)
		case errors.Is(err, ErrMissing):
			writeProblem(w, http.StatusPreconditionRequired, err)
		case errors.Is(err, ErrNotHeld):
			writeProblem(w, http.StatusConflict, err)
		case errors.Is(err, ErrMalformed):
			writeProblem(w, http.StatusBadRequest, err)
		default:
			writeProblem(w, http.StatusServiceUnavailable, err)
		}
	})
}
