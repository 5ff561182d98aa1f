package ratelimit

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// limEpoch is the fixed instant the step tables start from.
var limEpoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const milli = time.Millisecond

func TestLimitInterval(t *testing.T) {
	tests := []struct {
		name  string
		limit Limit
		iv    int64
		inf   bool
	}{
		{"every 3ms is exact", Every(3 * milli), 3_000_000, false},
		{"every 7ns is exact", Every(7), 7, false},
		{"every hour is exact", Every(time.Hour), int64(time.Hour), false},
		{"10 per second", 10, 100_000_000, false},
		{"3 per second rounds up", 3, 333_333_334, false},
		{"0.769 per second", 0.769, 1_300_390_118, false},
		{"above 1e9 per second is 1ns", 5e9, 1, false},
		{"tiny rate means no refill", 1e-30, 0, false},
		{"one per 50 years", Every(50 * 365 * 24 * time.Hour), 50 * 365 * 24 * int64(time.Hour), false},
		{"zero means no refill", 0, 0, false},
		{"negative means no refill", -1, 0, false},
		{"NaN means no refill", Limit(math.NaN()), 0, false},
		{"Inf", Inf, 0, true},
		{"+Inf float", Limit(math.Inf(1)), 0, true},
		{"Every(0) is Inf", Every(0), 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			iv, inf := tt.limit.interval()
			if iv != tt.iv || inf != tt.inf {
				t.Errorf("Limit(%v).interval() = %d, %v; want %d, %v", float64(tt.limit), iv, inf, tt.iv, tt.inf)
			}
		})
	}
}

// A limStep is one call in a step table: at limEpoch+at, AllowN(n) must return ok and
// (unless tokens is NaN) TokensAt must then return tokens.
type limStep struct {
	at     time.Duration
	n      int
	ok     bool
	tokens float64
}

func runLimSteps(t *testing.T, l *Limiter, steps []limStep) {
	t.Helper()
	for i, s := range steps {
		now := limEpoch.Add(s.at)
		if got := l.AllowN(now, s.n); got != s.ok {
			t.Fatalf("step %d: AllowN(limEpoch+%v, %d) = %v; want %v", i, s.at, s.n, got, s.ok)
		}
		if math.IsNaN(s.tokens) {
			continue
		}
		if got := l.TokensAt(now); math.Abs(got-s.tokens) > 1e-9 {
			t.Fatalf("step %d: TokensAt(limEpoch+%v) = %v; want %v", i, s.at, got, s.tokens)
		}
	}
}

// anyTokens in a step means "do not check the tokens".
var anyTokens = math.NaN()

func TestLimiterSteps(t *testing.T) {
	tests := []struct {
		name  string
		limit Limit
		burst int
		steps []limStep
	}{
		{"burst is the capacity exactly", 10, 3, []limStep{
			{0, 1, true, 2}, {0, 1, true, 1}, {0, 1, true, 0}, {0, 1, false, 0},
			{99 * milli, 1, false, 0.99}, {100 * milli, 1, true, 0}, {100 * milli, 1, false, 0},
			{350 * milli, 2, true, 0.5}, {350 * milli, 1, false, 0.5},
			{time.Hour, 3, true, 0}, {time.Hour, 0, true, 0},
		}},
		{"a long idle time fills to burst, no more", 1, 2, []limStep{
			{0, 2, true, 0}, {24 * time.Hour, 3, false, 2}, {24 * time.Hour, 2, true, 0},
		}},
		{"n above burst is refused and takes nothing", 10, 2, []limStep{
			{0, 3, false, 2}, {0, 2, true, 0},
		}},
		{"negative n is refused", 10, 2, []limStep{
			{0, -1, false, 2},
		}},
		{"burst 0 admits nothing but n 0", 10, 0, []limStep{
			{0, 1, false, 0}, {time.Hour, 1, false, 0}, {time.Hour, 0, true, 0},
		}},
		{"Inf admits anything", Inf, 0, []limStep{
			{0, 1000, true, 0}, {0, 1 << 40, true, 0},
		}},
		{"limit 0 keeps the initial tokens and never refills", 0, 2, []limStep{
			{0, 1, true, 1}, {time.Hour, 1, true, 0}, {1000 * time.Hour, 1, false, 0},
		}},
		{"a rate that is not a whole number of ns", 0.769, 1, []limStep{
			{0, 1, true, 0}, {1300 * milli, 1, false, anyTokens}, {1301 * milli, 1, true, 0},
		}},
		{"time going backwards never creates tokens", 1, 1, []limStep{
			{10 * time.Second, 1, true, 0}, {5 * time.Second, 1, false, 0},
			{10 * time.Second, 1, false, 0}, {10500 * milli, 1, false, 0.5},
			{9 * time.Second, 1, false, 0.5}, {11 * time.Second, 1, true, 0},
		}},
		{"tiny rate and huge burst do not overflow", Every(1000000 * time.Hour), math.MaxInt, []limStep{
			{0, 1, true, anyTokens}, {0, math.MaxInt, false, anyTokens}, {time.Hour, 1, true, anyTokens},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runLimSteps(t, NewLimiter(tt.limit, tt.burst), tt.steps)
		})
	}
}

