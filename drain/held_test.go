package drain_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/ratelimit"
)

// fakeQueue is a Source in memory with an ack wait, for tests in a
// synctest bubble: a message it has delivered and that is neither settled
// nor told InProgress within ackWait is delivered again, as JetStream
// does. It records what the Drainer does to each message.
type fakeQueue struct {
	window  int
	ackWait time.Duration // 0: no AckWaiter behaviour (never redelivered)
	ch      chan *fakeMsg
	started time.Time

	mu          sync.Mutex
	outstanding int // delivered, not settled
	maxOut      int
	asked       []int // NextUpTo's n
	acked       map[string]int
	redelivered int
	lateBeats   int // InProgress on a settled message
	allAcked    chan struct{}
	want        int
	all         []*fakeMsg
	// batched: NextUpTo takes up to n messages at once and keeps those
	// it does not return yet, delivered (their ack wait running), for
	// the next calls, as a queue's client does with a batch it pulled.
	batched bool
	buf     []*fakeMsg
	onBatch func() // called after a batch is pulled, if set
}

// ackQueue is a fakeQueue that reports its ack wait.
type ackQueue struct{ *fakeQueue }

func (q ackQueue) AckWait() time.Duration { return q.ackWait }

// multiQueue is an ackQueue that is a drain.MultiSource: NextMany waits
// for one message, and adds those waiting in the queue then; batched, it
// takes a batch of len(ms) as NextUpTo does and returns one of it.
type multiQueue struct{ ackQueue }

func (q multiQueue) NextMany(ctx context.Context, ms []drain.Message) (int, error) {
	if q.batched {
		m, err := q.NextUpTo(ctx, len(ms))
		if err != nil {
			return 0, err
		}
		ms[0] = m
		return 1, nil
	}
	q.mu.Lock()
	q.asked = append(q.asked, len(ms))
	q.mu.Unlock()
	m, err := q.NextUpTo1(ctx)
	if err != nil {
		return 0, err
	}
	ms[0] = m
	n := 1
	for ; n < len(ms); n++ {
		select {
		case more := <-q.ch:
			q.take(more)
			ms[n] = more
		default:
			return n, nil
		}
	}
	return n, nil
}

func newFakeQueue(window, n int, ackWait time.Duration, partition func(i int) string) *fakeQueue {
	q := &fakeQueue{window: window, ackWait: ackWait, ch: make(chan *fakeMsg, 2*n+window), started: time.Now(),
		acked: make(map[string]int), allAcked: make(chan struct{}), want: n}
	for i := range n {
		m := &fakeMsg{q: q, key: fmt.Sprintf("k%03d", i), part: partition(i), deliveries: 1}
		q.all = append(q.all, m)
		q.ch <- m
	}
	return q
}

func (q *fakeQueue) Next(ctx context.Context) (drain.Message, error) { return q.NextUpTo(ctx, 1) }

func (q *fakeQueue) NextUpTo(ctx context.Context, n int) (drain.Message, error) {
	q.mu.Lock()
	q.asked = append(q.asked, n)
	if q.batched && len(q.buf) > 0 {
		m := q.buf[0]
		q.buf = q.buf[1:]
		q.mu.Unlock()
		return m, nil
	}
	q.mu.Unlock()
	if q.batched {
		m, err := q.NextUpTo1(ctx)
		if err != nil {
			return nil, err
		}
		for range n - 1 {
			select {
			case more := <-q.ch:
				q.take(more)
				q.mu.Lock()
				q.buf = append(q.buf, more)
				q.mu.Unlock()
			default:
			}
		}
		if q.onBatch != nil {
			q.onBatch()
		}
		return m, nil
	}
	return q.NextUpTo1(ctx)
}

