package faultnet

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// A Relay is a TCP relay on a host that forwards each connection to a
// target and delays each direction by a one-way delay that may change
// while it runs: a round trip through it takes twice the delay more.
// With jitter (SetJitter), each read is delayed by the delay plus a
// uniformly random offset within ± the jitter, drawn apart for each read
// and each direction, but never written before the read ahead of it in
// its direction: TCP's bytes keep their order, so a read drawn short
// behind one drawn long waits for it (as behind a slow packet in a TCP
// stream). It stands in for tc netem where the kernel has no sch_netem
// (NetemSupported), at the cost of running in the test process; it adds
// no loss (Net.Loss does).
type Relay struct {
	l      net.Listener
	target string
	from   *Host
	delay  atomic.Int64 // one way, in nanoseconds
	jitter atomic.Int64 // ± around delay, in nanoseconds

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// Relay listens on the host at port and forwards to target, dialled from
// the host, each direction delayed by oneWay. It is closed when the test
// ends.
func (h *Host) Relay(port int, target string, oneWay time.Duration) *Relay {
	t := h.net.t
	t.Helper()
	l, err := h.Listen("tcp", h.Addr(port))
	if err != nil {
		t.Fatalf("faultnet: relay on %s: %v", h.name, err)
	}
	r := &Relay{l: l, target: target, from: h, conns: map[net.Conn]bool{}}
	r.delay.Store(int64(oneWay))
	r.wg.Go(r.accept)
	t.Cleanup(r.close)
	return r
}

// Addr is the relay's address.
func (r *Relay) Addr() string { return r.l.Addr().String() }

// SetDelay changes the one-way delay of what is read from now on.
func (r *Relay) SetDelay(oneWay time.Duration) { r.delay.Store(int64(oneWay)) }

// SetJitter changes the jitter of what is read from now on: each read's
// delay is drawn uniformly from the one-way delay ± j (at least 0).
func (r *Relay) SetJitter(j time.Duration) { r.jitter.Store(int64(j)) }

// due is when a chunk read now may be written, given when the one before
// it in its direction was (its order kept).
func (r *Relay) due(now, prev time.Time) time.Time {
	d := r.delay.Load()
	if j := r.jitter.Load(); j > 0 {
		d += rand.Int64N(2*j+1) - j
	}
	at := now.Add(time.Duration(max(d, 0)))
	if at.Before(prev) {
		return prev
	}
	return at
}

func (r *Relay) accept() {
	for {
		in, err := r.l.Accept()
		if err != nil {
			return
		}
		out, err := r.from.DialContext(context.Background(), "tcp", r.target)
		if err != nil {
			in.Close()
			continue
		}
		if !r.track(in, out) {
			return
		}
		r.wg.Go(func() { r.pump(in, out) })
		r.wg.Go(func() { r.pump(out, in) })
	}
}

// track records the connections to close; false if the relay is closed.
func (r *Relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		r.conns[c] = true
	}
	return true
}

// chunk is what one read returned, and when it may be written on.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst, each read held until its delay has passed; a
// reader and a writer goroutine, so that a held chunk does not hold up
// the reads behind it. An error on either side closes both.
func (r *Relay) pump(src, dst net.Conn) {
	q := make(chan chunk, 1024)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer dst.Close()
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d) // the link's delay itself
			}
			if _, err := dst.Write(c.b); err != nil {
				src.Close()
				for range q { // let the reader end
				}
				return
			}
		}
	})
	var prev time.Time
	for {
		b := make([]byte, 32<<10)
		n, err := src.Read(b)
		if n > 0 {
			prev = r.due(time.Now(), prev)
			q <- chunk{b[:n], prev}
		}
		if err != nil {
			break
		}
	}
	close(q)
	wg.Wait()
}

// close stops accepting, closes every connection and waits for the
// relay's goroutines.
func (r *Relay) close() {
	r.l.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}
