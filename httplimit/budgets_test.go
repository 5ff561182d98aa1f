package httplimit_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/ratelimit"
)

// A budgetStep is one step of a Budgets table, at a fixed instant.
type budgetStep struct {
	at  time.Duration // from t0
	op  string        // "reserve", "learn", "settle", "release"
	res int           // the reservation the step makes or ends
	// reserve: the estimate and the wait expected (0: granted).
	cost map[string]int64
	wait time.Duration
	// learn: what the response to res announced.
	ann []limitheader.Budget
	// settle: what the call used.
	used map[string]int64
}

var t0 = time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)

func openAI(name string, limit, remaining int64, reset time.Duration) limitheader.Budget {
	unit := "tokens"
	if name == "requests" {
		unit = "requests"
	}
	return limitheader.Budget{Dialect: limitheader.DialectOpenAI, Name: name, Unit: unit,
		Limit: limit, Remaining: remaining, Reset: reset, Window: limitheader.Unknown}
}

func runBudgetSteps(t *testing.T, b *httplimit.Budgets, steps []budgetStep) {
	t.Helper()
	res := map[int]*httplimit.Reservation{}
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.op {
		case "reserve":
			r, wait, _ := b.TryReserve("m", s.cost, now)
			if wait != s.wait {
				t.Fatalf("step %d (at %v, reserve %v): wait %v, want %v", i, s.at, s.cost, wait, s.wait)
			}
			if (r != nil) != (s.wait == 0) {
				t.Fatalf("step %d: reservation %v with wait %v", i, r, wait)
			}
			if r != nil {
				res[s.res] = r
			}
		case "learn":
			res[s.res].Learn(limitheader.Announcement{Budgets: s.ann}, now)
		case "settle":
			res[s.res].Settle(s.used, now)
		case "release":
			res[s.res].Release(now)
		default:
			t.Fatalf("step %d: op %q", i, s.op)
		}
	}
}