func TestLimiterZeroValue(t *testing.T) {
	var l Limiter
	if l.AllowN(limEpoch, 1) {
		t.Error("zero Limiter admitted an event")
	}
	if !l.AllowN(limEpoch, 0) {
		t.Error("zero Limiter refused n=0")
	}
	if got := l.TokensAt(limEpoch); got != 0 {
		t.Errorf("zero Limiter TokensAt = %v; want 0", got)
	}
	if l.Limit() != 0 || l.Burst() != 0 {
		t.Errorf("zero Limiter Limit, Burst = %v, %v", l.Limit(), l.Burst())
	}
}

// TestLimiterStaleNow reproduces the scenario of golang/go issues 65508 and
// 71360: callers read the clock, then reach the limiter in another order, so
// earlier and later instants interleave. x/time/rate moves its "last" back to
// the earlier instant and credits the same interval again at the next later
// one. The admitted count must stay within burst + rate × elapsed.
func TestLimiterStaleNow(t *testing.T) {
	tests := []struct {
		name        string
		every       time.Duration
		burst       int
		step, stale time.Duration
		staleN      int // n of the call with the earlier instant
	}{
		// x/time/rate admits 3000 events where 109 are allowed here: the
		// earlier call succeeds while tokens remain and moves its clock back.
		{"earlier calls admitted from a large burst", 100 * milli, 10, 10 * milli, 500 * milli, 1},
		// A check of n = 0 always succeeds in x/time/rate and moves its clock.
		{"earlier calls are checks", 100 * milli, 1, 10 * milli, 500 * milli, 0},
		{"stale by many intervals", milli, 5, milli / 2, time.Second, 1},
		{"stale by less than an interval", time.Second, 3, 100 * milli, 900 * milli, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(Every(tt.every), tt.burst)
			admitted := 0
			var latest time.Duration
			for i := range 1000 {
				latest = time.Duration(i) * tt.step
				calls := []struct {
					at time.Duration
					n  int
				}{{latest, 1}, {latest - tt.stale, tt.staleN}, {latest, 1}}
				for _, c := range calls {
					if l.AllowN(limEpoch.Add(c.at), c.n) {
						admitted += c.n
					}
				}
			}
			bound := tt.burst + int(latest/tt.every)
			if admitted > bound {
				t.Errorf("admitted %d events in %v; at most %d possible", admitted, latest, bound)
			}
			if admitted < bound-1 {
				t.Errorf("admitted only %d events in %v; want about %d", admitted, latest, bound)
			}
		})
	}
}

