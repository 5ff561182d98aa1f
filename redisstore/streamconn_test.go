package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/redistest"
)

// readers lists the connections of admin's server whose last command
// was XREADGROUP: their CLIENT LIST lines.
func readers(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	list, err := admin.ClientList(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(list, "\n") {
		if strings.Contains(l, " cmd=xreadgroup") {
			out = append(out, l)
		}
	}
	return out
}

// consumerOn returns the stream name on c, with group g, and its
// consumer c.
func consumerOn(t *testing.T, c Client, name string) (*Stream, *StreamConsumer) {
	t.Helper()
	s, err := NewStream(c, name, StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateGroup(t.Context(), "g"); err != nil {
		t.Fatal(err)
	}
	cons, err := s.Consumer("g", "c", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return s, cons
}

// addN adds n records to s and returns their ids.
func addN(t *testing.T, s *Stream, n int, from int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id, _, err := s.Add(t.Context(), StreamRecord{Key: fmt.Sprint("k", from+i), Data: []byte("d")}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func recordIDs(recs []StreamRecord) []string {
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

// TestReadNowConn: ReadNow reads on a connection of its own, dialled
// with the client's password, database and name (CLIENT LIST shows it,
// in that database, under that name), over TLS when the client speaks
// it; a connection the server closed is replaced, the records read once;
// Close closes it, and the next ReadNow opens another.
func TestReadNowConn(t *testing.T) {
	pass := redistest.StandaloneWith(t, "--requirepass", "s3cret")
	tls := redistest.StandaloneTLS(t)
	for _, tc := range []struct {
		name string
		srv  *redistest.Server
		opt  redis.Options
	}{
		{"password-db-name", pass, redis.Options{Addr: pass.Addr(), Password: "s3cret", DB: 3, ClientName: "reader-7"}},
		{"tls", tls, redis.Options{Addr: tls.Addr(), TLSConfig: tls.TLSConfig()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			admin := redis.NewClient(&redis.Options{Addr: tc.opt.Addr, Password: tc.opt.Password, TLSConfig: tc.opt.TLSConfig})
			t.Cleanup(func() { admin.Close() })
			c := redis.NewClient(&tc.opt)
			t.Cleanup(func() { c.Close() })
			s, cons := consumerOn(t, c, "conn-"+tc.name)
			want := addN(t, s, 6, 0)
			got, err := cons.ReadNow(ctx, 2)
			if err != nil || !slices.Equal(recordIDs(got), want[:2]) {
				t.Fatalf("ReadNow: %v, %v; want %v", recordIDs(got), err, want[:2])
			}
			rs := readers(t, admin)
			if len(rs) != 1 {
				t.Fatalf("connections reading: %q, want 1", rs)
			}
			if tc.opt.DB != 0 && (!strings.Contains(rs[0], " db=3 ") || !strings.Contains(rs[0], " name=reader-7 ")) {
				t.Errorf("the reading connection %q is not in db 3 under the client's name", rs[0])
			}
			// The server closes it (as its idle timeout would): the
			// next read is made on a new one, and loses nothing.
			id, _, _ := strings.Cut(strings.TrimPrefix(rs[0], "id="), " ")
			if err := admin.Do(ctx, "client", "kill", "id", id).Err(); err != nil {
				t.Fatal(err)
			}
			got, err = cons.ReadNow(ctx, 2)
			if err != nil || !slices.Equal(recordIDs(got), want[2:4]) {
				t.Fatalf("ReadNow after the server closed the connection: %v, %v; want %v", recordIDs(got), err, want[2:4])
			}
			if rs := readers(t, admin); len(rs) != 1 || strings.HasPrefix(rs[0], "id="+id+" ") {
				t.Fatalf("connections reading after the kill: %q, want another one", rs)
			}
			if err := cons.Close(); err != nil {
				t.Fatal(err)
			}
			// The server learns of the close in its own time.
			for deadline := time.Now().Add(5 * time.Second); len(readers(t, admin)) != 0; {
				if time.Now().After(deadline) {
					t.Fatalf("connections reading 5 s after Close: %q, want none", readers(t, admin))
				}
				time.Sleep(10 * time.Millisecond) // polling the server, bounded by deadline
			}
			got, err = cons.ReadNow(ctx, 5)
			if err != nil || !slices.Equal(recordIDs(got), want[4:]) {
				t.Fatalf("ReadNow after Close: %v, %v; want %v", recordIDs(got), err, want[4:])
			}
			if err := cons.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReadNowLeftToGoRedis: a client whose connections need its OnConnect
// hook is one ReadNow does not stand in for: it reads through go-redis's
// reply, with the same records, and opens no connection of its own.
func TestReadNowLeftToGoRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	var hooked atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), OnConnect: func(context.Context, *redis.Conn) error {
		hooked.Add(1)
		return nil
	}})
	t.Cleanup(func() { c.Close() })
	s, cons := consumerOn(t, c, "left")
	defer cons.Close()
	want := addN(t, s, 5, 0)
	a, err := cons.ReadNow(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cons.ReadNow(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := recordIDs(append(a, b...)); !slices.Equal(got, want) {
		t.Errorf("read %v, want %v", got, want)
	}
	if cons.conn.nc != nil {
		t.Error("ReadNow opened a connection of its own for a client with OnConnect")
	}
	if hooked.Load() == 0 {
		t.Error("go-redis's connections were not made (OnConnect never called)")
	}
}

// TestReadNowStopped: a ReadNow on a server that does not answer (stopped
// by SIGSTOP) ends with its context: at its deadline, or when it is
// cancelled; once the server answers again, the next ReadNow reads.
func TestReadNowStopped(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := t.Context()
	s, cons := consumerOn(t, srv.Client(), "stopped")
	defer cons.Close()
	if _, err := cons.ReadNow(ctx, 10); err != nil { // the connection is open
		t.Fatal(err)
	}
	want := addN(t, s, 3, 0)
	srv.Freeze()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := cons.ReadNow(short, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ReadNow past its deadline: %v, want context.DeadlineExceeded", err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := cons.ReadNow(gone, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadNow cancelled: %v, want context.Canceled", err)
	}
	srv.Thaw()
	// The first read may have run once the server went on, its reply
	// unread: those records are the consumer's, pending (a Source claims
	// them back after its ack wait).
	got, err := cons.ReadNow(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	pending, err := s.c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.key, Group: "g", Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, p := range pending {
		held = append(held, p.ID)
	}
	if !slices.Equal(held, want) || len(got) > len(want) || !slices.Equal(recordIDs(got), want[len(want)-len(got):]) {
		t.Errorf("after the server went on: read %v, pending %v; want the records %v pending, the last of them read", recordIDs(got), held, want)
	}
}

// TestReadNowMoved: in a Cluster, once the stream's slot has moved to
// another master, the read on the old master's connection is answered
// MOVED and made through go-redis, which follows it; the records are
// read once each, and a later read goes to the new master.
func TestReadNowMoved(t *testing.T) {
	cs := redistest.Cluster(t)
	ctx := t.Context()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cs.Addrs()})
	t.Cleanup(func() { c.Close() })
	s, cons := consumerOn(t, c, "moved")
	defer cons.Close()
	want := addN(t, s, 4, 0)
	got, err := cons.ReadNow(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	from, err := c.MasterForKey(ctx, s.key)
	if err != nil {
		t.Fatal(err)
	}
	var to *redis.Client
	for _, n := range cs.Nodes {
		if n.Addr() != from.Options().Addr {
			to = n.Client()
			break
		}
	}
	migrate(t, from, to, cs, s.key)
	more, err := cons.ReadNow(ctx, 10)
	if err != nil {
		t.Fatalf("ReadNow after the slot moved: %v", err)
	}
	got = append(got, more...)
	want = append(want, addN(t, s, 2, 4)...)
	more, err = cons.ReadNow(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, more...)
	if !slices.Equal(recordIDs(got), want) {
		t.Fatalf("read %v, want %v", recordIDs(got), want)
	}
	if rs := readers(t, to); len(rs) == 0 {
		t.Errorf("no connection reads from the new master")
	}
}

// migrate moves the slot of key, and its keys, from one master to
// another, and tells every node.
func migrate(t *testing.T, from, to *redis.Client, cs *redistest.ClusterSet, key string) {
	t.Helper()
	ctx := t.Context()
	slot, err := from.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	fromID, err := from.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	toID, err := to.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(to.Do(ctx, "cluster", "setslot", slot, "importing", fromID).Err())
	must(from.Do(ctx, "cluster", "setslot", slot, "migrating", toID).Err())
	keys, err := from.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
	must(err)
	host, port, _ := strings.Cut(to.Options().Addr, ":")
	args := []any{"migrate", host, port, "", 0, 5000, "keys"}
	for _, k := range keys {
		args = append(args, k)
	}
	must(from.Do(ctx, args...).Err())
	for _, n := range cs.Nodes {
		must(n.Client().Do(ctx, "cluster", "setslot", slot, "node", toID).Err())
	}
}

// FuzzReplyScan: replyScan finds the same end of a reply whichever way
// its bytes arrive, never reads past them, and agrees with
// parseReadReply: a reply parsed whole is one it finds whole.
func FuzzReplyScan(f *testing.F) {
	f.Add([]byte("*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nk\r\n$2\r\nab\r\n"), 7)
	f.Add([]byte("*-1\r\n"), 2)
	f.Add([]byte("-MOVED 1 127.0.0.1:7000\r\n"), 3)
	f.Add([]byte("%1\r\n$1\r\ns\r\n*0\r\n"), 5)
	f.Add([]byte("*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n*9\r\n"), 10)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		var whole replyScan
		done, err := whole.advance(b)
		if done && (err != nil || whole.pos > len(b)) {
			t.Fatalf("done at %d of %d, %v", whole.pos, len(b), err)
		}
		if cut < 0 || cut > len(b) {
			return
		}
		var split replyScan
		d1, err1 := split.advance(b[:cut])
		if err1 == nil && !d1 {
			d1, err1 = split.advance(b)
		}
		if err == nil && err1 == nil && (d1 != done || done && split.pos != whole.pos) {
			t.Fatalf("in two parts: done %v at %d; whole: %v at %d", d1, split.pos, done, whole.pos)
		}
		if _, perr := parseReadReply(b, 1<<20); perr == nil && (!done || whole.pos != len(b)) {
			t.Fatalf("parseReadReply took %q, replyScan: done %v at %d, %v", b, done, whole.pos, err)
		}
		if done && bytes.IndexByte(b[:whole.pos], '\n') < 0 {
			t.Fatalf("done at %d with no header", whole.pos)
		}
	})
}
