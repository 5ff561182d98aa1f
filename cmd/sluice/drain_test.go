package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestEnqueueDrain: sluice enqueue puts a file's lines into the embedded
// server's stream; sluice drain then POSTs each once, paced, and stops
// when the stream is empty.
func TestEnqueueDrain(t *testing.T) {
	enqueueDrain(t, 600, "-rate", "300/s")
}

// TestDrainLeased: the same on capacity leased on a real Redis.
func TestDrainLeased(t *testing.T) {
	srv := redistest.Standalone(t)
	enqueueDrain(t, 600, "-lease-redis", srv.Addr(), "-capacity", "300/s", "-partitions", "10")
}

// TestDrainSlowOnce: 20 records at 4/s from a consumer with a 1 s ack
// wait, so that most wait in the drainer for longer than the ack wait:
// each is POSTed once. Before, the records waiting were delivered again
// and both copies were sent (40 records at 2/s with a 5 s ack wait made
// 103 POSTs).
func TestDrainSlowOnce(t *testing.T) {
	enqueueDrain(t, 20, "-rate", "4/s", "-ack-wait", "1s")
}

// TestEnqueueDrainSources is TestEnqueueDrain on a Redis stream and on a
// Kafka topic (kfake): sluice enqueue and sluice drain with -source.
func TestEnqueueDrainSources(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Standalone(t)
		enqueueDrainOn(t, 300, []string{"-source", "redis", "-redis", srv.Addr()}, "-rate", "300/s")
	})
	t.Run("kafka", func(t *testing.T) {
		enqueueDrainOn(t, 300, []string{"-source", "kafka", "-kafka-brokers", kafkaBrokers(t)}, "-rate", "300/s", "-ack-wait", "6s")
	})
}

// enqueueDrain enqueues n records in the embedded JetStream server and
// drains them with the pacing flags, which must allow 300/s at most.
func enqueueDrain(t *testing.T, n int, pacing ...string) {
	enqueueDrainOn(t, n, []string{"-data", filepath.Join(t.TempDir(), "data")}, pacing...)
}

// enqueueDrainOn is enqueueDrain on the queue the flags of queue name.
func enqueueDrainOn(t *testing.T, n int, queue []string, pacing ...string) {
	dir := t.TempDir()
	file := recordsFile(t, dir, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	source := sourceJetStream
	if len(queue) > 1 && queue[0] == "-source" {
		source = queue[1]
	}
	wants := []string{fmt.Sprintf("enqueued %d records on %s RECORDS\n", n, source)}
	if source != sourceKafka { // the second time adds nothing: same keys
		wants = append(wants, fmt.Sprintf("enqueued 0 records on %s RECORDS (%d already there, dropped)\n", source, n))
	}
	var out, errb bytes.Buffer
	for _, want := range wants {
		out.Reset()
		if err := run(ctx, append([]string{"enqueue", "-file", file, "-partitions", "7"}, queue...), &out, &errb); err != nil {
			t.Fatalf("enqueue: %v\n%s", err, errb.String())
		}
		if out.String() != want {
			t.Errorf("enqueue said %q, want %q", out.String(), want)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	requests := 0
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		requests++
		seen[r.Header.Get(drain.IdempotencyKeyHeader)]++
	}))
	defer hs.Close()
	errb.Reset()
	begin := time.Now()
	if err := run(ctx, append(append([]string{"drain", "-url", hs.URL}, queue...), pacing...), &out, &errb); err != nil {
		t.Fatalf("drain: %v\n%s", err, errb.String())
	}
	took := time.Since(begin)
	t.Logf("drained in %v:\n%s", took, errb.String())
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n || requests != n {
		t.Errorf("%d keys in %d requests, want %d once each", len(seen), requests, n)
	}
	for i := 1; i <= n; i++ {
		if seen[fmt.Sprint("rec-", i)] != 1 {
			t.Fatalf("record rec-%d sent %d times", i, seen[fmt.Sprint("rec-", i)])
		}
	}
	if least := time.Duration(float64(n-3) / 300 * float64(time.Second)); took < least { // 3: the limiter's burst
		t.Errorf("drained %d in %v, faster than 300/s (%v at least)", n, took, least)
	}
	if !strings.Contains(errb.String(), "drain: progress") || !strings.Contains(errb.String(), fmt.Sprintf("done=%d total=%d", n, n)) {
		t.Errorf("no progress logged:\n%s", errb.String())
	}
}