func TestReservationDelay(t *testing.T) {
	l := NewLimiter(10, 1)
	want := []time.Duration{0, 100 * milli, 200 * milli, 300 * milli}
	var rs []*Reservation
	for i, w := range want {
		r := l.ReserveN(limEpoch, 1)
		if !r.OK() {
			t.Fatalf("reservation %d not OK", i)
		}
		if got := r.DelayFrom(limEpoch); got != w {
			t.Errorf("reservation %d: DelayFrom(limEpoch) = %v; want %v", i, got, w)
		}
		rs = append(rs, r)
	}
	if got := rs[3].DelayFrom(limEpoch.Add(250 * milli)); got != 50*milli {
		t.Errorf("DelayFrom(limEpoch+250ms) = %v; want 50ms", got)
	}
	if got := rs[3].DelayFrom(limEpoch.Add(time.Hour)); got != 0 {
		t.Errorf("DelayFrom(limEpoch+1h) = %v; want 0", got)
	}
	if got := l.TokensAt(limEpoch); got != -3 {
		t.Errorf("TokensAt after 4 reservations = %v; want -3", got)
	}
	bad := l.ReserveN(limEpoch, 2)
	if bad.OK() || bad.DelayFrom(limEpoch) != Never {
		t.Errorf("ReserveN(n > burst): OK %v, delay %v; want false, Never", bad.OK(), bad.DelayFrom(limEpoch))
	}
	if got := l.TokensAt(limEpoch); got != -3 {
		t.Errorf("a refused reservation changed tokens to %v", got)
	}
	frozen := NewLimiter(0, 1)
	frozen.AllowN(limEpoch, 1)
	if r := frozen.ReserveN(limEpoch, 1); r.OK() {
		t.Error("limit 0 reserved a token it can never refill")
	}
}

func TestReservationCancel(t *testing.T) {
	type op struct {
		at      time.Duration
		reserve int   // n to reserve, when cancel < 0
		cancel  int   // index of the reservation to cancel, or -1
		setLim  Limit // when nonzero, SetLimitAt instead
	}
	res := func(at time.Duration, n int) op { return op{at: at, reserve: n, cancel: -1} }
	cancel := func(at time.Duration, i int) op { return op{at: at, cancel: i} }
	set := func(at time.Duration, l Limit) op { return op{at: at, cancel: -1, setLim: l} }
	tests := []struct {
		name   string
		limit  Limit
		burst  int
		ops    []op
		tokens float64 // at the last op's instant
	}{
		{"cancel at the same instant gives all back", 10, 3, []op{res(0, 2), cancel(0, 0)}, 3},
		{"cancel twice gives back once", 10, 3, []op{res(0, 2), res(0, 1), cancel(0, 0), cancel(0, 0)}, 2},
		{"cancel after the events were due gives nothing", 10, 3, []op{res(0, 2), cancel(1*milli, 0)}, 1.01},
		{"cancel of the last waiting reservation", 10, 1, []op{res(0, 1), res(0, 1), res(0, 1), cancel(0, 2)}, -1},
		{"tokens later reservations rely on stay taken", 10, 1, []op{res(0, 1), res(0, 1), res(0, 1), cancel(0, 1)}, -2},
		{"then the later one gives back its own", 10, 1, []op{res(0, 1), res(0, 1), res(0, 1), cancel(0, 1), cancel(0, 2)}, -1},
		{"partly refilled while waiting", 10, 1, []op{res(0, 1), res(0, 1), cancel(90*milli, 1)}, 0.9},
		{"immediate reservations at one instant all give back", 10, 5, []op{res(0, 1), res(0, 1), cancel(0, 0)}, 4},
		{"never above burst", 10, 2, []op{res(0, 2), set(0, Inf), set(0, 10), cancel(0, 0)}, 2},
		{"cancel converts to a new rate", 10, 1, []op{res(0, 1), res(0, 1), set(0, 20), cancel(0, 1)}, 0},
		{"not OK gives nothing", 10, 1, []op{res(0, 2), cancel(0, 0)}, 1},
		{"limit 0 at the same instant", 0, 2, []op{res(0, 2), cancel(0, 0)}, 2},
		{"limit 0 later gives nothing", 0, 2, []op{res(0, 2), cancel(milli, 0)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(tt.limit, tt.burst)
			var rs []*Reservation
			var at time.Duration
			for _, o := range tt.ops {
				at = o.at
				now := limEpoch.Add(o.at)
				switch {
				case o.setLim != 0:
					l.SetLimitAt(now, o.setLim)
				case o.cancel >= 0:
					rs[o.cancel].CancelAt(now)
				default:
					rs = append(rs, l.ReserveN(now, o.reserve))
				}
			}
			if got := l.TokensAt(limEpoch.Add(at)); math.Abs(got-tt.tokens) > 1e-9 {
				t.Errorf("TokensAt = %v; want %v", got, tt.tokens)
			}
		})
	}
}