func TestBudgetsSteps(t *testing.T) {
	tokens := func(n int64) map[string]int64 { return map[string]int64{"tokens": n} }
	// OpenAI's budgets of a minute: 60 requests (1/s), 6,000 tokens (100/s).
	learned := []limitheader.Budget{openAI("requests", 60, 59, time.Second), openAI("tokens", 6000, 1000, 50*time.Second)}
	cases := []struct {
		name  string
		steps []budgetStep
		hold  time.Duration
	}{
		{"first call unpaced, announcement learned, settlement refunds and charges", []budgetStep{
			{op: "reserve", res: 0, cost: tokens(1000)}, // nothing known: sent at once
			{op: "learn", res: 0, ann: learned},
			{op: "settle", res: 0, used: tokens(800)},                         // tokens 1000-800 = 200; requests 59-1 = 58
			{op: "reserve", res: 1, cost: tokens(500), wait: 3 * time.Second}, // 300 short at 100/s
			{at: 2900 * time.Millisecond, op: "reserve", res: 1, cost: tokens(500), wait: 100 * time.Millisecond},
			{at: 3 * time.Second, op: "reserve", res: 1, cost: tokens(500)}, // level 500, all reserved
			{at: 3 * time.Second, op: "reserve", res: 2, cost: tokens(100), wait: time.Second},
			{at: 3 * time.Second, op: "settle", res: 1, used: tokens(100)}, // refund: level 400, nothing in flight
			{at: 3 * time.Second, op: "reserve", res: 2, cost: tokens(100)},
			{at: 3 * time.Second, op: "settle", res: 2, used: tokens(2000)}, // debt: 400-2000 = -1600
			{at: 3 * time.Second, op: "reserve", res: 3, cost: tokens(100), wait: 17 * time.Second},
			{at: 20 * time.Second, op: "reserve", res: 3, cost: tokens(100)},
		}, 0},
		{"requests count 1 by default; the refill stops at the limit", []budgetStep{
			{op: "reserve", res: 0},
			{op: "learn", res: 0, ann: []limitheader.Budget{openAI("requests", 60, 1, 59*time.Second)}},
			{op: "settle", res: 0}, // 1-1 = 0 left
			{op: "reserve", res: 1, wait: time.Second},
			{at: time.Hour, op: "reserve", res: 1, cost: map[string]int64{"requests": 100}}, // above the limit: needs it full
			{at: time.Hour, op: "reserve", res: 2, wait: time.Second},                       // 60 left, 60 in flight
			{at: time.Hour, op: "release", res: 1},
			{at: time.Hour, op: "reserve", res: 2},
		}, 0},
		{"a stale announcement is ignored", []budgetStep{
			{op: "reserve", res: 0},
			{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 6000, 0)}},
			{op: "settle", res: 0, used: tokens(0)},
			{op: "reserve", res: 1, cost: tokens(10)},
			{op: "reserve", res: 2, cost: tokens(10)},
			{op: "learn", res: 2, ann: []limitheader.Budget{openAI("tokens", 6000, 100, 59*time.Second)}},
			{op: "learn", res: 1, ann: []limitheader.Budget{openAI("tokens", 6000, 5000, 10*time.Second)}}, // older: ignored
			{op: "settle", res: 1, used: tokens(10)},
			{op: "settle", res: 2, used: tokens(10)}, // 100-20 = 80 left
			{op: "reserve", res: 3, cost: tokens(100), wait: 200 * time.Millisecond},
		}, 0},
		{"unknown dimensions and sentinels do not pace", []budgetStep{
			{op: "reserve", res: 0},
			{op: "learn", res: 0, ann: []limitheader.Budget{
				openAI("tokens", limitheader.Unknown, 0, limitheader.Unknown), // Azure's "not enforced"
				openAI("requests", 60, limitheader.Unknown, limitheader.Unknown),
			}},
			{op: "settle", res: 0},
			{op: "reserve", res: 1, cost: map[string]int64{"tokens": 1 << 40, "output-tokens": 1 << 40}},
		}, 0},
		{"a reset slower than a minute's refill is taken; the rounding of one is not", []budgetStep{
			{op: "reserve", res: 0},
			{op: "reserve", res: 1},
			{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 0, 10*time.Minute)}}, // a refill in 10 minutes: 10/s
			{op: "reserve", res: 2, cost: tokens(100), wait: 10 * time.Second},
			{op: "learn", res: 1, ann: []limitheader.Budget{openAI("tokens", 6000, 0, 65*time.Second)}}, // 100/s, 65 s rounded
			{op: "reserve", res: 2, cost: tokens(100), wait: time.Second},
		}, 0},
		{"a remaining unknown is read from the reset", []budgetStep{
			{op: "reserve", res: 0},
			{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, limitheader.Unknown, 59*time.Second)}},
			{op: "settle", res: 0, used: tokens(0)}, // 100 left
			{op: "reserve", res: 1, cost: tokens(150), wait: 500 * time.Millisecond},
		}, 0},
		{"an IETF window holds until its reset, then its limit", []budgetStep{
			{op: "reserve", res: 0},
			{op: "learn", res: 0, ann: []limitheader.Budget{{Dialect: limitheader.DialectIETF, Name: "default", Unit: "requests",
				Limit: 10, Remaining: 1, Reset: 5 * time.Second, Window: 10 * time.Second}}},
			{op: "settle", res: 0}, // 0 left until t0+5s
			{at: time.Second, op: "reserve", res: 1, wait: 4 * time.Second},
			{at: 5 * time.Second, op: "reserve", res: 1, cost: map[string]int64{"default": 10}},
			{at: 5 * time.Second, op: "settle", res: 1},
			{at: 6 * time.Second, op: "reserve", res: 2, wait: 9 * time.Second}, // the next window ends at t0+15s
			{at: 15 * time.Second, op: "reserve", res: 2},
		}, 0},
		{"an IETF window without a reset does not pace", []budgetStep{
			{op: "reserve", res: 0},
			{op: "learn", res: 0, ann: []limitheader.Budget{{Dialect: limitheader.DialectIETF, Name: "default", Unit: "requests",
				Limit: 10, Remaining: 0, Reset: limitheader.Unknown, Window: limitheader.Unknown}}},
			{op: "settle", res: 0},
			{op: "reserve", res: 1},
		}, 0},
		{"a debt outlives an announcement of 0 left, not one of more", []budgetStep{
			{op: "reserve", res: 0, cost: tokens(100)}, // three calls sent before anything is known
			{op: "reserve", res: 1, cost: tokens(100)},
			{op: "reserve", res: 2, cost: tokens(100)},
			{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 100, 59*time.Second)}},
			{op: "settle", res: 0, used: tokens(600)},                                                // 100-600 = -500
			{op: "learn", res: 1, ann: []limitheader.Budget{openAI("tokens", 6000, 0, time.Minute)}}, // in debt: -500 kept
			{op: "reserve", res: 3, cost: tokens(100), wait: 6 * time.Second},
			{op: "learn", res: 2, ann: []limitheader.Budget{openAI("tokens", 6000, 50, time.Minute)}}, // more: taken
			{op: "reserve", res: 3, cost: tokens(100), wait: 500 * time.Millisecond},
		}, 0},
		{"a reservation never settled expires after Hold, charged at its estimate", []budgetStep{
			{op: "reserve", res: 0},
			{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 6000, 0)}},
			{op: "settle", res: 0, used: tokens(0)},
			{op: "reserve", res: 1, cost: tokens(6000)}, // never settled
			{at: 30 * time.Second, op: "reserve", res: 2, cost: tokens(100), wait: time.Second},
			{at: 61 * time.Second, op: "reserve", res: 2, cost: tokens(100), wait: time.Second}, // expired: 6000-6000 charged
			{at: 62 * time.Second, op: "reserve", res: 2, cost: tokens(100)},                    // 100 refilled since
		}, time.Minute},
		{"keys are apart; a refusal releases", []budgetStep{
			{op: "reserve", res: 0, cost: tokens(1000)},
			{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 0, time.Minute)}},
			{op: "release", res: 0}, // a 429: nothing charged beyond the announcement
			{op: "reserve", res: 1, cost: tokens(100), wait: time.Second},
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runBudgetSteps(t, &httplimit.Budgets{Hold: tc.hold}, tc.steps)
		})
	}
}

