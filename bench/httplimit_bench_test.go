package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/httplimit/rudb"
	"github.com/sluicehq/sluice/httplimit/throttledtest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
)

// discardWriter is the cheapest http.ResponseWriter: it keeps one header
// map, cleared before each request, so that a benchmark measures the
// handler and the middleware rather than a recorder.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(s int)           { w.status = s }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

// bareHandler does nothing but answer.
var bareHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
})

// workHandler is a typical small JSON endpoint: it reads a 4 KiB body,
// decodes it and encodes a response.
var workHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Items []string `json:"items"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(in.Items), "first": in.Items[0]})
})

// workBody is a 4 KiB JSON document for workHandler.
var workBody = func() []byte {
	items := make([]string, 0, 128)
	for len(items) < 128 {
		items = append(items, strings.Repeat("x", 24))
	}
	b, _ := json.Marshal(map[string]any{"items": items})
	return b
}()

// serveLoop sends the same request to h in a loop from every goroutine,
// each goroutine as its own client address (so that they do not contend
// for one key).
func serveLoop(b *testing.B, h http.Handler, body []byte) {
	b.ReportAllocs()
	var clients atomic.Int32
	b.RunParallel(func(pb *testing.PB) {
		rd := bytes.NewReader(body)
		req := httptest.NewRequest("POST", "/items", nil)
		req.RemoteAddr = fmt.Sprintf("192.0.2.%d:4000", clients.Add(1))
		req.Body = io.NopCloser(rd)
		w := &discardWriter{h: make(http.Header)}
		for pb.Next() {
			rd.Reset(body)
			clear(w.h)
			h.ServeHTTP(w, req)
		}
	})
}

// BenchmarkMiddleware measures the middleware against a bare handler in
// the same run: allowed (one limit by client IP, memstore, RateLimit
// fields on the response), denied (429 with fields and problem details),
// and a handler doing real work, which a denial must be far cheaper than.
func BenchmarkMiddleware(b *testing.B) {
	newMW := func(b *testing.B, rule ratelimit.Rule, omit bool) *httplimit.Middleware {
		b.Helper()
		store := memstore.New(memstore.Options{})
		b.Cleanup(func() { store.Close() })
		m, err := httplimit.New(httplimit.Options{
			Store:              store,
			Policies:           []httplimit.Policy{{Rule: rule, Keys: []httplimit.Key{httplimit.ByIP()}}},
			OmitAllowedHeaders: omit,
		})
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	open := ratelimit.Rule{Name: "per_ip", Quota: 1e9, Period: time.Second, Burst: 1 << 40}
	closed := ratelimit.Rule{Name: "per_ip", Quota: 1, Period: time.Hour}
	b.Run("bare", func(b *testing.B) { serveLoop(b, bareHandler, nil) })
	b.Run("allowed", func(b *testing.B) { serveLoop(b, newMW(b, open, false).Handler(bareHandler), nil) })
	b.Run("allowed_no_fields", func(b *testing.B) { serveLoop(b, newMW(b, open, true).Handler(bareHandler), nil) })
	b.Run("denied", func(b *testing.B) { serveLoop(b, newMW(b, closed, false).Handler(workHandler), workBody) })
	b.Run("work", func(b *testing.B) { serveLoop(b, workHandler, workBody) })
}

// BenchmarkThrottledDB runs the throttled-database scenario over
// loopback, scaled down 10× in time so that a job takes half a second: the
// database grants 2,000 RU per 100 ms window (20,000 RU/s), a write costs
// 10 RU, and the job writes 1,000 records (10,000 RU: 0.5 s predicted). It
// reports the requests sent and throttled and the seconds per job, for the
// naive job (everything at once, resend what is refused) and for Sluice's
// Client paced at 20,000 RU/s.
func BenchmarkThrottledDB(b *testing.B) {
	const records, cost, budget, window = 1000, 10, 2000, 100 * time.Millisecond
	server := func(b *testing.B) (string, *http.Client) {
		b.Helper()
		db := &rudb.DB{Budget: budget, Window: window, WriteCost: cost}
		srv := httptest.NewServer(db)
		b.Cleanup(srv.Close)
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = 128, 128
		b.Cleanup(tr.CloseIdleConnections)
		return srv.URL + "/items", &http.Client{Transport: tr}
	}
	report := func(b *testing.B, r rudb.Result, err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.Sent), "sent/job")
		b.ReportMetric(float64(r.Throttled), "throttled/job")
		b.ReportMetric(r.Seconds, "s/job")
	}
	b.Run("naive", func(b *testing.B) {
		for b.Loop() {
			url, hc := server(b)
			r, err := rudb.Naive(context.Background(), hc, url, records)
			report(b, r, err)
		}
	})
	b.Run("sluice", func(b *testing.B) {
		for b.Loop() {
			url, hc := server(b)
			c := &httplimit.Client{HTTP: hc, Limiter: ratelimit.NewLimiter(ratelimit.Limit(budget*float64(time.Second/window)), 5*cost)}
			r, err := rudb.Paced(context.Background(), c, url, records, 32, cost)
			report(b, r, err)
		}
	})
}

// BenchmarkClient measures what httplimit.Client adds to http.Client.Do
// on a success, in process (no network): the pause check, pacing through a
// Limiter that never waits, and the AIMD bookkeeping.
func BenchmarkClient(b *testing.B) {
	rt := throttledtest.HandlerTransport{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	hc := &http.Client{Transport: rt}
	run := func(b *testing.B, do func(*http.Request) (*http.Response, error)) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req, _ := http.NewRequest("GET", "http://svc.test/", nil)
			for pb.Next() {
				resp, err := do(req)
				if err != nil {
					b.Error(err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	b.Run("http.Client", func(b *testing.B) { run(b, hc.Do) })
	b.Run("httplimit.Client", func(b *testing.B) {
		c := &httplimit.Client{HTTP: hc, Limiter: ratelimit.NewLimiter(ratelimit.Inf, 0)}
		run(b, c.Do)
	})
}