// NextUpTo1 delivers one message, waiting for it.
func (q *fakeQueue) NextUpTo1(ctx context.Context) (drain.Message, error) {
	select {
	case m := <-q.ch:
		q.take(m)
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// take delivers m.
func (q *fakeQueue) take(m *fakeMsg) {
	q.mu.Lock()
	q.outstanding++
	q.maxOut = max(q.maxOut, q.outstanding)
	q.mu.Unlock()
	m.deliver()
}

func (q *fakeQueue) Backlog(context.Context) (int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int64(q.want - len(q.acked)), nil
}

func (q *fakeQueue) Window() int { return q.window }

// fakeMsg is one message of a fakeQueue; one value serves every delivery.
type fakeMsg struct {
	q          *fakeQueue
	key, part  string
	mu         sync.Mutex
	deliveries int
	gen        int         // delivery generation: a timer of an older one does nothing
	timer      *time.Timer // the ack wait of the current delivery
	settled    bool
	last       time.Time     // delivered or told InProgress
	maxGap     time.Duration // longest time held without word
}

func (m *fakeMsg) deliver() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settled = false
	m.last = time.Now()
	m.gen++
	m.arm()
}

// arm starts the ack wait; m.mu is held.
func (m *fakeMsg) arm() {
	if m.q.ackWait == 0 {
		return
	}
	if m.timer != nil {
		m.timer.Stop()
	}
	gen := m.gen
	m.timer = time.AfterFunc(m.q.ackWait, func() {
		m.mu.Lock()
		if m.settled || m.gen != gen {
			m.mu.Unlock()
			return
		}
		m.settled = true // this delivery is over: the queue gives it again
		m.deliveries++
		m.mu.Unlock()
		m.q.mu.Lock()
		m.q.outstanding--
		m.q.redelivered++
		m.q.mu.Unlock()
		m.q.ch <- m
	})
}

// settle ends the current delivery; it reports false if it had ended.
func (m *fakeMsg) settle() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled {
		return false
	}
	m.settled = true
	m.maxGap = max(m.maxGap, time.Since(m.last))
	if m.timer != nil {
		m.timer.Stop()
	}
	m.q.mu.Lock()
	m.q.outstanding--
	m.q.mu.Unlock()
	return true
}

func (m *fakeMsg) Key() string       { return m.key }
func (m *fakeMsg) Data() []byte      { return []byte(m.key) }
func (m *fakeMsg) Tenant() string    { return "" }
func (m *fakeMsg) Partition() string { return m.part }
func (m *fakeMsg) Deliveries() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.deliveries
}

func (m *fakeMsg) Ack(context.Context) error {
	if !m.settle() {
		return errors.New("ack of a delivery that ended")
	}
	q := m.q
	q.mu.Lock()
	defer q.mu.Unlock()
	q.acked[m.key]++
	if len(q.acked) == q.want && q.acked[m.key] == 1 {
		close(q.allAcked)
	}
	return nil
}

func (m *fakeMsg) Nak(_ context.Context, delay time.Duration) error {
	if !m.settle() {
		return errors.New("nak of a delivery that ended")
	}
	m.mu.Lock()
	m.deliveries++
	m.mu.Unlock()
	time.AfterFunc(delay, func() { m.q.ch <- m })
	return nil
}

func (m *fakeMsg) InProgress(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled {
		m.q.mu.Lock()
		m.q.lateBeats++
		m.q.mu.Unlock()
		return errors.New("in progress of a delivery that ended")
	}
	m.maxGap = max(m.maxGap, time.Since(m.last))
	m.last = time.Now()
	m.arm()
	return nil
}

func (m *fakeMsg) DeadLetter(context.Context, error) error { return errors.New("no dead letters here") }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runBubble runs d in the bubble until q has every message acknowledged
// (or the bubble's clock passes limit), then stops it and returns the
// time taken.
func runBubble(t *testing.T, d *drain.Drainer, q *fakeQueue, limit time.Duration) time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	begin := time.Now()
	go func() { done <- d.Run(ctx) }()
	var took time.Duration
	select {
	case <-q.allAcked:
		took = time.Since(begin)
	case <-time.After(limit):
		q.mu.Lock()
		t.Errorf("after %v: %d of %d acknowledged", limit, len(q.acked), q.want)
		q.mu.Unlock()
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	return took
}

