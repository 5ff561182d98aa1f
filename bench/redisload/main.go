// Command redisload measures Sluice's Redis store against redis_rate, the
// usual Redis limiter in Go, on one local Redis in one run.
//
// It starts its own redis-server on a free loopback port (persistence off),
// or uses -addr (loopback only). For each implementation (Sluice with
// coalescing, Sluice without, Sluice with a batched and with an approximate
// rule, redis_rate) and each number of concurrent
// callers it runs a closed loop for -d, every call one GCRA decision on one
// of -k keys with a limit high enough that every call is admitted, and
// reports decisions per second, latency percentiles, and Redis CPU per
// decision (used_cpu_sys + used_cpu_user from INFO cpu, before and after).
// Then it measures a plain INCR with redis-benchmark on the same server as
// the CPU baseline, and finally runs Sluice open-loop at half of its
// measured peak to report p99 latency at that load.
//
// The output is a Markdown table. Every loop is bounded in time.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/internal/redisproc"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

func main() {
	addr := flag.String("addr", "", "Redis address (loopback); empty starts a redis-server")
	dur := flag.Duration("d", 3*time.Second, "duration of each run (at most 1m)")
	keys := flag.Int("k", 10000, "distinct keys")
	conc := flag.String("c", "1,16,64", "concurrent callers, comma-separated")
	only := flag.String("only", "", "run only the implementations whose name contains this")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the load generator here")
	pipelines := flag.Int("pipelines", 0, "Sluice's Options.Pipelines (0: its default)")
	window := flag.Duration("window", 0, "Sluice's Options.BatchWindow")
	runs := flag.Int("runs", 1, "runs of each closed-loop measurement, interleaved across implementations; the median (by decisions/s) is reported")
	pace := flag.Float64("pace", 0, "the open-loop rate in decisions per second (0: half of Sluice's peak)")
	limit := flag.Int64("limit", 1000, "the rule's limit per second per key (set it so that every call is admitted)")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "redisload:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f) //nolint:errcheck
		defer pprof.StopCPUProfile()
	}
	if err := run(*addr, min(*dur, time.Minute), *keys, *conc, *only, *pipelines, *window, *limit, *pace, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "redisload:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type result struct {
	name      string
	callers   int
	decisions int
	errs      int
	elapsed   time.Duration
	lat       []time.Duration
	cpu       float64 // Redis CPU seconds
	client    float64 // this process's CPU seconds
	spread    string  // runs and their range of decisions/s, when several
}

// rate is the result's decisions per second.
func (r result) rate() float64 { return float64(r.decisions) / r.elapsed.Seconds() }

func (r result) row() string {
	p := func(q float64) string {
		if len(r.lat) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", float64(r.lat[int(q*float64(len(r.lat)-1))].Nanoseconds())/1e3)
	}
	perDec, client := "-", "-"
	if r.decisions > 0 {
		perDec = fmt.Sprintf("%.1f", r.cpu*1e6/float64(r.decisions))
		if r.client > 0 {
			client = fmt.Sprintf("%.1f", r.client*1e6/float64(r.decisions))
		}
	}
	spread := r.spread
	if spread == "" {
		spread = "-"
	}
	return fmt.Sprintf("| %s | %d | %.0f | %s | %s | %s | %s | %s | %d | %s |",
		r.name, r.callers, r.rate(), p(0.5), p(0.99), p(0.999), perDec, client, r.errs, spread)
}

