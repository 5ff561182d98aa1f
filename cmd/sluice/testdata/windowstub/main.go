// Command windowstub is the throttled downstream of TestPythonLeases, in
// a process of its own: it admits at most -capacity requests in each
// fixed window of -window from its start and answers 429 beyond. The
// test runs it apart from its own (race-instrumented) process and, where
// it may, at a real-time priority, so that the downstream counts each
// request when it arrives, as a machine of its own would, not when a
// loaded test process gets to it.
//
//	GET  /?c=A&r=17  one request: client c (one byte), record r
//	POST /start      the instant the records start; events are timed from it
//	GET  /events     every request since /start, as JSON
//
// It prints "LISTEN <url>" once it listens, and exits when its standard
// input closes.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// An event is one request as the stub counted it.
type event struct {
	At     time.Duration `json:"at"`  // since /start
	Win    int64         `json:"win"` // the window it was counted in
	Client string        `json:"client"`
	Record int           `json:"record"`
	OK     bool          `json:"ok"`
}

func main() {
	capacity := flag.Int("capacity", 500, "requests admitted per window")
	window := flag.Duration("window", time.Second, "the window's length")
	flag.Parse()
	var (
		mu     sync.Mutex
		events []event
		start  time.Time
		win    int64 = -1
		count  int
	)
	origin := time.Now()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		q := r.URL.Query()
		rec, err := strconv.Atoi(q.Get("r"))
		c := q.Get("c")
		if err != nil || len(c) != 1 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		el := now.Sub(origin)
		mu.Lock()
		if n := int64(el / *window); n != win {
			win, count = n, 0
		}
		ok := count < *capacity
		if ok {
			count++
		}
		if !start.IsZero() {
			events = append(events, event{At: now.Sub(start), Win: win, Client: c, Record: rec, OK: ok})
		}
		mu.Unlock()
		if !ok {
			left := *window - el%*window
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(left.Seconds()))))
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	mux.HandleFunc("POST /start", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		start = time.Now()
		mu.Unlock()
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(events)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	go srv.Serve(ln)
	fmt.Printf("LISTEN http://%s\n", ln.Addr())
	io.Copy(io.Discard, os.Stdin) // until the test closes it
	srv.Close()
}
