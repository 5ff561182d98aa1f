// Package fence is the protected side's check of fencing tokens: an HTTP
// middleware, for the service that a semaphore or a capacity lease
// protects, that refuses the requests of a holder that has lost its permit
// or lease to another.
//
// # The model
//
// A holder's own checks cannot be exact: a process may pause (a garbage
// collection, SIGSTOP, a virtual machine migrated) between checking that
// it still holds its permit and sending its request, for longer than the
// permit lives, and another process may have been granted the permit in
// the meantime. So every grant carries a fencing token, a number that the
// store takes in the same atomic step as the grant and that increases with
// every grant of the same resource: concurrency.Permit.Fence for a
// semaphore (the resource is the semaphore's name), lease.Grant.Epoch for
// a capacity lease (the resource names the service and the partition). The
// holder sends it with each request, and the protected service remembers,
// per resource, the highest token it has accepted, and refuses a request
// that carries a lower one: it comes from a holder whose grant was
// followed by another's. A request carrying the highest token is accepted
// (a holder sends many requests under one grant), and so is one carrying a
// higher token, which becomes the highest.
//
// # On the wire
//
// Two header fields carry the token and its resource (Set writes them, Parse
// reads them; any language can, by these rules):
//
//   - Sluice-Fencing-Token (Header): the token in decimal, at least 1 and
//     at most 2⁶⁴−1, without sign, leading zeros or spaces;
//   - Sluice-Fencing-Resource (ResourceHeader): the resource, 1 to
//     MaxResourceLen bytes, percent-encoded so that any name, in any
//     bytes, can be sent: the receiver takes each %XX as the byte XX and
//     every other visible ASCII character as itself ('+' included); a
//     space, a control character or a byte above 0x7E is refused. Set
//     escapes every byte but letters, digits and -._~$&+:=@
//     (url.PathEscape).
//
// Each field must appear once. A client sets them from a semaphore's
// permit as
//
//	fence.Set(req.Header, sem.Name(), permit.Fence())
//
// and from a capacity lease as
//
//	fence.Set(req.Header, fmt.Sprintf("%s/%d", service, l.Partition), l.Epoch)
//
// # The check
//
// A Guard keeps the highest token per resource, and its Middleware
// answers, without calling the handler:
//
//   - 428 Precondition Required when either field is missing;
//   - 400 Bad Request when one is malformed or repeated;
//   - 409 Conflict when the token is lower than the highest accepted for
//     the resource: the request conflicts with the resource's current
//     holder.
//
// Each answer has a problem+json body (RFC 9457) whose detail says why.
//
// A Checker is the other check, for semaphores of any limit: instead of
// keeping the highest token, it asks whoever keeps the permits whether the
// request's token is held now (a HeldFunc: concurrency.Store's Holders, or
// sluice serve's POST /v1/semaphores/holders), like a lock service's
// sequencer check, and its Middleware answers 409 Conflict for a token
// whose permit expired or was released, and 503 when it cannot tell. It
// costs a round trip per check, or admits a lapsed permit for up to its
// CacheFor; see Checker.
//
// # What it guarantees, and its limits
//
// A request whose token is lower than one the Guard has accepted before
// is refused. That is all, and it holds only where it is checked: fencing
// protects only a downstream that checks it, and only the requests that
// pass through the check. More precisely:
//
//   - the check comes before the handler, and is not atomic with what the
//     handler does: a request admitted with token 5 may still be running
//     when one with token 6 is admitted. A handler whose effect must be
//     fenced exactly makes the same comparison in the same transaction as
//     its write (a conditional write in its database), with the token
//     Parse reads;
//   - a token is per resource: tokens of different semaphores, or of a
//     semaphore and a lease, are unrelated, and the resource a service
//     checks must be the one whose grant the token came from;
//   - a Guard fences a resource that one holder at a time may use: a
//     semaphore of limit 1, a lease's partition. Under a higher limit
//     several holders are valid at once, each with its own token, and a
//     Guard, which keeps only the highest, refuses all but the newest;
//   - a Guard remembers in memory: a service restarted (or a Guard
//     created) without memory accepts any token once for each resource,
//     the first it sees becoming the highest; so does a Guard that has
//     forgotten a resource because it remembers at most MaxResources;
//   - a store that loses its data (a Redis restart without persistence)
//     may grant a token again from 1; a Guard then refuses the new holders
//     until their tokens pass the highest it remembers.
//
// This package depends on the standard library only.
package fence