func run(addr string, dur time.Duration, nkeys int, concList, only string, pipelines int, window time.Duration, limit int64, pace float64, runs int) error {
	if addr == "" {
		a, stop, err := redisproc.Launch()
		if err != nil {
			return err
		}
		defer stop()
		addr = a
	} else if host, _, err := net.SplitHostPort(addr); err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("-addr %q is not a loopback address", addr)
	}
	var callers []int
	for _, f := range strings.Split(concList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bad -c %q", concList)
		}
		callers = append(callers, n)
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Ping(ctx).Err(); err != nil {
		return err
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}

	type impl struct {
		name string
		new  func() (decide func(ctx context.Context, key string) error, close func(), err error)
	}
	sluice := func(coalesce bool, counting ratelimit.Counting) func() (func(context.Context, string) error, func(), error) {
		rule := &ratelimit.Rule{Name: "bench", Quota: limit, Period: time.Second, Counting: counting}
		return func() (func(context.Context, string) error, func(), error) {
			c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{addr}, PoolSize: 64, Timeout: time.Second})
			if err != nil {
				return nil, nil, err
			}
			s, err := redisstore.New(c, redisstore.Options{
				NoCoalesce: !coalesce, Timeout: time.Second,
				Prefix: fmt.Sprintf("bench%d:", rand.Uint32()), Pipelines: pipelines, BatchWindow: window,
			})
			if err != nil {
				c.Close()
				return nil, nil, err
			}
			decide := func(ctx context.Context, key string) error {
				var buf [1]ratelimit.Decision
				ds, err := s.Decide(ctx, buf[:0], []ratelimit.Item{{Key: key, Rule: rule, Cost: 1}})
				if err == nil && ds[0].Reason != ratelimit.ReasonOK {
					err = fmt.Errorf("decision %v", ds[0].Reason)
				}
				return err
			}
			return decide, func() {
				if st := s.Stats(); st.Pipelines > 0 {
					fmt.Fprintf(os.Stderr, "  (%d pipelines, %.1f requests each; Redis calls %d, decided here %d, leases %d, reconciliations %d)\n",
						st.Pipelines, float64(st.Batched)/float64(st.Pipelines), st.Requests, st.Counted, st.Leases, st.Reconciles)
				}
				s.Close()
				c.Close()
			}, nil
		}
	}
	impls := []impl{
		{"sluice (coalescing)", sluice(true, ratelimit.Strict)},
		{"sluice (no coalescing)", sluice(false, ratelimit.Strict)},
		{"sluice batched", sluice(true, ratelimit.Batched)},
		{"sluice approximate", sluice(true, ratelimit.Approximate)},
		{"redis_rate v10", func() (func(context.Context, string) error, func(), error) {
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
			l := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: int(limit), Burst: int(limit), Period: time.Second}
			decide := func(ctx context.Context, key string) error {
				res, err := l.Allow(ctx, "rr:"+key, lim)
				if err == nil && res.Allowed == 0 {
					err = errors.New("denied")
				}
				return err
			}
			return decide, func() { c.Close() }, nil
		}},
		// The floor: one plain GET per call, no script, no limiter.
		{"go-redis GET (floor)", func() (func(context.Context, string) error, func(), error) {
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
			decide := func(ctx context.Context, key string) error {
				if err := c.Get(ctx, "floor:"+key).Err(); err != nil && !errors.Is(err, redis.Nil) {
					return err
				}
				return nil
			}
			return decide, func() { c.Close() }, nil
		}},
	}

	impls = slices.DeleteFunc(impls, func(im impl) bool { return !strings.Contains(im.name, only) })
	// measure runs im with n callers for dur, open loop at perSec decisions
	// per second, or closed loop (each caller as fast as it can) for 0.
	measure := func(im impl, name string, n int, perSec float64) (result, error) {
		decide, closeFn, err := im.new()
		if err != nil {
			return result{}, err
		}
		defer closeFn()
		for i := range min(n, 64) * 4 { // warm up: connections, scripts
			decide(ctx, keys[i%len(keys)]) //nolint:errcheck
		}
		return load(ctx, admin, name, n, dur, perSec, keys, decide)
	}

	fmt.Printf("Redis %s at %s; %d keys, %v per run, GOMAXPROCS=%d\n\n", redisVersion(ctx, admin), addr, nkeys, dur, runtime.GOMAXPROCS(0))
	fmt.Println("| implementation | callers | decisions/s | p50 µs | p99 µs | p99.9 µs | Redis CPU µs/decision | client CPU µs/decision | errors | runs: decisions/s |")
	fmt.Println("| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: |")
	var peak float64
	// Each closed-loop measurement is run runs times, round robin across the
	// implementations, so that a noisy minute on this shared machine does
	// not fall on one of them only; the median run is reported.
	for _, n := range callers {
		all := make([][]result, len(impls))
		for range max(runs, 1) {
			for i, im := range impls {
				r, err := measure(im, im.name, n, 0)
				if err != nil {
					return err
				}
				all[i] = append(all[i], r)
			}
		}
		for i, rs := range all {
			slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(a.rate(), b.rate()) })
			r := rs[len(rs)/2]
			if len(rs) > 1 {
				r.spread = fmt.Sprintf("%d: %.0f–%.0f", len(rs), rs[0].rate(), rs[len(rs)-1].rate())
			}
			fmt.Println(r.row())
			if strings.HasPrefix(impls[i].name, "sluice") {
				peak = max(peak, r.rate())
			}
		}
	}

	// The CPU baseline: INCR from redis-benchmark, 64 clients, no pipelining.
	if base, err := incrBaseline(ctx, admin, addr, 64); err != nil {
		fmt.Println("\nredis-benchmark INCR baseline:", err)
	} else {
		fmt.Println(base.row())
	}

	// Half of the peak (or -pace), open loop, 64 callers; latency is
	// measured from the moment each call may start.
	if pace <= 0 {
		pace = peak / 2
	}
	for _, im := range impls {
		r, err := measure(im, fmt.Sprintf("%s, paced at %.0f/s", im.name, pace), 64, pace)
		if err != nil {
			return err
		}
		fmt.Println(r.row())
	}
	if stats, err := admin.Info(ctx, "commandstats").Result(); err == nil {
		fmt.Println()
		for _, l := range strings.Split(stats, "\n") {
			if strings.Contains(l, "cmdstat_eval") || strings.Contains(l, "cmdstat_incr") {
				fmt.Println("    " + strings.TrimSpace(l))
			}
		}
	}
	return nil
}

