package adaptive_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
)

// start is on a bucket boundary of every window of these tests.
var start = time.Unix(1_200_000, 0)

func newRejecter(t testing.TB, o adaptive.RejecterOptions) *adaptive.Rejecter {
	t.Helper()
	th, err := adaptive.NewRejecter(o)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// seeded returns a deterministic source of Rand.
func seeded() func() float64 { return rand.New(rand.NewPCG(1, 2)).Float64 }

// count makes n requests and a accepts at at.
func count(th *adaptive.Rejecter, at time.Time, n, a int) {
	for range n {
		th.AllowAt(at)
	}
	for range a {
		th.AcceptAt(at)
	}
}

// TestRejecterProbability steps a Rejecter through fixed counts at fixed
// instants and checks the window's counts and the rejection probability
// max(0, (requests − K·accepts) / (requests + 1)) after each step.
func TestRejecterProbability(t *testing.T) {
	type step struct {
		at                 time.Duration // after start
		requests, accepts  int           // made at at
		wantReqs, wantAccs int64
		want               float64
	}
	tests := []struct {
		name  string
		k     float64
		steps []step
	}{
		{name: "K 2, a window of 20 s", k: 2, steps: []step{
			{want: 0}, // nothing counted
			{requests: 10, wantReqs: 10, want: 10.0 / 11},    // no accepts: near 1
			{accepts: 5, wantReqs: 10, wantAccs: 5, want: 0}, // one accept in two: none
			{accepts: 1, wantReqs: 10, wantAccs: 6, want: 0}, // more accepts: still none
			{at: 10 * time.Second, requests: 10, wantReqs: 20, wantAccs: 6, want: 8.0 / 21},
			{at: 19*time.Second + 999*time.Millisecond, wantReqs: 20, wantAccs: 6, want: 8.0 / 21},
			{at: 20 * time.Second, wantReqs: 10, want: 10.0 / 11}, // the bucket of 0 s slid out
			{at: 29*time.Second + 999*time.Millisecond, wantReqs: 10, want: 10.0 / 11},
			{at: 30 * time.Second, want: 0}, // and the bucket of 10 s
		}},
		{name: "K 1", k: 1, steps: []step{
			{requests: 10, accepts: 5, wantReqs: 10, wantAccs: 5, want: 5.0 / 11},
			{accepts: 5, wantReqs: 10, wantAccs: 10, want: 0},
		}},
		{name: "K 3", k: 3, steps: []step{
			{requests: 10, accepts: 3, wantReqs: 10, wantAccs: 3, want: 1.0 / 11},
			{requests: 90, wantReqs: 100, wantAccs: 3, want: 91.0 / 101},
			{accepts: 30, wantReqs: 100, wantAccs: 33, want: 1.0 / 101},
			{accepts: 1, wantReqs: 100, wantAccs: 34, want: 0},
		}},
		{name: "K 0 is 2", steps: []step{
			{requests: 10, accepts: 4, wantReqs: 10, wantAccs: 4, want: 2.0 / 11},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newRejecter(t, adaptive.RejecterOptions{K: tt.k, Window: 20 * time.Second, MaxProbability: 1, Rand: seeded()})
			for i, s := range tt.steps {
				at := start.Add(s.at)
				count(th, at, s.requests, s.accepts)
				st := th.StatsAt(at)
				if st.Requests != s.wantReqs || st.Accepts != s.wantAccs {
					t.Errorf("step %d (at %v): %d requests and %d accepts, want %d and %d", i, s.at, st.Requests, st.Accepts, s.wantReqs, s.wantAccs)
				}
				if math.Abs(st.Probability-s.want) > 1e-12 {
					t.Errorf("step %d (at %v): probability %v, want %v", i, s.at, st.Probability, s.want)
				}
			}
		})
	}
}

// TestRejecterDecision: a request is rejected when the random number is
// below the probability, and the random source is not consulted while the
// probability is zero.
func TestRejecterDecision(t *testing.T) {
	var r float64
	calls := 0
	th := newRejecter(t, adaptive.RejecterOptions{Rand: func() float64 { calls++; return r }})
	for range 10 {
		if !th.AllowAt(start) {
			t.Fatal("rejected a request while the probability was zero")
		}
		th.AcceptAt(start)
	}
	if calls != 0 {
		t.Errorf("Rand called %d times at probability 0, want none", calls)
	}
	// 30 requests, 10 accepts: p = (30 − 20)/31.
	count(th, start, 20, 0)
	p := 10.0 / 31
	if got := th.StatsAt(start).Probability; math.Abs(got-p) > 1e-12 {
		t.Fatalf("probability %v, want %v", got, p)
	}
	before := th.StatsAt(start)
	r = math.Nextafter(p, 0)
	if th.AllowAt(start) {
		t.Errorf("allowed at a random number %v below the probability %v", r, p)
	}
	// That rejection counted as a request: p = (31 − 20)/32.
	p = 11.0 / 32
	r = p
	if !th.AllowAt(start) {
		t.Errorf("rejected at a random number %v equal to the probability", r)
	}
	after := th.StatsAt(start)
	if after.Requests != before.Requests+2 || after.TotalRequests != before.TotalRequests+2 {
		t.Errorf("requests %d (total %d) after two more, want %d (%d): a rejection counts as a request", after.Requests, after.TotalRequests, before.Requests+2, before.TotalRequests+2)
	}
	if after.TotalRejected != before.TotalRejected+1 {
		t.Errorf("%d rejections, want %d", after.TotalRejected, before.TotalRejected+1)
	}
}

// TestRejecterWindow: a count is kept while its bucket is one of the last
// 20 and forgotten after; time going backwards counts in the newest
// bucket.
func TestRejecterWindow(t *testing.T) {
	th := newRejecter(t, adaptive.RejecterOptions{Window: 20 * time.Second})
	count(th, start.Add(time.Second-time.Nanosecond), 3, 0) // the end of bucket 0
	count(th, start.Add(time.Second), 4, 1)                 // the start of bucket 1
	for _, c := range []struct {
		at   time.Duration
		want int64
	}{
		{20*time.Second - time.Nanosecond, 7},
		{20 * time.Second, 4}, // 19 s and a nanosecond after the first 3
		{21*time.Second - time.Nanosecond, 4},
		{21 * time.Second, 0}, // exactly 20 s after the 4
	} {
		if got := th.StatsAt(start.Add(c.at)).Requests; got != c.want {
			t.Errorf("at %v: %d requests in the window, want %d", c.at, got, c.want)
		}
	}
	// The clock goes back to before everything: counted now, kept until
	// the newest bucket (that of 21 s) slides out.
	count(th, start, 5, 0)
	if st := th.StatsAt(start); st.Requests != 5 {
		t.Errorf("after time went back: %d requests, want the 5 just made", st.Requests)
	}
	if got := th.StatsAt(start.Add(41*time.Second - time.Nanosecond)).Requests; got != 5 {
		t.Errorf("at 41 s: %d requests, want 5", got)
	}
	if got := th.StatsAt(start.Add(41 * time.Second)).Requests; got != 0 {
		t.Errorf("at 41 s: %d requests, want 0", got)
	}
	if st := th.StatsAt(start.Add(time.Hour)); st.TotalRequests != 12 || st.TotalAccepts != 1 {
		t.Errorf("totals %d requests, %d accepts, want 12 and 1: totals are never forgotten", st.TotalRequests, st.TotalAccepts)
	}
}

// TestRejecterBeforeEpoch: instants before 1970 fall in their buckets like
// any other (the bucket index is a floor).
func TestRejecterBeforeEpoch(t *testing.T) {
	th := newRejecter(t, adaptive.RejecterOptions{Window: 20 * time.Second})
	t0 := time.Unix(-100, 0)
	count(th, t0.Add(-time.Nanosecond), 2, 0) // the last nanosecond of bucket −101
	count(th, t0, 1, 0)
	if got := th.StatsAt(t0.Add(19 * time.Second)).Requests; got != 1 {
		t.Errorf("%d requests at −81 s, want 1 (the bucket of −101 s has slid out)", got)
	}
}

// overloaded simulates a client with a steady demand of 100 requests a
// second (one every 10 ms) against a dependency that does capacity
// requests' work a second, with up to a second of it in reserve, and
// refuses what is beyond, from from for d. It returns the requests
// rejected locally, sent and accepted in the last window of the run.
func overloaded(th *adaptive.Rejecter, from time.Time, d time.Duration, capacity float64, window time.Duration) (rejected, sent, accepted int) {
	const tick = 10 * time.Millisecond
	tokens := 0.0
	for at := time.Duration(0); at < d; at += tick {
		now := from.Add(at)
		tokens = min(tokens+capacity*tick.Seconds(), capacity)
		last := at >= d-window
		if !th.AllowAt(now) {
			if last {
				rejected++
			}
			continue
		}
		if last {
			sent++
		}
		if tokens >= 1 {
			tokens--
			th.AcceptAt(now)
			if last {
				accepted++
			}
		}
	}
	return rejected, sent, accepted
}

const demand = 100.0 // requests a second, of overloaded

// TestRejecterConverges: against a dependency that accepts C of a demand
// D > K·C, the local rejection ratio settles at the formula's value —
// computed from the window's counts, and in closed form 1 − K·C/D — and
// about K requests reach the dependency per accept.
func TestRejecterConverges(t *testing.T) {
	window := 20 * time.Second
	for _, c := range []struct{ k, capacity float64 }{{2, 20}, {3, 20}, {2, 10}, {1.5, 50}, {2, 2}} {
		th := newRejecter(t, adaptive.RejecterOptions{K: c.k, Window: window, MaxProbability: 1, Rand: seeded()})
		rejected, sent, accepted := overloaded(th, start, 4*window, c.capacity, window)
		want := 1 - c.k*c.capacity/demand
		ratio := float64(rejected) / float64(rejected+sent)
		st := th.StatsAt(start.Add(4 * window))
		t.Logf("K %v, capacity %v/s: rejected %.3f (formula on the counts %.3f, closed form %.3f); %.3f sent per accept", c.k, c.capacity, ratio, st.Probability, want, float64(sent)/float64(accepted))
		if math.Abs(ratio-want) > 0.03 {
			t.Errorf("K %v, capacity %v/s: rejected %.3f of the last window's requests, want %.3f", c.k, c.capacity, ratio, want)
		}
		if math.Abs(st.Probability-ratio) > 0.03 {
			t.Errorf("K %v, capacity %v/s: probability %.3f at the end, but %.3f rejected", c.k, c.capacity, st.Probability, ratio)
		}
		if r := float64(sent) / float64(accepted); math.Abs(r-c.k) > 0.05*c.k {
			t.Errorf("K %v, capacity %v/s: %d sent for %d accepted (%.3f per accept), want about K", c.k, c.capacity, sent, accepted, r)
		}
	}
}

// TestRejecterRecovers: after the dependency recovers, every request sent
// is accepted and the probability falls to zero, never to rise again, in
// the time the model predicts: with q the accepts per request of the
// window when it recovers, the accepts grow as e^(K·t/W) and p is zero
// after t = W/K · ln((1 − q) / (q·(K − 1))). That is within one window
// when the overload was moderate (K 2 and p up to about 0.76), and longer
// after a deep one.
func TestRejecterRecovers(t *testing.T) {
	window := 20 * time.Second
	for _, c := range []struct {
		k, capacity  float64
		withinWindow bool
	}{{2, 20, true}, {3, 10, true}, {2, 5, false}} {
		th := newRejecter(t, adaptive.RejecterOptions{K: c.k, Window: window, MaxProbability: 1, Rand: seeded()})
		overloaded(th, start, 4*window, c.capacity, window)
		recovered := start.Add(4 * window)
		st := th.StatsAt(recovered)
		q := float64(st.Accepts) / float64(st.Requests)
		predicted := time.Duration(float64(window) / c.k * math.Log((1-q)/(q*(c.k-1))))
		// From now on every request sent is accepted.
		var zeroAt time.Duration = -1
		for at := time.Duration(0); at < 4*window; at += 10 * time.Millisecond {
			now := recovered.Add(at)
			if zeroAt < 0 && th.StatsAt(now).Probability == 0 {
				zeroAt = at
			}
			if th.AllowAt(now) {
				th.AcceptAt(now)
			} else if zeroAt >= 0 {
				t.Fatalf("K %v, capacity %v/s: rejected at %v after the recovery, after the probability fell to zero at %v", c.k, c.capacity, at, zeroAt)
			}
		}
		t.Logf("K %v, capacity %v/s: from p %.3f to 0 in %v, predicted %v", c.k, c.capacity, st.Probability, zeroAt, predicted)
		if zeroAt < 0 {
			t.Errorf("K %v, capacity %v/s: the probability never fell to zero", c.k, c.capacity)
			continue
		}
		if d := zeroAt - predicted; d.Abs() > window/10 {
			t.Errorf("K %v, capacity %v/s: the probability fell to zero %v after the recovery, predicted %v", c.k, c.capacity, zeroAt, predicted)
		}
		if c.withinWindow && zeroAt > window {
			t.Errorf("K %v, capacity %v/s: the probability fell to zero %v after the recovery, want within one window (%v)", c.k, c.capacity, zeroAt, window)
		}
	}
}

// TestRejecterFractionOfWhatItGets: a dependency that accepts a fixed
// fraction f of the requests it receives is never rejected while f > 1/K,
// and almost everything is rejected locally while f < 1/K.
func TestRejecterFractionOfWhatItGets(t *testing.T) {
	window := 20 * time.Second
	for _, c := range []struct {
		f        float64
		min, max float64 // of the rejection ratio in the last window
	}{{0.6, 0, 0}, {0.9, 0, 0}, {0.4, 0.9, 1}, {0.1, 0.95, 1}} {
		th := newRejecter(t, adaptive.RejecterOptions{Window: window, MaxProbability: 1, Rand: seeded()})
		credit := 0.0
		rejected, requests := 0, 0
		for at := time.Duration(0); at < 3*window; at += 10 * time.Millisecond {
			now := start.Add(at)
			ok := th.AllowAt(now)
			if at >= 2*window {
				requests++
				if !ok {
					rejected++
				}
			}
			if !ok {
				continue
			}
			if credit += c.f; credit >= 1 {
				credit--
				th.AcceptAt(now)
			}
		}
		if r := float64(rejected) / float64(requests); r < c.min || r > c.max {
			t.Errorf("accepting %v of what it gets: rejected %.4f, want in [%v, %v]", c.f, r, c.min, c.max)
		}
	}
}

func TestNewRejecterRejects(t *testing.T) {
	for _, c := range []struct {
		o    adaptive.RejecterOptions
		want string
	}{
		{adaptive.RejecterOptions{K: 0.5}, "K is 0.5; it must be at least 1"},
		{adaptive.RejecterOptions{K: -1}, "K is -1"},
		{adaptive.RejecterOptions{K: math.NaN()}, "K is NaN"},
		{adaptive.RejecterOptions{K: math.Inf(1)}, "K is +Inf"},
		{adaptive.RejecterOptions{Window: -time.Second}, "Window is -1s; it must be positive"},
		{adaptive.RejecterOptions{Window: 19}, "Window is 19ns; it must be at least 20 ns"},
		{adaptive.RejecterOptions{MaxProbability: 1.5}, "MaxProbability is 1.5; it must be in (0, 1]"},
		{adaptive.RejecterOptions{MaxProbability: -0.1}, "MaxProbability is -0.1"},
		{adaptive.RejecterOptions{MaxProbability: math.NaN()}, "MaxProbability is NaN"},
	} {
		th, err := adaptive.NewRejecter(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRejecter(%+v) = %v, %v; want an error saying %q", c.o, th, err, c.want)
		}
	}
	for _, o := range []adaptive.RejecterOptions{{}, {K: 1}, {K: 1e6}, {Window: 20}, {Window: time.Hour}} {
		if _, err := adaptive.NewRejecter(o); err != nil {
			t.Errorf("NewRejecter(%+v): %v", o, err)
		}
	}
}

// TestRejecterZeroValue: the zero Rejecter has K 2 and a window of two
// minutes.
func TestRejecterZeroValue(t *testing.T) {
	var th adaptive.Rejecter
	count(&th, start, 10, 4)
	if p := th.StatsAt(start).Probability; math.Abs(p-2.0/11) > 1e-12 {
		t.Errorf("probability %v, want 2/11 (K 2)", p)
	}
	if n := th.StatsAt(start.Add(2*time.Minute - time.Nanosecond)).Requests; n != 10 {
		t.Errorf("%d requests just before two minutes, want 10", n)
	}
	if n := th.StatsAt(start.Add(2 * time.Minute)).Requests; n != 0 {
		t.Errorf("%d requests after two minutes, want 0", n)
	}
	// Allow and Accept read time.Now.
	th.Allow()
	th.Accept()
	if st := th.Stats(); st.Requests != 1 || st.Accepts != 1 {
		t.Errorf("Allow and Accept now: %d requests, %d accepts in the window, want 1 and 1", st.Requests, st.Accepts)
	}
}

// TestRejecterNow: Allow, Accept and Stats read RejecterOptions.Now.
func TestRejecterNow(t *testing.T) {
	now := start
	th := newRejecter(t, adaptive.RejecterOptions{Window: 20 * time.Second, Now: func() time.Time { return now }})
	th.Allow()
	th.Accept()
	now = now.Add(20 * time.Second)
	th.Allow()
	if st := th.Stats(); st.Requests != 1 || st.Accepts != 0 || st.TotalRequests != 2 {
		t.Errorf("stats %+v, want 1 request in the window of 2", st)
	}
}

// TestRejecterConcurrent: counts made from many goroutines are all kept
// (and the race detector sees the locking).
func TestRejecterConcurrent(t *testing.T) {
	th := newRejecter(t, adaptive.RejecterOptions{})
	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				th.AllowAt(start)
				if (g+i)%2 == 0 {
					th.AcceptAt(start)
				}
			}
		})
	}
	wg.Wait()
	st := th.StatsAt(start)
	if st.Requests != goroutines*each || st.Accepts != goroutines*each/2 || st.TotalRequests != st.Requests {
		t.Errorf("stats %+v, want %d requests and %d accepts", st, goroutines*each, goroutines*each/2)
	}
}

