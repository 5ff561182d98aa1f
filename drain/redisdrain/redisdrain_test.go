package redisdrain_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/redisdrain"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

func TestOptions(t *testing.T) {
	c := client(t, []string{redistest.Standalone(t).Addr()})
	ok := redisdrain.Options{Stream: "s", Group: "g", Consumer: "c"}
	for _, tc := range []struct {
		name string
		edit func(*redisdrain.Options)
		want string
	}{
		{"no stream", func(o *redisdrain.Options) { o.Stream = "" }, "Options.Stream is empty"},
		{"no group", func(o *redisdrain.Options) { o.Group = "" }, "Options.Group is empty"},
		{"no consumer", func(o *redisdrain.Options) { o.Consumer = "" }, "Options.Consumer is empty"},
		{"negative window", func(o *redisdrain.Options) { o.Window = -1 }, "Options.Window -1"},
		{"window too large", func(o *redisdrain.Options) { o.Window = redisdrain.MaxWindow + 1 }, "Options.Window"},
		{"negative ack wait", func(o *redisdrain.Options) { o.AckWait = -time.Second }, "Options.AckWait"},
		{"ack wait too short", func(o *redisdrain.Options) { o.AckWait = time.Millisecond }, "Options.AckWait 1ms is below 10ms"},
		{"claim beyond the ack wait", func(o *redisdrain.Options) { o.AckWait, o.ClaimEvery = time.Second, 2*time.Second }, "Options.ClaimEvery"},
		{"negative claim", func(o *redisdrain.Options) { o.ClaimEvery = -1 }, "Options.ClaimEvery"},
		{"brace in the prefix", func(o *redisdrain.Options) { o.Prefix = "x{" }, "brace"},
		{"long consumer name", func(o *redisdrain.Options) { o.Consumer = strings.Repeat("c", 300) }, "consumer name"},
	} {
		o := ok
		tc.edit(&o)
		if _, err := redisdrain.New(t.Context(), c, o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	src, err := redisdrain.New(t.Context(), c, ok)
	if err != nil {
		t.Fatal(err)
	}
	got := src.Options()
	if got.Window != redisdrain.DefaultWindow || got.AckWait != redisdrain.DefaultAckWait || got.ClaimEvery != time.Second || src.Window() != redisdrain.DefaultWindow {
		t.Errorf("defaults: %+v", got)
	}
	src, err = redisdrain.New(t.Context(), c, redisdrain.Options{Stream: "s", Group: "g", Consumer: "c2", AckWait: 2 * time.Second, Window: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Options(); got.ClaimEvery != 500*time.Millisecond || got.Window != 3 {
		t.Errorf("ClaimEvery for a 2 s ack wait: %+v", got)
	}
	if _, err := redisdrain.NewPublisher(c, redisdrain.PublishOptions{}); err == nil {
		t.Error("a Publisher without a stream")
	}
	if _, err := redisdrain.NewPublisher(c, redisdrain.PublishOptions{Stream: "s", Dedupe: -1}); err == nil {
		t.Error("a negative dedupe window")
	}
}

// TestPublishDedupe publishes a key twice and a message without a key,
// and drains them: the repeat is dropped, and the keyless message's key is
// the stream and its id.
func TestPublishDedupe(t *testing.T) {
	c := client(t, []string{redistest.Standalone(t).Addr()})
	ctx := t.Context()
	r := redisdrain.Record{Key: "order-1", Tenant: "acme", Partition: "p1", Data: []byte("a")}
	if added, err := redisdrain.Publish(ctx, c, "orders", r); err != nil || !added {
		t.Fatalf("Publish = %v, %v", added, err)
	}
	r.Data = []byte("b")
	if added, err := redisdrain.Publish(ctx, c, "orders", r); err != nil || added {
		t.Fatalf("Publish of a repeat within the window = %v, %v; want false", added, err)
	}
	if added, err := redisdrain.Publish(ctx, c, "orders", redisdrain.Record{Data: []byte("c")}); err != nil || !added {
		t.Fatalf("Publish without a key = %v, %v", added, err)
	}
	src, err := redisdrain.New(ctx, c, redisdrain.Options{Stream: "orders", Group: "g", Consumer: "c", AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var got []drain.Message
	for range 2 {
		m, err := src.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	if m := got[0]; m.Key() != "order-1" || string(m.Data()) != "a" || m.Tenant() != "acme" || m.Partition() != "p1" {
		t.Errorf("first: %s %q %s %s", m.Key(), m.Data(), m.Tenant(), m.Partition())
	}
	if m := got[1]; !strings.HasPrefix(m.Key(), "orders/") || string(m.Data()) != "c" || m.Tenant() != "" {
		t.Errorf("keyless: key %q data %q", m.Key(), m.Data())
	}
	if n, err := src.Backlog(ctx); err != nil || n != 2 {
		t.Errorf("Backlog = %d, %v; want 2 (the repeat was never added)", n, err)
	}
}

// TestClose checks that Close hands back what was read and not handed
// out, to be claimed at once by another consumer, and that the Source
// takes nothing after it.
func TestClose(t *testing.T) {
	addrs := []string{redistest.Standalone(t).Addr()}
	c := client(t, addrs)
	ctx := t.Context()
	p, _ := redisdrain.NewPublisher(c, redisdrain.PublishOptions{Stream: "s"})
	for _, k := range []string{"a", "b", "c"} {
		if _, err := p.Publish(ctx, redisdrain.Record{Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	const ackWait = time.Hour // only a hand-back can make them claimable
	open := func(name string) *redisdrain.Source {
		s, err := redisdrain.New(ctx, c, redisdrain.Options{Stream: "s", Group: "g", Consumer: name, AckWait: ackWait, ClaimEvery: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := open("a")
	m, err := a.Next(ctx) // reads all three, hands out one
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if m, err := a.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next after Close = %v, %v", m, err)
	}
	b := open("b")
	var keys []string
	var bs []drain.Message
	for range 2 {
		n, err := b.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Deliveries() != 2 {
			t.Errorf("%s handed back: Deliveries %d, want 2", n.Key(), n.Deliveries())
		}
		keys = append(keys, n.Key())
		bs = append(bs, n)
	}
	if strings.Join(keys, ",") == "" || keys[0] == m.Key() || keys[1] == m.Key() {
		t.Errorf("handed back %v; %s was handed out and is a's", keys, m.Key())
	}
	// a still holds m and b the two it took: Close removes neither.
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cs, err := c.XInfoConsumers(ctx, b.Stream().Key(), "g").Result()
	if err != nil || len(cs) != 2 || cs[0].Name != "a" || cs[0].Pending != 1 {
		t.Errorf("consumers after Close: %+v, %v; want a holding 1 and b its 2", cs, err)
	}
	if err := m.Ack(ctx); err != nil {
		t.Errorf("Ack of a message handed out before Close: %v", err)
	}
	// Holding nothing, a Source's Close removes its consumer.
	for _, n := range bs {
		if err := n.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if cs, err := c.XInfoConsumers(ctx, b.Stream().Key(), "g").Result(); err != nil || len(cs) != 1 || cs[0].Name != "b" {
		t.Errorf("consumers after a's Close: %+v, %v; want b alone", cs, err)
	}
	if n, err := b.Backlog(ctx); err != nil || n != 0 {
		t.Errorf("Backlog = %d, %v; want 0, all acknowledged", n, err)
	}
}

// TestReadsWithinWindow checks that the Source never takes from Redis
// more than its window: what the consumer has pending there is what it
// handed out plus what it holds to hand out, never above Window; and
// that a read takes half the window, so that the next read has room
// while its records are worked on.
func TestReadsWithinWindow(t *testing.T) {
	c := client(t, []string{redistest.Standalone(t).Addr()})
	ctx := t.Context()
	p, _ := redisdrain.NewPublisher(c, redisdrain.PublishOptions{Stream: "w"})
	for i := range 20 {
		if _, err := p.Publish(ctx, redisdrain.Record{Data: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	const window = 6
	src, err := redisdrain.New(ctx, c, redisdrain.Options{Stream: "w", Group: "g", Consumer: "c", Window: window, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	pending := func() int64 {
		t.Helper()
		ps, err := c.XPending(ctx, src.Stream().Key(), "g").Result()
		if err != nil {
			t.Fatal(err)
		}
		return ps.Count
	}
	var held []drain.Message
	for range window {
		m, err := src.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, m)
		if n := pending(); n > window {
			t.Fatalf("%d pending for a window of %d", n, window)
		}
		if len(held) == 1 {
			if n := pending(); n != window/2 {
				t.Fatalf("%d pending after the first read, want half the window, %d", n, window/2)
			}
		}
	}
	if n := pending(); n != window {
		t.Fatalf("%d pending with the window full, want %d", n, window)
	}
	// Settling two lets two more in, not more.
	for _, m := range held[:2] {
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := src.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := pending(); n != window {
		t.Errorf("%d pending after two settled and two taken, want %d", n, window)
	}
	if n, err := src.Backlog(ctx); err != nil || n != 18 {
		t.Errorf("Backlog = %d, %v; want 18", n, err)
	}
}

// holdAll publishes n records to stream, on a Redis server of its own,
// and takes them all through a Source of window n.
func holdAll(t *testing.T, stream string, n int) (redisstore.Client, *redisdrain.Source, []drain.AsyncAcker) {
	t.Helper()
	c := client(t, []string{redistest.Standalone(t).Addr()})
	ctx := t.Context()
	p, _ := redisdrain.NewPublisher(c, redisdrain.PublishOptions{Stream: stream})
	for i := range n {
		if _, err := p.Publish(ctx, redisdrain.Record{Data: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	src, err := redisdrain.New(ctx, c, redisdrain.Options{Stream: stream, Group: "g", Consumer: "c", Window: n, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var held []drain.AsyncAcker
	for range n {
		m, err := src.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, m.(drain.AsyncAcker))
	}
	return c, src, held
}

// TestAckAsyncAlone: an acknowledgement asked for while the Source's
// other records are held is sent within the gathering bound, not held
// until they ask too.
func TestAckAsyncAlone(t *testing.T) {
	const n = 10
	_, src, held := holdAll(t, "alone", n)
	ctx := t.Context()
	acked := make(chan error, 1)
	held[0].AckAsync(ctx, drain.ConfirmFunc(func(err error) { acked <- err }))
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	if got, err := src.Backlog(ctx); err != nil || got != n-1 {
		t.Errorf("Backlog after one ack = %d, %v; want %d", got, err, n-1)
	}
}

// TestAckAsyncGroups: 200 records acknowledged through AckAsync at once
// are all acknowledged, each done called once without error, in far fewer
// XACKs than records (they go together once all have asked).
func TestAckAsyncGroups(t *testing.T) {
	const n = 200
	c, src, held := holdAll(t, "grouped", n)
	ctx := t.Context()
	xacks := func() int64 {
		t.Helper()
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_xack:calls="); ok {
				calls, _, _ := strings.Cut(rest, ",")
				v, err := strconv.ParseInt(calls, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
		return 0
	}
	before := xacks()
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for _, m := range held {
		wg.Go(func() {
			<-start
			m.AckAsync(ctx, drain.ConfirmFunc(func(err error) { errs <- err }))
		})
	}
	close(start)
	wg.Wait()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-errs:
		t.Fatalf("a done called twice (%v)", err)
	default:
	}
	if n, err := src.Backlog(ctx); err != nil || n != 0 {
		t.Errorf("Backlog after the acks = %d, %v; want 0", n, err)
	}
	if calls := xacks() - before; calls > n/2 {
		t.Errorf("%d XACKs for %d records, want at most %d", calls, n, n/2)
	} else {
		t.Logf("%d XACKs for %d records", calls, n)
	}
}

// TestHeldNotClaimedBack: a record held past AckWait without InProgress
// (its drainer starved of CPU) is claimed back by its own Source's scan,
// which must not hand it out a second time: Next finds nothing new, the
// claim is seen in the record's delivery counter, and the first delivery
// still settles it. A record put back (Nak) is claimed and delivered
// again.
func TestHeldNotClaimedBack(t *testing.T) {
	c := client(t, []string{redistest.Standalone(t).Addr()})
	ctx := t.Context()
	p, _ := redisdrain.NewPublisher(c, redisdrain.PublishOptions{Stream: "h"})
	publish := func(b byte) {
		t.Helper()
		if _, err := p.Publish(ctx, redisdrain.Record{Data: []byte{b}}); err != nil {
			t.Fatal(err)
		}
	}
	publish(0)
	src, err := redisdrain.New(ctx, c, redisdrain.Options{Stream: "h", Group: "g", Consumer: "c", Window: 2, AckWait: redisdrain.MinAckWait})
	if err != nil {
		t.Fatal(err)
	}
	first, err := src.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deliveries := func() int64 {
		t.Helper()
		ps, err := c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: src.Stream().Key(), Group: "g", Start: "-", End: "+", Count: 10}).Result()
		if err != nil || len(ps) != 1 {
			t.Fatalf("XPENDING: %v, %v; want the one record", ps, err)
		}
		return ps[0].RetryCount
	}
	// Settle nothing. Until the scan has claimed the held record (its
	// counter grows), Next has nothing to hand out.
	for deliveries() < 2 {
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		m, err := src.Next(short)
		// Its end may come back as go-redis's i/o timeout (the socket's
		// deadline is the context's, and may pass before the context's
		// own timer fires).
		dl, _ := short.Deadline()
		ended := !time.Now().Before(dl)
		cancel()
		if err == nil {
			t.Fatalf("Next handed out %v while the only record was held", m.Data())
		}
		if !ended {
			t.Fatal(err)
		}
	}
	// And after it: the claimed record is not handed out, nor does it
	// take a second place in the window, which still has room for a new
	// record.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	m, err := src.Next(short)
	cancel()
	if err == nil {
		t.Fatalf("Next handed out %v after claiming the held record", m.Data())
	}
	publish(1)
	second, err := src.Next(ctx)
	if err != nil || second.Data()[0] != 1 {
		t.Fatalf("Next = %v, %v; want the second record", second, err)
	}
	if err := second.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Nak(ctx, 0); err != nil {
		t.Fatal(err)
	}
	again, err := src.Next(ctx)
	if err != nil || again.Data()[0] != 0 {
		t.Fatalf("after the Nak, Next = %v, %v; want the record put back", again, err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