// TestReservationCancelOutOfOrder cancels reservations in another order than
// they were made. A cancelled reservation is not one that later
// reservations rely on: what a cancel gives back is counted against the
// latest reservation still pending, not against the latest ever made.
func TestReservationCancelOutOfOrder(t *testing.T) {
	// A resStep at limEpoch+at either reserves n tokens, which must be due
	// at limEpoch+due, or (when cancel >= 0) cancels the reservation made
	// by step number cancel; then TokensAt must return tokens, unless it is
	// anyTokens.
	type resStep struct {
		at     time.Duration
		n      int
		due    time.Duration
		cancel int
		tokens float64
	}
	res := func(at time.Duration, n int, due time.Duration, tokens float64) resStep {
		return resStep{at: at, n: n, due: due, cancel: -1, tokens: tokens}
	}
	cancel := func(at time.Duration, step int, tokens float64) resStep {
		return resStep{at: at, cancel: step, tokens: tokens}
	}
	// Every table starts the same way at 10 per second, burst 4: the
	// bucket emptied at once (step 0), then A of 3 tokens, B of 1 and C of
	// 1 reserved, due at 300, 400 and 500ms (steps 1, 2 and 3).
	queue := []resStep{
		res(0, 4, 0, 0), res(0, 3, 300*milli, -3), res(0, 1, 400*milli, -4), res(0, 1, 500*milli, -5),
	}
	tests := []struct {
		name  string
		steps []resStep
	}{
		// The case as it was reported: only the due instant is checked.
		{"the last, then the first", []resStep{
			cancel(0, 3, anyTokens), // C: all of it, nothing waits behind it
			// A: B still relies on 1 of its 3 tokens; C is gone.
			cancel(100*milli, 1, anyTokens),
			res(100*milli, 3, 500*milli, anyTokens),
		}},
		{"the last, then the first, token by token", []resStep{
			cancel(0, 3, -4),
			cancel(100*milli, 1, -1),
			res(100*milli, 3, 500*milli, -4),
		}},
		{"the middle, then the last, then the first", []resStep{
			cancel(0, 2, -5), // B: C relies on its token
			cancel(0, 3, -4), // C: all of it
			cancel(0, 1, -1), // A: all of it, B and C are gone
			res(0, 1, 200*milli, -2),
		}},
		{"the first, then the last, then the middle", []resStep{
			cancel(0, 1, -4), // A: B and C rely on 2 of its tokens
			cancel(0, 3, -3), // C: all of it
			cancel(0, 2, -2), // B: all of it, C is gone
			res(0, 1, 300*milli, -3),
		}},
		{"a reservation due before one made earlier", []resStep{
			cancel(0, 3, -4), // C
			cancel(0, 1, -2), // A: B relies on 1 of its tokens
			// D is due at 300ms, before B at 400ms.
			res(0, 1, 300*milli, -3),
			cancel(0, 2, -2), // B: D is due before it and relies on nothing of it
			cancel(0, 6, -1), // D: all of it, B is gone
			res(0, 1, 200*milli, -2),
		}},
		{"the last two, then the first", []resStep{
			cancel(0, 3, -4),        // C
			cancel(0, 2, -3),        // B: all of it, C is gone
			cancel(100*milli, 1, 1), // A: all of it; 1 token refilled since 0
			res(100*milli, 2, 200*milli, -1),
		}},
		{"cancels at an older instant count at the latest one", []resStep{
			cancel(0, 3, -4),         // C
			cancel(450*milli, 2, .5), // B was due at 400ms: nothing back
			cancel(100*milli, 1, .5), // taken as at 450ms: A was due too
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(10, 4)
			rs := map[int]*Reservation{}
			for i, s := range append(slices.Clip(queue), tt.steps...) {
				now := limEpoch.Add(s.at)
				if s.cancel >= 0 {
					rs[s.cancel].CancelAt(now)
				} else {
					r := l.ReserveN(now, s.n)
					if !r.OK() {
						t.Fatalf("step %d: ReserveN(limEpoch+%v, %d) not OK", i, s.at, s.n)
					}
					if due := s.at + r.DelayFrom(now); due != s.due {
						t.Fatalf("step %d: ReserveN(limEpoch+%v, %d) due at limEpoch+%v; want +%v", i, s.at, s.n, due, s.due)
					}
					rs[i] = r
				}
				if got := l.TokensAt(now); !math.IsNaN(s.tokens) && math.Abs(got-s.tokens) > 1e-9 {
					t.Fatalf("step %d: TokensAt(limEpoch+%v) = %v; want %v", i, s.at, got, s.tokens)
				}
			}
		})
	}
}

