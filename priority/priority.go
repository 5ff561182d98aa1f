package priority

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// A Priority says how much a request matters when the server must refuse
// some. Shedding takes the lowest priority first: Sheddable, then Low,
// Normal, High and, last of all, Critical. The zero value is Normal, so a
// request that carries no priority is an ordinary one.
type Priority int8

// The priorities, lowest first.
const (
	// Sheddable is work that may be refused whenever the server is busy:
	// prefetches, batch jobs, retries of best-effort work.
	Sheddable Priority = -2
	// Low is work a user would notice only after a while.
	Low Priority = -1
	// Normal is the default: a user is waiting.
	Normal Priority = 0
	// High is work that other work depends on.
	High Priority = 1
	// Critical is what must go through even in deep overload: health of
	// the business (checkout, login), control traffic.
	Critical Priority = 2
)

// Levels is the number of priorities; arrays indexed by priority
// (Priority.Index; adaptive's Stats.Shed) have this length, Sheddable
// first and Critical last.
const Levels = 5

// The names under which the edges carry a request's priority to the next
// service. The value is a priority's name (Priority.String, Parse).
const (
	// Header is the HTTP header field.
	Header = "Sluice-Priority"
	// Metadata is the gRPC metadata key (gRPC keys are lower case).
	Metadata = "sluice-priority"
)

// ErrUnknown is returned (wrapped) by Parse for a name that is not a
// priority's.
var ErrUnknown = errors.New("priority: unknown priority")

var names = [Levels]string{"sheddable", "low", "normal", "high", "critical"}

// Valid reports whether p is one of the five priorities.
func (p Priority) Valid() bool { return p >= Sheddable && p <= Critical }

// Index returns p's position in arrays indexed by priority: 0 for
// Sheddable up to Levels-1 for Critical. p must be valid.
func (p Priority) Index() int { return int(p) - int(Sheddable) }

// String returns p's name as Parse reads it ("critical", "high",
// "normal", "low", "sheddable"), or "priority(N)" for an invalid p.
func (p Priority) String() string {
	if !p.Valid() {
		return "priority(" + strconv.Itoa(int(p)) + ")"
	}
	return names[p.Index()]
}

// maxName bounds what Parse looks at, so that an
// attacker's megabyte header is refused without being copied or folded.
const maxName = len("sheddable")

// Parse returns the priority named s, ignoring ASCII case: one of
// "critical", "high", "normal", "low" and "sheddable". Anything else —
// including the empty string, surrounding spaces and digits — is an error
// wrapping ErrUnknown; an edge then treats the request as Normal
// (or refuses it, as it documents). It does not allocate unless it fails.
func Parse(s string) (Priority, error) {
	if p, ok := lookup(s); ok {
		return p, nil
	}
	if len(s) > 32 {
		s = s[:32] + "..."
	}
	return Normal, fmt.Errorf("%w %q: want one of critical, high, normal, low, sheddable", ErrUnknown, s)
}

// lookup returns the priority named s, as Parse, without
// an error to build.
func lookup(s string) (Priority, bool) {
	if len(s) <= maxName {
		for i, name := range names {
			if equalFoldASCII(s, name) {
				return Priority(i) + Sheddable, true
			}
		}
	}
	return Normal, false
}

// Trusted returns the priority that the first of values (the values of
// a Header or Metadata) names, lowered to max,
// and true; or Normal and false when there is none or it names no
// priority. It is how an edge reads a caller's priority: a caller may
// lower its own, but not raise it above what the edge trusts. It does not
// allocate.
func Trusted(values []string, max Priority) (Priority, bool) {
	if len(values) == 0 {
		return Normal, false
	}
	p, ok := lookup(values[0])
	if !ok {
		return Normal, false
	}
	return min(p, max), true
}

// equalFoldASCII reports whether s equals lower (lower-case ASCII letters)
// ignoring the case of ASCII letters in s only: "ſ" (U+017F) is not "s".
func equalFoldASCII(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

type priorityKey struct{}

// NewContext returns a copy of ctx carrying priority p. An invalid p is
// carried as Normal.
func NewContext(ctx context.Context, p Priority) context.Context {
	if !p.Valid() {
		p = Normal
	}
	return context.WithValue(ctx, priorityKey{}, p)
}

// FromContext returns the priority ctx carries, or Normal if it carries
// none. It does not allocate.
func FromContext(ctx context.Context) Priority {
	if p, ok := ctx.Value(priorityKey{}).(Priority); ok {
		return p
	}
	return Normal
}
