package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// streamConn is a connection of a StreamConsumer's own to the node that
// holds its stream, on which ReadNow sends XREADGROUP and reads the reply
// straight from the socket into one buffer: through go-redis, each of a
// record's seven strings costs an allocation and a copy of its own (its
// RawWriteToCmd hands each to io.CopyN), about a quarter of a Drainer's
// CPU a record. It is dialled, with the client's options (its Dialer, so TLS,
// its credentials, database and client name), at the first read, and
// again after an error. go-redis's hooks do not see the reads made here.
//
// A client it cannot stand in for, it leaves to go-redis (nodeFor returns
// errNotUsable): a Ring, a client with an OnConnect hook or streaming
// credentials. A server's answer that go-redis acts on (a Cluster's
// MOVED or ASK, a replica's READONLY after a failover, LOADING, …) closes
// the connection and has that read made by go-redis, which follows it.
//
// Its methods are safe for concurrent use; reads are made one at a time.
type streamConn struct {
	mu   sync.Mutex
	nc   net.Conn
	node *redis.Client // whose options nc was dialled with
}

// redirected is an error reply go-redis acts on, returned by exchange.
type redirected struct{ msg string }

func (e redirected) Error() string { return "server: " + e.msg }

// redirects are the first words of the error replies that go-redis
// follows or waits out, and a read on this connection would not.
var redirects = []string{"MOVED ", "ASK ", "TRYAGAIN ", "CLUSTERDOWN ", "READONLY ", "LOADING ", "MASTERDOWN ", "NOREPLICAS "}

// redirect returns a redirected error if reply, whole, is an error
// reply go-redis acts on.
func redirect(reply []byte) error {
	if len(reply) < 3 || reply[0] != '-' {
		return nil
	}
	msg := string(reply[1 : len(reply)-2])
	for _, r := range redirects {
		if strings.HasPrefix(msg, r) {
			return redirected{msg}
		}
	}
	return nil
}

// errNotUsable says that c is a client the connection leaves to go-redis.
var errNotUsable = errors.New("redisstore: client left to go-redis")

// nodeFor returns the client whose options reach the node holding key,
// or errNotUsable.
func nodeFor(ctx context.Context, c Client, key string) (*redis.Client, error) {
	var node *redis.Client
	switch c := c.(type) {
	case *redis.Client:
		node = c
	case *redis.ClusterClient:
		n, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		node = n
	default:
		return nil, errNotUsable
	}
	o := node.Options()
	if o.OnConnect != nil || o.StreamingCredentialsProvider != nil || o.Dialer == nil {
		return nil, errNotUsable
	}
	return node, nil
}

// read sends args to the node holding key, on node's options, and
// appends the raw reply to buf. A reply that is an error go-redis
// follows is returned as a redirected error, and errNotUsable when c is
// not a client it can stand in for.
func (sc *streamConn) read(ctx context.Context, c Client, key string, buf []byte, args ...string) ([]byte, error) {
	if ctx.Err() != nil {
		return buf, context.Cause(ctx)
	}
	node, err := nodeFor(ctx, c, key)
	if err != nil {
		return buf, err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.nc != nil && sc.node != node {
		sc.closeLocked() // the key moved
	}
	for retried := false; ; retried = true {
		fresh := sc.nc == nil
		if fresh {
			if err := sc.dial(ctx, node); err != nil {
				return buf, err
			}
		}
		start := len(buf)
		var out []byte
		out, err = sc.exchange(ctx, buf, args)
		if err == nil {
			return out, nil
		}
		sc.closeLocked()
		// A connection that answered before and now reads its end at
		// once was closed by the server while idle (its timeout): the
		// command never ran. Once more on a new one.
		if fresh || retried || len(out) > start || !closedByPeer(err) {
			return buf, err
		}
	}
}

// closedByPeer reports whether err says the server had closed the
// connection.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// dial opens the connection to node and authenticates it, selects the
// database and names the client as node's options say.
func (sc *streamConn) dial(ctx context.Context, node *redis.Client) error {
	o := node.Options()
	nc, err := o.Dialer(ctx, o.Network, o.Addr)
	if err != nil {
		return err
	}
	sc.nc, sc.node = nc, node
	user, pass := o.Username, o.Password
	switch {
	case o.CredentialsProviderContext != nil:
		if user, pass, err = o.CredentialsProviderContext(ctx); err != nil {
			sc.closeLocked()
			return err
		}
	case o.CredentialsProvider != nil:
		user, pass = o.CredentialsProvider()
	}
	var hello [][]string
	switch {
	case pass != "" && user != "":
		hello = append(hello, []string{"auth", user, pass})
	case pass != "":
		hello = append(hello, []string{"auth", pass})
	}
	if o.DB != 0 {
		hello = append(hello, []string{"select", strconv.Itoa(o.DB)})
	}
	if o.ClientName != "" {
		hello = append(hello, []string{"client", "setname", o.ClientName})
	}
	for _, cmd := range hello {
		r, err := sc.exchange(ctx, nil, cmd)
		if err == nil && string(r) != "+OK\r\n" {
			err = fmt.Errorf("%s answered %.100q", cmd[0], r)
		}
		if err != nil {
			sc.closeLocked()
			return fmt.Errorf("redisstore: stream connection to %s: %w", o.Addr, err)
		}
	}
	return nil
}

// exchange writes one command and reads its reply, appended to buf,
// within the node's timeouts and ctx.
func (sc *streamConn) exchange(ctx context.Context, buf []byte, args []string) ([]byte, error) {
	o := sc.node.Options()
	deadline := time.Time{}
	if t := max(o.ReadTimeout, o.WriteTimeout); t > 0 {
		deadline = time.Now().Add(t)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	if err := sc.nc.SetDeadline(deadline); err != nil {
		return buf, err
	}
	nc := sc.nc
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	size := 1 + 20 + 2
	for _, a := range args {
		size += 1 + 20 + 2 + len(a) + 2
	}
	// The request is written from buf's spare room; the reply
	// overwrites it.
	buf = slices.Grow(buf, size)
	req := buf[len(buf):]
	req = append(req, '*')
	req = strconv.AppendInt(req, int64(len(args)), 10)
	req = append(req, '\r', '\n')
	for _, a := range args {
		req = append(req, '$')
		req = strconv.AppendInt(req, int64(len(a)), 10)
		req = append(req, '\r', '\n')
		req = append(req, a...)
		req = append(req, '\r', '\n')
	}
	if _, err := nc.Write(req); err != nil {
		return buf, ctxErr(ctx, err)
	}
	start := len(buf)
	s := replyScan{pos: start}
	for {
		if cap(buf)-len(buf) < minRead {
			buf = slices.Grow(buf, max(len(buf)-start, minRead))
		}
		n, err := nc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		done, serr := s.advance(buf)
		switch {
		case serr != nil:
			return buf, fmt.Errorf("reply: %w", serr)
		case done && s.pos != len(buf):
			return buf, fmt.Errorf("reply: %d bytes after it", len(buf)-s.pos)
		case done:
			return buf, redirect(buf[start:])
		case err != nil:
			return buf, ctxErr(ctx, err)
		}
	}
}

// minRead is the least room exchange reads into.
const minRead = 4096

// ctxErr is err, or ctx's error when ctx ended the wait (its deadline,
// which the connection's is, may have passed before ctx says so).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return err
}

// close closes the connection, if open; the next read opens another.
func (sc *streamConn) close() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.closeLocked()
}

