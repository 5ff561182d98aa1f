package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/drain/jsdrain"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

const drainUsage = `Usage: sluice drain -url URL (-rate N/s | -lease-redis ADDR -capacity N/s) [flags]

Drain takes the records of a JetStream stream and POSTs each to URL (its
key in the Idempotency-Key header), no faster than -rate, or than this
process's leased share of -capacity when several drainers share one
downstream through leases on Redis. A record is acknowledged only after a
2xx answer; 429 and 503 pause the records of -pause-scope (all of them,
the throttled record's partition, or its tenant) for the time the answer
asks, at most -max-pause, and put the record back without counting a
failure; other failures are retried with backoff up to -max-failures,
then published to the dead-letter subject with the last error. Every
record the drainer holds is kept from redelivery (told in progress
within the ack wait), and it holds no more than -rate sends in half of
-ack-wait.

By default the stream lives in an embedded NATS server whose data is in
-data; -nats-url drains an external server or cluster instead. Drain stops
when the stream is empty (or on SIGINT/SIGTERM, handing back what it held);
-follow keeps it waiting for more. On a terminal it shows a progress bar
with the estimated time to finish; otherwise it logs progress every second.
`

const enqueueUsage = `Usage: sluice enqueue [-file FILE] [flags]

Enqueue puts each line of FILE (or of standard input) into the JetStream
stream as one record, durably: it returns once the stream has confirmed
every record. Record i's key is -key-prefix followed by i, so enqueuing the
same file again within the stream's duplicate window (an hour) adds nothing.
With -partitions N, record i goes to partition p<(i-1) mod N> (the
Sluice-Partition header), which drain -pause-scope partition pauses alone.
`

// runEnqueue runs `sluice enqueue`.
func runEnqueue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("enqueue", enqueueUsage, stderr)
	var q queueFlags
	q.register(fs)
	file := fs.String("file", "-", "the records, one a line; - for standard input")
	prefix := fs.String("key-prefix", "rec-", "the records' keys: this prefix and the line number from 1")
	fs.StringVar(&q.subject, "subject", "records", "with -source jetstream: the subject, under the stream's: <stream>.<subject>")
	tenant := fs.String("tenant", "", "the records' tenant")
	partitions := fs.Int("partitions", 0, "spread the records over this many partitions, p0, p1, … in turn; 0: none")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *partitions < 0 {
		return usagef("enqueue: -partitions is negative")
	}
	var in io.Reader = os.Stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	qu, err := q.open(ctx)
	if err != nil {
		return usagef("enqueue: %v", err)
	}
	defer qu.close()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20) // a record is at most 1 MiB, NATS's default payload limit
	n, dups := 0, 0
	var batch []queueRecord
	flush := func() error {
		d, err := qu.publish(ctx, q.stream, batch)
		for _, dup := range d {
			if dup {
				dups++
			}
		}
		batch = batch[:0]
		return err
	}
	for sc.Scan() {
		n++
		r := queueRecord{key: *prefix + strconv.Itoa(n), tenant: *tenant, data: append([]byte(nil), sc.Bytes()...)}
		if *partitions > 0 {
			r.partition = "p" + strconv.Itoa((n-1)%*partitions)
		}
		if batch = append(batch, r); len(batch) == 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading records: %w", err)
	}
	if err := flush(); err != nil {
		return err
	}
	if dups > 0 {
		_, err = fmt.Fprintf(stdout, "enqueued %d records on %s %s (%d already there, dropped)\n", n-dups, q.source, q.stream, dups)
		return err
	}
	_, err = fmt.Fprintf(stdout, "enqueued %d records on %s %s\n", n, q.source, q.stream)
	return err
}

// runDrain runs `sluice drain`.
func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runDrainWith(ctx, args, stderr, nil)
}

