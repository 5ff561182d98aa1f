package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrQueueFull is returned at once by Shaper.ReserveN and Shaper.WaitN when
// admitting the caller would queue more than the shaper's bound.
var ErrQueueFull = errors.New("ratelimit: shaper queue is full")

// A Shaper is a leaky bucket used as a queue: rather than reject events that
// come too fast, it delays them so that they leave one unit every interval,
// evenly spaced, with no burst beyond a single unit. A caller of n units
// leaves at its turn and holds the output for n intervals; the next caller
// leaves n intervals later.
//
// The queue is bounded in units: a caller is admitted only if it would wait
// at most queue intervals; otherwise it is rejected at once with
// ErrQueueFull, taking nothing. With callers of one unit each, queue is the
// number of callers that may be waiting at one time (the one leaving is not
// waiting); queue 0 makes the Shaper a meter that admits one unit per
// interval and never delays. A caller of n units waits for the units ahead
// of it only, so a large n is admitted and pushes back the callers after
// it.
//
// ReserveN takes an explicit instant and returns the delay for the caller to
// sleep; WaitN sleeps itself. Time never goes backwards for a Shaper: an
// instant earlier than the latest one seen is treated as that one.
//
// A WaitN whose context is done while it waits gives its turn back when no
// later caller is queued behind it; otherwise its turn stays empty (the
// later callers keep theirs), so the output never exceeds the rate.
//
// The zero value shapes nothing: every caller leaves at once. A Shaper is
// safe for concurrent use and must not be copied after first use.
type Shaper struct {
	mu    sync.Mutex
	every int64 // ns per unit; <= 0 means no shaping
	queue int64
	// mono turns instants into offsets that never go back.
	mono monoClock
	// next is the offset at which the next unit may leave.
	next int64
}

// NewShaper returns a Shaper that lets one unit leave every interval and
// queues at most queue units (a negative queue counts as 0). An every of
// zero or less shapes nothing.
func NewShaper(every time.Duration, queue int) *Shaper {
	return &Shaper{every: int64(every), queue: int64(max(0, queue))}
}

// Interval returns the time between two units.
func (s *Shaper) Interval() time.Duration { return time.Duration(s.every) }

// Queue returns the bound on the units waiting.
func (s *Shaper) Queue() int { return int(s.queue) }

// turn is one caller's place in the output: it leaves at offset start and
// the output is its own until end.
type turn struct {
	start, end int64
	// wait is the delay from the instant of the reservation to start.
	wait time.Duration
}

// ReserveN takes a turn for n units at now and returns how long the caller
// must wait before it proceeds. It returns ErrQueueFull, taking nothing,
// when the wait would exceed the queue bound. n == 0 takes nothing and
// returns 0; a negative n is an error.
func (s *Shaper) ReserveN(now time.Time, n int) (time.Duration, error) {
	tn, err := s.reserve(now, n, Never)
	return tn.wait, err
}

func (s *Shaper) reserve(now time.Time, n int, maxWait time.Duration) (turn, error) {
	if n < 0 {
		return turn{}, fmt.Errorf("ratelimit: shaper: n=%d is negative", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.mono.advance(now)
	if s.every <= 0 || n == 0 {
		return turn{start: t, end: t}, nil
	}
	start := max(s.next, t)
	wait := start - t
	if wait > satMul(s.queue, s.every) {
		return turn{}, ErrQueueFull
	}
	if wait > int64(maxWait) {
		return turn{}, fmt.Errorf("%w: shaper needs %v, %v left", ErrWouldExceedDeadline, time.Duration(wait), maxWait)
	}
	end := satAdd(start, satMul(int64(n), s.every))
	s.next = end
	return turn{start: start, end: end, wait: time.Duration(wait)}, nil
}

// cancel withdraws tn at now and reports whether it had not yet started.
// The turn is given back when it is the last one taken.
func (s *Shaper) cancel(tn turn, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.mono.advance(now)
	if tn.start <= t {
		return false
	}
	if tn.end == s.next {
		s.next = tn.start
	}
	return true
}

// Wait is WaitN(ctx, 1).
func (s *Shaper) Wait(ctx context.Context) error { return s.WaitN(ctx, 1) }

// WaitN waits for a turn of n units and returns when the caller may
// proceed. It fails at once with ErrQueueFull when the queue is full, with
// ErrWouldExceedDeadline when the turn comes after ctx's deadline, and with
// ctx.Err() when ctx is done before or during the wait.
func (s *Shaper) WaitN(ctx context.Context, n int) error { return s.waitN(ctx, n, time.Now) }

func (s *Shaper) waitN(ctx context.Context, n int, clock func() time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := clock()
	maxWait := timeLeft(ctx, now)
	tn, err := s.reserve(now, n, maxWait)
	if err != nil {
		return err
	}
	if tn.wait <= 0 {
		return nil
	}
	tm := time.NewTimer(tn.wait)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		// The turn may have come at the very instant ctx was done; then
		// it is the caller's.
		if !s.cancel(tn, clock()) {
			return nil
		}
		return ctx.Err()
	}
}
