package ratelimit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestShaperReserveN(t *testing.T) {
	type call struct {
		at    time.Duration
		n     int
		delay time.Duration
		err   error
	}
	tests := []struct {
		name  string
		every time.Duration
		queue int
		calls []call
	}{
		{"one unit every interval, queue bounded", 100 * milli, 2, []call{
			{0, 1, 0, nil}, {0, 1, 100 * milli, nil}, {0, 1, 200 * milli, nil}, {0, 1, 0, ErrQueueFull},
			{100 * milli, 1, 200 * milli, nil}, {100 * milli, 1, 0, ErrQueueFull},
			{time.Second, 1, 0, nil}, {time.Second, 1, 100 * milli, nil},
		}},
		{"n units hold the output n intervals", 10 * milli, 1, []call{
			{0, 3, 0, nil}, {0, 1, 0, ErrQueueFull}, {20 * milli, 1, 10 * milli, nil}, {20 * milli, 5, 0, ErrQueueFull},
			{30 * milli, 5, 10 * milli, nil}, {40 * milli, 1, 0, ErrQueueFull}, {80 * milli, 1, 10 * milli, nil},
			{200 * milli, 1, 0, nil},
		}},
		{"queue 0 is a meter", 100 * milli, 0, []call{
			{0, 1, 0, nil}, {0, 1, 0, ErrQueueFull}, {99 * milli, 1, 0, ErrQueueFull}, {100 * milli, 1, 0, nil},
		}},
		{"time going backwards is the latest instant", 100 * milli, 1, []call{
			{time.Second, 1, 0, nil}, {500 * milli, 1, 100 * milli, nil}, {500 * milli, 1, 0, ErrQueueFull},
		}},
		{"n 0 takes nothing", 100 * milli, 0, []call{
			{0, 0, 0, nil}, {0, 1, 0, nil}, {0, 0, 0, nil},
		}},
		{"no shaping", 0, 0, []call{
			{0, 1, 0, nil}, {0, 1000, 0, nil}, {0, 1, 0, nil},
		}},
		{"huge n does not overflow", time.Hour, 0, []call{
			{0, 1 << 62, 0, nil}, {1000 * time.Hour, 1, 0, ErrQueueFull},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewShaper(tt.every, tt.queue)
			for i, c := range tt.calls {
				d, err := s.ReserveN(limEpoch.Add(c.at), c.n)
				if d != c.delay || !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
					t.Fatalf("call %d: ReserveN(limEpoch+%v, %d) = %v, %v; want %v, %v", i, c.at, c.n, d, err, c.delay, c.err)
				}
			}
		})
	}
	if _, err := NewShaper(milli, 1).ReserveN(limEpoch, -1); err == nil {
		t.Error("ReserveN(-1) succeeded")
	}
	var zero Shaper
	for range 3 {
		if d, err := zero.ReserveN(limEpoch, 5); d != 0 || err != nil {
			t.Errorf("zero Shaper: ReserveN = %v, %v; want 0, nil", d, err)
		}
	}
}

// waitAll starts one Wait per context at once and returns, for each, when
// it returned (relative to the start) and its error.
func waitAll(t *testing.T, s *Shaper, ctxs []context.Context) ([]time.Duration, []error) {
	t.Helper()
	start := time.Now()
	took := make([]time.Duration, len(ctxs))
	errs := make([]error, len(ctxs))
	var wg sync.WaitGroup
	for i, ctx := range ctxs {
		wg.Go(func() {
			errs[i] = s.Wait(ctx)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	return took, errs
}

func TestShaperWaitSpacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every, callers = 40 * milli, 10
		s := NewShaper(every, callers)
		ctxs := make([]context.Context, callers)
		for i := range ctxs {
			ctxs[i] = t.Context()
		}
		took, errs := waitAll(t, s, ctxs)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("caller %d: %v", i, err)
			}
		}
		slices.Sort(took)
		for i, d := range took {
			if want := time.Duration(i) * every; d != want {
				t.Errorf("caller %d left at %v; want %v (exactly one interval apart)", i, d, want)
			}
		}
	})
}

func TestShaperWaitQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every, queue, callers = 50 * milli, 3, 7
		s := NewShaper(every, queue)
		ctxs := make([]context.Context, callers)
		for i := range ctxs {
			ctxs[i] = t.Context()
		}
		took, errs := waitAll(t, s, ctxs)
		var passed []time.Duration
		full := 0
		for i, err := range errs {
			switch {
			case err == nil:
				passed = append(passed, took[i])
			case errors.Is(err, ErrQueueFull):
				full++
				if took[i] != 0 {
					t.Errorf("a rejected caller waited %v", took[i])
				}
			default:
				t.Errorf("caller %d: %v", i, err)
			}
		}
		if len(passed) != queue+1 || full != callers-queue-1 {
			t.Fatalf("%d passed, %d rejected; want %d and %d", len(passed), full, queue+1, callers-queue-1)
		}
		slices.Sort(passed)
		for i, d := range passed {
			if want := time.Duration(i) * every; d != want {
				t.Errorf("caller %d left at %v; want %v", i, d, want)
			}
		}
	})
}

func TestShaperWaitCancel(t *testing.T) {
	tests := []struct {
		name string
		// callers that Wait at the start; the one at index cancelled has
		// its context cancelled after 10ms.
		callers   int
		cancelled int
		// the turn of one more caller that comes at 20ms
		late time.Duration
	}{
		{"the last turn is given back", 2, 1, 100 * milli},
		{"a turn with callers behind it stays empty", 3, 1, 300 * milli},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := NewShaper(100*milli, 5)
				start := time.Now()
				ctxs := make([]context.Context, tt.callers)
				for i := range ctxs {
					ctxs[i] = t.Context()
				}
				ctx, cancel := context.WithCancel(t.Context())
				ctxs[tt.cancelled] = ctx
				time.AfterFunc(10*milli, cancel)
				errs := make([]error, tt.callers)
				var wg sync.WaitGroup
				for i := range ctxs {
					wg.Go(func() { errs[i] = s.Wait(ctxs[i]) })
					synctest.Wait() // its turn is taken: turns follow the indexes
				}
				var lateAt time.Duration
				wg.Go(func() {
					time.Sleep(20 * milli) // fake time in the bubble
					if err := s.Wait(t.Context()); err != nil {
						t.Error(err)
					}
					lateAt = time.Since(start)
				})
				wg.Wait()
				if !errors.Is(errs[tt.cancelled], context.Canceled) {
					t.Errorf("cancelled caller: %v; want context.Canceled", errs[tt.cancelled])
				}
				if lateAt != tt.late {
					t.Errorf("late caller left at %v; want %v", lateAt, tt.late)
				}
			})
		})
	}
}

func TestShaperWaitDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewShaper(100*milli, 5)
		if err := s.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 99*milli)
		t.Cleanup(cancel)
		start := time.Now()
		if err := s.Wait(ctx); !errors.Is(err, ErrWouldExceedDeadline) {
			t.Fatalf("Wait = %v; want ErrWouldExceedDeadline", err)
		}
		if took := time.Since(start); took != 0 {
			t.Errorf("failing Wait took %v; want 0", took)
		}
		// Nothing was taken: the next caller gets the 100ms turn.
		if d, err := s.ReserveN(time.Now(), 1); d != 100*milli || err != nil {
			t.Errorf("ReserveN = %v, %v; want 100ms, nil", d, err)
		}
		done, cancel2 := context.WithCancel(t.Context())
		cancel2()
		if err := s.Wait(done); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait on a done context = %v; want context.Canceled", err)
		}
	})
}

func BenchmarkShaperReserveN(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		s := NewShaper(time.Microsecond, 1000)
		now := time.Now()
		for b.Loop() {
			now = now.Add(time.Microsecond)
			if _, err := s.ReserveN(now, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		s := NewShaper(time.Nanosecond, 1000)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.ReserveN(time.Now(), 1)
			}
		})
	})
}
