package redisdrain_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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
	for range 2 {
		n, err := b.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Deliveries() != 2 {
			t.Errorf("%s handed back: Deliveries %d, want 2", n.Key(), n.Deliveries())
		}
		keys = append(keys, n.Key())
	}
	if strings.Join(keys, ",") == "" || keys[0] == m.Key() || keys[1] == m.Key() {
		t.Errorf("handed back %v; %s was handed out and is a's", keys, m.Key())
	}
	if err := m.Ack(ctx); err != nil {
		t.Errorf("Ack of a message handed out before Close: %v", err)
	}
	st, _ := redisstore.NewStream(c, "s", redisstore.StreamOptions{})
	if n, err := st.Backlog(ctx, "g"); err != nil || n != 2 {
		t.Errorf("Backlog = %d, %v; want the 2 b holds", n, err)
	}
}