func TestLimiterSetMidStream(t *testing.T) {
	type op struct {
		at     time.Duration
		limit  Limit // SetLimitAt, when n <= 0 and burst < 0
		burst  int   // SetBurstAt when >= 0
		n      int   // AllowN(n) when > 0, expecting ok
		ok     bool
		tokens float64 // after the op
	}
	allow := func(at time.Duration, n int, ok bool, tokens float64) op {
		return op{at: at, burst: -1, n: n, ok: ok, tokens: tokens}
	}
	setL := func(at time.Duration, l Limit, tokens float64) op {
		return op{at: at, limit: l, burst: -1, tokens: tokens}
	}
	setB := func(at time.Duration, b int, tokens float64) op {
		return op{at: at, burst: b, tokens: tokens}
	}
	tests := []struct {
		name  string
		limit Limit
		burst int
		ops   []op
	}{
		{"faster rate keeps the debt", 1, 2, []op{
			allow(0, 2, true, 0), setL(500*milli, 2, 0.5), allow(750*milli, 1, true, 0),
			allow(750*milli, 1, false, 0), allow(1250*milli, 1, true, 0),
		}},
		{"slower rate keeps the debt", 2, 2, []op{
			allow(0, 2, true, 0), setL(250*milli, 1, 0.5), allow(500*milli, 1, false, 0.75),
			allow(750*milli, 1, true, 0),
		}},
		{"raising the burst adds tokens at once", 10, 1, []op{
			allow(0, 1, true, 0), setB(0, 3, 2), allow(0, 2, true, 0),
		}},
		{"lowering the burst keeps the debt", 10, 5, []op{
			allow(0, 1, true, 4), setB(0, 2, 1), allow(0, 1, true, 0), allow(0, 1, false, 0),
			allow(100*milli, 1, true, 0),
		}},
		{"burst 0 then back", 10, 2, []op{
			setB(0, 0, 0), allow(time.Hour, 1, false, 0), setB(time.Hour, 2, 2),
		}},
		{"limit 0 freezes and drops the fraction", 10, 2, []op{
			allow(0, 2, true, 0), setL(50*milli, 0, 0), allow(time.Hour, 1, false, 0),
			setL(time.Hour, 10, 0), allow(time.Hour+100*milli, 1, true, 0),
		}},
		{"limit 0 keeps whole tokens", 10, 3, []op{
			allow(0, 1, true, 2), setL(0, 0, 2), allow(time.Hour, 2, true, 0),
			allow(2*time.Hour, 1, false, 0),
		}},
		{"Inf forgets the debt, leaving it starts full", 10, 2, []op{
			allow(0, 2, true, 0), setL(0, Inf, 2), allow(0, 100, true, 2), setL(0, 10, 2),
			allow(0, 2, true, 0),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(tt.limit, tt.burst)
			for i, o := range tt.ops {
				now := limEpoch.Add(o.at)
				switch {
				case o.n > 0:
					if got := l.AllowN(now, o.n); got != o.ok {
						t.Fatalf("op %d: AllowN(limEpoch+%v, %d) = %v; want %v", i, o.at, o.n, got, o.ok)
					}
				case o.burst >= 0:
					l.SetBurstAt(now, o.burst)
					if l.Burst() != o.burst {
						t.Fatalf("op %d: Burst() = %d; want %d", i, l.Burst(), o.burst)
					}
				default:
					l.SetLimitAt(now, o.limit)
					if l.Limit() != o.limit {
						t.Fatalf("op %d: Limit() = %v; want %v", i, l.Limit(), o.limit)
					}
				}
				if got := l.TokensAt(now); math.Abs(got-o.tokens) > 1e-9 {
					t.Fatalf("op %d: TokensAt(limEpoch+%v) = %v; want %v", i, o.at, got, o.tokens)
				}
			}
		})
	}
}

