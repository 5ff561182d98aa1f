package concurrency

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrExceedsLimit is returned when a request can never be granted: its
// weight is larger than the semaphore's size (or a distributed semaphore's
// limit is 0). Waiting would not help, so the caller is told at once.
var ErrExceedsLimit = errors.New("concurrency: request exceeds the limit")

// ErrNegativeWeight is returned for a weight below zero.
var ErrNegativeWeight = errors.New("concurrency: negative weight")

// A Semaphore bounds the total weight of operations in flight in one process.
//
// The model: the semaphore has a size, the total weight it admits at once.
// Acquire(ctx, w) takes w units, waiting while they are not available;
// Release(w) gives them back. Waiters are served strictly first in, first
// out: while the oldest waiter cannot be served, nobody behind it is, even
// a request that would fit, and TryAcquire fails. So a request for many
// units is never starved by a stream of requests for few; the price is that
// capacity may stay idle while the head of the queue waits for enough of it.
// A waiter whose context ends leaves the queue, and those it was blocking
// are served at once if they now fit.
//
// A weight of 0 is always granted at once and holds nothing. A weight above
// the size can never be granted: Acquire returns ErrExceedsLimit without
// waiting and TryAcquire returns false.
//
// A Semaphore is safe for concurrent use. Its zero value has size 0 and
// grants only weight 0; use NewSemaphore.
type Semaphore struct {
	mu      sync.Mutex
	size    int64
	held    int64
	waiters list.List // of *semWaiter, oldest first
}

type semWaiter struct {
	w     int64
	ready chan struct{} // closed when the units have been granted
}

// NewSemaphore returns a semaphore of the given size (total weight). A size
// below zero is treated as 0.
func NewSemaphore(size int64) *Semaphore {
	return &Semaphore{size: max(size, 0)}
}

// Size returns the total weight the semaphore admits at once.
func (s *Semaphore) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Held returns the weight currently held.
func (s *Semaphore) Held() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Waiting returns the number of callers blocked in Acquire.
func (s *Semaphore) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiters.Len()
}

// Acquire takes w units, waiting until they are available or ctx ends. It
// returns nil when the units are held (the caller must Release them), and
// otherwise an error with nothing held: ctx's error (wrapped, so errors.Is
// matches context.Canceled or context.DeadlineExceeded), ErrExceedsLimit or
// ErrNegativeWeight. When ctx ends at the very moment the units are granted,
// Acquire keeps them and returns nil.
func (s *Semaphore) Acquire(ctx context.Context, w int64) error {
	if w < 0 {
		return ErrNegativeWeight
	}
	s.mu.Lock()
	if w > s.size {
		s.mu.Unlock()
		return fmt.Errorf("%w: weight %d, size %d", ErrExceedsLimit, w, s.size)
	}
	if s.fits(w) {
		s.held += w
		s.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("concurrency: acquire %d: %w", w, err)
	}
	sw := &semWaiter{w: w, ready: make(chan struct{})}
	elem := s.waiters.PushBack(sw)
	s.mu.Unlock()

	select {
	case <-sw.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-sw.ready:
		// Granted while we were being cancelled: the units are ours.
		return nil
	default:
	}
	head := s.waiters.Front() == elem
	s.waiters.Remove(elem)
	if head {
		// We may have been blocking smaller requests behind us.
		s.grant()
	}
	return fmt.Errorf("concurrency: acquire %d: %w", w, ctx.Err())
}

// TryAcquire takes w units if they are available now and nobody is waiting,
// and reports whether it did. It never waits.
func (s *Semaphore) TryAcquire(w int64) bool {
	if w < 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w > s.size || !s.fits(w) {
		return false
	}
	s.held += w
	return true
}

// Release gives back w units and serves waiters, oldest first, as far as
// they fit. Releasing more than is held is a bug in the caller; the excess
// is ignored (the held weight never goes below zero), so it can never let
// more than the size in. A negative w is ignored.
func (s *Semaphore) Release(w int64) {
	if w <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = max(s.held-w, 0)
	s.grant()
}

// fits reports whether w units may be granted to a new caller now: they are
// free and nobody older is waiting. A weight of 0 always fits.
func (s *Semaphore) fits(w int64) bool {
	return w == 0 || (s.waiters.Len() == 0 && s.size-s.held >= w)
}

// grant serves waiters from the front of the queue while they fit. It is
// called with s.mu held.
func (s *Semaphore) grant() {
	for {
		front := s.waiters.Front()
		if front == nil {
			return
		}
		sw := front.Value.(*semWaiter)
		if s.size-s.held < sw.w {
			return // strict FIFO: nobody overtakes the head
		}
		s.held += sw.w
		s.waiters.Remove(front)
		close(sw.ready)
	}
}
