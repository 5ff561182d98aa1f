package main

// Clients that misbehave on purpose, on raw TCP connections: they send a
// request a byte at a time, or open more gRPC streams than allowed, so that
// the tests can see what serve does about them. They use the standard
// library only, and none runs a goroutine per connection: one trickle
// drives them all.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// dialRaw opens a TCP connection to addr, closed when the test ends.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// slowBody opens an HTTP connection to addr and sends the header of a
// request with a body of 1,000 bytes to come; it returns once the handler
// is reading the body (the server answered Expect: 100-continue). header
// is extra header lines, each ending in \r\n.
func slowBody(t *testing.T, addr, method, path, header string) net.Conn {
	t.Helper()
	c := dialRaw(t, addr)
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n%s\r\n", method, path, header)
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounds a failing test
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("slow body to %s%s: %q, %v; want 100 Continue", addr, path, line, err)
	}
	c.SetReadDeadline(time.Time{})
	return c
}

// slowHeader opens an HTTP connection to addr and sends the start of a
// request whose header the trickle then never finishes.
func slowHeader(t *testing.T, addr string) net.Conn {
	t.Helper()
	c := dialRaw(t, addr)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: sluice\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	return c
}

// h2Preface opens every HTTP/2 connection.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frame types and flags the slow gRPC clients use.
const (
	h2Data      = 0x0
	h2Headers   = 0x1
	h2RSTStream = 0x3
	h2Settings  = 0x4
	h2Ping      = 0x6
	h2GoAway    = 0x7

	h2EndHeaders = 0x4
	h2Ack        = 0x1

	h2RefusedStream = 0x7
)

// writeFrame writes one HTTP/2 frame.
func writeFrame(w io.Writer, typ, flags byte, stream uint32, payload []byte) error {
	var h [9]byte
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3], h[4] = typ, flags
	binary.BigEndian.PutUint32(h[5:], stream&0x7fffffff)
	_, err := w.Write(append(h[:], payload...))
	return err
}

// readFrame reads one HTTP/2 frame.
func readFrame(r io.Reader) (typ, flags byte, stream uint32, payload []byte, err error) {
	var h [9]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	payload = make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
	_, err = io.ReadFull(r, payload)
	return h[3], h[4], binary.BigEndian.Uint32(h[5:]) & 0x7fffffff, payload, err
}

// hpackLiteral encodes header fields as literals without indexing, without
// Huffman coding: every name and value here is shorter than 127 bytes.
func hpackLiteral(fields ...string) []byte {
	var b []byte
	for i := 0; i < len(fields); i += 2 {
		b = append(b, 0x00, byte(len(fields[i])))
		b = append(b, fields[i]...)
		b = append(b, byte(len(fields[i+1])))
		b = append(b, fields[i+1]...)
	}
	return b
}

// grpcSlowCall is the HTTP/2 header of a ShouldRateLimit call.
var grpcSlowCall = hpackLiteral(
	":method", "POST", ":scheme", "http", ":authority", "sluice",
	":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
	"content-type", "application/grpc", "te", "trailers",
)