func TestLimiterWait(t *testing.T) {
	tests := []struct {
		name    string
		limit   Limit
		burst   int
		n       int
		timeout time.Duration // 0: no deadline
		wantErr error
		took    time.Duration
	}{
		{"available at once", 10, 3, 3, 0, nil, 0},
		{"sleeps for the missing tokens", 10, 3, 1, 0, nil, 100 * milli},
		{"deadline just long enough", 10, 3, 2, 200 * milli, nil, 200 * milli},
		{"deadline too short fails at once", 10, 3, 2, 199 * milli, ErrWouldExceedDeadline, 0},
		{"n above burst", 10, 3, 4, 0, ErrExceedsBurst, 0},
		{"limit 0 would wait forever", 0, 3, 1, 0, ErrWouldExceedDeadline, 0},
		{"Inf never waits", Inf, 0, 5, 0, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := NewLimiter(tt.limit, tt.burst)
				if tt.limit != Inf && tt.n <= tt.burst {
					// Empty the bucket first, except in the first case.
					if tt.name != "available at once" && !l.AllowN(time.Now(), tt.burst) {
						t.Fatal("could not empty the bucket")
					}
				}
				before := l.Tokens()
				ctx := t.Context()
				if tt.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.timeout)
					t.Cleanup(cancel)
				}
				start := time.Now()
				err := l.WaitN(ctx, tt.n)
				if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
					t.Fatalf("WaitN = %v; want %v", err, tt.wantErr)
				}
				if took := time.Since(start); took != tt.took {
					t.Errorf("WaitN took %v; want %v", took, tt.took)
				}
				if err != nil && l.Tokens() != before {
					t.Errorf("a failed WaitN changed tokens from %v to %v", before, l.Tokens())
				}
			})
		})
	}
}

func TestLimiterWaitCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter(10, 1)
		if err := l.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(30*milli, cancel)
		start := time.Now()
		if err := l.Wait(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v; want context.Canceled", err)
		}
		if took := time.Since(start); took != 30*milli {
			t.Errorf("cancelled Wait took %v; want 30ms", took)
		}
		// The token given back: 0.3 refilled since the first Wait.
		if got := l.Tokens(); math.Abs(got-0.3) > 1e-9 {
			t.Errorf("Tokens after cancel = %v; want 0.3", got)
		}
		done, cancel2 := context.WithCancel(t.Context())
		cancel2()
		if err := l.Wait(done); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait on a done context = %v; want context.Canceled", err)
		}
		if err := l.WaitN(t.Context(), -1); err == nil {
			t.Error("WaitN(-1) succeeded")
		}
	})
}

// TestLimiterWaitSpacing checks that concurrent waiters leave exactly one
// interval apart.
func TestLimiterWaitSpacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const waiters = 8
		l := NewLimiter(Every(25*milli), 1)
		start := time.Now()
		var mu sync.Mutex
		var took []time.Duration
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				if err := l.Wait(t.Context()); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				took = append(took, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		slices.Sort(took)
		for i, d := range took {
			if want := time.Duration(i) * 25 * milli; d != want {
				t.Errorf("waiter %d left at %v; want %v", i, d, want)
			}
		}
	})
}

