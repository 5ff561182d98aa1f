package redisstore

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLogTo: go-redis's own lines (here, a failed dial) reach the given
// logger as structured records instead of plain text on standard error.
func TestLogTo(t *testing.T) {
	var buf bytes.Buffer
	LogTo(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	c, err := NewClient(ClientOptions{Addrs: []string{"127.0.0.1:1"}}) // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
	out := buf.String()
	if !strings.Contains(out, `"level":"DEBUG"`) || !strings.Contains(out, `"component":"go-redis"`) || !strings.Contains(out, "failed to dial") {
		t.Errorf("go-redis's log, as records: %q", out)
	}
}

func TestNewClientRejects(t *testing.T) {
	for _, addrs := range [][]string{nil, {}, {" "}, {"127.0.0.1:1", ""}} {
		if _, err := NewClient(ClientOptions{Addrs: addrs}); err == nil {
			t.Errorf("NewClient(%q) accepted", addrs)
		}
	}
}