func TestBudgetsKeysApart(t *testing.T) {
	var b httplimit.Budgets
	r, _, _ := b.TryReserve("a", nil, t0)
	r.Learn(limitheader.Announcement{Budgets: []limitheader.Budget{openAI("requests", 60, 0, time.Minute)}}, t0)
	r.Settle(nil, t0)
	if _, wait, _ := b.TryReserve("a", nil, t0); wait == 0 {
		t.Fatal("key a: granted with nothing left")
	}
	if r, wait, _ := b.TryReserve("b", nil, t0); r == nil || wait != 0 {
		t.Fatalf("key b: wait %v", wait)
	}
}

func TestBudgetsReserveDeadline(t *testing.T) {
	var b httplimit.Budgets
	r, _, _ := b.TryReserve("m", nil, time.Now())
	r.Learn(limitheader.Announcement{Budgets: []limitheader.Budget{openAI("requests", 1, 0, time.Minute)}}, time.Now())
	r.Settle(nil, time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := b.Reserve(ctx, "m", nil)
	if !errors.Is(err, httplimit.ErrWouldExceedDeadline) {
		t.Fatalf("err %v, want ErrWouldExceedDeadline", err)
	}
}

// BenchmarkBudgetsReserveSettle is a Client's per-call work in Budgets:
// reserve an estimate in three dimensions, learn the response's
// announcement (parsed already), settle the usage; one key shared by every
// goroutine, budgets too large to wait.
func BenchmarkBudgetsReserveSettle(b *testing.B) {
	const big = 1 << 50
	ann := limitheader.Announcement{Budgets: []limitheader.Budget{
		openAI("requests", big, big, 0), openAI("tokens", big, big, 0),
		{Dialect: limitheader.DialectAnthropic, Name: "output-tokens", Unit: "tokens", Limit: big, Remaining: big, Reset: 0, Window: limitheader.Unknown},
	}}
	var bu httplimit.Budgets
	r, _, _ := bu.TryReserve("m", nil, t0)
	r.Learn(ann, t0)
	r.Settle(nil, t0)
	cost := map[string]int64{"tokens": 1200, "output-tokens": 256}
	used := map[string]int64{"requests": 1, "tokens": 1100, "output-tokens": 150}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, wait, _ := bu.TryReserve("m", cost, t0)
			if r == nil {
				b.Fatalf("wait %v", wait)
			}
			r.Learn(ann, t0)
			r.Settle(used, t0)
		}
	})
}

// BenchmarkBudgetsBaselineLimiters is the plain decision beside it: three
// ratelimit.Limiters (one per dimension), AllowN each, nothing settled.
func BenchmarkBudgetsBaselineLimiters(b *testing.B) {
	ls := [3]*ratelimit.Limiter{}
	for i := range ls {
		ls[i] = ratelimit.NewLimiter(1e15, 1<<40) // finite: the full decision
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for _, l := range ls {
				if !l.AllowN(t0, 1) {
					b.Fatal("denied")
				}
			}
		}
	})
}

