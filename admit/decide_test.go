package admit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/ratelimit"
)

// fixedStore answers with fixed decisions, or an error.
type fixedStore struct {
	ds    []ratelimit.Decision
	err   error
	calls int
}

func (s *fixedStore) Decide(_ context.Context, dst []ratelimit.Decision, _ []ratelimit.Item) ([]ratelimit.Decision, error) {
	s.calls++
	return append(dst, s.ds...), s.err
}

var (
	ok      = ratelimit.Decision{Allowed: true, Reason: ratelimit.ReasonOK}
	failOK  = ratelimit.Decision{Allowed: true, Reason: ratelimit.ReasonFailOpen}
	limited = func(d time.Duration) ratelimit.Decision {
		return ratelimit.Decision{Reason: ratelimit.ReasonLimited, RetryAfter: d}
	}
	tooBig = ratelimit.Decision{Reason: ratelimit.ReasonExceedsCapacity, RetryAfter: ratelimit.Never}
	closed = func(d time.Duration) ratelimit.Decision {
		return ratelimit.Decision{Reason: ratelimit.ReasonFailClosed, RetryAfter: d}
	}
	local = func(d time.Duration) ratelimit.Decision {
		return ratelimit.Decision{Reason: ratelimit.ReasonLocal, RetryAfter: d}
	}
)

func TestRetryable(t *testing.T) {
	localOK := ratelimit.Decision{Allowed: true, Reason: ratelimit.ReasonLocal}
	for _, tt := range []struct {
		name string
		d    ratelimit.Decision
		want bool
	}{
		{"admitted", ok, false},
		{"admitted locally", localOK, false},
		{"limited", limited(time.Second), true},
		{"denied locally", local(time.Second), true},
		{"denied locally, too big", local(ratelimit.Never), false},
		{"too big", tooBig, false},
		{"failed closed", closed(time.Second), false},
	} {
		if got := admit.Retryable(&tt.d); got != tt.want {
			t.Errorf("%s: Retryable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name  string
		ds    []ratelimit.Decision
		err   error
		want  admit.Outcome
		retry time.Duration
	}{
		{"admitted", []ratelimit.Decision{ok, ok}, nil, admit.Admitted, 0},
		{"failed open", []ratelimit.Decision{failOK, ok}, nil, admit.Admitted, 0},
		{"limited: the longest wait", []ratelimit.Decision{limited(time.Second), ok, limited(3 * time.Second)}, nil, admit.OverQuota, 3 * time.Second},
		{"too big: no retry", []ratelimit.Decision{tooBig, ok}, nil, admit.OverQuota, 0},
		{"too big and limited", []ratelimit.Decision{tooBig, limited(time.Second)}, nil, admit.OverQuota, time.Second},
		{"local denial: a quota's", []ratelimit.Decision{local(2 * time.Second), limited(time.Second)}, nil, admit.OverQuota, 2 * time.Second},
		{"local denial too big", []ratelimit.Decision{local(ratelimit.Never)}, nil, admit.OverQuota, 0},
		{"failed closed", []ratelimit.Decision{ok, closed(2 * time.Second)}, nil, admit.Unavailable, 2 * time.Second},
		{"failed closed beats limited, either order", []ratelimit.Decision{limited(time.Minute), closed(2 * time.Second)}, nil, admit.Unavailable, 2 * time.Second},
		{"failed closed beats limited", []ratelimit.Decision{closed(2 * time.Second), limited(time.Minute)}, nil, admit.Unavailable, 2 * time.Second},
		{"first failed closed speaks", []ratelimit.Decision{closed(2 * time.Second), closed(5 * time.Second)}, nil, admit.Unavailable, 2 * time.Second},
		{"error", nil, errors.New("down"), admit.Unavailable, 0},
		{"error with decisions", []ratelimit.Decision{ok, ok}, errors.New("down"), admit.Unavailable, 0},
	}
	items := []ratelimit.Item{{Key: "a"}, {Key: "b"}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &fixedStore{ds: tt.ds, err: tt.err}
			its := items
			if len(tt.ds) > 0 {
				its = make([]ratelimit.Item, len(tt.ds))
			}
			ds, v := admit.Decide(t.Context(), st, nil, its)
			if v.Outcome != tt.want || v.RetryAfter != tt.retry {
				t.Errorf("verdict %v after %v, want %v after %v", v.Outcome, v.RetryAfter, tt.want, tt.retry)
			}
			if (v.Err != nil) != (tt.err != nil) || (tt.err != nil && !errors.Is(v.Err, tt.err)) {
				t.Errorf("Err = %v, want %v", v.Err, tt.err)
			}
			if len(ds) != len(tt.ds) {
				t.Errorf("%d decisions returned, want the store's %d", len(ds), len(tt.ds))
			}
		})
	}
}