// slowStreams opens a gRPC connection to addr, starts n ShouldRateLimit
// calls whose message (10,000 bytes announced) the trickle sends a byte at
// a time, and returns once the server has read them all: the ids of the
// streams it accepted, and how many it refused (RST_STREAM
// REFUSED_STREAM) for being beyond its limit of concurrent streams.
func slowStreams(t *testing.T, addr string, n int) (c net.Conn, accepted []uint32, refused int) {
	t.Helper()
	c = dialRaw(t, addr)
	if _, err := io.WriteString(c, h2Preface); err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(c, h2Settings, 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	prefix := []byte{0, 0, 0, 0x27, 0x10} // uncompressed, 10,000 bytes
	for i := range n {
		id := uint32(2*i + 1)
		if err := writeFrame(c, h2Headers, h2EndHeaders, id, grpcSlowCall); err != nil {
			t.Fatal(err)
		}
		if err := writeFrame(c, h2Data, 0, id, prefix); err != nil {
			t.Fatal(err)
		}
	}
	// The server reads frames in order: once it answers this ping, it has
	// started, or refused, every call above.
	if err := writeFrame(c, h2Ping, 0, 0, []byte("slowslow")); err != nil {
		t.Fatal(err)
	}
	refusedIDs := map[uint32]bool{}
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounds a failing test
	br := bufio.NewReader(c)
	for {
		typ, flags, stream, payload, err := readFrame(br)
		if err != nil {
			t.Fatalf("slow gRPC calls: reading the server's frames: %v", err)
		}
		if typ == h2RSTStream && len(payload) == 4 && binary.BigEndian.Uint32(payload) == h2RefusedStream {
			refusedIDs[stream] = true
		}
		if typ == h2GoAway {
			t.Fatalf("slow gRPC calls: GOAWAY %x", payload)
		}
		if typ == h2Ping && flags&h2Ack != 0 && string(payload) == "slowslow" {
			break
		}
	}
	c.SetReadDeadline(time.Time{})
	for i := range n {
		if id := uint32(2*i + 1); !refusedIDs[id] {
			accepted = append(accepted, id)
		}
	}
	return c, accepted, len(refusedIDs)
}

// trickle is a set of slow clients that one goroutine drives: every tick
// it takes one more step of each (a byte of header or body, a DATA frame),
// until the server closes the connection or the trickle is stopped.
type trickle struct {
	stop, done chan struct{}
	mu         sync.Mutex
	cut        int // connections whose step failed: the server closed them
}

// slowConn is one slow client: its connection and its next step.
type slowConn struct {
	c    net.Conn
	step func(net.Conn) error
}

// byteStep sends one byte.
func byteStep(c net.Conn) error {
	_, err := c.Write([]byte("a"))
	return err
}

// dataStep returns the step that sends one byte of message on each of the
// streams.
func dataStep(streams []uint32) func(net.Conn) error {
	return func(c net.Conn) error {
		for _, id := range streams {
			if err := writeFrame(c, h2Data, 0, id, []byte{0}); err != nil {
				return err
			}
		}
		return nil
	}
}

// prefaceStep returns the step that sends the HTTP/2 preface one byte at
// a time, over and over: a handshake that never completes.
func prefaceStep() func(net.Conn) error {
	next := 0
	return func(c net.Conn) error {
		_, err := c.Write([]byte{h2Preface[next%len(h2Preface)]})
		next++
		return err
	}
}

// startTrickle drives conns, one step every tick, until stopped; then it
// closes them. A connection the server closed fails a step (at the latest
// the second after) and is closed.
func startTrickle(t *testing.T, tick time.Duration, conns ...slowConn) *trickle {
	tr := &trickle{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		live := conns
		defer func() {
			for _, s := range live {
				s.c.Close()
			}
		}()
		tk := time.NewTicker(tick)
		defer tk.Stop()
		for {
			select {
			case <-tr.stop:
				return
			case <-tk.C:
			}
			kept := live[:0]
			for _, s := range live {
				s.c.SetWriteDeadline(time.Now().Add(time.Second))
				if err := s.step(s.c); err != nil {
					s.c.Close()
					tr.mu.Lock()
					tr.cut++
					tr.mu.Unlock()
					continue
				}
				kept = append(kept, s)
			}
			live = kept
		}
	}()
	t.Cleanup(tr.close)
	return tr
}

// close stops the trickle and closes its connections; it may be called
// more than once.
func (tr *trickle) close() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	<-tr.done
}

// cutCount is how many of the trickle's connections the server has closed.
func (tr *trickle) cutCount() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.cut
}

// errClosedByServer reports that a connection ended from the server's side.
var errClosedByServer = errors.New("closed by the server")

// readUntilClosed reads c until the server closes it, within d; it
// returns errClosedByServer, or the read's error if it times out.
func readUntilClosed(c net.Conn, d time.Duration) error {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return err
	}
	return errClosedByServer
}
