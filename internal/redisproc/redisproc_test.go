package redisproc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// needServer skips the test when redis-server is missing, except under
// CI=true, where it fails: CI must install it.
func needServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found (CI must install Redis): %v", err)
		}
		t.Skipf("redis-server not found: %v", err)
	}
}

// TestLaunch: a launched server answers; stop kills it and removes its
// directory.
func TestLaunch(t *testing.T) {
	needServer(t)
	addr, stop, err := Launch()
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	err = c.Ping(ctx).Err()
	stop()
	if err != nil {
		t.Fatalf("PING a launched server: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := c.Ping(cctx).Err(); err == nil {
		t.Fatal("PING succeeded after stop")
	}
}

// TestKillRestart: a killed server refuses signals, restarts on its port
// and directory, and answers again; a server that requires a password is
// ready when it refuses PING.
func TestKillRestart(t *testing.T) {
	needServer(t)
	p, err := Start(Options{Kind: Standalone, Dir: t.TempDir(), Args: func(int) []string { return []string{"--requirepass", "secret"} }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if p.Port() == 6379 {
		t.Fatal("chose the shared port 6379")
	}
	port := p.Port()
	p.Kill()
	if err := p.Signal(os.Interrupt); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Signal after Kill: %v, want ErrNotRunning", err)
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if p.Port() != port {
		t.Fatalf("restarted on port %d, want %d", p.Port(), port)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: "secret", MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
}

func TestStartNeedsDir(t *testing.T) {
	if _, err := Start(Options{}); err == nil {
		t.Fatal("Start without a Dir succeeded")
	}
}