// TestBudgetsPace: a pace set on a dimension the service never announces
// starts full at its burst, refills at its rate, is charged what each
// call used at settlement (a debt when it cost more than its estimate),
// and, on a dimension the service announces, holds a call that the
// announced budget alone would send. SetCapacity's bucket is
// ratelimit.WindowPacing's; a burst of 0 removes the pace.
func TestBudgetsPace(t *testing.T) {
	ru := func(n int64) map[string]int64 { return map[string]int64{httplimit.RequestUnits: n} }
	b := &httplimit.Budgets{}
	b.SetPace("m", httplimit.RequestUnits, 100, 20, t0) // 100 RU/s, burst 20: 10 ms an RU
	runBudgetSteps(t, b, []budgetStep{
		{op: "reserve", res: 0, cost: ru(10)},
		{op: "reserve", res: 1, cost: ru(10)},
		{op: "reserve", res: 2, cost: ru(10), wait: 100 * time.Millisecond}, // 20 in flight
		{op: "settle", res: 0, used: ru(15)},                                // level 5, 10 in flight
		{op: "reserve", res: 2, cost: ru(10), wait: 150 * time.Millisecond},
		{op: "settle", res: 1, used: nil}, // the estimate stands: level -5
		{at: 100 * time.Millisecond, op: "reserve", res: 2, cost: ru(10), wait: 50 * time.Millisecond},
		{at: 150 * time.Millisecond, op: "reserve", res: 2, cost: ru(10)},
		{at: 150 * time.Millisecond, op: "release", res: 2},               // refused: level stays 10
		{at: 150 * time.Millisecond, op: "reserve", res: 3, cost: ru(50)}, // above the burst: needs the burst... 10 short
	}[:9])
	runBudgetSteps(t, b, []budgetStep{
		{at: 150 * time.Millisecond, op: "reserve", res: 3, cost: ru(50), wait: 100 * time.Millisecond}, // needs the burst, 20
		{at: 250 * time.Millisecond, op: "reserve", res: 3, cost: ru(50)},
		{at: 250 * time.Millisecond, op: "settle", res: 3, used: ru(50)}, // level -30
		{at: 250 * time.Millisecond, op: "reserve", res: 4, cost: ru(1), wait: 310 * time.Millisecond},
	})

	// On an announced dimension, the pace and the announcement each hold.
	b = &httplimit.Budgets{}
	tokens := func(n int64) map[string]int64 { return map[string]int64{"tokens": n} }
	b.SetPace("m", "tokens", 10, 100, t0) // a tenth of the account's 100/s
	runBudgetSteps(t, b, []budgetStep{
		{op: "reserve", res: 0, cost: tokens(100)},
		{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 5900, time.Second)}},
		{op: "settle", res: 0, used: tokens(100)},
		{op: "reserve", res: 1, cost: tokens(10), wait: time.Second}, // the account has 5,900; the pace 0
		{at: time.Second, op: "reserve", res: 1, cost: tokens(10)},
	})
	b.SetPace("m", "tokens", 0, 0, t0.Add(time.Second))
	runBudgetSteps(t, b, []budgetStep{{at: time.Second, op: "reserve", res: 2, cost: tokens(1000)}})

	// SetCapacity: 20,000 RU/s per one-second window is a bucket of 200
	// at 19,600/s.
	b = &httplimit.Budgets{}
	b.SetCapacity("m", httplimit.RequestUnits, 20000, time.Second, t0)
	lim, burst := ratelimit.WindowPacing(20000, time.Second)
	if lim != 19600 || burst != 200 {
		t.Fatalf("WindowPacing(20000, 1s) = %v, %d; want 19600, 200", lim, burst)
	}
	runBudgetSteps(t, b, []budgetStep{
		{op: "reserve", res: 0, cost: ru(200)},
		{op: "reserve", res: 1, cost: ru(196), wait: 10 * time.Millisecond},
	})
}