// TestDrainHeldHeartbeat: 20 messages at 2/s from a queue whose ack wait
// is 2 s. Every message held (waiting for the Limiter, or in the Sink)
// is told InProgress at least every ProgressEvery, never after it was
// settled; the Drainer holds no more than the rate sends in half the ack
// wait; nothing is delivered twice, so each is sent once. Before, the
// Drainer took the whole window at once and only messages in the Sink
// were told InProgress: all but the first few came again. The same with a
// MultiSource, which is asked for no more than the room.
func TestDrainHeldHeartbeat(t *testing.T) {
	t.Run("Source", func(t *testing.T) { testDrainHeldHeartbeat(t, false) })
	t.Run("MultiSource", func(t *testing.T) { testDrainHeldHeartbeat(t, true) })
}

func testDrainHeldHeartbeat(t *testing.T, multi bool) {
	synctest.Test(t, func(t *testing.T) {
		const n = 20
		q := newFakeQueue(64, n, 2*time.Second, func(int) string { return "" })
		var src drain.Source = ackQueue{q}
		if multi {
			src = multiQueue{ackQueue{q}}
		}
		var mu sync.Mutex
		sent := map[string]int{}
		d, err := drain.New(drain.Options{
			Inputs: []drain.Input{{Source: src}},
			Sink: func(ctx context.Context, m drain.Message) error {
				mu.Lock()
				sent[m.Key()]++
				mu.Unlock()
				// A slow sink: longer than ProgressEvery, shorter than
				// the Timeout.
				time.Sleep(1500 * time.Millisecond)
				return nil
			},
			Limiter: ratelimit.NewLimiter(2, 1),
			Logger:  quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		took := runBubble(t, d, q, time.Minute)
		synctest.Wait()
		st := d.Stats()
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.redelivered != 0 || st.Redelivered != 0 {
			t.Errorf("%d messages delivered again by the queue (stats: %d)", q.redelivered, st.Redelivered)
		}
		for k, c := range sent {
			if c != 1 {
				t.Errorf("%s sent %d times", k, c)
			}
		}
		if len(sent) != n || st.Done != n || st.Duplicates != 0 {
			t.Errorf("%d sent, done %d, duplicates %d; want %d, %d, 0", len(sent), st.Done, st.Duplicates, n, n)
		}
		if q.lateBeats != 0 {
			t.Errorf("%d InProgress after the message was settled", q.lateBeats)
		}
		// ProgressEvery defaults to a third of the ack wait.
		every := 2 * time.Second / 3
		for _, m := range q.all {
			if m.maxGap > every {
				t.Errorf("%s held %v without InProgress, want at most %v", m.key, m.maxGap, every)
			}
		}
		// At most 2 waiting (2/s × 2 s / 2) and 4 in the Sink (1.5 s each
		// at 2/s).
		if q.maxOut > 6 {
			t.Errorf("held %d at once, want at most 6", q.maxOut)
		}
		for _, a := range q.asked {
			if a > 2 {
				t.Errorf("asked the source for %d, want at most 2", a)
				break
			}
		}
		t.Logf("took %v; held at most %d; stats %+v", took, q.maxOut, st)
	})
}

// TestBatchTakenWhenRateFalls: a Source that pulls a batch of what the
// Drainer has room for (20/s × half the 2 s ack wait) keeps it,
// delivered, until it is taken; as the batch comes, the Limiter's rate
// falls to 2/s, so that the Drainer's room for waiting messages is gone.
// What the Source still holds of the batch must be taken all the same,
// and so told InProgress: none is delivered again. Before, the Drainer
// took one more each time one was sent, at 2/s, and the end of the batch
// outlived its ack wait in the Source. The same with a MultiSource that
// returns one message of its batch at a time.
func TestBatchTakenWhenRateFalls(t *testing.T) {
	t.Run("BatchSource", func(t *testing.T) { testBatchTakenWhenRateFalls(t, false) })
	t.Run("MultiSource", func(t *testing.T) { testBatchTakenWhenRateFalls(t, true) })
}

func testBatchTakenWhenRateFalls(t *testing.T, multi bool) {
	synctest.Test(t, func(t *testing.T) {
		const n = 30
		q := newFakeQueue(64, n, 2*time.Second, func(int) string { return "" })
		q.batched = true
		lim := ratelimit.NewLimiter(20, 1)
		var once sync.Once
		q.onBatch = func() { once.Do(func() { lim.SetLimit(2) }) }
		var src drain.Source = ackQueue{q}
		if multi {
			src = multiQueue{ackQueue{q}}
		}
		d, err := drain.New(drain.Options{
			Inputs:  []drain.Input{{Source: src}},
			Sink:    func(context.Context, drain.Message) error { return nil },
			Limiter: lim,
			Logger:  quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		runBubble(t, d, q, 5*time.Minute)
		synctest.Wait()
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.redelivered != 0 {
			t.Errorf("%d messages delivered again by the queue while the Drainer or its Source held them", q.redelivered)
		}
		if len(q.acked) != n {
			t.Errorf("%d of %d acknowledged", len(q.acked), n)
		}
	})
}

// TestWorkersKeepSlowSinkBusy: 640 messages, no Limiter, a Sink that
// takes 100 ms and 64 workers. The workers woken as the Sink needs them
// (see Options.Workers) still keep all 64 calls in flight: each wave of 64 goes
// at once, and the 640 take 1 s.
func TestWorkersKeepSlowSinkBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, workers = 640, 64
		q := newFakeQueue(256, n, 0, func(int) string { return "" })
		var mu sync.Mutex
		in, most := 0, 0
		d, err := drain.New(drain.Options{
			Inputs: []drain.Input{{Source: q}},
			Sink: func(context.Context, drain.Message) error {
				mu.Lock()
				in++
				most = max(most, in)
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
				mu.Lock()
				in--
				mu.Unlock()
				return nil
			},
			Workers: workers,
			Logger:  quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		took := runBubble(t, d, q, time.Minute)
		if most != workers {
			t.Errorf("at most %d Sink calls in flight, want %d", most, workers)
		}
		if want := n / workers * 100 * time.Millisecond; took != want {
			t.Errorf("took %v, want %v", took, want)
		}
	})
}

// TestFreeWorkersCombined runs the workers without a Limiter with the
// features a user turns on beside them: two Inputs of two priorities
// (one a MultiSource), both with an ack wait (heartbeats), five
// partitions paused one at a time (PausePartition: the first message of
// p0 is answered 429 for 500 ms), and a Sink that answers most messages
// at once and one in ten after 50 ms. Every message is acknowledged
// once, none is delivered again nor told InProgress once settled, no
// call for p0 is made during its pause, the Stats count each key once
// (the queues share their keys: the rest are duplicates), and
// the slow calls overlap: the 80 of them, 4 s one after another, take
// less than a second with the pause.
func TestFreeWorkersCombined(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 400
		part := func(i int) string { return fmt.Sprint("p", i%5) }
		hi := newFakeQueue(64, n, 2*time.Second, part)
		lo := newFakeQueue(64, n, 2*time.Second, part)
		var mu sync.Mutex
		in, most := 0, 0
		var pausedAt time.Time
		var p0 []time.Time
		begin := time.Now()
		d, err := drain.New(drain.Options{
			Inputs: []drain.Input{{Source: ackQueue{hi}, Priority: priority.High}, {Source: multiQueue{ackQueue{lo}}, Priority: priority.Low}},
			Sink: func(ctx context.Context, m drain.Message) error {
				mu.Lock()
				in++
				most = max(most, in)
				if m.Partition() == "p0" {
					p0 = append(p0, time.Now())
					if pausedAt.IsZero() {
						pausedAt = time.Now()
						in--
						mu.Unlock()
						return drain.Throttle(500*time.Millisecond, errors.New("429"))
					}
				}
				mu.Unlock()
				if strings.HasSuffix(m.Key(), "7") {
					time.Sleep(50 * time.Millisecond)
				}
				mu.Lock()
				in--
				mu.Unlock()
				return nil
			},
			PauseScope: drain.PausePartition,
			Logger:     quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		for _, q := range []*fakeQueue{hi, lo} {
			select {
			case <-q.allAcked:
			case <-time.After(time.Minute):
				t.Fatalf("after a minute: %d of %d acknowledged", len(q.acked), q.want)
			}
		}
		took := time.Since(begin)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		synctest.Wait()
		for name, q := range map[string]*fakeQueue{"high": hi, "low": lo} {
			q.mu.Lock()
			for k, c := range q.acked {
				if c != 1 {
					t.Errorf("%s: %s acknowledged %d times", name, k, c)
				}
			}
			if q.redelivered != 0 || q.lateBeats != 0 {
				t.Errorf("%s: %d delivered again, %d InProgress after settlement", name, q.redelivered, q.lateBeats)
			}
			q.mu.Unlock()
		}
		// The two queues hold the same keys: the second acknowledgement
		// of each is a duplicate.
		if st := d.Stats(); st.Done != n || st.Duplicates != n || st.Throttled != 1 || st.Pauses != 1 {
			t.Errorf("stats %+v: want %d done, %d duplicates, 1 throttled, 1 pause", st, n, n)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, at := range p0[1:] {
			if at.Before(pausedAt.Add(500 * time.Millisecond)) {
				t.Errorf("p0 called %v after its 500 ms pause began", at.Sub(pausedAt))
			}
		}
		if most > drain.DefaultWorkers {
			t.Errorf("%d Sink calls at once, more than the %d workers", most, drain.DefaultWorkers)
		}
		if took >= time.Second {
			t.Errorf("took %v, want under 1 s: the slow calls did not overlap", took)
		}
		t.Logf("took %v, at most %d calls at once", took, most)
	})
}

// TestMultiSourceWindow: 2,000 messages of a MultiSource with a window
// of 64 and an ack wait of 2 s, no Limiter, a Sink that takes 10 ms: the
// Drainer takes them in batches no larger than its room, holds no more
// than the window, tells the held ones InProgress and never a settled
// one (holds are reused), and each message is acknowledged once.
func TestMultiSourceWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, window = 2000, 64
		q := newFakeQueue(window, n, 2*time.Second, func(int) string { return "" })
		d, err := drain.New(drain.Options{
			Inputs: []drain.Input{{Source: multiQueue{ackQueue{q}}}},
			Sink: func(context.Context, drain.Message) error {
				time.Sleep(10 * time.Millisecond)
				return nil
			},
			Workers: 16,
			Logger:  quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		runBubble(t, d, q, time.Minute)
		synctest.Wait()
		st := d.Stats()
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.maxOut > window {
			t.Errorf("held %d at once, want at most %d", q.maxOut, window)
		}
		batches := 0
		for _, a := range q.asked {
			if a > window {
				t.Errorf("asked the source for %d, more than the window %d", a, window)
			}
			if a > 1 {
				batches++
			}
		}
		if batches == 0 {
			t.Errorf("never asked for more than one message: %v", q.asked)
		}
		if q.redelivered != 0 || q.lateBeats != 0 {
			t.Errorf("%d delivered again, %d InProgress after the message was settled", q.redelivered, q.lateBeats)
		}
		for k, c := range q.acked {
			if c != 1 {
				t.Errorf("%s acknowledged %d times", k, c)
			}
		}
		if len(q.acked) != n || st.Done != n || st.Duplicates != 0 {
			t.Errorf("%d acknowledged, done %d, duplicates %d; want %d, %d, 0", len(q.acked), st.Done, st.Duplicates, n, n)
		}
	})
}

// scopeRun drains 40 messages of partitions p0..p3 at 20/s, where the
// first call for p0 is answered throttled for 1 s, and returns the calls'
// times (from the start) by partition, the time of that answer and the
// time taken.
func scopeRun(t *testing.T, scope drain.PauseScope) (calls map[string][]time.Duration, throttledAt, took time.Duration) {
	const n = 40
	q := newFakeQueue(16, n, 0, func(i int) string { return fmt.Sprint("p", i%4) })
	var mu sync.Mutex
	calls = map[string][]time.Duration{}
	throttledAt = -1
	begin := time.Now()
	d, err := drain.New(drain.Options{
		Inputs: []drain.Input{{Source: q}},
		Sink: func(ctx context.Context, m drain.Message) error {
			mu.Lock()
			defer mu.Unlock()
			at := time.Since(begin)
			calls[m.Partition()] = append(calls[m.Partition()], at)
			if m.Partition() == "p0" && throttledAt < 0 {
				throttledAt = at
				return drain.Throttle(time.Second, errors.New("429"))
			}
			return nil
		},
		Limiter:    ratelimit.NewLimiter(20, 1),
		PauseScope: scope,
		Workers:    4,
		Logger:     quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	took = runBubble(t, d, q, time.Minute)
	st := d.Stats()
	if st.Done != n || st.Throttled != 1 || st.Pauses != 1 {
		t.Errorf("stats %+v: want %d done, 1 throttled, 1 pause", st, n)
	}
	return calls, throttledAt, took
}

// during counts the calls in (from, to).
func during(calls []time.Duration, from, to time.Duration) int {
	c := 0
	for _, at := range calls {
		if at > from && at < to {
			c++
		}
	}
	return c
}

// TestPauseScopePartition: with PausePartition, a throttled answer for
// partition p0 pauses p0 alone: no call for p0 until its pause ends,
// while the other partitions go on at the full rate; the messages of p0
// held meanwhile are set aside and sent after it, and no grant of the
// Limiter is spent on them: the 41 calls take 41 grants' time (the
// bubble's clock is exact). Before, a throttled answer paused every
// worker.
func TestPauseScopePartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls, at, took := scopeRun(t, drain.PausePartition)
		if at < 0 {
			t.Fatal("p0 was never called")
		}
		if c := during(calls["p0"], at, at+time.Second); c != 0 {
			t.Errorf("%d calls for p0 during its pause", c)
		}
		others := 0
		for _, p := range []string{"p1", "p2", "p3"} {
			others += during(calls[p], at, at+time.Second)
		}
		// 20/s for 1 s: 20 grants, one of which may have been in hand.
		if others < 19 {
			t.Errorf("%d calls for other partitions during p0's pause, want at least 19 (20/s)", others)
		}
		if len(calls["p0"]) != 11 {
			t.Errorf("%d calls for p0, want 11 (10 and the one throttled)", len(calls["p0"]))
		}
		// 41 calls at 20/s with a burst of 1: 2 s, and nothing lost to
		// the pause.
		if took > 2100*time.Millisecond {
			t.Errorf("took %v, want at most 2.1 s: grants were spent on paused messages", took)
		}
		t.Logf("throttled at %v, %d other calls during the pause, took %v", at, others, took)
	})
}

// TestPauseScopeAll: with PauseAll (the default), the same answer pauses
// every partition for its second.
func TestPauseScopeAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls, at, took := scopeRun(t, drain.PauseAll)
		for p, cs := range calls {
			if c := during(cs, at, at+time.Second); c != 0 {
				t.Errorf("%d calls for %s during the sink-wide pause", c, p)
			}
		}
		// The 1 s pause, then 40 calls at 20/s less the grants banked
		// meanwhile (a burst of 1, and one in hand).
		if took < 2800*time.Millisecond {
			t.Errorf("took %v, want at least 2.8 s", took)
		}
	})
}

