package redisstore

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// TestNewClientCluster: two or more addresses make a Cluster client that
// asks for the slots' owners every clusterReloadInterval, not go-redis's
// 60 s, so that it finds a promoted replica while the old master hangs.
func TestNewClientCluster(t *testing.T) {
	c, err := NewClient(ClientOptions{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient of two addresses made a %T, want a *redis.ClusterClient", c)
	}
	if got := cc.Options().ClusterStateReloadInterval; got != clusterReloadInterval {
		t.Errorf("ClusterStateReloadInterval %v, want %v", got, clusterReloadInterval)
	}
	if got := cc.Options().MaxRetries; got != -1 {
		t.Errorf("MaxRetries %d, want -1 (no retries)", got)
	}
}