// TestClientCharge: a Client settles a reservation with the charge the
// answer announces in x-ms-request-charge (rounded up) as RequestUnits,
// unless the Usage hook names them; a call that cost more than its
// estimate holds the next one back by the difference.
func TestClientCharge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		charge string
		usage  func(*http.Response, []byte) map[string]int64
		wait   time.Duration // of the next call of 22 RU, at 100 RU/s from a burst of 30
	}{
		{"charge above the estimate", "19.2", nil, 120 * time.Millisecond}, // 30 - 20 = 10 left
		{"charge higher still", "25", nil, 170 * time.Millisecond},
		{"hook names the units", "25", func(*http.Response, []byte) map[string]int64 { return map[string]int64{httplimit.RequestUnits: 5} }, 0},
		{"no charge: the estimate", "", nil, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.charge != "" {
					w.Header().Set("X-Ms-Request-Charge", tc.charge)
				}
			}))
			defer srv.Close()
			b := &httplimit.Budgets{}
			c := &httplimit.Client{Budgets: b, Usage: tc.usage, Now: func() time.Time { return t0 }}
			b.SetPace("db", httplimit.RequestUnits, 100, 30, t0)
			ctx := httplimit.WithEstimate(context.Background(), httplimit.Estimate{Key: "db", Cost: map[string]int64{httplimit.RequestUnits: 10}})
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			_, wait, _ := b.TryReserve("db", map[string]int64{httplimit.RequestUnits: 22}, t0)
			if wait != tc.wait {
				t.Errorf("next call waits %v, want %v", wait, tc.wait)
			}
		})
	}
}

// TestBudgetsPaceBooked: callers of Reserve on a pace are booked ahead,
// each sent when the pace would have admitted it (10 RU at 100 RU/s: one
// every 100 ms after the burst), and one whose deadline comes before its
// turn fails at once and gives its booking back, so that the next caller
// is not pushed back by it.
func TestBudgetsPaceBooked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &httplimit.Budgets{}
		start := time.Now()
		b.SetPace("db", httplimit.RequestUnits, 100, 10, start)
		ru := map[string]int64{httplimit.RequestUnits: 10}
		var got []time.Duration
		for range 3 {
			r, err := b.Reserve(context.Background(), "db", ru)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, time.Since(start))
			r.Settle(nil, time.Now())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := b.Reserve(ctx, "db", ru); !errors.Is(err, httplimit.ErrWouldExceedDeadline) {
			t.Fatalf("a turn past the deadline: %v, want ErrWouldExceedDeadline", err)
		}
		if _, err := b.Reserve(context.Background(), "db", ru); err != nil {
			t.Fatal(err)
		}
		got = append(got, time.Since(start))
		want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
		if !slices.Equal(got, want) {
			t.Errorf("sent at %v, want %v", got, want)
		}
	})
}

// TestBudgetsShare: SetShare paces every announced dimension to a
// fraction of it (a token bucket's burst and 99 % of its rate), from the
// announcement on when it comes later; a share of nothing holds every
// call, and the pace then starts full at the share it is granted.
func TestBudgetsShare(t *testing.T) {
	tokens := func(n int64) map[string]int64 { return map[string]int64{"tokens": n} }
	b := &httplimit.Budgets{}
	b.SetShare("m", 0, t0) // nothing granted yet, nothing announced yet
	runBudgetSteps(t, b, []budgetStep{
		{op: "reserve", res: 0, cost: tokens(100)}, // unknown: sent
		// 6,000 a minute (100/s); the account has 5,000 left.
		{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 5000, 10*time.Second)}},
		{op: "settle", res: 0, used: tokens(100)},
		{op: "reserve", res: 1, cost: tokens(1), wait: math.MaxInt64}, // a share of nothing
	})
	fresh := &httplimit.Budgets{}
	runBudgetSteps(t, fresh, []budgetStep{
		{op: "reserve", res: 0, cost: tokens(1)},
		{op: "learn", res: 0, ann: []limitheader.Budget{openAI("tokens", 6000, 5000, 10*time.Second)}},
	})
	fresh.SetShare("m", 0, t0) // no call of its own to owe for: held all the same
	runBudgetSteps(t, fresh, []budgetStep{{op: "reserve", res: 1, cost: tokens(1), wait: math.MaxInt64}})
	b.SetShare("m", 0.5, t0) // a burst of 3,000 (full), 49.5 tokens/s
	runBudgetSteps(t, b, []budgetStep{
		{op: "reserve", res: 1, cost: tokens(3000)},
		{op: "settle", res: 1, used: tokens(2000)}, // 1,000 given back: the pace has 1,000, the account 2,900
		{op: "reserve", res: 2, cost: tokens(1000)},
		{op: "reserve", res: 3, cost: tokens(99), wait: 2 * time.Second}, // the pace's 99 at 49.5/s
	})
}