import (
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
)

// The header fields that carry a fencing token and its resource.
const (
	// Header carries the token, in decimal.
	Header = "Sluice-Fencing-Token"
	// ResourceHeader carries the resource, percent-encoded.
	ResourceHeader = "Sluice-Fencing-Resource"
)

// MaxResourceLen is the longest resource, in bytes (decoded), that Parse
// accepts.
const MaxResourceLen = 256

// maxTokenLen is the number of digits of the largest token, 2⁶⁴−1.
const maxTokenLen = len("18446744073709551615")

// Errors of Parse and Guard.Admit.
var (
	// ErrMissing is returned (wrapped) by Parse when a field is absent.
	ErrMissing = errors.New("fence: missing fencing header")
	// ErrMalformed is returned (wrapped) by Parse for a field that breaks
	// the rules of the package documentation, or that appears twice.
	ErrMalformed = errors.New("fence: malformed fencing header")
	// ErrStale is returned (wrapped) by Guard.Admit for a token lower than
	// the highest accepted for its resource.
	ErrStale = errors.New("fence: stale fencing token")
)

// Set writes token and resource into h, replacing any value they had, in
// the form Parse reads. A resource longer than MaxResourceLen, or empty,
// is written all the same, and refused by the receiving side's Parse.
func Set(h http.Header, resource string, token uint64) {
	h[Header] = []string{strconv.FormatUint(token, 10)}
	h[ResourceHeader] = []string{url.PathEscape(resource)}
}

// Parse reads the fencing token and its resource from h. It returns an
// error wrapping ErrMissing when either field is absent, and one wrapping
// ErrMalformed when either appears more than once or breaks the rules of
// the package documentation; it reads no more than a few hundred bytes of
// a field, however long.
func Parse(h http.Header) (resource string, token uint64, err error) {
	tv, err := one(h, Header)
	if err != nil {
		return "", 0, err
	}
	rv, err := one(h, ResourceHeader)
	if err != nil {
		return "", 0, err
	}
	if token, err = ParseToken(tv); err != nil {
		return "", 0, err
	}
	if resource, err = ParseResource(rv); err != nil {
		return "", 0, err
	}
	return resource, token, nil
}

// one returns the one value of h's field name.
func one(h http.Header, name string) (string, error) {
	switch v := h.Values(name); len(v) {
	case 0:
		return "", fmt.Errorf("%w: no %s", ErrMissing, name)
	case 1:
		return v[0], nil
	default:
		return "", fmt.Errorf("%w: %d values of %s", ErrMalformed, len(v), name)
	}
}

// ParseToken parses the value of the Sluice-Fencing-Token field: a decimal
// number from 1 to 2⁶⁴−1 without sign, leading zeros or spaces. Anything
// else is an error wrapping ErrMalformed.
func ParseToken(s string) (uint64, error) {
	if len(s) == 0 || len(s) > maxTokenLen || s[0] == '0' {
		return 0, fmt.Errorf("%w: token %.*q", ErrMalformed, maxTokenLen+1, s)
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: token %.*q", ErrMalformed, maxTokenLen+1, s)
		}
	}
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: token %q above 2^64-1", ErrMalformed, s)
	}
	return t, nil
}

