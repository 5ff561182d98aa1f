package drain

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// lapseSource is a Source with an ack wait that is never read from: the
// test hands its Drainer messages itself.
type lapseSource struct{ wait time.Duration }

func (s lapseSource) Next(ctx context.Context) (Message, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (lapseSource) Backlog(context.Context) (int64, error) { return 0, nil }
func (lapseSource) Window() int                            { return 16 }
func (s lapseSource) AckWait() time.Duration               { return s.wait }

// lapseMsg counts the queue calls made on it.
type lapseMsg struct {
	key                  string
	acks, naks, progress atomic.Int32
}

func (m *lapseMsg) Key() string       { return m.key }
func (m *lapseMsg) Data() []byte      { return nil }
func (m *lapseMsg) Tenant() string    { return "" }
func (m *lapseMsg) Partition() string { return "" }
func (m *lapseMsg) Deliveries() int   { return 1 }
func (m *lapseMsg) Ack(context.Context) error {
	m.acks.Add(1)
	return nil
}
func (m *lapseMsg) Nak(context.Context, time.Duration) error {
	m.naks.Add(1)
	return nil
}
func (m *lapseMsg) InProgress(context.Context) error {
	m.progress.Add(1)
	return nil
}
func (m *lapseMsg) DeadLetter(context.Context, error) error { return errors.New("none") }

// TestLapsedNotSent: a message held past its Source's ack wait since it
// was last told InProgress (a drainer stopped with SIGSTOP, resumed) is
// neither told InProgress nor sent, and the queue is not told anything:
// it hands the message on; one within its ack wait is sent and
// acknowledged.
func TestLapsedNotSent(t *testing.T) {
	const wait = 3 * time.Second
	var sent atomic.Int32
	d, err := New(Options{Inputs: []Input{{Source: lapseSource{wait}}},
		Sink: func(context.Context, Message) error { sent.Add(1); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	hold := func(m Message, beat time.Time) *hold {
		d.mu.Lock()
		defer d.mu.Unlock()
		h := d.newHoldLocked(m, 0, beat)
		h.inSink, h.index = true, len(d.held)
		d.held = append(d.held, h)
		d.heldN[0]++
		d.sinkN[0]++
		d.stats.InFlight++
		return h
	}
	old, fresh := &lapseMsg{key: "old"}, &lapseMsg{key: "fresh"}
	ho := hold(old, now.Add(-wait))
	hf := hold(fresh, now.Add(-wait/2))

	// The heartbeat leaves the lapsed one alone and tells the other.
	d.beat(context.Background(), ho, time.Second)
	d.beat(context.Background(), hf, time.Second)
	if old.progress.Load() != 0 || fresh.progress.Load() != 1 {
		t.Errorf("InProgress told %d times to the lapsed message, %d to the other; want 0 and 1", old.progress.Load(), fresh.progress.Load())
	}

	calls := newDeadlines(context.Background(), time.Second)
	defer calls.stop()
	if done := d.work(calls, ho); done != nil {
		t.Errorf("the lapsed message returned to be forgotten")
	}
	// The acknowledged one is forgotten by the worker's next take.
	if done := d.work(calls, hf); done != hf {
		t.Errorf("the acknowledged message not returned to be forgotten: %v", done)
	} else {
		d.forget(done, true, nil)
	}
	st := d.Stats()
	if sent.Load() != 1 || fresh.acks.Load() != 1 {
		t.Errorf("%d sent, the fresh message acknowledged %d times; want 1 and 1", sent.Load(), fresh.acks.Load())
	}
	if n := old.acks.Load() + old.naks.Load(); n != 0 {
		t.Errorf("the lapsed message acknowledged or put back %d times, want 0", n)
	}
	if st.Lapsed != 1 || st.Done != 1 || st.InFlight != 0 || len(d.held) != 0 {
		t.Errorf("stats %+v, %d held; want 1 lapsed, 1 done, none in flight or held", st, len(d.held))
	}
}
