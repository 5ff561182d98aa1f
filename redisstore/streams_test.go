package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
)

// newTestStream returns a stream named name on a fresh standalone
// server, with a group "g" created.
func newTestStream(t *testing.T, name string) (*Stream, Client) {
	t.Helper()
	srv := redistest.Standalone(t)
	c := srv.Client()
	s, err := NewStream(c, name, StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateGroup(t.Context(), "g"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateGroup(t.Context(), "g"); err != nil {
		t.Fatalf("CreateGroup of an existing group: %v", err)
	}
	return s, c
}

func TestStreamKeysOneSlot(t *testing.T) {
	for _, name := range []string{"orders", "{orders}", "a}b{c", strings.Repeat("x", 200)} {
		s, err := NewStream(redistest.Standalone(t).Client(), name, StreamOptions{Prefix: "p:"})
		if err != nil {
			t.Fatal(err)
		}
		keys := []string{s.Key(), s.DeadLetterKey(), s.delays, s.dupKey("k"), s.dupKey("{other}"), s.dupKey(strings.Repeat("y", 500))}
		for _, k := range keys {
			if slot(k) != slot(s.Key()) {
				t.Errorf("stream %q: key %q in slot %d, the stream's %q in %d", name, k, slot(k), s.Key(), slot(s.Key()))
			}
			if !strings.HasPrefix(k, "p:{") {
				t.Errorf("stream %q: key %q does not start with the prefix and a tag", name, k)
			}
		}
		if strings.Count(s.Key(), "{") != 1 || strings.Count(s.Key(), "}") != 1 {
			t.Errorf("stream %q: key %q has a brace of the name's", name, s.Key())
		}
	}
	a, _ := NewStream(redistest.Standalone(t).Client(), "a", StreamOptions{})
	b, _ := NewStream(redistest.Standalone(t).Client(), "b", StreamOptions{})
	if a.Key() == b.Key() || a.dupKey("k") == b.dupKey("k") {
		t.Errorf("two streams share keys: %q %q", a.Key(), b.Key())
	}
}

func TestStreamDedupe(t *testing.T) {
	s, c := newTestStream(t, "dedupe")
	ctx := t.Context()
	r := StreamRecord{Key: "k1", Tenant: "t", Partition: "p", Data: []byte("one")}
	id1, added, err := s.Add(ctx, r, time.Minute)
	if err != nil || !added {
		t.Fatalf("first Add = %q, %v, %v", id1, added, err)
	}
	r.Data = []byte("two")
	id2, added, err := s.Add(ctx, r, time.Minute)
	if err != nil || added || id2 != id1 {
		t.Fatalf("second Add of k1 within the window = %q, %v, %v; want %q, false", id2, added, err, id1)
	}
	if _, added, _ := s.Add(ctx, StreamRecord{Key: "k2", Data: []byte("x")}, time.Minute); !added {
		t.Error("another key was dropped")
	}
	for range 2 {
		if _, added, err := s.Add(ctx, StreamRecord{Data: []byte("no key")}, 0); err != nil || !added {
			t.Errorf("a record without a key: %v, %v", added, err)
		}
	}
	if n := c.XLen(ctx, s.Key()).Val(); n != 4 {
		t.Errorf("XLEN %d, want 4", n)
	}
	// The marker lasts the window, and then a record of the key is added
	// again.
	if ttl := c.PTTL(ctx, s.dupKey("k1")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("k1's marker PTTL %v, want within (0, 1m]", ttl)
	}
	if _, added, _ := s.Add(ctx, StreamRecord{Key: "k3", Data: []byte("x")}, 20*time.Millisecond); !added {
		t.Fatal("k3 dropped")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, added, err := s.Add(ctx, StreamRecord{Key: "k3", Data: []byte("x")}, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if added {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("k3 still deduplicated 5 s after a 20 ms window")
		}
		time.Sleep(5 * time.Millisecond) // polling the server's expiry
	}
}

func TestStreamDeadLetterFields(t *testing.T) {
	s, c := newTestStream(t, "dead")
	ctx := t.Context()
	id, _, err := s.Add(ctx, StreamRecord{Key: "k", Tenant: "acme", Partition: "p7", Data: []byte("body")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A field another producer added travels with the record.
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: s.Key(), Values: []any{"data", "raw", "origin", "python"}}).Err(); err != nil {
		t.Fatal(err)
	}
	cons, err := s.Consumer("g", "c1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := cons.Read(ctx, 10, time.Second)
	if err != nil || len(recs) != 2 || recs[0].ID != id || recs[0].Deliveries != 1 {
		t.Fatalf("Read = %+v, %v", recs, err)
	}
	reason := strings.Repeat("é", MaxStreamReason) // 2 bytes each: cut mid-rune at 1024 bytes is not allowed
	if _, err := cons.DeadLetter(ctx, id, "k", reason); err != nil {
		t.Fatal(err)
	}
	if _, err := cons.DeadLetter(ctx, recs[1].ID, "stream/"+recs[1].ID, "bad"); err != nil {
		t.Fatal(err)
	}
	if _, err := cons.DeadLetter(ctx, id, "k", "again"); !errors.Is(err, ErrNotPending) {
		t.Errorf("second DeadLetter: %v, want ErrNotPending", err)
	}
	if p := c.XPending(ctx, s.Key(), "g").Val(); p.Count != 0 {
		t.Errorf("%d records still pending after dead-lettering", p.Count)
	}
	dead, err := s.DeadLetters(ctx, 10)
	if err != nil || len(dead) != 2 {
		t.Fatalf("DeadLetters = %+v, %v", dead, err)
	}
	d := dead[0]
	if d.Key != "k" || d.Tenant != "acme" || d.Partition != "p7" || string(d.Data) != "body" || d.Origin != id || d.Deliveries != 1 {
		t.Errorf("dead letter %+v: want key k, tenant acme, partition p7, data body, origin %s, 1 delivery", d, id)
	}
	if len(d.Error) > MaxStreamReason || len(d.Error) < MaxStreamReason-3 || !utf8.ValidString(d.Error) || !strings.HasPrefix(reason, d.Error) {
		t.Errorf("reason of %d bytes kept as %d bytes (valid UTF-8 %v)", len(reason), len(d.Error), utf8.ValidString(d.Error))
	}
	if d := dead[1]; d.Key != "stream/"+recs[1].ID || d.Error != "bad" || string(d.Data) != "raw" {
		t.Errorf("dead letter of a foreign record %+v", d)
	}
	f := c.XRange(ctx, s.DeadLetterKey(), "-", "+").Val()[1].Values
	if f["origin"] != "python" {
		t.Errorf("dead letter fields %v lost the record's own field", f)
	}
}

func TestStreamReleaseBeyondAckWait(t *testing.T) {
	s, _ := newTestStream(t, "delay")
	ctx := t.Context()
	if _, _, err := s.Add(ctx, StreamRecord{Key: "k", Data: []byte("x")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	const ackWait, delay = 200 * time.Millisecond, time.Second
	a, _ := s.Consumer("g", "a", ackWait)
	b, _ := s.Consumer("g", "b", ackWait)
	recs, err := a.Read(ctx, 1, time.Second)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read = %+v, %v", recs, err)
	}
	released := time.Now()
	if err := a.Release(ctx, recs[0].ID, delay); err != nil {
		t.Fatal(err)
	}
	// Claimed again and again past the ack wait, it is put back unseen
	// until the delay ends, its delivery count kept.
	cursor := "0-0"
	var parked int
	for {
		got, next, err := b.Claim(ctx, cursor, 10)
		if err != nil {
			t.Fatal(err)
		}
		cursor = next
		if len(got) > 0 {
			// Up to a millisecond early by this process's clock: Redis
			// counts the delay in its whole milliseconds.
			if since := time.Since(released); since < delay-time.Millisecond {
				t.Fatalf("claimed %v after Release(%v)", since, delay)
			}
			if got[0].ID != recs[0].ID || got[0].Deliveries != 2 || got[0].Key != "k" {
				t.Fatalf("claimed %+v, want %s with 2 deliveries", got[0], recs[0].ID)
			}
			break
		}
		if time.Since(released) > delay+5*time.Second {
			t.Fatal("not claimed 5 s after its delay")
		}
		if time.Since(released) > ackWait+50*time.Millisecond {
			parked++
		}
		time.Sleep(20 * time.Millisecond) // polling, as a Source's claims do
	}
	if parked == 0 {
		t.Error("no claim ran between the ack wait and the delay: the test proved nothing")
	}
	if err := b.Ack(ctx, recs[0].ID); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Backlog(ctx, "g"); err != nil || n != 0 {
		t.Errorf("Backlog after the ack = %d, %v", n, err)
	}
}

// A delay is its group's: another group's Ack of its own copy of the
// record neither forgets it nor lets this group's claim take the record
// early, and a delay in one group does not hold back another.
func TestStreamDelayPerGroup(t *testing.T) {
	s, _ := newTestStream(t, "delaygroups")
	ctx := t.Context()
	if err := s.CreateGroup(ctx, "h"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Add(ctx, StreamRecord{Key: "k", Data: []byte("x")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	const ackWait, delay = 200 * time.Millisecond, time.Second
	a, _ := s.Consumer("g", "a", ackWait)
	a2, _ := s.Consumer("g", "a2", ackWait)
	b, _ := s.Consumer("h", "b", ackWait)
	b2, _ := s.Consumer("h", "b2", ackWait)
	ra, err := a.Read(ctx, 1, time.Second)
	if err != nil || len(ra) != 1 {
		t.Fatalf("Read in g = %+v, %v", ra, err)
	}
	rb, err := b.Read(ctx, 1, time.Second)
	if err != nil || len(rb) != 1 || rb[0].ID != ra[0].ID {
		t.Fatalf("Read in h = %+v, %v", rb, err)
	}
	id := ra[0].ID
	released := time.Now()
	if err := a.Release(ctx, id, delay); err != nil {
		t.Fatal(err)
	}
	// h puts its copy back with no delay and claims it at once: g's delay
	// is not h's.
	if err := b.Release(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if got, _, err := b2.Claim(ctx, "0-0", 10); err != nil || len(got) != 1 || got[0].ID != id {
		t.Fatalf("h's claim of its copy released with no delay = %+v, %v; g's delay held it", got, err)
	}
	if err := b2.Ack(ctx, id); err != nil {
		t.Fatal(err)
	}
	cursor := "0-0"
	var parked int
	for {
		got, next, err := a2.Claim(ctx, cursor, 10)
		if err != nil {
			t.Fatal(err)
		}
		cursor = next
		if len(got) > 0 {
			// Redis counts the delay in whole milliseconds of its clock
			// (the release's instant rounded down): the record may come
			// up to a millisecond early by this process's clock. Had h's
			// Ack forgotten the delay, it would come after ackWait.
			if since := time.Since(released); since < delay-time.Millisecond {
				t.Fatalf("g claimed %v after Release(%v): h's Ack forgot g's delay", since, delay)
			}
			if got[0].ID != id || got[0].Deliveries != 2 {
				t.Fatalf("claimed %+v, want %s with 2 deliveries", got[0], id)
			}
			break
		}
		if time.Since(released) > delay+5*time.Second {
			t.Fatal("not claimed 5 s after its delay")
		}
		if time.Since(released) > ackWait+50*time.Millisecond {
			parked++
		}
		time.Sleep(20 * time.Millisecond) // polling, as a Source's claims do
	}
	if parked == 0 {
		t.Error("no claim ran between the ack wait and the delay: the test proved nothing")
	}
	if err := a2.Ack(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"g", "h"} {
		if n, err := s.Backlog(ctx, g); err != nil || n != 0 {
			t.Errorf("Backlog of %s after the acks = %d, %v", g, n, err)
		}
	}
	if n := s.c.HLen(ctx, s.delays).Val(); n != 0 {
		t.Errorf("%d delays left after every group acked", n)
	}
}

// A consumer whose record another consumer has claimed since cannot
// dead-letter it: the new owner keeps it.
func TestStreamDeadLetterNotHeld(t *testing.T) {
	s, c := newTestStream(t, "deadheld")
	ctx := t.Context()
	s.Add(ctx, StreamRecord{Data: []byte("x")}, 0)
	a, _ := s.Consumer("g", "a", time.Minute)
	b, _ := s.Consumer("g", "b", time.Minute)
	recs, err := a.Read(ctx, 5, time.Second)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read = %+v, %v", recs, err)
	}
	id := recs[0].ID
	if _, err := b.DeadLetter(ctx, id, "k", "not mine"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("DeadLetter by another consumer: %v, want ErrNotHeld", err)
	}
	// a puts it back (as if its ack wait had passed) and b claims it; a,
	// still working on its copy, fails and dead-letters it.
	if err := a.Release(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if got, _, err := b.Claim(ctx, "0-0", 5); err != nil || len(got) != 1 {
		t.Fatalf("Claim = %+v, %v", got, err)
	}
	if _, err := a.DeadLetter(ctx, id, "k", "stale"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("DeadLetter by the consumer that lost the record: %v, want ErrNotHeld", err)
	}
	if n := c.XLen(ctx, s.DeadLetterKey()).Val(); n != 0 {
		t.Errorf("%d dead letters after refused DeadLetters", n)
	}
	p := c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.Key(), Group: "g", Start: id, End: id, Count: 1}).Val()
	if len(p) != 1 || p[0].Consumer != "b" {
		t.Fatalf("pending after the refused DeadLetter: %+v, want held by b", p)
	}
	if _, err := b.DeadLetter(ctx, id, "k", "b's"); err != nil {
		t.Fatalf("DeadLetter by the holder: %v", err)
	}
	if _, err := a.DeadLetter(ctx, id, "k", "again"); !errors.Is(err, ErrNotPending) {
		t.Errorf("DeadLetter of a dead-lettered record: %v, want ErrNotPending", err)
	}
	if dead, err := s.DeadLetters(ctx, 10); err != nil || len(dead) != 1 || dead[0].Error != "b's" || dead[0].Deliveries != 2 {
		t.Errorf("DeadLetters = %+v, %v; want b's alone, after 2 deliveries", dead, err)
	}
}

func TestStreamNotHeld(t *testing.T) {
	s, _ := newTestStream(t, "held")
	ctx := t.Context()
	s.Add(ctx, StreamRecord{Data: []byte("x")}, 0)
	a, _ := s.Consumer("g", "a", time.Minute)
	b, _ := s.Consumer("g", "b", time.Minute)
	recs, err := a.Read(ctx, 5, time.Second)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read = %+v, %v", recs, err)
	}
	id := recs[0].ID
	if err := b.Extend(ctx, id); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend by another consumer: %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, id, 0); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Release by another consumer: %v, want ErrNotHeld", err)
	}
	if got, _, _ := b.Claim(ctx, "0-0", 5); len(got) != 0 {
		t.Errorf("claimed a record idle less than the ack wait: %+v", got)
	}
	if err := a.Extend(ctx, id); err != nil {
		t.Errorf("Extend by its holder: %v", err)
	}
	if n, err := s.Backlog(ctx, "g"); err != nil || n != 1 {
		t.Errorf("Backlog of one pending = %d, %v", n, err)
	}
	if err := a.Ack(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := a.Ack(ctx, id); err != nil {
		t.Errorf("a second Ack: %v", err)
	}
	if err := a.Extend(ctx, id); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend after Ack: %v, want ErrNotHeld", err)
	}
	if got, err := a.Read(ctx, 5, time.Millisecond); err != nil || len(got) != 0 {
		t.Errorf("Read of an empty stream = %+v, %v", got, err)
	}
}

func TestStreamValidation(t *testing.T) {
	c := redistest.Standalone(t).Client()
	ctx := context.Background()
	if _, err := NewStream(nil, "s", StreamOptions{}); err == nil {
		t.Error("nil client accepted")
	}
	for _, name := range []string{"", strings.Repeat("n", maxStreamName+1)} {
		if _, err := NewStream(c, name, StreamOptions{}); err == nil || !strings.Contains(err.Error(), "stream name") {
			t.Errorf("stream name of %d bytes: %v", len(name), err)
		}
	}
	if _, err := NewStream(c, "s", StreamOptions{Prefix: "a{"}); err == nil || !strings.Contains(err.Error(), "brace") {
		t.Errorf("prefix with a brace: %v", err)
	}
	s, _ := NewStream(c, "s", StreamOptions{})
	for _, tc := range []struct {
		group, name string
		wait        time.Duration
		want        string
	}{
		{"", "c", time.Second, "group name"},
		{"g", "", time.Second, "consumer name"},
		{"g", "c", 0, "ack wait"},
	} {
		if _, err := s.Consumer(tc.group, tc.name, tc.wait); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Consumer(%q, %q, %v): %v, want an error about the %s", tc.group, tc.name, tc.wait, err, tc.want)
		}
	}
	cons, _ := s.Consumer("g", "c", time.Second)
	for _, n := range []int{0, MaxStreamCount + 1} {
		if _, err := cons.Read(ctx, n, time.Second); err == nil || !strings.Contains(err.Error(), "count") {
			t.Errorf("Read of %d: %v", n, err)
		}
		if _, _, err := cons.Claim(ctx, "0-0", n); err == nil || !strings.Contains(err.Error(), "count") {
			t.Errorf("Claim of %d: %v", n, err)
		}
		if _, err := s.DeadLetters(ctx, n); err == nil || !strings.Contains(err.Error(), "count") {
			t.Errorf("DeadLetters of %d: %v", n, err)
		}
	}
	if _, err := cons.Read(ctx, 1, 0); err == nil || !strings.Contains(err.Error(), "block") {
		t.Errorf("Read with block 0 (BLOCK 0 waits for ever): %v", err)
	}
	if _, _, err := s.Add(ctx, StreamRecord{Key: strings.Repeat("k", MaxStreamKey+1)}, time.Minute); err == nil || !strings.Contains(err.Error(), "key") {
		t.Errorf("a long key: %v", err)
	}
	if _, _, err := s.Add(ctx, StreamRecord{Key: "k"}, 0); err == nil || !strings.Contains(err.Error(), "dedupe") {
		t.Errorf("a key without a dedupe window: %v", err)
	}
	if _, err := s.Backlog(ctx, "nosuchgroup"); err == nil {
		t.Error("Backlog of a missing stream and group: no error")
	}
	if err := s.CreateGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Backlog(ctx, "other"); err == nil || !strings.Contains(err.Error(), `no group "other"`) {
		t.Errorf("Backlog of a missing group: %v", err)
	}
}

func TestStreamPrune(t *testing.T) {
	s, c := newTestStream(t, "prune")
	ctx := t.Context()
	s.Add(ctx, StreamRecord{Data: []byte("x")}, 0)
	a, _ := s.Consumer("g", "a", time.Minute)
	b, _ := s.Consumer("g", "b", time.Minute)
	d, _ := s.Consumer("g", "d", time.Minute)
	recs, err := a.Read(ctx, 5, time.Second)
	if err != nil || len(recs) != 1 {
		t.Fatalf("Read = %+v, %v", recs, err)
	}
	for _, k := range []*StreamConsumer{b, d} {
		if err := c.XGroupCreateConsumer(ctx, s.Key(), "g", k.Name()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	names := func() []string {
		cs, err := c.XInfoConsumers(ctx, s.Key(), "g").Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, k := range cs {
			out = append(out, k.Name)
		}
		return out
	}
	if n, err := s.Prune(ctx, "g", time.Hour); err != nil || n != 0 {
		t.Errorf("Prune of consumers idle an hour = %d, %v; none is", n, err)
	}
	if ok, err := b.Remove(ctx); err != nil || !ok {
		t.Errorf("b.Remove = %v, %v", ok, err)
	}
	if got := strings.Join(names(), ","); got != "a,d" {
		t.Errorf("consumers after b.Remove: %s", got)
	}
	if n, err := s.Prune(ctx, "g", 0); err != nil || n != 1 {
		t.Errorf("Prune(0) = %d, %v; want d alone removed", n, err)
	}
	if got := strings.Join(names(), ","); got != "a" {
		t.Errorf("consumers after Prune: %s; a holds a record", got)
	}
	if ok, err := a.Remove(ctx); err != nil || ok {
		t.Errorf("Remove of a consumer with a pending record = %v, %v", ok, err)
	}
	if p := c.XPending(ctx, s.Key(), "g").Val(); p.Count != 1 {
		t.Errorf("pending %d after the prunes, want 1", p.Count)
	}
	a.Ack(ctx, recs[0].ID)
	if ok, err := a.Remove(ctx); err != nil || !ok {
		t.Errorf("Remove after the ack = %v, %v", ok, err)
	}
}

// TestStreamAckMany: one Ack of several records, one of them put back
// with a delay beyond the ack wait, leaves none pending and forgets the
// delay; an id not pending among them changes nothing.
func TestStreamAckMany(t *testing.T) {
	s, c := newTestStream(t, "ackmany")
	ctx := t.Context()
	for i := range 3 {
		if _, _, err := s.Add(ctx, StreamRecord{Key: fmt.Sprint("k", i), Data: []byte("x")}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := s.Consumer("g", "a", 200*time.Millisecond)
	recs, err := a.Read(ctx, 3, time.Second)
	if err != nil || len(recs) != 3 {
		t.Fatalf("Read = %+v, %v", recs, err)
	}
	if err := a.Release(ctx, recs[1].ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := c.HLen(ctx, s.delays).Result(); err != nil || n != 1 {
		t.Fatalf("delays held = %d, %v; want 1", n, err)
	}
	if err := a.Ack(ctx, recs[0].ID, recs[1].ID, recs[2].ID, "0-1"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Backlog(ctx, "g"); err != nil || n != 0 {
		t.Errorf("Backlog after the ack = %d, %v", n, err)
	}
	if n, err := c.HLen(ctx, s.delays).Result(); err != nil || n != 0 {
		t.Errorf("delays held after the ack = %d, %v; want 0", n, err)
	}
	if err := a.Ack(ctx); err != nil {
		t.Errorf("Ack of no records: %v", err)
	}
}
