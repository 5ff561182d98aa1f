// Package loadrun is the closed loop and the accounting of Sluice's load
// generators (bench/rlsload, and bench/peers for the peers that do not
// speak Envoy's API): Callers goroutines each call one decision after
// another, on keys drawn from K, for a duration or a count, and the Result
// holds requests per second, latency percentiles and, for the processes
// named, CPU per request read from /proc. On a machine the load generator
// shares with the server, requests/s is about the busy CPU divided by the
// machine's CPU per request, so that is where a ratio to another server
// comes from.
//
// The zero Config is not useful: Callers and Keys must be at least 1 and
// one of Dur and N set. Run may be called from several goroutines, but the
// machine's figures are only meaningful for one run at a time.
package loadrun

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config is one run.
type Config struct {
	Name, Domain string
	Callers      int           // concurrent callers, 1 to 1024
	Keys         int           // distinct keys, at least 1
	Dur          time.Duration // at most 2m; ignored when N > 0
	N            int           // requests after the warm-up, shared among the callers, at most 10,000,000
	// PIDs are the server's processes (several for a cluster): their CPU
	// is summed. StorePID is a store's (a redis-server), or 0.
	PIDs     []int
	StorePID int
}

// Result is one run's figures, the JSON line bench/rls.sh tabulates.
type Result struct {
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

// A Call sends the decision of key i (0 ≤ i < Keys) and reports whether it
// was over the limit. It is called from all the callers at once.
type Call func(i int) (limited bool, err error)

// Check reports whether c is within the bounds of a run.
func (c Config) Check() error {
	if c.Dur > 2*time.Minute || c.Callers < 1 || c.Callers > 1024 || c.Keys < 1 || c.N < 0 || c.N > 10_000_000 || (c.N == 0 && c.Dur <= 0) {
		return errors.New("bounds: 1 ≤ c ≤ 1024, k ≥ 1, 0 < d ≤ 2m, 0 ≤ n ≤ 10,000,000")
	}
	return nil
}

// Run warms up (one call for each of the first 2,000 keys), then runs the
// closed loop and returns its figures.
func Run(c Config, call Call) (Result, error) {
	if err := c.Check(); err != nil {
		return Result{}, err
	}
	callers, keys := c.Callers, c.Keys
	// Warm up the connections and the server's keys.
	for i := range min(keys, 2000) {
		if _, err := call(i); err != nil {
			return Result{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	cpu0, store0, self0 := procsCPU(c.PIDs), procCPU(c.StorePID), procCPU(os.Getpid())
	reads0 := procReads(c.StorePID)
	busy0, idle0 := machineCPU()
	start := time.Now()
	deadline := start.Add(c.Dur)
	if c.N > 0 {
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
			quota := c.N / callers
			if w < c.N%callers {
				quota++
			}
			for c.N == 0 || len(l) < quota {
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
	cpu1, store1, self1 := procsCPU(c.PIDs), procCPU(c.StorePID), procCPU(os.Getpid())
	reads1 := procReads(c.StorePID)
	busy1, idle1 := machineCPU()
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := Result{Name: c.Name, Domain: c.Domain, Callers: callers, Keys: keys, Seconds: elapsed.Seconds(), Requests: len(all)}
	for w := range callers {
		r.Errors += errs[w]
		r.OverLimit += over[w]
	}
	if len(all) == 0 {
		return r, errors.New("no request completed")
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
	return r, nil
}

// Print writes r as one JSON line, or as one line of prose.
func (r Result) Print(w io.Writer, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s c=%d k=%d: %.0f req/s, p50 %.0fµs p99 %.0fµs p99.9 %.0fµs, errors %d, over-limit %d", r.Name, r.Callers, r.Keys, r.RPS, r.P50us, r.P99us, r.P999us, r.Errors, r.OverLimit)
	if r.CPUPerReqU > 0 {
		fmt.Fprintf(&b, ", server CPU %.1fµs/req", r.CPUPerReqU)
	}
	if r.StoreCPUU > 0 {
		fmt.Fprintf(&b, ", store CPU %.1fµs/req, %.0f store reads/s", r.StoreCPUU, r.StoreReads)
	}
	fmt.Fprintf(&b, ", load generator CPU %.1fµs/req", r.LoadCPUU)
	if r.MachineU > 0 {
		fmt.Fprintf(&b, ", machine CPU %.1fµs/req (%.0f%% busy)", r.MachineU, 100*r.Busy)
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
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

// procsCPU returns the user+system CPU time of the processes pids, summed.
func procsCPU(pids []int) time.Duration {
	var t time.Duration
	for _, p := range pids {
		t += procCPU(p)
	}
	return t
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

// Value is the descriptor value of key i of a load: an IPv4 address, as a
// per-client limit sees.
func Value(i int) string { return "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) }
