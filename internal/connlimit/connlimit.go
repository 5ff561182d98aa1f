// Package connlimit caps the connections a listener keeps open at once.
//
// A [Listener] wraps a net.Listener. Below its cap it hands out every
// connection it accepts, and each one gives its place back when it is
// closed. At the cap it still accepts each new connection, and closes it at
// once, counting it as refused.
//
// Closing beyond the cap, rather than holding connections until a place
// frees up (a semaphore in front of Accept), is deliberate. A connection
// left waiting is not refused by the kernel: it completes its handshake
// into the listen backlog, so the client believes it is connected and waits
// for an answer until its own timeout, and once the backlog is full the
// kernel drops the handshakes of every later client, well-behaved or not.
// A connection closed at once tells its client straight away that this
// server is full, a proxy or load balancer moves on to another replica, and
// the refusal is counted where an operator can see it ([Listener.Stats]).
package connlimit

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
)

// Listener is a net.Listener that keeps at most a fixed number of the
// connections it accepted open at once. It is safe for concurrent use.
type Listener struct {
	net.Listener
	max      int64
	open     atomic.Int64
	accepted atomic.Uint64
	refused  atomic.Uint64
}

// Stats are a Listener's counts: the connections open now, and those
// accepted and refused since it was made.
type Stats struct {
	Max      int    // the cap
	Open     int    // accepted and not closed yet
	Accepted uint64 // handed out by Accept
	Refused  uint64 // closed at once because Open was at Max
}

// New returns a Listener that keeps at most max of ln's connections open at
// once. It returns an error if max is less than 1.
func New(ln net.Listener, max int) (*Listener, error) {
	if max < 1 {
		return nil, fmt.Errorf("connlimit: a cap of %d connections: want at least 1", max)
	}
	return &Listener{Listener: ln, max: int64(max)}, nil
}

// Accept waits for the next connection that fits under the cap and returns
// it. A connection that arrives while the cap is reached is closed at once
// and counted as refused, and Accept waits for the next one. Errors are the
// wrapped listener's.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			c.Close()
			continue
		}
		l.accepted.Add(1)
		return &conn{Conn: c, l: l}, nil
	}
}

// Stats returns the listener's counts now.
func (l *Listener) Stats() Stats {
	return Stats{
		Max:      int(l.max),
		Open:     int(l.open.Load()),
		Accepted: l.accepted.Load(),
		Refused:  l.refused.Load(),
	}
}

// conn is an accepted connection; closing it, once or more, gives its
// place back once.
type conn struct {
	net.Conn
	l      *Listener
	closed atomic.Bool
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return err
}

// CloseWrite half-closes the connection when the wrapped one can (a TCP
// connection can). net/http does so before closing a connection, so that
// the client reads the whole response rather than a reset; wrapping must
// not take that away.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