// ParseResource decodes the value of the Sluice-Fencing-Resource field:
// percent-encoded bytes, 1 to MaxResourceLen of them once decoded. A value
// longer than any such encoding, with a byte that is not visible ASCII or
// with a broken escape is an error wrapping ErrMalformed.
func ParseResource(s string) (string, error) {
	if len(s) == 0 || len(s) > 3*MaxResourceLen {
		return "", fmt.Errorf("%w: resource of %d bytes", ErrMalformed, len(s))
	}
	for i := range len(s) {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return "", fmt.Errorf("%w: resource with byte %#x", ErrMalformed, s[i])
		}
	}
	r, err := url.PathUnescape(s)
	if err != nil {
		return "", fmt.Errorf("%w: resource: %v", ErrMalformed, err)
	}
	if len(r) > MaxResourceLen {
		return "", fmt.Errorf("%w: resource of %d bytes, above %d", ErrMalformed, len(r), MaxResourceLen)
	}
	return r, nil
}

// DefaultMaxResources is the number of resources a Guard remembers when
// its MaxResources is 0.
const DefaultMaxResources = 10_000

// A Guard remembers, per resource, the highest fencing token it has
// accepted, and refuses lower ones (see the package documentation).
//
// It remembers at most MaxResources resources (DefaultMaxResources when 0);
// beyond that, it forgets the one least recently seen, which then accepts
// any token once, as after a restart. Memory is bounded by MaxResources ×
// (MaxResourceLen + about 100 bytes).
//
// The zero value is ready to use. MaxResources must not change once the
// Guard is in use. A Guard is safe for concurrent use; Admit takes one
// lock.
type Guard struct {
	// MaxResources bounds the number of resources remembered.
	MaxResources int

	mu        sync.Mutex
	highest   map[string]*list.Element // of *entry, in lru
	lru       list.List                // most recently seen first
	refused   uint64
	forgotten uint64
}

type entry struct {
	resource string
	highest  uint64
}

// Stats are a Guard's counts since it was made.
type Stats struct {
	Resources int    // resources remembered now
	Refused   uint64 // stale tokens refused
	Forgotten uint64 // resources forgotten to stay within MaxResources
}

// Stats returns g's counts.
func (g *Guard) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{Resources: len(g.highest), Refused: g.refused, Forgotten: g.forgotten}
}

// Highest returns the highest token accepted for resource, and whether g
// remembers one.
func (g *Guard) Highest(resource string) (uint64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.highest[resource]
	if !ok {
		return 0, false
	}
	return e.Value.(*entry).highest, true
}

// Admit accepts token for resource if it is at least the highest accepted
// for resource, and then remembers it as the highest; otherwise it returns
// an error wrapping ErrStale and remembers nothing new.
func (g *Guard) Admit(resource string, token uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if el, ok := g.highest[resource]; ok {
		g.lru.MoveToFront(el)
		e := el.Value.(*entry)
		if token < e.highest {
			g.refused++
			return fmt.Errorf("%w: token %d of resource %q is below %d, the highest accepted", ErrStale, token, resource, e.highest)
		}
		e.highest = token
		return nil
	}
	if g.highest == nil {
		g.highest = make(map[string]*list.Element)
	}
	g.highest[resource] = g.lru.PushFront(&entry{resource: resource, highest: token})
	limit := g.MaxResources
	if limit <= 0 {
		limit = DefaultMaxResources
	}
	for len(g.highest) > limit {
		delete(g.highest, g.lru.Remove(g.lru.Back()).(*entry).resource)
		g.forgotten++
	}
	return nil
}

// Middleware returns a handler that calls next only for a request whose
// fencing token Admit accepts; it answers the others itself, with 428, 400
// or 409 (see the package documentation).
func (g *Guard) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resource, token, err := Parse(r.Header)
		if err == nil {
			err = g.Admit(resource, token)
		}
		switch {
		case err == nil:
			next.ServeHTTP(w, r)
		case errors.Is(err, ErrMissing):
			writeProblem(w, http.StatusPreconditionRequired, err)
		case errors.Is(err, ErrStale):
			writeProblem(w, http.StatusConflict, err)
		default:
			writeProblem(w, http.StatusBadRequest, err)
		}
	})
}

// writeProblem answers status with a problem+json body whose detail is
// err's message.
func writeProblem(w http.ResponseWriter, status int, err error) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{"about:blank", http.StatusText(status), status, err.Error()})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