// TestRejecterAllocatesNothing: the decision path and the accounting do
// not allocate, whether a request is rejected or not.
func TestRejecterAllocatesNothing(t *testing.T) {
	th := newRejecter(t, adaptive.RejecterOptions{Rand: seeded()})
	now := start
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Second) // crosses buckets too
		if th.AllowAt(now) && now.Unix()%3 == 0 {
			th.AcceptAt(now)
		}
		th.StatsAt(now)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request, want 0", allocs)
	}
	if th.StatsAt(now).TotalRejected == 0 {
		t.Error("nothing was rejected: the rejecting path was not measured")
	}
}

func BenchmarkRejecter(b *testing.B) {
	b.Run("AllowAt+AcceptAt", func(b *testing.B) {
		th := newRejecter(b, adaptive.RejecterOptions{})
		b.ReportAllocs()
		for b.Loop() {
			if th.AllowAt(start) {
				th.AcceptAt(start)
			}
		}
	})
	b.Run("AllowAt/rejecting", func(b *testing.B) {
		th := newRejecter(b, adaptive.RejecterOptions{})
		b.ReportAllocs()
		for b.Loop() {
			th.AllowAt(start)
		}
	})
	b.Run("Allow+Accept/time.Now", func(b *testing.B) {
		th := newRejecter(b, adaptive.RejecterOptions{})
		b.ReportAllocs()
		for b.Loop() {
			if th.Allow() {
				th.Accept()
			}
		}
	})
	b.Run("AllowAt+AcceptAt/parallel", func(b *testing.B) {
		th := newRejecter(b, adaptive.RejecterOptions{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if th.AllowAt(start) {
					th.AcceptAt(start)
				}
			}
		})
	})
	b.Run("Allow+Accept/parallel", func(b *testing.B) {
		th := newRejecter(b, adaptive.RejecterOptions{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if th.Allow() {
					th.Accept()
				}
			}
		})
	})
	b.Run("Allow/parallel/rejecting", func(b *testing.B) {
		th := newRejecter(b, adaptive.RejecterOptions{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				th.Allow()
			}
		})
	})
}

