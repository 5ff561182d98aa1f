package drain_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
)

// groupQueue is a Source in memory whose messages are AsyncAckers
// confirmed in groups with drain.ConfirmAll, as a queue that answers many
// acknowledgements at once: the acknowledgement that completes a group
// (group of them, or every message out) confirms it before AckAsync
// returns. The group numbered failGroup is confirmed with an error, its
// messages queued again (delivered a second time), as a queue does with
// acknowledgements it did not take.
type groupQueue struct {
	window, group, failGroup int
	others                   drain.Confirm // added to the first group, not a Drainer's

	mu        sync.Mutex
	queue     []*groupMsg
	out       int // delivered, not confirmed
	asked     []asked
	groups    int
	room      chan struct{} // signalled when a confirmation frees the window
	confirmed int           // messages confirmed without error
	failed    int           // the messages of group failGroup
	wantAll   int
	allDone   chan struct{}
}

type groupMsg struct {
	q          *groupQueue
	key        string
	deliveries int
}

func (q *groupQueue) Next(ctx context.Context) (drain.Message, error) {
	for {
		q.mu.Lock()
		if len(q.queue) > 0 && q.out < q.window {
			m := q.queue[0]
			q.queue = q.queue[1:]
			m.deliveries++
			q.out++
			q.mu.Unlock()
			return m, nil
		}
		q.mu.Unlock()
		select {
		case <-q.room:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (q *groupQueue) Backlog(context.Context) (int64, error) { return 0, nil }
func (q *groupQueue) Window() int                            { return q.window }

func (m *groupMsg) Key() string                              { return m.key }
func (m *groupMsg) Data() []byte                             { return nil }
func (m *groupMsg) Tenant() string                           { return "" }
func (m *groupMsg) Partition() string                        { return "" }
func (m *groupMsg) Deliveries() int                          { return m.deliveries }
func (m *groupMsg) Ack(context.Context) error                { panic("Ack of an AsyncAcker") }
func (m *groupMsg) Nak(context.Context, time.Duration) error { panic("Nak") }
func (m *groupMsg) InProgress(context.Context) error         { return nil }
func (m *groupMsg) DeadLetter(context.Context, error) error  { panic("DeadLetter") }

func (m *groupMsg) AckAsync(_ context.Context, done drain.Confirm) {
	q := m.q
	q.mu.Lock()
	q.asked = append(q.asked, asked{m, done})
	q.mu.Unlock()
	q.flush()
}

// flush confirms the acknowledgements asked, a group at a time, while
// they make one: group of them, or every message out. A group confirmed
// is no longer out, which may make those asked meanwhile a group: it
// looks again.
func (q *groupQueue) flush() {
	for {
		q.mu.Lock()
		if len(q.asked) == 0 || len(q.asked) < q.group && len(q.asked) < q.out {
			q.mu.Unlock()
			return
		}
		k := min(len(q.asked), q.group)
		group := slices.Clone(q.asked[:k])
		q.asked = slices.Delete(q.asked, 0, k)
		q.groups++
		var err error
		if q.groups == q.failGroup {
			err = errors.New("acknowledgements lost")
			q.failed = len(group)
		}
		cs := make([]drain.Confirm, 0, len(group)+1)
		for _, a := range group {
			cs = append(cs, a.done)
		}
		if q.groups == 1 && q.others != nil {
			cs = append(cs, q.others)
		}
		q.mu.Unlock()
		// The Drainer forgets the group before its messages come again, as a
		// queue's answer comes before it delivers them again.
		drain.ConfirmAll(cs, err)
		q.mu.Lock()
		q.out -= len(group)
		for _, a := range group {
			if err != nil {
				q.queue = append(q.queue, a.m)
			} else {
				q.confirmed++
			}
		}
		if q.confirmed == q.wantAll {
			close(q.allDone)
		}
		q.mu.Unlock()
		select {
		case q.room <- struct{}{}:
		default:
		}
	}
}

type asked struct {
	m    *groupMsg
	done drain.Confirm
}

// TestConfirmAll: a Source whose acknowledgements are confirmed in groups
// of up to four (drain.ConfirmAll; fewer when every message out has
// asked), its window eight: the Drainer goes on only as each group's
// confirmation frees its window, and counts each record Done once, the
// key queued twice in Duplicates, and each message of the group
// confirmed with an error in AckErrors (those messages come again:
// Redelivered). A Confirm that is not the Drainer's, in a group, is told
// too.
func TestConfirmAll(t *testing.T) {
	const n = 101 // k0 … k99, then k0 again
	var others []error
	q := &groupQueue{window: 8, group: 4, failGroup: 3, room: make(chan struct{}, 1), wantAll: n, allDone: make(chan struct{})}
	q.others = drain.ConfirmFunc(func(err error) { others = append(others, err) })
	for i := range n {
		q.queue = append(q.queue, &groupMsg{q: q, key: fmt.Sprint("k", i%100)})
	}
	d, err := drain.New(drain.Options{
		Inputs: []drain.Input{{Source: q}},
		Sink:   func(context.Context, drain.Message) error { return nil },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- d.Run(ctx) }()
	<-q.allDone
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	f := int64(q.failed) // how many the failed group held: 1 to 4, as the acknowledgements came
	if f < 1 || f > 4 || st.Done != 100 || st.Duplicates != 1 || st.AckErrors != f || st.Redelivered != f || st.InFlight != 0 {
		t.Errorf("Done %d Duplicates %d AckErrors %d Redelivered %d InFlight %d; want 100 1 %d %d 0 (the failed group's %d)", st.Done, st.Duplicates, st.AckErrors, st.Redelivered, st.InFlight, f, f, f)
	}
	if len(others) != 1 || others[0] != nil {
		t.Errorf("the other Confirm was told %v, want [<nil>]", others)
	}
}
