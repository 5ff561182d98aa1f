// Package rudb simulates a request-unit database: an HTTP database that
// charges every operation in request units (RU) and refuses what its
// budget cannot pay, for demonstrations (`sluice demo`), benchmarks and
// tests of clients that must live with one. It is real code, not test
// code: it imports neither testing nor net/http/httptest.
//
// DB is a database in the manner of Azure Cosmos DB: it grants a budget of
// request units per fixed window (20,000 RU per second, say), charges
// every operation its cost in RU, and answers an operation that the rest of
// the window's budget cannot pay with 429 Too Many Requests and
// x-ms-retry-after-ms, the milliseconds until the window ends. A refused
// operation costs nothing. An admitted one says what it cost in
// x-ms-request-charge; with WriteCostMax, what a write costs is drawn at
// random by the DB, so that its client learns it only from the answer, as
// a real database's charge depends on the document and its indexing.
//
// Naive and Paced write records to it in the two ways a job can: all at
// once, resending whatever is refused; or through an httplimit.Client that
// paces the writes to the budget.
//
// To run a client and a DB together without a network (under
// testing/synctest), tests use httplimit/throttledtest's HandlerTransport.
package rudb

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/limitheader"
)

// DB is the simulated database, an http.Handler. Writes (POST, PUT, PATCH,
// DELETE) cost WriteCost RU, other requests ReadCost. Windows are aligned to
// the Unix epoch. Set the fields before the first request; a DB is safe for
// concurrent use.
type DB struct {
	// Budget is the RU granted per window; 0 means 20,000.
	Budget int64
	// Window is the length of a window; 0 means one second.
	Window time.Duration
	// WriteCost and ReadCost are the RU of a write and of a read; 0 means
	// 10 and 1.
	WriteCost, ReadCost int64
	// WriteCostMax, when above WriteCost, makes each write cost a whole
	// number of RU drawn uniformly from WriteCost to WriteCostMax, both
	// included (5 to 15, say), drawn again for each attempt: the client
	// knows the cost only from the answer's x-ms-request-charge.
	WriteCostMax int64
	// Seed seeds the draws of WriteCostMax; 0 draws a random seed.
	Seed uint64
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Idempotent makes a write with an Idempotency-Key header field take
	// effect once: a write whose key was written before is answered 200
	// with Idempotent-Replayed: true, costs nothing and counts in
	// Stats.Replayed, not Written. The DB remembers every key for its
	// life.
	Idempotent bool

	mu      sync.Mutex
	window  int64 // index of the current window
	used    int64 // RU used in it
	stats   Stats
	written map[string]struct{} // the keys written, when Idempotent
	rng     *rand.Rand          // the draws of WriteCostMax, made at first use
}

// ReplayedHeader is the header field with which an Idempotent DB marks
// the answer to a write it had already done.
const ReplayedHeader = "Idempotent-Replayed"

// Stats count what a DB answered.
type Stats struct {
	Requests  int64 // requests received
	Throttled int64 // answered 429
	Written   int64 // writes admitted
	Replayed  int64 // writes answered as done before (Idempotent)
	RU        int64 // request units charged
}

// Stats returns the DB's counters.
func (db *DB) Stats() Stats {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.stats
}