// TestDecideWrongCount: a store that answers the wrong number of decisions
// could not decide.
func TestDecideWrongCount(t *testing.T) {
	st := &fixedStore{ds: []ratelimit.Decision{ok}}
	_, v := admit.Decide(t.Context(), st, nil, make([]ratelimit.Item, 2))
	if v.Outcome != admit.Unavailable || v.Err == nil || !strings.Contains(v.Err.Error(), "1 decisions for 2 items") {
		t.Errorf("verdict %+v, want Unavailable with an error", v)
	}
}

// TestDecideAppends: decisions are appended after what dst holds, and only
// the new ones are read.
func TestDecideAppends(t *testing.T) {
	st := &fixedStore{ds: []ratelimit.Decision{ok}}
	dst := []ratelimit.Decision{limited(time.Hour)}
	ds, v := admit.Decide(t.Context(), st, dst, make([]ratelimit.Item, 1))
	if len(ds) != 2 || v.Outcome != admit.Admitted {
		t.Errorf("%d decisions, verdict %v; want 2 and admitted", len(ds), v.Outcome)
	}
}

func TestDecideNothing(t *testing.T) {
	st := &fixedStore{err: errors.New("must not be asked")}
	if _, v := admit.Decide(t.Context(), st, nil, nil); v != (admit.Verdict{}) || st.calls != 0 {
		t.Errorf("no items: verdict %+v after %d calls, want an admission without asking", v, st.calls)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[admit.Outcome]string{admit.Admitted: "admitted", admit.OverQuota: "over_quota", admit.Unavailable: "unavailable", 9: "Outcome(9)"} {
		if got := o.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", o, got, want)
		}
	}
}

// clockedStore is a fixedStore that decides at an instant read from its
// clock, as memstore does.
type clockedStore struct {
	fixedStore
	clock time.Time
	at    time.Time // the instant of the last DecideAt
}

func (s *clockedStore) Now() time.Time { return s.clock }

func (s *clockedStore) DecideAt(ctx context.Context, now time.Time, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	s.at = now
	return s.Decide(ctx, dst, items)
}

// TestDecideTimed: with a store that decides at an instant read from its
// clock, DecideTimed reads it once, decides there and returns it; with any
// other store it returns the zero time and Decide's answer.
func TestDecideTimed(t *testing.T) {
	clock := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cs := &clockedStore{fixedStore: fixedStore{ds: []ratelimit.Decision{limited(time.Second)}}, clock: clock}
	ds, v, at := admit.DecideTimed(t.Context(), cs, nil, make([]ratelimit.Item, 1))
	if !at.Equal(clock) || !cs.at.Equal(clock) || len(ds) != 1 || v.Outcome != admit.OverQuota || v.RetryAfter != time.Second {
		t.Errorf("clocked store: %d decisions, verdict %+v at %v (store decided at %v); want one over quota at %v", len(ds), v, at, cs.at, clock)
	}
	cs.fixedStore = fixedStore{ds: []ratelimit.Decision{ok}}
	if _, v, _ := admit.DecideTimed(t.Context(), cs, nil, make([]ratelimit.Item, 2)); v.Outcome != admit.Unavailable || v.Err == nil {
		t.Errorf("clocked store answering 1 decision for 2 items: verdict %+v, want Unavailable with an error", v)
	}
	plain := &fixedStore{ds: []ratelimit.Decision{ok}}
	if ds, v, at := admit.DecideTimed(t.Context(), plain, nil, make([]ratelimit.Item, 1)); !at.IsZero() || len(ds) != 1 || v.Outcome != admit.Admitted {
		t.Errorf("plain store: %d decisions, verdict %+v at %v; want one admitted at the zero time", len(ds), v, at)
	}
	if _, _, at := admit.DecideTimed(t.Context(), cs, nil, nil); !at.IsZero() || cs.calls != 1 {
		t.Errorf("no items: at %v after %d calls, want the zero time without asking", at, cs.calls)
	}
}
