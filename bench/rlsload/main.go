// Command rlsload is a closed-loop load generator for Envoy rate limit
// services: C concurrent callers send ShouldRateLimit for D, each request
// carrying one descriptor whose value is one of K distinct keys. It reports
// requests per second and latency percentiles, and, given the server's PID,
// the server CPU time spent per request (from /proc), with its own and the
// whole machine's: on a machine the load generator shares with the server,
// requests/s is about the busy CPU divided by the machine's CPU per
// request, so that is where a ratio to another server comes from.
// With -http it sends the same decisions as POST /v1/check (Sluice's JSON
// API) over HTTP/1.1, one keep-alive connection per caller. Loopback only.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type result struct {
	Name       string  `json:"name"`
	Domain     string  `json:"domain"`
	Callers    int     `json:"callers"`
	Keys       int     `json:"keys"`
	Seconds    float64 `json:"seconds"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	OverLimit  int     `json:"over_limit"`
	RPS        float64 `json:"rps"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	P999us     float64 `json:"p999_us"`
	CPUPerReqU float64 `json:"server_cpu_us_per_request,omitempty"`
	StoreCPUU  float64 `json:"store_cpu_us_per_request,omitempty"`
	// StoreReads is the store's read system calls per second: one per
	// burst of commands a client sent (a pipeline is one, a large one a
	// few), so, on a store with one client process, about its round trips
	// per second, never fewer.
	StoreReads float64 `json:"store_reads_per_s,omitempty"`
	LoadCPUU   float64 `json:"loadgen_cpu_us_per_request"`
	MachineU   float64 `json:"machine_cpu_us_per_request,omitempty"`
	Busy       float64 `json:"machine_busy,omitempty"` // fraction of all CPUs
}

// config is one run's flags.
type config struct {
	addr, domain, key, name string
	callers, keys, n        int
	dur                     time.Duration
	pid, storePID           int
	asJSON, http            bool
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", "127.0.0.1:8081", "server address; must be loopback")
	flag.IntVar(&c.callers, "c", 16, "concurrent callers")
	flag.DurationVar(&c.dur, "d", 5*time.Second, "duration (at most 2m)")
	flag.IntVar(&c.n, "n", 0, "requests after the warm-up, shared among the callers, instead of a duration (at most 10,000,000)")
	flag.IntVar(&c.keys, "k", 10000, "distinct descriptor values")
	flag.StringVar(&c.domain, "domain", "bench", "domain")
	flag.StringVar(&c.key, "key", "remote_address", "descriptor key")
	flag.IntVar(&c.pid, "pid", 0, "server PID, to report its CPU per request")
	flag.IntVar(&c.storePID, "store-pid", 0, "the store's PID (a redis-server), to report its CPU per request")
	flag.StringVar(&c.name, "name", "", "label for the result")
	flag.BoolVar(&c.asJSON, "json", false, "print one JSON object")
	flag.BoolVar(&c.http, "http", false, "POST /v1/check over HTTP/1.1 to addr instead of calling ShouldRateLimit over gRPC")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "rlsload:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	addr, callers, dur, keys := c.addr, c.callers, c.dur, c.keys
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return errors.New("refusing a non-loopback address")
	}
	if dur > 2*time.Minute || callers < 1 || callers > 1024 || keys < 1 || c.n < 0 || c.n > 10_000_000 {
		return errors.New("bounds: 1 ≤ c ≤ 1024, k ≥ 1, d ≤ 2m, 0 ≤ n ≤ 10,000,000")
	}
	call, closeCall, err := caller(c)
	if err != nil {
		return err
	}
	defer closeCall()
	// Warm up the connections and the server's keys.
	for i := 0; i < min(keys, 2000); i++ {
		if _, err := call(i); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	cpu0, store0, self0 := procCPU(c.pid), procCPU(c.storePID), procCPU(os.Getpid())
	reads0 := procReads(c.storePID)
	busy0, idle0 := machineCPU()
	start := time.Now()
	deadline := start.Add(dur)
	if c.n > 0 {
		deadline = start.Add(10 * time.Minute) // bounded by the count, and by this
	}
	lat := make([][]time.Duration, callers)
	errs := make([]int, callers)
	over := make([]int, callers)
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			x := uint64(w)*0x9E3779B97F4A7C15 | 1
			l := make([]time.Duration, 0, 1<<16)
			quota := c.n / callers
			if w < c.n%callers {
				quota++
			}
			for c.n == 0 || len(l) < quota {
				t := time.Now()
				if t.After(deadline) {
					break
				}
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				limited, err := call(int(x % uint64(keys)))
				l = append(l, time.Since(t))
				if err != nil {
					errs[w]++
				} else if limited {
					over[w]++
				}
			}
			lat[w] = l
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, store1, self1 := procCPU(c.pid), procCPU(c.storePID), procCPU(os.Getpid())
	reads1 := procReads(c.storePID)
	busy1, idle1 := machineCPU()
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := result{Name: c.name, Domain: c.domain, Callers: callers, Keys: keys, Seconds: elapsed.Seconds(), Requests: len(all)}
	for w := range callers {
		r.Errors += errs[w]
		r.OverLimit += over[w]
	}
	if len(all) == 0 {
		return errors.New("no request completed")
	}
	pct := func(p float64) float64 { return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) }
	r.RPS = float64(len(all)) / elapsed.Seconds()
	r.P50us, r.P99us, r.P999us = pct(0.50), pct(0.99), pct(0.999)
	perReq := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(len(all)) }
	r.CPUPerReqU, r.StoreCPUU, r.LoadCPUU = perReq(cpu1-cpu0), perReq(store1-store0), perReq(self1-self0)
	r.StoreReads = float64(reads1-reads0) / elapsed.Seconds()
	if busy, total := busy1-busy0, busy1-busy0+idle1-idle0; total > 0 {
		r.MachineU, r.Busy = perReq(busy), float64(busy)/float64(total)
	}
	if c.asJSON {
		return json.NewEncoder(os.Stdout).Encode(r)
	}
	fmt.Printf("%s c=%d k=%d: %.0f req/s, p50 %.0fµs p99 %.0fµs p99.9 %.0fµs, errors %d, over-limit %d", c.name, callers, keys, r.RPS, r.P50us, r.P99us, r.P999us, r.Errors, r.OverLimit)
	if r.CPUPerReqU > 0 {
		fmt.Printf(", server CPU %.1fµs/req", r.CPUPerReqU)
	}
	if r.StoreCPUU > 0 {
		fmt.Printf(", store CPU %.1fµs/req, %.0f store reads/s", r.StoreCPUU, r.StoreReads)
	}
	fmt.Printf(", load generator CPU %.1fµs/req", r.LoadCPUU)
	if r.MachineU > 0 {
		fmt.Printf(", machine CPU %.1fµs/req (%.0f%% busy)", r.MachineU, 100*r.Busy)
	}
	fmt.Println()
	return nil
}