// TestPauseScopeBound: options name the scopes; an invalid one is refused.
func TestPauseScopeBound(t *testing.T) {
	for _, s := range []drain.PauseScope{drain.PauseAll, drain.PausePartition, drain.PauseTenant} {
		got, err := drain.ParsePauseScope(s.String())
		if err != nil || got != s {
			t.Errorf("ParsePauseScope(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := drain.ParsePauseScope("host"); err == nil {
		t.Error("ParsePauseScope(host): no error")
	}
	q := newFakeQueue(1, 0, 0, func(int) string { return "" })
	if _, err := drain.New(drain.Options{Inputs: []drain.Input{{Source: q}}, Sink: func(context.Context, drain.Message) error { return nil },
		PauseScope: 7}); err == nil {
		t.Error("New with PauseScope 7: no error")
	}
	if _, err := drain.New(drain.Options{Inputs: []drain.Input{{Source: ackQueue{q}}}, Sink: func(context.Context, drain.Message) error { return nil },
		ProgressEvery: time.Second}); err != nil {
		t.Errorf("ProgressEvery without an ack wait: %v", err)
	}
	q.ackWait = time.Second
	if _, err := drain.New(drain.Options{Inputs: []drain.Input{{Source: ackQueue{q}}}, Sink: func(context.Context, drain.Message) error { return nil },
		ProgressEvery: time.Second}); err == nil {
		t.Error("ProgressEvery not below the ack wait: no error")
	}
}

// TestPauseScopesBounded: with PausePartition, once MaxPauseScopes
// partitions are paused, the next throttled answer pauses every message:
// no call until it ends, and then every message is done.
func TestPauseScopesBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := drain.MaxPauseScopes + 20
		q := newFakeQueue(2*n, n, 0, func(i int) string { return fmt.Sprint("p", i) })
		var mu sync.Mutex
		var calls []time.Duration
		tried := map[string]bool{}
		begin := time.Now()
		d, err := drain.New(drain.Options{
			Inputs: []drain.Input{{Source: q}},
			Sink: func(ctx context.Context, m drain.Message) error {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, time.Since(begin))
				if !tried[m.Key()] {
					tried[m.Key()] = true
					return drain.Throttle(10*time.Second, errors.New("429"))
				}
				return nil
			},
			PauseScope: drain.PausePartition,
			Workers:    1,
			Logger:     quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		runBubble(t, d, q, time.Minute)
		mu.Lock()
		defer mu.Unlock()
		// MaxPauseScopes partitions paused, then one answer more: every
		// message paused for 10 s.
		at0 := during(calls, -1, time.Nanosecond)
		if at0 != drain.MaxPauseScopes+1 {
			t.Errorf("%d calls before the pause of every message, want %d", at0, drain.MaxPauseScopes+1)
		}
		if c := during(calls, 0, 10*time.Second); c != 0 {
			t.Errorf("%d calls while every message was paused", c)
		}
		if st := d.Stats(); st.Done != int64(n) {
			t.Errorf("done %d, want %d", st.Done, n)
		}
	})
}

// TestHeartbeatMeetsAck: Sink calls that end exactly as a heartbeat is
// due (each takes two heartbeat periods, in a bubble where both happen at
// the same instant): no message is told InProgress after, or while, it
// is acknowledged, and no acknowledgement fails.
func TestHeartbeatMeetsAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 64
		q := newFakeQueue(64, n, 3*time.Second, func(int) string { return "" })
		d, err := drain.New(drain.Options{
			Inputs: []drain.Input{{Source: ackQueue{q}}},
			Sink: func(ctx context.Context, m drain.Message) error {
				time.Sleep(time.Second)
				return nil
			},
			ProgressEvery: time.Second, // heartbeats every 500 ms
			Workers:       8,
			Logger:        quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		runBubble(t, d, q, time.Minute)
		st := d.Stats()
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.lateBeats != 0 || st.AckErrors != 0 {
			t.Errorf("%d InProgress after a settlement, %d ack errors", q.lateBeats, st.AckErrors)
		}
		if st.Done != n || q.redelivered != 0 {
			t.Errorf("done %d, redelivered %d; want %d, 0", st.Done, q.redelivered, n)
		}
	})
}