// runDrainWith runs `sluice drain` with args, its sink wrapped by wrap
// when wrap is not nil (the ingestion demo's processors validate and
// enrich each record before it is sent).
func runDrainWith(ctx context.Context, args []string, stderr io.Writer, wrap func(drain.Sink) drain.Sink) error {
	fs := newEnvFlagSet("drain", drainUsage, drainEnvPrefix, stderr)
	var q queueFlags
	q.register(fs)
	url := fs.String("url", "", "the HTTP endpoint each record is POSTed to (required)")
	rate := fs.String("rate", "", "the rate, as N/s, N/m or N/h")
	leaseRedis := fs.String("lease-redis", "", "lease the capacity on this Redis (host:port), shared with other drainers")
	capacity := fs.String("capacity", "", "with -lease-redis: the downstream's whole capacity, as N/s")
	partitions := fs.Int("partitions", 20, "with -lease-redis: the partitions the capacity is leased in")
	service := fs.String("lease-service", "sluice-drain", "with -lease-redis: the name the drainers share leases under")
	consumer := fs.String("consumer", "sluice-drain", "the durable consumer's name (Redis and Kafka: the consumer group's), shared by the drainers of one stream")
	workers := fs.Int("workers", drain.DefaultWorkers, "requests in flight at most")
	maxFailures := fs.Int("max-failures", drain.DefaultMaxFailures, "failed attempts before a record is dead-lettered")
	pauseScope := fs.String("pause-scope", "all", "what a 429 or 503 pauses: all (every record: one quota for the whole sink), partition (the throttled record's partition) or tenant (its tenant)")
	maxPause := fs.Duration("max-pause", drain.DefaultMaxPause, "the longest pause one throttled answer may ask for")
	follow := fs.Bool("follow", false, "keep draining when the stream is empty")
	window := fs.Int("window", 0, "records delivered and not yet acknowledged at most (JetStream: the consumer's max-ack-pending); 0 for the source's default: 256 on JetStream and Kafka, 512 on Redis (which reads half its window at a time)")
	ackWait := fs.Duration("ack-wait", jsdrain.DefaultAckWait, "how long a record delivered to a drainer that went silent waits before it is delivered again (Kafka: the group's session timeout)")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics of the drainer (and of its leases) at http://ADDR/metrics; empty: none")
	if err := parseFlagsEnv(fs, args, drainEnvPrefix, os.LookupEnv); err != nil {
		return err
	}
	if *url == "" {
		return usagef("drain: -url is required")
	}
	if (*rate == "") == (*leaseRedis == "") {
		return usagef("drain: give one of -rate and -lease-redis")
	}
	if *leaseRedis != "" && *capacity == "" {
		return usagef("drain: -lease-redis needs -capacity")
	}
	scope, err := drain.ParsePauseScope(*pauseScope)
	if err != nil {
		return usagef("drain: -pause-scope: want all, partition or tenant")
	}
	if *maxPause <= 0 {
		return usagef("drain: -max-pause must be positive")
	}
	// On a terminal, log lines go above the progress bar.
	out, term := newProgressWriter(stderr)
	log := slog.New(slog.NewTextHandler(out, nil))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var limiter drain.Limiter
	var onThrottle func(time.Duration)
	var holderDone chan error
	var holder *lease.Holder
	var leased float64
	if *rate != "" {
		r, err := parseRate(*rate)
		if err != nil {
			return usagef("drain: -rate: %v", err)
		}
		limiter = ratelimit.NewLimiter(ratelimit.Limit(r), max(1, int(r/100)))
	} else {
		c, err := parseRate(*capacity)
		if err != nil {
			return usagef("drain: -capacity: %v", err)
		}
		leased = c
		o, err := q.redisOptions([]string{*leaseRedis})
		if err != nil {
			return err
		}
		rc, err := redisstore.NewClient(o)
		if err != nil {
			return err
		}
		defer rc.Close()
		// One that cannot be reached is left to the lease Holder, which
		// tries again.
		if refusal, err := pingRedis(ctx, rc); refusal {
			return fmt.Errorf("drain: -lease-redis %s: %w", *leaseRedis, err)
		}
		st, err := redisstore.NewLeaseStore(rc, *service, redisstore.LeaseOptions{})
		if err != nil {
			return err
		}
		h, err := lease.NewHolder(st, lease.Options{Capacity: c, Partitions: *partitions})
		if err != nil {
			return err
		}
		holder = h
		hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
		defer hcancel()
		holderDone = make(chan error, 1)
		go func() { holderDone <- h.Run(hctx) }()
		defer func() { hcancel(); <-holderDone }()
		limiter = h.Limiter()
		onThrottle = h.ThrottledAfter
	}

	qu, err := q.open(ctx)
	if err != nil {
		return usagef("drain: %v", err)
	}
	defer qu.close()
	src, stopSrc, err := qu.source(ctx, q.stream, *consumer, *window, *ackWait)
	if err != nil {
		return err
	}
	defer func() {
		if err := stopSrc(); err != nil {
			log.Warn("drain: closing the consumer; what it settled last may be delivered again", "err", err)
		}
	}()
	sink := (&drain.HTTPSink{URL: *url}).Send
	if wrap != nil {
		sink = wrap(sink)
	}
	d, err := drain.New(drain.Options{
		Inputs: []drain.Input{{Source: src}}, Sink: sink, Limiter: limiter, OnThrottle: onThrottle,
		Workers: *workers, MaxFailures: *maxFailures, Logger: log, StatsEvery: drainLook,
		PauseScope: scope, MaxPause: *maxPause,
	})
	if err != nil {
		return usagef("drain: %v", err)
	}
	// Before this drainer takes any: what another holds, or held when it
	// stopped, waits out the ack wait before anyone can send it.
	if hs, ok := src.(heldSource); ok {
		if held, err := hs.Held(ctx); err != nil {
			log.Warn("drain: reading the consumer", "err", err)
		} else if held > 0 {
			log.Warn("drain: records held by another drainer of this consumer, or by one that stopped: those of a stopped one are delivered again once the ack wait has passed",
				"held", held, "ack_wait", hs.AckWait(), "until", time.Now().Add(hs.AckWait()).Format(time.TimeOnly))
		}
	}
	if *metricsAddr != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(newDrainCollector(d, holder, *service, leased, *partitions))
		stop, err := serveDrainMetrics(ctx, *metricsAddr, reg, log)
		if err != nil {
			return fmt.Errorf("drain: -metrics-addr: %w", err)
		}
		defer stop()
	}
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	show := progressFunc(out, term, log)
	tk := time.NewTicker(drainLook)
	defer tk.Stop()
	for n := 1; ; n++ {
		select {
		case err := <-runErr:
			show(d.Stats(), true)
			return err
		case <-tk.C:
			st := d.Stats()
			if n%int(time.Second/drainLook) == 0 {
				show(st, false)
			}
			if holder != nil {
				// The drainer knows the backlog: it is the holder's
				// demand, so it leases what clears it (within its share).
				holder.SetBacklog(int(min(st.Backlog, math.MaxInt32)))
			}
			if !*follow && !st.BacklogAt.IsZero() && st.Backlog == 0 && st.InFlight == 0 && st.Waiting == 0 {
				cancel()
			}
		}
	}
}