func (sc *streamConn) closeLocked() error {
	if sc.nc == nil {
		return nil
	}
	err := sc.nc.Close()
	sc.nc, sc.node = nil, nil
	return err
}

// maxRESPDepth bounds how deeply a reply's arrays nest: an XREADGROUP
// reply nests five deep.
const maxRESPDepth = 8

// replyScan finds the end of one RESP reply in a buffer as its bytes
// arrive, without looking again at what it has passed: pos is where the
// next header starts, open holds the elements left in each array begun
// and not ended.
type replyScan struct {
	pos     int
	open    []int
	started bool
	depth   [maxRESPDepth]int // open's array
}

// advance scans b, which holds what it held at the last call and maybe
// more, and reports whether the reply is whole: then it ends at pos.
func (s *replyScan) advance(b []byte) (bool, error) {
	if s.open == nil {
		s.open = s.depth[:0]
	}
	for !s.started || len(s.open) > 0 {
		i := bytes.IndexByte(b[s.pos:], '\n')
		if i < 0 {
			if len(b)-s.pos > maxHeader {
				return false, errors.New("header too long")
			}
			return false, nil
		}
		if i < 2 || b[s.pos+i-1] != '\r' {
			return false, errors.New("header without CRLF")
		}
		kind, line := b[s.pos], b[s.pos+1:s.pos+i-1]
		next := s.pos + i + 1
		switch kind {
		case '*', '%', '$':
			n, ok := respLen(line)
			if !ok {
				return false, fmt.Errorf("bad length %.30q", line)
			}
			switch {
			case kind == '$' && n >= 0:
				if len(b) < next+n+2 {
					return false, nil // the string's bytes are yet to come
				}
				if b[next+n] != '\r' || b[next+n+1] != '\n' {
					return false, errors.New("string without CRLF")
				}
				next += n + 2
			case n > 0:
				if len(s.open) == maxRESPDepth {
					return false, fmt.Errorf("arrays nested more than %d deep", maxRESPDepth)
				}
				if kind == '%' {
					n *= 2
				}
				s.started, s.pos = true, next
				s.open = append(s.open, n)
				continue
			}
		case '+', '-', ':', '_':
		default:
			return false, fmt.Errorf("unexpected %q", kind)
		}
		// One element ends at next, and with it each array it was the
		// last of.
		s.started, s.pos = true, next
		for len(s.open) > 0 {
			if s.open[len(s.open)-1]--; s.open[len(s.open)-1] > 0 {
				break
			}
			s.open = s.open[:len(s.open)-1]
		}
	}
	return true, nil
}

// maxHeader bounds a header line: a length of 20 digits, or an error
// reply's text.
const maxHeader = 4096
