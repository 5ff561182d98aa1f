package redisstore

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// readReply is the RESP2 reply of an XREADGROUP of stream with recs,
// each its id and then its fields in order; an id alone is a record
// deleted since (its fields null).
func readReply(stream string, recs [][]string) []byte {
	var b bytes.Buffer
	bulk := func(s string) { fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(s), s) }
	fmt.Fprintf(&b, "*1\r\n*2\r\n")
	bulk(stream)
	fmt.Fprintf(&b, "*%d\r\n", len(recs))
	for _, r := range recs {
		fmt.Fprintf(&b, "*2\r\n")
		bulk(r[0])
		if len(r) == 1 {
			b.WriteString("*-1\r\n")
			continue
		}
		fmt.Fprintf(&b, "*%d\r\n", len(r)-1)
		for _, f := range r[1:] {
			bulk(f)
		}
	}
	return b.Bytes()
}

func TestParseReadReply(t *testing.T) {
	data := "a\r\n$3\r\n*-1\r\n\x00:"
	b := readReply("s", [][]string{
		{"1-0", FieldKey, "k1", FieldTenant, "t", FieldPartition, "p", FieldData, data},
		{"2-0", "other", "x", FieldData, ""},
		{"3-0"},
		{"4-5", FieldData, "d", FieldData, "last wins"},
	})
	got, err := parseReadReply(b, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []StreamRecord{
		{ID: "1-0", Key: "k1", Tenant: "t", Partition: "p", Data: []byte(data), Deliveries: 1},
		{ID: "2-0", Data: []byte{}, Deliveries: 1},
		{ID: "4-5", Data: []byte("last wins"), Deliveries: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	// RESP3: a map of the stream to its records.
	b3 := append([]byte("%1\r\n"), b[len("*1\r\n*2\r\n"):]...)
	if got3, err := parseReadReply(b3, 4); err != nil || !reflect.DeepEqual(got3, want) {
		t.Errorf("RESP3: %+v, %v", got3, err)
	}
	for _, null := range []string{"*-1\r\n", "_\r\n"} {
		if got, err := parseReadReply([]byte(null), 4); err != nil || got != nil {
			t.Errorf("%q: %v, %v; want nothing", null, got, err)
		}
	}
	// Every prefix of a valid reply, and every reply with a byte
	// changed, is refused or parsed, never a panic; prefixes are
	// refused.
	for i := range len(b) {
		if _, err := parseReadReply(b[:i], 4); err == nil {
			t.Errorf("prefix of %d bytes accepted", i)
		}
	}
	for _, bad := range []struct{ reply, want string }{
		{"-NOGROUP No such key\r\n", "NOGROUP"},
		{string(b), "more than the 3"},
		{string(b[:len(b)-1]) + "x", "CRLF"},
		{"*-1\r\nx", "after the reply"},
		{"*2\r\n*0\r\n*0\r\n", "want one stream"},
		{"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$0\r\n\r\n*0\r\n", "empty"},
		{"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$1\r\n1\r\n*1\r\n$1\r\nk\r\n", "even"},
		{"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$1\r\n1\r\n*2\r\n$99\r\nk\r\n", "left"},
		{"*1\r\n*2\r\n$1\r\ns\r\n*99999999999999\r\n", "bad length"},
		{"*1\r\n*2\r\n$1\r\ns\r\n*01\r\n", "bad length"},
		{"*1\r\n*2\r\n$1\r\ns\r\n*1x\r\n", "bad length"},
		{"*1\r\n*2\r\n$1\r\nsXY*0\r\n", "CRLF"},
	} {
		n := 4
		if strings.Contains(bad.want, "more than") {
			n = 3
		}
		if _, err := parseReadReply([]byte(bad.reply), n); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want an error with %q", bad.reply, err, bad.want)
		}
	}
}

func FuzzParseReadReply(f *testing.F) {
	f.Add(readReply("s", [][]string{{"1-0", FieldKey, "k", FieldData, "d"}, {"2-0"}}), 4)
	f.Add([]byte("*-1\r\n"), 1)
	f.Add([]byte("%1\r\n$1\r\ns\r\n*0\r\n"), 1)
	f.Fuzz(func(t *testing.T, b []byte, count int) {
		count = 1 + abs(count)%MaxStreamCount
		in := bytes.Clone(b)
		recs, err := parseReadReply(b, count)
		if !bytes.Equal(in, b) {
			t.Fatal("the reply was changed")
		}
		if err != nil {
			return
		}
		if len(recs) > count {
			t.Fatalf("%d records, at most %d asked for", len(recs), count)
		}
		for _, r := range recs {
			if r.ID == "" || r.Deliveries != 1 {
				t.Fatalf("record %+v", r)
			}
			if len(r.Data) > 0 && !bytes.Contains(b, r.Data) {
				t.Fatalf("data %q not from the reply", r.Data)
			}
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// TestReadNow reads with ReadNow what Read would have read, fields and
// all, and nothing once the stream has none new.
func TestReadNow(t *testing.T) {
	s, _ := newTestStream(t, "now")
	ctx := t.Context()
	cons, err := s.Consumer("g", "c", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cons.ReadNow(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("empty stream: %v, %v", got, err)
	}
	var want []StreamRecord
	for i := range 5 {
		r := StreamRecord{Key: fmt.Sprint("k", i), Tenant: "t", Partition: fmt.Sprint("p", i%2), Data: []byte(fmt.Sprintf("d\r\n%d", i))}
		if i == 3 {
			r.Key, r.Tenant, r.Partition = "", "", ""
		}
		id, _, err := s.Add(ctx, r, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		r.ID, r.Deliveries = id, 1
		want = append(want, r)
	}
	a, err := cons.ReadNow(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cons.ReadNow(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := append(a, b...); !reflect.DeepEqual(got, want) {
		t.Errorf("ReadNow: %+v\nwant %+v", got, want)
	}
	if got, err := cons.ReadNow(ctx, 3); err != nil || len(got) != 0 {
		t.Errorf("after the last: %v, %v", got, err)
	}
	// The records are this consumer's: acknowledged, nothing is pending.
	if err := cons.Ack(ctx, want[0].ID, want[1].ID, want[2].ID, want[3].ID, want[4].ID); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Backlog(ctx, "g"); err != nil || n != 0 {
		t.Errorf("backlog %d, %v after acknowledging what ReadNow read", n, err)
	}
	// A reply far larger than the last (its buffer made for that one's
	// size) is read whole.
	big := StreamRecord{Key: "big", Data: bytes.Repeat([]byte("0123456789"), 20000)}
	if big.ID, _, err = s.Add(ctx, big, time.Minute); err != nil {
		t.Fatal(err)
	}
	big.Deliveries = 1
	if got, err := cons.ReadNow(ctx, 3); err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], big) {
		t.Errorf("a reply of 200 KB after small ones: %d records, %v", len(got), err)
	}
	other, _ := NewStream(s.c, "missing", StreamOptions{})
	oc, _ := other.Consumer("g", "c", time.Minute)
	if _, err := oc.ReadNow(ctx, 1); err == nil || !strings.Contains(err.Error(), "NOGROUP") {
		t.Errorf("ReadNow of a missing group: %v", err)
	}
	if _, err := cons.ReadNow(ctx, 0); err == nil || !strings.Contains(err.Error(), "count") {
		t.Errorf("ReadNow of 0: %v", err)
	}
}
