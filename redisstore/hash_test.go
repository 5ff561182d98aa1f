package redisstore

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestExpiringHash(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	h, err := NewExpiringHash(c, "t:h")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := h.Put(ctx, "a", "1|x", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := h.Put(ctx, "b", "2", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// b expires by the server's clock; the list that finds it expired
	// deletes it.
	deadline := time.Now().Add(5 * time.Second)
	var list []HashEntry
	for {
		if list, err = h.List(ctx); err != nil {
			t.Fatal(err)
		}
		if len(list) == 1 || time.Now().After(deadline) {
			break
		}
	}
	if len(list) != 1 || list[0].Field != "a" || list[0].Value != "1|x" || list[0].TTL <= 59*time.Minute || list[0].TTL > time.Hour {
		t.Fatalf("List = %+v, want only a = \"1|x\" with about an hour left", list)
	}
	if n, _ := c.HLen(ctx, "t:h").Result(); n != 1 {
		t.Errorf("expired field not deleted: %d fields left", n)
	}
	// A value the table did not write is not an entry.
	c.HSet(ctx, "t:h", "junk", "no expiry")
	if list, err := h.List(ctx); err != nil || len(list) != 1 {
		t.Fatalf("List with a foreign field = %+v, %v", list, err)
	}
	if ok, err := h.Delete(ctx, "a"); !ok || err != nil {
		t.Fatalf("Delete(a) = %v, %v", ok, err)
	}
	if ok, err := h.Delete(ctx, "a"); ok || err != nil {
		t.Fatalf("Delete(a) again = %v, %v", ok, err)
	}
	if _, err := NewExpiringHash(nil, "k"); err == nil {
		t.Error("nil client accepted")
	}
	if _, err := NewExpiringHash(c, ""); err == nil {
		t.Error("empty key accepted")
	}
}