// TestLimiterConcurrent counts admissions across goroutines that read a
// shared clock and reach the limiter in any order, against the bound.
func TestLimiterConcurrent(t *testing.T) {
	const (
		goroutines = 8
		calls      = 2000
		every      = 10 * time.Microsecond
		burst      = 4
	)
	l := NewLimiter(Every(every), burst)
	l.AllowN(limEpoch, 0) // the first instant
	var clock, admitted atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range calls {
				now := clock.Add(int64(time.Microsecond))
				if l.AllowN(limEpoch.Add(time.Duration(now)), 1) {
					admitted.Add(1)
				}
				if tok := l.TokensAt(limEpoch.Add(time.Duration(now))); tok > burst {
					t.Errorf("TokensAt = %v > burst", tok)
				}
			}
		})
	}
	wg.Wait()
	bound := burst + clock.Load()/int64(every)
	if got := admitted.Load(); got > bound || got < bound/2 {
		t.Errorf("admitted %d; want at most %d (and not far below)", got, bound)
	}
}

// TestLimiterConcurrentReserve mixes reservations, cancellations, changes
// and reads across goroutines, all at one instant; it is a test for -race,
// and checks that the tokens never exceed the burst.
func TestLimiterConcurrentReserve(t *testing.T) {
	const goroutines, calls, burst = 6, 500, 3
	l := NewLimiter(Every(time.Millisecond), burst)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				r := l.ReserveN(limEpoch, 1+i%burst)
				if !r.OK() {
					t.Error("reservation not OK")
					return
				}
				if g == 0 && i%50 == 0 {
					l.SetBurstAt(limEpoch, burst)
				}
				r.CancelAt(limEpoch)
				if tok := l.TokensAt(limEpoch); tok > burst {
					t.Errorf("TokensAt = %v > burst", tok)
				}
			}
		})
	}
	wg.Wait()
	// Cancels that later reservations relied on gave back less than they
	// took, so the bucket may owe tokens now, but never holds too many.
	if tok := l.TokensAt(limEpoch); tok > burst {
		t.Errorf("TokensAt after all = %v > burst", tok)
	}
	if tok := l.TokensAt(limEpoch.Add(time.Hour)); tok != burst {
		t.Errorf("TokensAt an hour later = %v; want %d", tok, burst)
	}
}

// FuzzLimiter drives a Limiter with steps of time that may go backwards and
// checks that it never admits more than burst + rate × (latest instant −
// first instant), that its tokens never exceed burst, and that a refusal
// takes nothing.
func FuzzLimiter(f *testing.F) {
	f.Add([]byte{10, 1, 0, 0, 1, 0, 0, 1, 0xff, 0xff, 1})
	f.Add([]byte{3, 0, 100, 0, 2, 0x9c, 0xff, 1, 100, 0, 3})
	f.Add([]byte{0, 5, 1, 0, 5, 1, 0, 5, 0x80, 0, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		every := (time.Duration(data[0]) + 1) * milli / 7 // not a round number
		burst := int(data[1] % 8)
		l := NewLimiter(Every(every), burst)
		var at, first, latest time.Duration
		admitted := 0
		for i := 2; i+3 <= len(data); i += 3 {
			step := time.Duration(int16(binary.LittleEndian.Uint16(data[i:]))) * milli / 4
			n := int(data[i+2]%10) - 1 // -1..8
			at += step
			if i == 2 {
				first, latest = at, at
			}
			latest = max(latest, at)
			now := limEpoch.Add(at)
			before := l.TokensAt(now)
			if l.AllowN(now, n) {
				admitted += max(n, 0)
			} else if after := l.TokensAt(now); after != before {
				t.Fatalf("refused AllowN(%d) changed tokens %v -> %v", n, before, after)
			}
			if tok := l.TokensAt(now); tok > float64(burst) {
				t.Fatalf("tokens %v exceed burst %d", tok, burst)
			}
			if bound := burst + int((latest-first)/every); admitted > bound {
				t.Fatalf("admitted %d; bound %d (burst %d, every %v, elapsed %v)",
					admitted, bound, burst, every, latest-first)
			}
		}
	})
}

