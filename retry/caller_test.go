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

// countingRejecter lets everything through and counts.
type countingRejecter struct{ allows, accepts int }

func (t *countingRejecter) Allow() bool { t.allows++; return true }
func (t *countingRejecter) Accept()     { t.accepts++ }

// TestCallerRetriesAfterPauseWithJitter: a refusal asking for 1 s pauses
// the scope; the retry comes after the pause plus a jitter within the
// first backoff step, and a second call of the scope made during the
// pause waits it out with a jitter too. (grpclimit's client retried at
// the pause's end exactly, every waiter at one instant; httplimit's
// spread them. Both now spread them.)
func TestCallerRetriesAfterPauseWithJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := &countingRejecter{}
		c := &retry.Caller{Rejecter: th, Rand: func() float64 { return 0.5 }}
		start := time.Now()
		var sent []time.Duration
		refuse := retry.Answer{Outcome: retry.Refused, Hint: time.Second, Hinted: true, Quota: true, Retryable: true}
		err := c.Do(t.Context(), retry.Call{Scope: "s", Send: func(ctx context.Context, a retry.Attempt) (retry.Answer, error) {
			a.Sending()
			sent = append(sent, time.Since(start))
			if a.N == 0 {
				return refuse, errors.New("429")
			}
			return retry.Answer{Outcome: retry.Accepted}, nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		// Retry 0's backoff is [0, 50 ms): 25 ms with Rand 0.5.
		if want := []time.Duration{0, time.Second + 25*time.Millisecond}; len(sent) != 2 || sent[1] != want[1] {
			t.Errorf("attempts at %v, want %v", sent, want)
		}
		st := c.Stats()
		if st.Requests != 2 || st.Refused != 1 || st.Retries != 1 {
			t.Errorf("stats %+v, want 2 requests, 1 refused, 1 retry", st)
		}
		if th.allows != 2 || th.accepts != 1 {
			t.Errorf("rejecter: %d allows, %d accepts; want 2 and 1", th.allows, th.accepts)
		}

		// A pause begun now holds a new call of the scope, and releases it
		// with jitter; another scope is not held.
		now := time.Now()
		c.Observe("s", now, retry.Answer{Outcome: retry.Refused, Hint: time.Second, Hinted: true})
		if err := c.Await(t.Context(), "other", 1); err != nil || time.Since(now) != 0 {
			t.Fatalf("another scope waited %v (%v)", time.Since(now), err)
		}
		if err := c.Await(t.Context(), "s", 1); err != nil {
			t.Fatal(err)
		}
		if w := time.Since(now); w != time.Second+25*time.Millisecond {
			t.Errorf("a call during the pause waited %v, want 1.025s", w)
		}
	})
}

// TestCallerDeadlineAndFailures: a retry that would outlast the deadline
// fails at once (StageRetry, a *DeadlineError); a failure is neither
// retried nor accepted, unless its caller cancelled it.
func TestCallerDeadlineAndFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := &countingRejecter{}
		c := &retry.Caller{Rejecter: th}
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		n := 0
		err := c.Do(ctx, retry.Call{Send: func(ctx context.Context, a retry.Attempt) (retry.Answer, error) {
			n++
			return retry.Answer{Outcome: retry.Refused, Hint: time.Second, Hinted: true, Retryable: true}, errors.New("503")
		}})
		var se *retry.StageError
		if !errors.As(err, &se) || se.Stage != retry.StageRetry || !errors.Is(err, ratelimit.ErrWouldExceedDeadline) || n != 1 || time.Since(start) != 0 {
			t.Fatalf("err %v after %d attempts and %v; want StageRetry, ErrWouldExceedDeadline, 1 attempt, at once", err, n, time.Since(start))
		}
		if th.accepts != 0 {
			t.Errorf("%d accepts, want 0", th.accepts)
		}

		failed := errors.New("no slot")
		send := func(ctx context.Context, a retry.Attempt) (retry.Answer, error) {
			n++
			return retry.Answer{Outcome: retry.Failed}, failed
		}
		c2 := &retry.Caller{Rejecter: th}
		n = 0
		if err := c2.Do(t.Context(), retry.Call{Send: send}); err != failed || n != 1 || th.accepts != 0 {
			t.Errorf("failure: %v after %d attempts, %d accepts; want it as is, 1, 0", err, n, th.accepts)
		}
		cctx, ccancel := context.WithCancel(t.Context())
		ccancel()
		if err := c2.Do(cctx, retry.Call{Send: send}); err != failed || th.accepts != 1 {
			t.Errorf("cancelled: %v, %d accepts; want it as is and 1 accept", err, th.accepts)
		}
		if st := c2.Stats(); st.Requests != 0 {
			t.Errorf("%d requests counted, want 0: nothing called Sending", st.Requests)
		}
	})
}
