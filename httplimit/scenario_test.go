package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/httplimit/rudb"
	"github.com/sluicehq/sluice/httplimit/throttledtest"
	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/sluicehq/sluice/ratelimit"
)

// The throttled-database scenario of issue 5: a database granting 20,000 RU
// per one-second window, writes of 10 RU, 10,000 records to write.
const (
	dbBudget  = 20000
	dbCost    = 10
	dbRecords = 10000
)

// predicted is the time the budget allows for the job: 100,000 RU at
// 20,000 RU/s.
var predicted = time.Duration(dbRecords*dbCost) * time.Second / dbBudget

// pacedClient returns a Client paced at rate RU/s with a burst of five
// writes (so that it can catch up after a scheduling hiccup), sending
// through rt.
func pacedClient(rt http.RoundTripper, rate float64) *httplimit.Client {
	return &httplimit.Client{
		HTTP:    &http.Client{Transport: rt},
		Limiter: ratelimit.NewLimiter(ratelimit.Limit(rate), 5*dbCost),
	}
}

func TestThrottledDBSynctest(t *testing.T) {
	t.Run("naive", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db := &rudb.DB{Budget: dbBudget}
			hc := &http.Client{Transport: throttledtest.HandlerTransport{Handler: db}}
			r, err := rudb.Naive(t.Context(), hc, "http://db.test/items", dbRecords)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("naive: sent %d, throttled %d, %v", r.Sent, r.Throttled, r.Elapsed)
			// All at once, each window admitting 2,000: 10k+8k+6k+4k+2k.
			if r.Sent != 30000 || r.Throttled != 20000 {
				t.Errorf("naive sent %d (throttled %d), want 30000 (20000)", r.Sent, r.Throttled)
			}
			if got := db.Stats().Written; got != dbRecords {
				t.Errorf("written %d, want %d", got, dbRecords)
			}
		})
	})
	for _, procs := range []int{1, 4} {
		t.Run("sluice/processes="+string(rune('0'+procs)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				db := &rudb.DB{Budget: dbBudget}
				rt := throttledtest.HandlerTransport{Handler: db}
				results := make(chan rudb.Result, procs)
				start := time.Now()
				for p := range procs {
					go func() {
						// Each "process" has its own Client and limiter at
						// 1/procs of the budget.
						c := pacedClient(rt, dbBudget/float64(procs))
						n := dbRecords / procs
						if p == 0 {
							n += dbRecords % procs
						}
						r, err := rudb.Paced(t.Context(), c, "http://db.test/items", n, 32, dbCost)
						if err != nil {
							t.Error(err)
						}
						results <- r
					}()
				}
				var sent, throttled int64
				for range procs {
					r := <-results
					sent += r.Sent
					throttled += r.Throttled
				}
				elapsed := time.Since(start)
				t.Logf("sluice ×%d: sent %d, throttled %d, %v (predicted %v)", procs, sent, throttled, elapsed, predicted)
				if sent > dbRecords+dbRecords/100 {
					t.Errorf("sent %d requests, want at most %d", sent, dbRecords+dbRecords/100)
				}
				if lo, hi := predicted*9/10, predicted*11/10; elapsed < lo || elapsed > hi {
					t.Errorf("took %v, want %v ± 10%%", elapsed, predicted)
				}
				if got := db.Stats().Written; got != dbRecords {
					t.Errorf("written %d, want %d", got, dbRecords)
				}
			})
		})
	}
}

// TestThrottledDBRealTime runs the Sluice side once in real time: 10,000
// writes must take 5 s ± 10% with at most 1% more requests than records.
//
// It goes over loopback, except under the race detector: that multiplies
// the CPU cost of net/http about 4.5×, so 2,000 requests a second over
// loopback need about 0.9 of a core for client and server together, and on
// a busy 2-core machine the timing would measure the machine, not the
// client. Under -race the same job runs through the in-process transport,
// with the same real clock and timers (0.2 of a core).
func TestThrottledDBRealTime(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("takes 5 s of real time")
	}
	db := &rudb.DB{Budget: dbBudget}
	var rt http.RoundTripper = throttledtest.HandlerTransport{Handler: db}
	url := "http://db.test/items"
	if !raceEnabled {
		srv := httptest.NewServer(db)
		t.Cleanup(srv.Close)
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		t.Cleanup(tr.CloseIdleConnections)
		rt, url = tr, srv.URL+"/items"
	}
	c := pacedClient(rt, dbBudget)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r, err := rudb.Paced(ctx, c, url, dbRecords, 32, dbCost)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sluice in real time (%s): sent %d, throttled %d, %v (predicted %v)", url, r.Sent, r.Throttled, r.Elapsed, predicted)
	if r.Sent > dbRecords+dbRecords/100 {
		t.Errorf("sent %d requests, want at most %d", r.Sent, dbRecords+dbRecords/100)
	}
	if lo, hi := predicted*9/10, predicted*11/10; r.Elapsed < lo || r.Elapsed > hi {
		t.Errorf("took %v, want %v ± 10%%", r.Elapsed, predicted)
	}
	if got := db.Stats().Written; got != dbRecords {
		t.Errorf("written %d, want %d", got, dbRecords)
	}
}
