package concurrency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestSemaphoreSteps runs sequences of non-blocking operations and checks
// the held weight after each.
func TestSemaphoreSteps(t *testing.T) {
	type step struct {
		op   string // "try" or "release"
		w    int64
		ok   bool // for "try"
		held int64
	}
	tests := []struct {
		name  string
		size  int64
		steps []step
	}{
		{"fill exactly", 3, []step{
			{"try", 1, true, 1}, {"try", 2, true, 3}, {"try", 1, false, 3},
			{"release", 2, false, 1}, {"try", 2, true, 3},
		}},
		{"weight zero always fits", 1, []step{
			{"try", 1, true, 1}, {"try", 0, true, 1},
		}},
		{"weight above size never", 2, []step{
			{"try", 3, false, 0}, {"try", 2, true, 2},
		}},
		{"negative weight refused", 2, []step{
			{"try", -1, false, 0}, {"release", -5, false, 0},
		}},
		{"over-release clamps at zero", 2, []step{
			{"try", 1, true, 1}, {"release", 5, false, 0}, {"try", 2, true, 2}, {"try", 1, false, 2},
		}},
		{"size zero", 0, []step{
			{"try", 1, false, 0}, {"try", 0, true, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSemaphore(tt.size)
			for i, st := range tt.steps {
				switch st.op {
				case "try":
					if got := s.TryAcquire(st.w); got != st.ok {
						t.Fatalf("step %d: TryAcquire(%d) = %v, want %v", i, st.w, got, st.ok)
					}
				case "release":
					s.Release(st.w)
				}
				if got := s.Held(); got != st.held {
					t.Fatalf("step %d: Held() = %d, want %d", i, got, st.held)
				}
			}
		})
	}
}

func TestSemaphoreAcquireErrors(t *testing.T) {
	s := NewSemaphore(2)
	if err := s.Acquire(context.Background(), 3); !errors.Is(err, ErrExceedsLimit) {
		t.Errorf("Acquire(3) on size 2 = %v, want ErrExceedsLimit", err)
	}
	if err := s.Acquire(context.Background(), -1); !errors.Is(err, ErrNegativeWeight) {
		t.Errorf("Acquire(-1) = %v, want ErrNegativeWeight", err)
	}
	s.TryAcquire(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Acquire(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire with a cancelled context = %v, want context.Canceled", err)
	}
	if s.Waiting() != 0 || s.Held() != 2 {
		t.Errorf("after failed Acquire: waiting %d, held %d; want 0, 2", s.Waiting(), s.Held())
	}
}

// acquireAsync starts Acquire in a goroutine and returns a channel that
// receives its result.
func acquireAsync(ctx context.Context, s *Semaphore, w int64) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- s.Acquire(ctx, w) }()
	return ch
}

// done reports whether ch has a value, once every goroutine of the bubble is
// blocked.
func done(t *testing.T, ch <-chan error) (error, bool) {
	t.Helper()
	synctest.Wait()
	select {
	case err := <-ch:
		return err, true
	default:
		return nil, false
	}
}

func TestSemaphoreFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := NewSemaphore(10)
		if !s.TryAcquire(8) {
			t.Fatal("TryAcquire(8) failed on an empty semaphore")
		}
		big := acquireAsync(ctx, s, 5) // must wait for 3 more units
		if _, ok := done(t, big); ok {
			t.Fatal("Acquire(5) returned with only 2 units free")
		}
		// A small request would fit in the 2 free units but must queue behind.
		small := acquireAsync(ctx, s, 1)
		if _, ok := done(t, small); ok {
			t.Fatal("Acquire(1) overtook an older waiter")
		}
		if s.TryAcquire(1) {
			t.Fatal("TryAcquire(1) overtook an older waiter")
		}
		s.Release(4) // 6 free: the big one goes first, then the small one fits too
		if err, ok := done(t, big); !ok || err != nil {
			t.Fatalf("Acquire(5) after Release: done %v, err %v", ok, err)
		}
		if err, ok := done(t, small); !ok || err != nil {
			t.Fatalf("Acquire(1) after Release: done %v, err %v", ok, err)
		}
		if got := s.Held(); got != 10 {
			t.Fatalf("Held() = %d, want 10", got)
		}
	})
}