// caller returns the function that sends the decision of key i and reports
// whether it was over the limit, and what closes its connections.
func caller(c config) (func(i int) (bool, error), func(), error) {
	value := func(i int) string { return "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) }
	if c.http {
		bodies := make([][]byte, c.keys)
		for i := range bodies {
			b, err := json.Marshal(map[string]any{"domain": c.domain, "descriptors": []any{map[string]any{"entries": []any{map[string]string{"key": c.key, "value": value(i)}}}}})
			if err != nil {
				return nil, nil, err
			}
			bodies[i] = b
		}
		tr := &http.Transport{MaxIdleConnsPerHost: c.callers, MaxConnsPerHost: c.callers, DisableCompression: true}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		url := "http://" + c.addr + "/v1/check"
		return func(i int) (bool, error) {
			resp, err := client.Post(url, "application/json", bytes.NewReader(bodies[i]))
			if err != nil {
				return false, err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case err != nil:
				return false, err
			case resp.StatusCode == http.StatusTooManyRequests:
				return true, nil
			case resp.StatusCode != http.StatusOK:
				return false, fmt.Errorf("status %d", resp.StatusCode)
			}
			return false, nil
		}, tr.CloseIdleConnections, nil
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	reqs := make([]*rlsv3.RateLimitRequest, c.keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: c.key, Value: value(i)}},
		}}}
	}
	return func(i int) (bool, error) {
		resp, err := client.ShouldRateLimit(context.Background(), reqs[i])
		if err != nil {
			return false, err
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT, nil
	}, func() { conn.Close() }, nil
}

// machineCPU returns the busy and the idle CPU time of all CPUs since boot
// (from /proc/stat; iowait counts as idle, steal as neither), or zeros.
func machineCPU() (busy, idle time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	var t [7]int64
	for i := range t {
		t[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	return ticks(t[0] + t[1] + t[2] + t[5] + t[6]), ticks(t[3] + t[4])
}

// ticks converts /proc's CPU times, in USER_HZ (100 on Linux).
func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / 100 }

// procReads returns the read system calls process pid has made (syscr in
// /proc/pid/io), or 0.
func procReads(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// procCPU returns the user+system CPU time of process pid, or 0.
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) start after ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return ticks(utime + stime)
}