func TestProgressLine(t *testing.T) {
	got := progressLine(drain.Stats{Done: 250, Backlog: 750, Total: 1000, Rate: 100, ETA: 7500 * time.Millisecond, BacklogAt: time.Now()}, 20)
	if want := "[#####...............]  25% 250/1000 100/s ETA 8s  429s 0  failed 0  dead 0 "; got != want {
		t.Errorf("progressLine = %q, want %q", got, want)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]float64{"2000/s": 2000, "500": 500, "60/m": 1, "7200/h": 2, "0.5/s": 0.5} {
		if got, err := parseRate(in); err != nil || got != want {
			t.Errorf("parseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0/s", "-1/s", "x/s", "1/d", "NaN", "Inf/s", "1e300/s", strings.Repeat("1", 40)} {
		if _, err := parseRate(in); err == nil {
			t.Errorf("parseRate(%q) succeeded", in)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"2000/s", "1/m", "5/h", "3", "", "1e9/s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseRate(s)
		if err != nil {
			return
		}
		if len(s) > 32 || !(r > 0 && r <= maxRate) {
			t.Fatalf("parseRate(%q) = %v accepted", s, r)
		}
	})
}

// TestProgressWriter: on a terminal, a log line written while the bar
// shows goes above it (the bar's line cleared, the bar drawn again
// below), and the last frame ends its line.
func TestProgressWriter(t *testing.T) {
	var b bytes.Buffer
	w := &progressWriter{w: &b}
	fmt.Fprint(w, "before\n")
	w.frame("[bar 1]", false)
	fmt.Fprint(w, "drain: stopped\n")
	w.frame("[bar 2]", true)
	fmt.Fprint(w, "after\n")
	if want := "before\n\r[bar 1]\r\x1b[Kdrain: stopped\n\r[bar 1]\r[bar 2]\nafter\n"; b.String() != want {
		t.Errorf("wrote %q, want %q", b.String(), want)
	}
}

// TestDrainHeldNotice: a drainer that starts while records are held by
// another of its consumer (here one whose server stopped with 5 records
// delivered and not acknowledged) says how many and for how long, then
// drains them once the ack wait has passed.
func TestDrainHeldNotice(t *testing.T) {
	const n = 10
	dir := t.TempDir()
	file := recordsFile(t, dir, n)
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	if err := run(ctx, []string{"enqueue", "-data", data, "-file", file}, &out, &errb); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errb.String())
	}
	// A drainer that takes 5 records and dies with them.
	func() {
		q := queueFlags{source: sourceJetStream, data: data, stream: "RECORDS"}
		qu, err := q.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer qu.close()
		src, stop, err := qu.source(ctx, "RECORDS", "sluice-drain", 0, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		for range 5 {
			if _, err := src.(drain.BatchSource).NextUpTo(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
	}()
	var mu sync.Mutex
	seen := map[string]int{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen[r.Header.Get(drain.IdempotencyKeyHeader)]++
	}))
	defer hs.Close()
	errb.Reset()
	if err := run(ctx, []string{"drain", "-data", data, "-url", hs.URL, "-rate", "100/s", "-ack-wait", "1s"}, &out, &errb); err != nil {
		t.Fatalf("drain: %v\n%s", err, errb.String())
	}
	log := errb.String()
	if !strings.Contains(log, "records held by another drainer") || !strings.Contains(log, "held=5 ack_wait=1s") {
		t.Errorf("no notice of the 5 records held:\n%s", log)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Errorf("%d records sent, want %d", len(seen), n)
	}
}

// TestDrainPauseScopePartition: sluice enqueue -partitions spreads the
// records over partitions (the Sluice-Partition header), and sluice drain
// -pause-scope partition pauses only the throttled record's: a 429 with
// Retry-After: 1 for the first record of p0 holds p0 back for its second
// while p1 and p2 are all written meanwhile (but for what was already
// in flight); each record is written once; on JetStream, Redis Streams
// and Kafka.
func TestDrainPauseScopePartition(t *testing.T) {
	t.Run("jetstream", func(t *testing.T) {
		pauseScopePartition(t, []string{"-data", filepath.Join(t.TempDir(), "data")})
	})
	t.Run("redis", func(t *testing.T) {
		pauseScopePartition(t, []string{"-source", "redis", "-redis", redistest.Standalone(t).Addr()})
	})
	t.Run("kafka", func(t *testing.T) {
		pauseScopePartition(t, []string{"-source", "kafka", "-kafka-brokers", kafkaBrokers(t), "-ack-wait", "6s"})
	})
}

// pauseScopePartition is TestDrainPauseScopePartition on the queue that
// queue's flags name.
func pauseScopePartition(t *testing.T, queue []string) {
	const n = 30
	file := recordsFile(t, t.TempDir(), n)
	enqueueFlags := queue
	if queue[len(queue)-2] == "-ack-wait" { // a drain flag
		enqueueFlags = queue[:len(queue)-2]
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	if err := run(ctx, append([]string{"enqueue", "-file", file, "-partitions", "3"}, enqueueFlags...), &out, &errb); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errb.String())
	}
	var mu sync.Mutex
	written := map[string]time.Time{} // key → when
	parts := map[string]string{}      // key → partition
	var throttledAt time.Time
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key, part := r.Header.Get(drain.IdempotencyKeyHeader), r.Header.Get(drain.HeaderPartition)
		if part == "p0" && throttledAt.IsZero() {
			throttledAt = time.Now()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		if _, ok := written[key]; ok {
			t.Errorf("%s written twice", key)
		}
		written[key], parts[key] = time.Now(), part
	}))
	defer hs.Close()
	errb.Reset()
	if err := run(ctx, append([]string{"drain", "-url", hs.URL, "-rate", "300/s", "-pause-scope", "partition"}, queue...), &out, &errb); err != nil {
		t.Fatalf("drain: %v\n%s", err, errb.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(written) != n {
		t.Fatalf("%d records written, want %d", len(written), n)
	}
	// A record of p0 already sent when the 429 came back is not recalled:
	// on Kafka a partition's records come together (one Kafka partition
	// per key), so the limiter's burst can send two more of p0 with the
	// throttled one.
	const inFlight = 50 * time.Millisecond
	for i := 1; i <= n; i++ {
		key := fmt.Sprint("rec-", i)
		if want := fmt.Sprint("p", (i-1)%3); parts[key] != want {
			t.Errorf("%s in partition %q, want %q", key, parts[key], want)
		}
		at := written[key].Sub(throttledAt)
		switch {
		case parts[key] == "p0" && at > inFlight && at < time.Second:
			t.Errorf("%s (p0) written %v after p0's 429, within its pause", key, at)
		case parts[key] != "p0" && at > time.Second:
			t.Errorf("%s (%s) written %v after p0's 429: held back by another partition's pause", key, parts[key], at)
		}
	}
	if _, err := drain.ParsePauseScope("host"); err == nil {
		t.Error("ParsePauseScope(host) accepted")
	}
	errb.Reset()
	if err := run(ctx, append([]string{"drain", "-url", hs.URL, "-rate", "1/s", "-pause-scope", "host"}, queue...), &out, &errb); err == nil {
		t.Error("-pause-scope host: no error")
	}
}

// recordsFile writes n records, one a line, to a file in dir for sluice
// enqueue, and returns its path.
func recordsFile(t *testing.T, dir string, n int) string {
	t.Helper()
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, "{\"record\":%d}\n", i)
	}
	file := filepath.Join(dir, "records.jsonl")
	if err := os.WriteFile(file, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestDrainBinaryRedis drives the built binary on a Redis stream (a
// standalone server and a Cluster) with the features a user turns on
// together: more records than the window (so that reads of half the
// window follow one another), a rate, pauses per partition, a sink that
// answers a random fifth of its requests 429 (Retry-After: 1), and a
// 1 s ack wait, shorter than a pause plus the wait for the rate, so that
// records held in the drainer outlive it. Each record is written once
// (one 2xx per key, none after it) and every record is written.
func TestDrainBinaryRedis(t *testing.T) {
	bin := buildSluice(t)
	for name, addr := range map[string]func(t *testing.T) string{
		"standalone": func(t *testing.T) string { return redistest.Standalone(t).Addr() },
		"cluster":    func(t *testing.T) string { return strings.Join(redistest.Cluster(t).Addrs(), ",") },
	} {
		t.Run(name, func(t *testing.T) {
			const n = 1500
			queue := []string{"-source", "redis", "-redis", addr(t)}
			file := recordsFile(t, t.TempDir(), n)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if out, err := exec.CommandContext(ctx, bin, append([]string{"enqueue", "-file", file, "-partitions", "50"}, queue...)...).CombinedOutput(); err != nil {
				t.Fatalf("enqueue: %v\n%s", err, out)
			}
			var mu sync.Mutex
			written := map[string]int{}
			throttled := 0
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				key := r.Header.Get(drain.IdempotencyKeyHeader)
				if rand.IntN(5) == 0 {
					throttled++
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				written[key]++
			}))
			defer hs.Close()
			out, err := exec.CommandContext(ctx, bin, append([]string{"drain", "-url", hs.URL, "-rate", "1000/s", "-pause-scope", "partition", "-ack-wait", "1s"}, queue...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("drain: %v\n%s", err, out)
			}
			mu.Lock()
			defer mu.Unlock()
			twice := 0
			for k, c := range written {
				if c > 1 {
					twice++
					t.Errorf("%s written %d times", k, c)
				}
			}
			if len(written) != n {
				t.Errorf("%d records written, want %d", len(written), n)
			}
			t.Logf("%d written, %d twice, %d answered 429; the drainer's last lines:\n%s", len(written), twice, throttled, tail(string(out), 600))
			if throttled == 0 {
				t.Error("no request answered 429")
			}
		})
	}
}

// TestDrainRedisCredentials drives the built binary on a Redis whose
// default user is off (an ACL user and its password: -redis-username with
// -redis-password-file, or $SLUICE_REDIS_PASSWORD) and on one that speaks
// only TLS (-redis-tls-ca): enqueue and drain reach the stream, and
// drain's -lease-redis, on the same server, takes the same credentials.
// With a wrong password, or with TLS verified against the system's roots,
// enqueue fails with Redis's refusal (or the certificate's), and so does
// drain, at once, when it is the lease's Redis that refuses.
func TestDrainRedisCredentials(t *testing.T) {
	bin := buildSluice(t)
	acl := redistest.StandaloneWith(t, aclArgs...)
	secure := redistest.StandaloneTLS(t)
	pw, wrong := filepath.Join(t.TempDir(), "pw"), filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wrong, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	user := []string{"-redis-username", "sluice"}
	wrongPass := append(user[:len(user):len(user)], "-redis-password-file", wrong)
	for _, c := range []struct {
		name           string
		addr           string
		creds, without []string
		env            string // $SLUICE_REDIS_PASSWORD with creds
		lease          bool
		refused        string // in enqueue's output, without
	}{
		{"password file", acl.Addr(), append(user[:len(user):len(user)], "-redis-password-file", pw), wrongPass, "", true, "WRONGPASS"},
		{"password env", acl.Addr(), user, wrongPass, "s3cret", false, "WRONGPASS"},
		{"tls", secure.Addr(), []string{"-redis-tls-ca", secure.CAFile()}, []string{"-redis-tls"}, "", true, "certificate signed by unknown authority"},
	} {
		t.Run(c.name, func(t *testing.T) {
			const n = 40
			stream := strings.ReplaceAll(strings.ToUpper(c.name), " ", "-")
			queue := []string{"-source", "redis", "-redis", c.addr, "-stream", stream}
			file := recordsFile(t, t.TempDir(), n)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sluice := func(env string, args ...string) ([]byte, error) {
				cmd := exec.CommandContext(ctx, bin, args...)
				cmd.Env = append(os.Environ(), redisPasswordEnv+"="+env)
				return cmd.CombinedOutput()
			}
			out, err := sluice("", append(append([]string{"enqueue", "-file", file}, queue...), c.without...)...)
			if err == nil || !strings.Contains(string(out), c.refused) {
				t.Errorf("enqueue %v: %v, want %q in:\n%s", c.without, err, c.refused, out)
			}
			if out, err := sluice(c.env, append(append([]string{"enqueue", "-file", file}, queue...), c.creds...)...); err != nil {
				t.Fatalf("enqueue: %v\n%s", err, out)
			}
			if c.lease {
				// The stream on a Redis that takes anyone; the lease's
				// refuses.
				open := []string{"-source", "redis", "-redis", redistest.Standalone(t).Addr(), "-stream", stream}
				out, err := sluice("", append(append([]string{"drain", "-url", "http://127.0.0.1:1", "-lease-redis", c.addr, "-capacity", "10/s"}, open...), c.without...)...)
				if err == nil || !strings.Contains(string(out), "-lease-redis "+c.addr) || !strings.Contains(string(out), c.refused) {
					t.Errorf("drain -lease-redis %v: %v, want the lease's Redis and %q in:\n%s", c.without, err, c.refused, out)
				}
			}
			var mu sync.Mutex
			written := map[string]int{}
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				written[r.Header.Get(drain.IdempotencyKeyHeader)]++
			}))
			defer hs.Close()
			pace := []string{"-rate", "1000/s"}
			if c.lease {
				pace = []string{"-lease-redis", c.addr, "-capacity", "1000/s", "-lease-service", stream}
			}
			out, err = sluice(c.env, append(append(append([]string{"drain", "-url", hs.URL}, pace...), queue...), c.creds...)...)
			if err != nil {
				t.Fatalf("drain: %v\n%s", err, out)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(written) != n {
				t.Errorf("%d records written, want %d:\n%s", len(written), n, tail(string(out), 600))
			}
			for k, w := range written {
				if w != 1 {
					t.Errorf("%s written %d times", k, w)
				}
			}
		})
	}
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	return s[max(0, len(s)-n):]
}