// TestSemaphoreNoStarvation: a waiter for the whole semaphore is served even
// though small holders keep cycling as fast as they can.
func TestSemaphoreNoStarvation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := NewSemaphore(4)
		var wg sync.WaitGroup
		var cycles atomic.Int64
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					if s.Acquire(ctx, 1) != nil {
						return
					}
					time.Sleep(time.Millisecond) // work, in fake time
					cycles.Add(1)
					s.Release(1)
				}
			})
		}
		time.Sleep(10 * time.Millisecond)
		start := time.Now()
		if err := s.Acquire(ctx, 4); err != nil {
			t.Fatalf("Acquire(4): %v", err)
		}
		// Every small holder finishes its current millisecond of work and
		// then queues behind the big waiter.
		if waited := time.Since(start); waited > time.Millisecond {
			t.Errorf("Acquire(4) waited %v, want at most 1ms", waited)
		}
		if cycles.Load() == 0 {
			t.Error("small holders never ran")
		}
		s.Release(4)
		cancel()
		wg.Wait()
	})
}

// TestSemaphoreCancelWakesOthers: a cancelled head waiter leaves the queue and
// the waiters it was blocking are served.
func TestSemaphoreCancelWakesOthers(t *testing.T) {
	tests := []struct {
		name        string
		size, held  int64
		headW       int64
		behind      []int64
		wantGranted []bool
	}{
		{"head blocked two small", 4, 3, 4, []int64{1, 1}, []bool{true, false}},
		{"head blocked one that fits", 10, 5, 8, []int64{5}, []bool{true}},
		{"behind still too large", 10, 5, 8, []int64{6}, []bool{false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := NewSemaphore(tt.size)
				s.TryAcquire(tt.held)
				headCtx, cancelHead := context.WithCancel(context.Background())
				head := acquireAsync(headCtx, s, tt.headW)
				synctest.Wait()
				var behind []<-chan error
				for _, w := range tt.behind {
					behind = append(behind, acquireAsync(context.Background(), s, w))
					synctest.Wait() // keep arrival order
				}
				for i, ch := range behind {
					if _, ok := done(t, ch); ok {
						t.Fatalf("waiter %d served while the head waits", i)
					}
				}
				cancelHead()
				if err, ok := done(t, head); !ok || !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled head: done %v, err %v; want context.Canceled", ok, err)
				}
				want := tt.held
				for i, ch := range behind {
					err, ok := done(t, ch)
					if ok != tt.wantGranted[i] || err != nil {
						t.Fatalf("waiter %d: done %v err %v, want granted %v", i, ok, err, tt.wantGranted[i])
					}
					if ok {
						want += tt.behind[i]
					}
				}
				if got := s.Held(); got != want {
					t.Fatalf("Held() = %d, want %d", got, want)
				}
				s.Release(s.Held()) // let the remaining waiters finish
				for i, ch := range behind {
					if !tt.wantGranted[i] {
						if err := <-ch; err != nil {
							t.Fatalf("waiter %d after release: %v", i, err)
						}
					}
				}
			})
		})
	}
}

// TestSemaphoreDeadline: a waiter whose deadline passes returns
// DeadlineExceeded at that instant, holding nothing.
func TestSemaphoreDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewSemaphore(1)
		s.TryAcquire(1)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := s.Acquire(ctx, 1)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v, want DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited != 50*time.Millisecond {
			t.Fatalf("waited %v, want 50ms", waited)
		}
		if s.Held() != 1 || s.Waiting() != 0 {
			t.Fatalf("held %d, waiting %d; want 1, 0", s.Held(), s.Waiting())
		}
	})
}

// TestSemaphoreStress checks under -race that the held weight never exceeds
// the size while many goroutines acquire, cancel and release.
func TestSemaphoreStress(t *testing.T) {
	const size = 7
	s := NewSemaphore(size)
	var inside atomic.Int64
	var peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 300 {
				w := int64(1 + (g+i)%3)
				ctx, cancel := context.WithCancel(context.Background())
				if i%5 == 0 {
					cancel() // some give up at once
				}
				if err := s.Acquire(ctx, w); err != nil {
					cancel()
					continue
				}
				n := inside.Add(w)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				inside.Add(-w)
				s.Release(w)
				cancel()
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > size || p == 0 {
		t.Fatalf("peak weight inside = %d, want 1..%d", p, size)
	}
	if s.Held() != 0 || s.Waiting() != 0 {
		t.Fatalf("after all: held %d waiting %d", s.Held(), s.Waiting())
	}
}
