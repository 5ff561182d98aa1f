package connlimit

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// acceptAll accepts from l until it fails, passing each connection on.
func acceptAll(t *testing.T, l net.Listener) <-chan net.Conn {
	t.Helper()
	ch := make(chan net.Conn)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range ch {
			c.Close()
		}
		<-done
	})
	return ch
}

func newListener(t *testing.T, max int) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(ln, max)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	return l
}

func dial(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read that ends
// rather than waits. The deadline only bounds a test that fails.
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return false
	}
	return err != nil
}

// TestCap: beyond the cap, connections are closed at once and counted; a
// closed connection gives its place back, once however often it is closed.
func TestCap(t *testing.T) {
	l := newListener(t, 2)
	accepted := acceptAll(t, l)
	var kept []net.Conn
	for range 2 {
		dial(t, l)
		kept = append(kept, <-accepted)
	}
	for range 3 {
		if c := dial(t, l); !closedByServer(t, c) {
			t.Fatal("a connection beyond the cap was not closed")
		}
	}
	if s := l.Stats(); s != (Stats{Max: 2, Open: 2, Accepted: 2, Refused: 3}) {
		t.Errorf("stats at the cap = %+v", s)
	}
	kept[0].Close()
	kept[0].Close()
	if s := l.Stats(); s.Open != 1 {
		t.Errorf("after closing one twice, %d open, want 1", s.Open)
	}
	c := dial(t, l)
	kept[0] = <-accepted
	if s := l.Stats(); s != (Stats{Max: 2, Open: 2, Accepted: 3, Refused: 3}) {
		t.Errorf("stats after a place came back = %+v", s)
	}
	// The accepted connection works, and half-closes as TCP does.
	if _, err := kept[0].Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := kept[0].(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(c); string(b) != "x" || err != nil {
		t.Errorf("after CloseWrite, the client read %q, %v; want x and EOF", b, err)
	}
}

// TestConcurrent: connections opened and closed from many goroutines never
// hold more than the cap, and each is either accepted or refused, as its
// client sees it.
func TestConcurrent(t *testing.T) {
	const max, clients = 4, 64
	l := newListener(t, max)
	accepted := acceptAll(t, l)
	var servers sync.WaitGroup
	servers.Go(func() {
		for c := range accepted {
			if s := l.Stats(); s.Open > max {
				t.Errorf("%d open, cap %d", s.Open, max)
			}
			servers.Go(func() {
				c.Write([]byte("ok"))
				io.Copy(io.Discard, c) // until the client closes
				c.Close()
			})
		}
	})
	var mu sync.Mutex
	var admitted, refused uint64
	var clientsDone sync.WaitGroup
	for range clients {
		clientsDone.Go(func() {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounds a failing test
			b := make([]byte, 2)
			_, err = io.ReadFull(c, b)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && string(b) == "ok":
				admitted++
			case err != nil && !errors.Is(err, os.ErrDeadlineExceeded):
				refused++
			default:
				t.Errorf("client read %q, %v", b, err)
			}
		})
	}
	clientsDone.Wait()
	l.Close()
	servers.Wait()
	if s := l.Stats(); s != (Stats{Max: max, Open: 0, Accepted: admitted, Refused: refused}) || admitted+refused != clients {
		t.Errorf("stats = %+v; clients saw %d accepted, %d refused", s, admitted, refused)
	}
}

func TestNewRefusesNoCap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := New(ln, 0); err == nil {
		t.Error("New with a cap of 0 succeeded")
	}
}