// load runs n callers for dur, each deciding on random keys: as fast as it
// can when perSec is 0, else all together at most perSec decisions per
// second.
func load(ctx context.Context, admin *redis.Client, name string, n int, dur time.Duration, perSec float64, keys []string, decide func(context.Context, string) error) (result, error) {
	cpu0, err := redisCPU(ctx, admin)
	if err != nil {
		return result{}, err
	}
	self0 := selfCPU()
	lctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	pace := func(context.Context) error { return nil }
	if perSec > 0 {
		pace = rate.NewLimiter(rate.Limit(perSec), 1).Wait
	}
	lats := make([][]time.Duration, n)
	errs := make([]int, n)
	for w := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			lat := make([]time.Duration, 0, 1<<16)
			for {
				if lctx.Err() != nil || pace(lctx) != nil {
					break
				}
				t0 := time.Now()
				if err := decide(ctx, keys[rng.IntN(len(keys))]); err != nil {
					errs[w]++
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			lats[w] = lat
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, err := redisCPU(ctx, admin)
	if err != nil {
		return result{}, err
	}
	r := result{name: name, callers: n, elapsed: elapsed, cpu: cpu1 - cpu0, client: selfCPU() - self0}
	for w := range n {
		r.lat = append(r.lat, lats[w]...)
		r.errs += errs[w]
	}
	r.decisions = len(r.lat)
	slices.Sort(r.lat)
	return r, nil
}

// selfCPU returns this process's user+system CPU time, in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

var cpuRE = regexp.MustCompile(`used_cpu_(sys|user):([0-9.]+)`)

// redisCPU returns the server's used_cpu_sys + used_cpu_user, in seconds.
func redisCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, m := range cpuRE.FindAllStringSubmatch(info, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

func redisVersion(ctx context.Context, c *redis.Client) string {
	info, _ := c.Info(ctx, "server").Result()
	if m := regexp.MustCompile(`redis_version:(\S+)`).FindStringSubmatch(info); m != nil {
		return m[1]
	}
	return "?"
}

// incrBaseline runs redis-benchmark -t incr against addr.
func incrBaseline(ctx context.Context, admin *redis.Client, addr string, clients int) (result, error) {
	host, port, _ := net.SplitHostPort(addr)
	const n = 300000
	cpu0, err := redisCPU(ctx, admin)
	if err != nil {
		return result{}, err
	}
	t0 := time.Now()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, "redis-benchmark", "-h", host, "-p", port, "-t", "incr",
		"-n", strconv.Itoa(n), "-c", strconv.Itoa(clients), "-q").CombinedOutput()
	if err != nil {
		return result{}, fmt.Errorf("%w: %s", err, out)
	}
	elapsed := time.Since(t0)
	cpu1, err := redisCPU(ctx, admin)
	if err != nil {
		return result{}, err
	}
	r := result{name: "redis-benchmark INCR (" + strings.TrimSpace(lastLine(string(out))) + ")", callers: clients, decisions: n, elapsed: elapsed, cpu: cpu1 - cpu0}
	return r, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexAny(s, "\r\n"); i >= 0 {
		s = s[i+1:]
	}
	return s
}
