package retry

import (
	"strings"
	"sync"
	"time"
)

// Pauses holds the pauses that a throttled service asked a client for: one
// per scope, which the client chooses (a host, a tenant, the whole
// service). A refusal that says how long to wait extends its scope's pause;
// every call of that scope then waits it out (see Wait) instead of each
// retrying on its own schedule.
//
// The zero value holds no pause. Pauses is safe for concurrent use and must
// not be copied after first use.
type Pauses struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// Extend makes scope's pause last until at least until (a pause is never
// shortened). now is the time of the refusal: the pauses of every scope
// that have ended by then are forgotten, so that the scopes held are those
// paused lately, however many a client meets. It reports whether the
// pause was extended.
func (p *Pauses) Extend(scope string, now, until time.Time) (extended bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.until == nil {
		p.until = make(map[string]time.Time)
	}
	if until.After(p.until[scope]) {
		// A copy of the key: stored, scope would escape, and with it
		// every caller's request on the path of a call never refused.
		p.until[strings.Clone(scope)] = until
		extended = true
	}
	for s, u := range p.until {
		if !u.After(now) {
			delete(p.until, s)
		}
	}
	return extended
}

// Left returns how long scope's pause lasts after now(), or 0 when it has
// none. It calls now only when scope has a pause, so that the calls of a
// client that is not paused need not read its clock; now must not call p's
// methods.
func (p *Pauses) Left(scope string, now func() time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.until[scope]
	if !ok {
		return 0
	}
	return max(0, until.Sub(now()))
}

// Len returns the number of scopes held: those paused at the last Extend
// (some of which may have ended since).
func (p *Pauses) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.until)
}