func (db *DB) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	write := r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch || r.Method == http.MethodDelete
	cost := or(db.ReadCost, 1)
	if write {
		cost = or(db.WriteCost, 10)
	}
	budget, win := or(db.Budget, 20000), time.Duration(or(int64(db.Window), int64(time.Second)))
	now := time.Now
	if db.Now != nil {
		now = db.Now
	}
	t := now().UnixNano()
	key := ""
	if write && db.Idempotent {
		key = r.Header.Get("Idempotency-Key")
	}
	db.mu.Lock()
	db.stats.Requests++
	if _, done := db.written[key]; done && key != "" {
		db.stats.Replayed++
		db.mu.Unlock()
		w.Header().Set(ReplayedHeader, "true")
		w.WriteHeader(http.StatusOK)
		return
	}
	if write && db.WriteCostMax > cost {
		if db.rng == nil {
			seed := db.Seed
			if seed == 0 {
				seed = rand.Uint64()
			}
			db.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		}
		cost += db.rng.Int64N(db.WriteCostMax - cost + 1)
	}
	if i := t / int64(win); i != db.window {
		db.window, db.used = i, 0
	}
	if db.used+cost > budget {
		db.stats.Throttled++
		end := (db.window + 1) * int64(win)
		db.mu.Unlock()
		ms := (end - t + int64(time.Millisecond) - 1) / int64(time.Millisecond)
		w.Header().Set("X-Ms-Retry-After-Ms", strconv.FormatInt(max(1, ms), 10))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"code":"TooManyRequests","message":"Request rate is large."}`+"\n")
		return
	}
	db.used += cost
	db.stats.RU += cost
	if write {
		db.stats.Written++
	}
	if key != "" {
		if db.written == nil {
			db.written = make(map[string]struct{})
		}
		db.written[key] = struct{}{}
	}
	db.mu.Unlock()
	w.Header().Set("X-Ms-Request-Charge", strconv.FormatInt(cost, 10))
	if write {
		w.WriteHeader(http.StatusCreated)
	}
}

func or(v, def int64) int64 {
	if v > 0 {
		return v
	}
	return def
}

// A Result is what a job of writes saw.
type Result struct {
	Sent      int64         `json:"sent"`      // requests sent, resends included
	Throttled int64         `json:"throttled"` // 429 responses received
	Elapsed   time.Duration `json:"-"`
	Seconds   float64       `json:"seconds"` // Elapsed in seconds
}

func newRecord(url string, i int) func() (*http.Request, error) {
	body := fmt.Sprintf(`{"id":%d,"payload":"record %d"}`, i, i)
	return func() (*http.Request, error) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
		return req, err
	}
}

// Naive writes records to url the way a job without a limiter does: every
// write at once, each in its own goroutine; a write that is refused waits
// for the delay the 429 asks for and is sent again, until all are written.
// hc should bound its connections per host.
func Naive(ctx context.Context, hc *http.Client, url string, records int) (Result, error) {
	var sent, throttled atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for i := range records {
		wg.Go(func() {
			mk := newRecord(url, i)
			for {
				req, err := mk()
				if err != nil {
					report(errs, err)
					return
				}
				sent.Add(1)
				resp, err := hc.Do(req.WithContext(ctx))
				if err != nil {
					report(errs, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusTooManyRequests {
					return
				}
				throttled.Add(1)
				d, _ := limitheader.RetryDelay(resp.Header, time.Now())
				select {
				case <-time.After(d):
				case <-ctx.Done():
					report(errs, ctx.Err())
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	r := Result{Sent: sent.Load(), Throttled: throttled.Load(), Elapsed: el, Seconds: el.Seconds()}
	select {
	case err := <-errs:
		return r, err
	default:
		return r, nil
	}
}

// Paced writes records to url through c, from workers goroutines, each
// write costing cost units of c's Limiter. A write that c returns refused
// (its retry budget spent) is sent again through c. Sent and Throttled are
// the growth of c's counters, so give each job its own Client.
func Paced(ctx context.Context, c *httplimit.Client, url string, records, workers int, cost int64) (Result, error) {
	before := c.Stats()
	start := time.Now()
	next := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range max(1, workers) {
		wg.Go(func() {
			for i := range next {
				mk := newRecord(url, i)
				for {
					req, err := mk()
					if err != nil {
						report(errs, err)
						return
					}
					resp, err := c.Do(req.WithContext(httplimit.WithCost(ctx, cost)))
					if err != nil {
						report(errs, err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusTooManyRequests {
						break
					}
				}
			}
		})
	}
feed:
	for i := range records {
		select {
		case next <- i:
		case err := <-errs:
			report(errs, err)
			break feed
		}
	}
	close(next)
	wg.Wait()
	el := time.Since(start)
	after := c.Stats()
	r := Result{Sent: after.Requests - before.Requests, Throttled: after.Throttled - before.Throttled, Elapsed: el, Seconds: el.Seconds()}
	select {
	case err := <-errs:
		return r, err
	default:
		return r, nil
	}
}

func report(errs chan error, err error) {
	select {
	case errs <- err:
	default:
	}
}
