package retry_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/retry"
)

func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if err := retry.Wait(t.Context(), time.Now(), 3*time.Second); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el != 3*time.Second {
			t.Errorf("waited %v, want 3s", el)
		}
		// Nothing to wait: at once, even on a done context.
		done, cancel := context.WithCancel(t.Context())
		cancel()
		for _, d := range []time.Duration{0, -time.Second} {
			if err := retry.Wait(done, time.Now(), d); err != nil {
				t.Errorf("Wait(%v) on a done context = %v, want nil", d, err)
			}
		}
	})
}

func TestWaitPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := retry.Wait(ctx, start, 5*time.Second)
		if el := time.Since(start); el != 0 {
			t.Errorf("failed after %v, want at once", el)
		}
		if !errors.Is(err, ratelimit.ErrWouldExceedDeadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrWouldExceedDeadline and DeadlineExceeded", err)
		}
		var de *retry.DeadlineError
		if !errors.As(err, &de) || de.Wait != 5*time.Second || de.Left != 2*time.Second {
			t.Errorf("err = %#v, want a DeadlineError of a 5s wait with 2s left", err)
		}
		// The caller's clock decides: a reading a second later leaves 1s.
		if err := retry.Wait(ctx, start.Add(time.Second), 1500*time.Millisecond); !errors.As(err, &de) || de.Left != time.Second {
			t.Errorf("with a later now: %v, want 1s left", err)
		}
		// A wait that ends exactly at the deadline fits.
		if err := retry.Wait(ctx, time.Now(), 2*time.Second); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a wait to the deadline: %v", err)
		}
	})
}

func TestWaitCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- retry.Wait(ctx, time.Now(), time.Hour) }()
		synctest.Wait() // the wait has begun
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
}

// TestSleepPastDeadline: Sleep, unlike Wait, does not fail at once on a
// wait that outlasts the deadline: it waits until ctx is done.
func TestSleepPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		if err := retry.Sleep(ctx, 5*time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
		if el := time.Since(start); el != 2*time.Second {
			t.Errorf("returned after %v, want 2s (the deadline)", el)
		}
		if err := retry.Sleep(t.Context(), time.Second); err != nil {
			t.Errorf("Sleep(1s) = %v, want nil", err)
		}
		if err := retry.Sleep(ctx, 0); err != nil {
			t.Errorf("Sleep(0) on a done context = %v, want nil", err)
		}
	})
}