// TestRejecterCap: by default the probability stops at 0.9, so that during
// an outage one request in ten still probes the dependency, and after an
// outage rejecting ends sooner than with the book's uncapped formula.
func TestRejecterCap(t *testing.T) {
	window := 20 * time.Second
	recovery := func(maxP float64) (time.Duration, float64) {
		th := newRejecter(t, adaptive.RejecterOptions{Window: window, MaxProbability: maxP, Rand: seeded()})
		// An outage: 10 requests a second for two windows, none accepted.
		at := start
		for ; at.Before(start.Add(2 * window)); at = at.Add(100 * time.Millisecond) {
			th.AllowAt(at)
		}
		peak := th.StatsAt(at).Probability
		for d := time.Duration(0); d < 10*window; d += 100 * time.Millisecond {
			now := at.Add(d)
			if th.StatsAt(now).Probability == 0 {
				return d, peak
			}
			if th.AllowAt(now) {
				th.AcceptAt(now)
			}
		}
		t.Fatalf("MaxProbability %v: still rejecting 10 windows after the outage", maxP)
		return 0, 0
	}
	capped, cappedPeak := recovery(0)
	book, bookPeak := recovery(1)
	t.Logf("after an outage of two windows: rejecting stops %v later capped at 0.9 (peak %.3f), %v later uncapped (peak %.3f)", capped, cappedPeak, book, bookPeak)
	if cappedPeak != adaptive.DefaultRejecterMaxProbability || bookPeak <= 0.99 {
		t.Errorf("peak probability %v capped, %v uncapped; want %v and above 0.99", cappedPeak, bookPeak, adaptive.DefaultRejecterMaxProbability)
	}
	if capped > 2*window || capped >= book {
		t.Errorf("capped, rejecting stopped %v after the outage (uncapped %v); want within two windows and sooner", capped, book)
	}
}