// FuzzReservations drives a Limiter with reservations, cancellations and
// AllowN calls at instants that may go backwards, and checks the schedule
// it promised: the events that will happen (every admitted AllowN, every
// reservation not cancelled before it was due) never exceed burst + rate ×
// the time between the first and the last of any run of them, and the
// tokens never exceed burst.
func FuzzReservations(f *testing.F) {
	// The tables of TestReservationCancelOutOfOrder, roughly: empty the
	// bucket, reserve three, cancel them in turn, reserve again.
	f.Add([]byte{100, 4, 0, 0, 4, 0, 0, 3, 0, 0, 1, 0, 0, 1, 1, 0, 3, 1, 0, 1, 0, 0, 3})
	f.Add([]byte{100, 4, 0, 0, 4, 0, 0, 3, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1, 2, 0, 1, 1, 0, 2})
	f.Add([]byte{6, 3, 2, 0, 1, 0, 0, 2, 0, 0, 2, 1, 0xff, 1, 0, 0, 1, 1, 4, 0, 2, 0xfe, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		every := (time.Duration(data[0]) + 1) * milli / 7
		burst := int(data[1] % 8)
		l := NewLimiter(Every(every), burst)
		type event struct{ act, n int64 }
		var rs []*Reservation
		events := map[*Reservation]event{} // the reservations that will happen
		var allowed []event
		var at time.Duration
		for i := 2; i+3 <= len(data); i += 3 {
			at += time.Duration(int8(data[i+1])) * every / 3
			now := limEpoch.Add(at)
			// The instants of the schedule are the Limiter's offsets, which
			// never go back: l.mono.last is the latest after each call.
			switch arg := int(data[i+2]); data[i] % 3 {
			case 0:
				r := l.ReserveN(now, arg%(burst+2))
				if r.OK() && r.n > 0 {
					rs = append(rs, r)
					events[r] = event{r.act, r.n}
				}
			case 1:
				if len(rs) > 0 {
					r := rs[arg%len(rs)]
					r.CancelAt(now)
					if r.act >= l.mono.last {
						delete(events, r)
					}
				}
			default:
				if n := arg % (burst + 2); l.AllowN(now, n) && n > 0 {
					allowed = append(allowed, event{l.mono.last, int64(n)})
				}
			}
			if tok := l.TokensAt(now); tok > float64(burst) {
				t.Fatalf("tokens %v exceed burst %d", tok, burst)
			}
		}
		all := slices.AppendSeq(allowed, maps.Values(events))
		slices.SortFunc(all, func(a, b event) int { return cmp.Compare(a.act, b.act) })
		for j := range all {
			var sum int64
			for i := j; i >= 0; i-- {
				sum += all[i].n
				if sum*l.iv > int64(burst)*l.iv+all[j].act-all[i].act {
					t.Fatalf("%d tokens' events from %v to %v: more than burst %d at one per %v; events %v",
						sum, time.Duration(all[i].act), time.Duration(all[j].act), burst, time.Duration(l.iv), all)
				}
			}
		}
	})
}

func BenchmarkLimiterAllowN(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		l := NewLimiter(Every(time.Second), 1)
		now := time.Now()
		for b.Loop() {
			l.AllowN(now, 1)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		l := NewLimiter(Every(time.Second), 1)
		now := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.AllowN(now, 1)
			}
		})
	})
}

func BenchmarkLimiterAllow(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		l := NewLimiter(Every(time.Microsecond), 100)
		for b.Loop() {
			l.Allow()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		l := NewLimiter(Every(time.Microsecond), 100)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow()
			}
		})
	})
}

func BenchmarkLimiterReserveCancel(b *testing.B) {
	b.ReportAllocs()
	l := NewLimiter(Every(time.Second), 1)
	now := time.Now()
	for b.Loop() {
		l.ReserveN(now, 1).CancelAt(now)
	}
}