// drainLook is how often sluice drain polls the backlog (to stop soon
// after the stream is empty, and to tell a lease holder its demand); it
// shows progress every second.
const drainLook = 100 * time.Millisecond

// progressWriter is stderr with a progress bar on its last line when
// stderr is a terminal: a log line written while the bar shows clears the
// bar's line, goes above it, and the bar is drawn again below.
type progressWriter struct {
	mu  sync.Mutex
	w   io.Writer
	bar string // the frame shown; "" when none
}

// newProgressWriter returns w as a progressWriter and whether w is a
// terminal (when not, the writer only passes writes on).
func newProgressWriter(w io.Writer) (*progressWriter, bool) {
	term := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			term = true
		}
	}
	return &progressWriter{w: w}, term
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar == "" {
		return p.w.Write(b)
	}
	if _, err := io.WriteString(p.w, "\r\x1b[K"); err != nil {
		return 0, err
	}
	n, err := p.w.Write(b)
	if err == nil {
		_, err = io.WriteString(p.w, "\r"+p.bar)
	}
	return n, err
}

// frame shows the bar line; the last one ends with a newline, after
// which the bar is gone.
func (p *progressWriter) frame(line string, last bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r%s", line)
	p.bar = line
	if last {
		fmt.Fprintln(p.w)
		p.bar = ""
	}
}

// progressFunc returns what shows progress on w: a bar with the ETA when
// w is a terminal, a log line otherwise.
func progressFunc(w *progressWriter, term bool, log *slog.Logger) func(st drain.Stats, last bool) {
	if !term {
		return func(st drain.Stats, last bool) {
			log.Info("drain: progress", "done", st.Done, "total", st.Total, "backlog", st.Backlog, "rate", math.Round(st.Rate), "eta", st.ETA.Round(time.Second),
				"throttled", st.Throttled, "failed", st.Failed, "dead_lettered", st.DeadLettered, "duplicates", st.Duplicates, "redelivered", st.Redelivered)
		}
	}
	return func(st drain.Stats, last bool) { w.frame(progressLine(st, 30), last) }
}

// progressLine draws st as a bar of width cells with counts, rate and ETA:
// the records settled (done, duplicates and dead-lettered) of the total
// known, which only grows.
func progressLine(st drain.Stats, width int) string {
	settled := st.Done + st.Duplicates + st.DeadLettered
	total := max(st.Total, settled)
	frac := 1.0
	if total > 0 {
		frac = float64(settled) / float64(total)
	}
	cells := int(frac * float64(width))
	eta := "?"
	if st.ETA > 0 {
		eta = st.ETA.Round(time.Second).String()
	} else if st.Backlog == 0 && !st.BacklogAt.IsZero() {
		eta = "0s"
	}
	line := fmt.Sprintf("[%s%s] %3.0f%% %d/%d %.0f/s ETA %s  429s %d  failed %d  dead %d ",
		strings.Repeat("#", cells), strings.Repeat(".", width-cells), 100*frac, settled, total, st.Rate, eta,
		st.Throttled, st.Failed, st.DeadLettered)
	if st.Duplicates > 0 {
		line += fmt.Sprintf(" dup %d ", st.Duplicates)
	}
	return line
}

// maxRate bounds what parseRate accepts, per second.
const maxRate = 1e9

// parseRate reads a rate as N/s, N/m or N/h (N a positive decimal, at most
// 32 bytes in all), or a bare N per second, and returns it per second.
func parseRate(s string) (float64, error) {
	if len(s) == 0 || len(s) > 32 {
		return 0, errors.New("want N/s, N/m or N/h")
	}
	num, unit, _ := strings.Cut(s, "/")
	per := 1.0
	switch unit {
	case "", "s":
	case "m":
		per = 60
	case "h":
		per = 3600
	default:
		return 0, fmt.Errorf("unknown unit %q: want s, m or h", unit)
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive number", num)
	}
	if r := n / per; r <= maxRate {
		return r, nil
	}
	return 0, fmt.Errorf("%s is above %g/s", s, maxRate)
}
