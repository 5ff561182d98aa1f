package overload

import (
	"context"
	"flag"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/httplimit"
)

var realRun = flag.Bool("overload.real", false, "run TestOverloadReal: a net/http server over loopback at 1×, 2× and 4× its capacity (about 40 s of wall time)")

// spin burns the CPU for d: the handler's fixed work.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

// realServer starts an HTTP server on loopback whose handler waits for
// one of workers slots and then spins for work; guarded, the Guard is in
// front. It returns the URL and a stop function.
func realServer(t *testing.T, workers int, work time.Duration, g *adaptive.Guard) (string, func()) {
	sem := make(chan struct{}, workers)
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sem <- struct{}{}
		spin(work)
		<-sem
		io.WriteString(w, "ok")
	})
	if g != nil {
		h = httplimit.Protect(g, httplimit.ProtectOptions{})(h)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), func() { srv.Close() }
}

// realResult is what an open-loop run measured.
type realResult struct {
	offered, good, refused, late int
	lats                         []time.Duration
}

// openLoop sends Poisson arrivals at rate a second for d, each request
// with a client timeout of deadline, never waiting for answers before
// sending the next.
func openLoop(url string, rate float64, d, deadline time.Duration, seed uint64) realResult {
	tr := &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	rng := rand.New(rand.NewPCG(seed, 1))
	var mu sync.Mutex
	var res realResult
	var wg sync.WaitGroup
	start := time.Now()
	for next := time.Duration(0); next < d; next += time.Duration(rng.ExpFloat64() / rate * 1e9) {
		if w := next - time.Since(start); w > 0 {
			time.Sleep(w) // pacing the open-loop generator, not synchronisation
		}
		res.offered++
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			t0 := time.Now()
			resp, err := client.Do(req)
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				res.late++
				res.lats = append(res.lats, deadline)
				return
			case resp.StatusCode == http.StatusServiceUnavailable:
				res.refused++
			case resp.StatusCode == http.StatusOK:
				res.good++
				res.lats = append(res.lats, lat)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	return res
}

func (r realResult) p99() time.Duration {
	if len(r.lats) == 0 {
		return 0
	}
	slices.Sort(r.lats)
	return r.lats[min(len(r.lats)-1, int(math.Ceil(0.99*float64(len(r.lats))))-1)]
}

// TestOverloadReal runs a real net/http server over loopback, one worker
// spinning 4 ms of CPU a request, against an open-loop generator at 1×,
// 2× and 4× its capacity (measured first, closed-loop), unprotected and
// behind a Guard. It asserts only that the Guard, at 2× and 4×, answers
// more requests in time than no protection; the figures are for
// bench/RESULTS.md. Wall-clock and CPU-bound: flag-gated.
func TestOverloadReal(t *testing.T) {
	if !*realRun {
		t.Skip("flag -overload.real not set")
	}
	const workers, work, deadline, dur = 1, 4 * time.Millisecond, time.Second, 8 * time.Second
	url, stop := realServer(t, workers, work, nil)
	// Capacity: workers busy back to back for 2 s, 8 closed-loop clients.
	var n int
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(2 * time.Second)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				resp, err := http.Get(url)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	stop()
	capacity := float64(n) / 2
	t.Logf("capacity %.0f requests/s (%d worker, %v of CPU a request)", capacity, workers, work)
	for _, load := range []float64{1, 2, 4} {
		var goods [2]float64
		for gi, guarded := range []bool{false, true} {
			var g *adaptive.Guard
			name := "no protection"
			if guarded {
				var err error
				g, err = adaptive.NewGuard(adaptive.GuardOptions{
					Concurrency: adaptive.ConcurrencyOptions{Max: 200, Controller: &adaptive.Gradient{Target: 150 * time.Millisecond}},
					Shedder:     &adaptive.ShedderOptions{Objective: adaptive.Objective{Quantile: 0.99, Latency: sluiceObjective}},
				})
				if err != nil {
					t.Fatal(err)
				}
				name = "adaptive.Guard"
			}
			url, stop := realServer(t, workers, work, g)
			r := openLoop(url, load*capacity, dur, deadline, 1)
			stop()
			good := float64(r.good) / dur.Seconds() / capacity
			goods[gi] = good
			t.Logf("| %v× | %s | %.3f | %v | %.3f | %.3f |", load, name, good, r.p99().Round(time.Millisecond),
				float64(r.refused)/float64(r.offered), float64(r.late)/float64(r.offered))
		}
		if load >= 2 && goods[1] <= goods[0] {
			t.Errorf("%v×: goodput with the Guard %.3f, without %.3f: want more with it", load, goods[1], goods[0])
		}
	}
}
