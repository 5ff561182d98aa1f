package faultnet_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/internal/redisproc"
)

// checks records when each holder told the resource it had checked its
// permit (the holders of pause_test.go do before each write).
type checks struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (c *checks) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/checked" {
			c.mu.Lock()
			c.at[req.Header.Get("Holder")] = append(c.at[req.Header.Get("Holder")], time.Now())
			c.mu.Unlock()
		}
		next.ServeHTTP(w, req)
	})
}

// last returns holder's last check before to, or the zero time.
func (c *checks) last(holder string, to time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var l time.Time
	for _, at := range c.at[holder] {
		if at.Before(to) {
			l = at
		}
	}
	return l
}

// TestFaultSemaphorePartition: a semaphore permit's holder cut from
// Redis. Two holder processes (pause_test.go's) share a semaphore of
// limit 1 (TTL 1 s) on Redis and write to a resource on a fourth host
// that checks fencing tokens; holder A, holding the permit, is cut from
// Redis (not from the resource) for 4 s while B waits. Promises
// (ARCHITECTURE.md, "Time": a permit is a duration on the holder's
// monotonic clock from when its request was sent, minus a margin, and
// its validity is judged at each check): A stops using its permit at its
// deadline, by its own clock, though its renewals hang; B is granted
// once the permit expired in Redis; never more than the limit inside the
// resource. Checked: A's last check of its permit within a TTL of the
// cut (its last renewal came before it); A's last write within a TTL
// and its preparation of the cut; at most 1 write inside the resource at
// once; no write of A let in after B's first; B wrote.
func TestFaultSemaphorePartition(t *testing.T) {
	inMakeFaults(t)
	n := faultnet.New(t)
	rh, xh, ah, bh := n.Host("redis"), n.Host("resource"), n.Host("holderA"), n.Host("holderB")
	redis := startRedis(t, rh, redisproc.Standalone, redisPort)
	l, err := xh.Listen("tcp", xh.Addr(httpPort))
	if err != nil {
		t.Fatal(err)
	}
	res := &resource{url: "http://" + xh.Addr(httpPort), checked: make(chan string, 64)}
	ck := &checks{at: map[string][]time.Time{}}
	srv := &http.Server{Handler: ck.wrap(res.handler())}
	go srv.Serve(l) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })

	startHolder(ah, "A", res, "", redis.Addr())
	res.awaitChecked(t, "A")                    // A holds the permit
	startHolder(bh, "B", res, "", redis.Addr()) // B waits for it
	res.awaitChecked(t, "A")                    // A checked again: it is preparing its write
	ah.Partition(rh)
	cutAt := time.Now()
	res.awaitWrite(t, "write by B", func(acc, _ []write) bool { return len(acc) > 0 && acc[len(acc)-1].holder == "B" })
	bWrote := time.Now()
	// The scenario's own span: the cut lasts 4 s, then 1 s healed.
	<-time.After(time.Until(cutAt.Add(4 * time.Second)))
	ah.Heal(rh)
	healAt := time.Now()
	<-time.After(time.Second)
	accepted, refused := res.writes()

	lastCheck := ck.last("A", healAt).Sub(cutAt)
	var lastWrite time.Duration
	aAfter, aWrites := 0, 0
	var bFirst time.Time
	for _, w := range accepted {
		switch w.holder {
		case "A":
			if !w.at.Before(cutAt) && w.at.Before(healAt) {
				lastWrite = w.at.Sub(cutAt)
				aWrites++
			}
			if !bFirst.IsZero() {
				aAfter++
			}
		case "B":
			if bFirst.IsZero() {
				bFirst = w.at
			}
		}
	}
	t.Logf("A cut at %s; its last check %v after the cut, its last write %v after it (%d writes from the cut to the heal); B's first write %v after the cut; accepted %d, refused %v; most inside at once %d",
		cutAt.Format("15:04:05.000"), lastCheck.Round(time.Millisecond), lastWrite.Round(time.Millisecond), aWrites, bWrote.Sub(cutAt).Round(time.Millisecond), len(accepted), refused, res.in.Max())
	row(t, "semaphore, partition: the holder of a semaphore permit (limit 1, TTL 1 s) cut from Redis (not from the resource) 4 s while another waits",
		fmt.Sprintf("the cut holder's last check of its permit %v after the cut, its last write %v after it (TTL %v, %v of work between check and write); the next holder's first write %v after the cut; at most %d inside the resource at once; the cut holder's writes let in after the next holder's first: %d; refused by fencing: %d",
			lastCheck.Round(time.Millisecond), lastWrite.Round(time.Millisecond), semTTL, holderPrepare, bWrote.Sub(cutAt).Round(time.Millisecond), res.in.Max(), aAfter, len(refused)))

	if lastCheck > semTTL {
		t.Errorf("A checked its permit %v after being cut from Redis, past the TTL %v: it did not stop at its deadline", lastCheck, semTTL)
	}
	if lastWrite > semTTL+holderPrepare+resourceWork {
		t.Errorf("A wrote %v after being cut from Redis, past the TTL and its preparation", lastWrite)
	}
	if res.in.Max() > 1 {
		t.Errorf("%d writes inside the resource at once, above the limit of 1", res.in.Max())
	}
	if aAfter > 0 {
		t.Errorf("%d of A's writes let in after B's first", aAfter)
	}
}
