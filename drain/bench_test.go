package drain_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/draintest"
)

// memSource is a Source of n messages in memory whose queue methods do
// nothing: what a Drainer costs on its own.
type memSource struct {
	msgs []memMsg
	next atomic.Int64
}

type memMsg struct{ key string }

func (m *memMsg) Key() string                              { return m.key }
func (m *memMsg) Data() []byte                             { return nil }
func (m *memMsg) Tenant() string                           { return "" }
func (m *memMsg) Partition() string                        { return "" }
func (m *memMsg) Deliveries() int                          { return 1 }
func (m *memMsg) Ack(context.Context) error                { return nil }
func (m *memMsg) Nak(context.Context, time.Duration) error { return nil }
func (m *memMsg) InProgress(context.Context) error         { return nil }
func (m *memMsg) DeadLetter(context.Context, error) error  { return nil }
func (s *memSource) Backlog(context.Context) (int64, error) {
	return int64(len(s.msgs)) - s.next.Load(), nil
}
func (s *memSource) Window() int { return 256 }

func (s *memSource) Next(ctx context.Context) (drain.Message, error) {
	i := s.next.Add(1) - 1
	if int(i) >= len(s.msgs) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &s.msgs[i], nil
}

// BenchmarkDrainer drains b.N messages of a Source in memory, with no
// limiter and a Sink that does nothing, and reports the CPU time per
// message: the Drainer's own cost, which a queue's adds to.
func BenchmarkDrainer(b *testing.B) {
	src := &memSource{msgs: make([]memMsg, b.N)}
	for i := range src.msgs {
		src.msgs[i].key = strconv.Itoa(i)
	}
	var done atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	d, err := drain.New(drain.Options{
		Inputs: []drain.Input{{Source: src}},
		Sink: func(context.Context, drain.Message) error {
			if done.Add(1) == int64(b.N) {
				cancel()
			}
			return nil
		},
		Logger: quiet,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := draintest.CPUTime(b)
	if err := d.Run(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64((draintest.CPUTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/msg")
}
