package storetest

import (
	"sync"
	"time"
)

// A Clock is a clock for tests that moves only when told to: a settable
// instant. Stores under test read it through Now, which Run passes to
// NewStore; tests of other stores and of code that takes a clock use it
// the same way. It is safe for concurrent use. The zero value reads the
// zero time.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's instant.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
