package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/httplimit/rudb"
	"github.com/sluicehq/sluice/internal/chart"
	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/internal/natsembed"
	"github.com/sluicehq/sluice/internal/redisproc"
)

const ingestUsage = `Usage: sluice demo ingest [flags]

Demo ingest runs the ingestion example of the rate-limiting pattern end to
end, in real processes on loopback. An API process accepts records over
HTTP and puts each, durably before it answers, in queue A or queue B by
its type: streams of an embedded NATS JetStream server (-source
jetstream, the default), Redis streams on the demo's redis-server
(-source redis) or Kafka topics (-source kafka, on the brokers of
-kafka-brokers: no Kafka broker is embedded). Job processors A and B,
separate processes that never talk to each other, each drain their queue
(sluice drain with a step that validates and enriches each record) into a
throttled database that grants -capacity writes per fixed one-second
window, and share that capacity as -partitions leases on a redis-server
the demo starts (redis-server must be on PATH). The database is
idempotent: a record's key is written once, a resend is answered as
already done.

The demo submits -a records of type A and -b of type B at once, then
prints each type's writes per second, when each finished, and the
requests sent and throttled. With -kill, processor A is killed with
SIGKILL when half of its records are written, and started again: every
record is still written exactly once, and the records the dead process
had written without acknowledging are counted as redelivered. -plot FILE
draws the rates as a PNG chart.
`

// The queues: a stream per record type.
var ingestStreams = map[string]string{"A": "INGEST_A", "B": "INGEST_B"}

// ingestLimits bound what the demo's API accepts.
const (
	maxRecordBytes = 64 << 10
	maxRecordID    = 128
)

// An ingestRecord is what the API accepts: a JSON object with an id and a
// type, A or B; other members are the record's payload and travel with
// it.
type ingestRecord struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

// parseRecord validates a record's body.
func parseRecord(body []byte) (ingestRecord, error) {
	var rec ingestRecord
	if len(body) > maxRecordBytes {
		return rec, fmt.Errorf("record of %d bytes, at most %d", len(body), maxRecordBytes)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return rec, fmt.Errorf("record is not a JSON object: %v", err)
	}
	for name, dst := range map[string]*string{"id": &rec.ID, "type": &rec.Type} {
		raw, ok := obj[name]
		if !ok {
			return rec, fmt.Errorf("record has no %q", name)
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return rec, fmt.Errorf("record's %q is not a string", name)
		}
	}
	if _, ok := ingestStreams[rec.Type]; !ok {
		return rec, fmt.Errorf("record's type %q is neither A nor B", rec.Type)
	}
	if rec.ID == "" || len(rec.ID) > maxRecordID {
		return rec, fmt.Errorf("record's id must have 1 to %d characters", maxRecordID)
	}
	for _, c := range []byte(rec.ID) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return rec, fmt.Errorf("record's id %q may hold only letters, digits, '-', '_' and '.'", rec.ID)
		}
	}
	return rec, nil
}

// enrichRecord validates body and returns it with the processor's marks:
// who processed it, and the length of its payload.
func enrichRecord(body []byte, processor string) ([]byte, error) {
	if _, err := parseRecord(body); err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, err
	}
	obj["processed_by"], _ = json.Marshal(processor)
	obj["payload_bytes"], _ = json.Marshal(len(obj["payload"]))
	return json.Marshal(obj)
}

// runIngestAPI runs the demo's API process (sluice demo ingest-api): it
// prints its address on stdout and serves POST /records until ctx ends.
func runIngestAPI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo ingest-api", "Usage: sluice demo ingest-api -source S (-nats-url URL | -redis ADDR | -kafka-brokers ADDRS) [-addr HOST:PORT]\n\nThe API process of sluice demo ingest.\n", stderr)
	var q queueFlags
	q.register(fs)
	addr := fs.String("addr", "127.0.0.1:0", "the address to listen on")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if q.source == sourceJetStream && q.natsURL == "" {
		return usagef("demo ingest-api: -nats-url is required")
	}
	qu, err := q.open(ctx)
	if err != nil {
		return usagef("demo ingest-api: %v", err)
	}
	defer qu.close()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /records", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRecordBytes))
		if err != nil {
			http.Error(w, "record too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		rec, err := parseRecord(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// Queued durably before the answer: the queue has stored it.
		dups, err := qu.publish(r.Context(), ingestStreams[rec.Type], []queueRecord{{key: rec.ID, data: body}})
		if err != nil {
			http.Error(w, "queue unavailable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"queue":%q,"duplicate":%t}`+"\n", rec.Type, dups[0])
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10,
	}
	cl, err := connlimit.New(ln, 256)
	if err != nil {
		ln.Close()
		return err
	}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(cl) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// runIngestProcessor runs one of the demo's job processors (sluice demo
// ingest-processor -type A ...): sluice drain on its type's queue, with a
// step that validates and enriches each record, until the queue is empty.
func runIngestProcessor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) < 2 || args[0] != "-type" {
		return usagef("demo ingest-processor: want -type A|B, then sluice drain's flags")
	}
	typ := args[1]
	stream, ok := ingestStreams[typ]
	if !ok {
		return usagef("demo ingest-processor: -type %q is neither A nor B", typ)
	}
	name := "processor-" + typ
	enrich := func(next drain.Sink) drain.Sink {
		return func(ctx context.Context, m drain.Message) error {
			data, err := enrichRecord(m.Data(), name)
			if err != nil {
				return err
			}
			return next(ctx, enriched{m, data})
		}
	}
	return runDrainWith(ctx, append([]string{"-stream", stream, "-consumer", name}, args[2:]...), stderr, enrich)
}

// enriched is a message with a processor's body.
type enriched struct {
	drain.Message
	data []byte
}

func (m enriched) Data() []byte { return m.data }

// An ingestEvent is one write as the database answered it.
type ingestEvent struct {
	at     time.Duration // since the records were submitted
	typ    byte          // 'A' or 'B'
	status int
}

// ingestDB is the throttled database with a record of every write.
type ingestDB struct {
	db    *rudb.DB
	mu    sync.Mutex // guards start, ev and first
	start time.Time
	ev    []ingestEvent
	first map[byte]int // records of each type written (first writes)
	moved chan struct{}
}

func (d *ingestDB) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	d.db.ServeHTTP(sw, r)
	key := r.Header.Get(drain.IdempotencyKeyHeader)
	if key == "" {
		return
	}
	d.mu.Lock()
	e := ingestEvent{at: time.Since(d.start), typ: key[0], status: sw.status}
	d.ev = append(d.ev, e)
	if e.status == http.StatusCreated {
		d.first[e.typ]++
	}
	d.mu.Unlock()
	select {
	case d.moved <- struct{}{}:
	default:
	}
}

func (d *ingestDB) written(typ byte) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.first[typ]
}

// A lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// ingestReport is what the demo found.
type ingestReport struct {
	A, B        int      // records of each type
	FinishA     float64  `json:"finish_a_seconds"`
	FinishB     float64  `json:"finish_b_seconds"`
	Requests    int64    `json:"requests"`
	Throttled   int64    `json:"throttled"`
	Written     int64    `json:"written"`
	Redelivered int64    `json:"redelivered"`
	Missing     int      `json:"missing"`
	Killed      bool     `json:"killed"`
	PerSecond   [][3]int `json:"per_second"` // A written, B written, 429s
}

// runIngest runs `sluice demo ingest`.
func runIngest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo ingest", ingestUsage, stderr)
	a := fs.Int("a", 10000, "records of type A")
	b := fs.Int("b", 5000, "records of type B")
	capacity := fs.Int("capacity", 500, "writes the database grants per second")
	partitions := fs.Int("partitions", 20, "the partitions the capacity is leased in")
	kill := fs.Bool("kill", false, "kill processor A with SIGKILL half-way, and start it again")
	plot := fs.String("plot", "", "draw the rates over time as a PNG chart to this file")
	asJSON := fs.Bool("json", false, "print the figures as one JSON object")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up when the records are not all written by then")
	verbose := fs.Bool("v", false, "pass the processes' logs on to standard error")
	self := fs.String("self", "", "the sluice binary the processes run; empty: this one")
	source := fs.String("source", sourceJetStream, "the queues: jetstream (an embedded NATS server), redis (streams on the demo's redis-server) or kafka (topics on -kafka-brokers)")
	kafka := fs.String("kafka-brokers", "", "with -source kafka: the seed brokers (host:port, comma-separated)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *a < 1 || *b < 1 || *a > 1e7 || *b > 1e7:
		return usagef("demo ingest: -a and -b must be from 1 to 10,000,000")
	case *capacity < 1 || *partitions < 1 || *partitions > *capacity:
		return usagef("demo ingest: want 1 <= -partitions <= -capacity")
	case *timeout <= 0:
		return usagef("demo ingest: -timeout must be positive")
	case *source != sourceJetStream && *source != sourceRedis && *source != sourceKafka:
		return usagef("demo ingest: -source %q: want jetstream, redis or kafka", *source)
	case *source == sourceKafka && *kafka == "":
		return usagef("demo ingest: -source kafka needs -kafka-brokers")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	// The demo and its processes write to stderr together.
	stderr = &lockedWriter{w: stderr}
	if *self == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		*self = exe
	}
	redisAddr, stopRedis, err := redisproc.Launch()
	if err != nil {
		return fmt.Errorf("demo ingest: starting redis-server (it must be on PATH): %w", err)
	}
	defer stopRedis()
	dir, err := os.MkdirTemp("", "sluice-ingest")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	q := queueFlags{source: *source, redis: redisAddr, kafka: *kafka}
	if *source == sourceJetStream {
		ns, err := natsembed.Start(filepath.Join(dir, "nats"), "127.0.0.1", -1)
		if err != nil {
			return err
		}
		defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
		q.natsURL = ns.ClientURL()
	}

	db := &ingestDB{
		db:    &rudb.DB{Budget: int64(*capacity), WriteCost: 1, ReadCost: 1, Idempotent: true},
		first: map[byte]int{}, moved: make(chan struct{}, 1),
	}
	dbAddr, stopDB, err := serveLoopback(db, 512)
	if err != nil {
		return err
	}
	defer stopDB() //nolint:errcheck // the demo's figures are in; a slow shutdown changes none
	dbURL := "http://" + dbAddr + "/records"

	logs := io.Discard
	if *verbose {
		logs = stderr
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			stopProcess(p)
		}
	}()
	start := func(stdout io.Writer, role string, args ...string) (*exec.Cmd, error) {
		cmd := exec.Command(*self, append([]string{"demo", role}, args...)...)
		cmd.Stdout, cmd.Stderr = stdout, logs
		dieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting %s: %w", role, err)
		}
		procs = append(procs, cmd)
		return cmd, nil
	}
	// The API prints its address first.
	pr, pw := io.Pipe()
	api, err := start(pw, "ingest-api", q.args()...)
	if err != nil {
		return err
	}
	apiAddr, err := readAddr(ctx, pr, api)
	pw.Close()
	if err != nil {
		return err
	}
	// A dead processor's records come back after the ack wait (on Kafka,
	// the group's session timeout, which brokers bound below at 6 s).
	ackWait := "2s"
	if *source == sourceKafka {
		ackWait = "6s"
	}
	processor := func(typ string) (*exec.Cmd, error) {
		return start(logs, "ingest-processor", append([]string{"-type", typ}, append(q.args(), "-url", dbURL,
			"-lease-redis", redisAddr, "-capacity", strconv.Itoa(*capacity)+"/s", "-partitions", strconv.Itoa(*partitions),
			"-lease-service", "ingest-db", "-ack-wait", ackWait)...)...)
	}

	// Submit every record at once (A and B interleaved, as they arrive);
	// the processors start once their queues hold work, and each stops
	// when its queue is empty, giving its capacity back.
	fmt.Fprintf(stderr, "demo ingest: submitting %d records of type A and %d of type B; the database grants %d writes/s\n", *a, *b, *capacity)
	db.mu.Lock()
	db.start = time.Now()
	db.mu.Unlock()
	queued := make(chan struct{})
	submitted := make(chan error, 1)
	go func() { submitted <- submitRecords(ctx, "http://"+apiAddr+"/records", *a, *b, queued) }()
	select {
	case <-queued:
	case err := <-submitted:
		if err == nil {
			err = errors.New("no record was queued")
		}
		return fmt.Errorf("demo ingest: submitting: %w", err)
	}
	procA, err := processor("A")
	if err != nil {
		return err
	}
	if _, err := processor("B"); err != nil {
		return err
	}
	if err := <-submitted; err != nil {
		return fmt.Errorf("demo ingest: submitting: %w", err)
	}
	killed := false
	for db.written('A') < *a || db.written('B') < *b {
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo ingest: %w with %d of %d A and %d of %d B written", ctx.Err(), db.written('A'), *a, db.written('B'), *b)
		case <-db.moved:
		}
		if *kill && !killed && db.written('A') >= *a/2 {
			killed = true
			if err := procA.Process.Kill(); err != nil {
				return err
			}
			_ = procA.Wait()
			fmt.Fprintf(stderr, "demo ingest: processor A killed with SIGKILL at %d of %d written; starting it again\n", db.written('A'), *a)
			if procA, err = processor("A"); err != nil {
				return err
			}
		}
	}
	rep := db.report(*a, *b)
	rep.Killed = killed
	if *plot != "" {
		if err := writeIngestPlot(*plot, rep, *capacity); err != nil {
			return err
		}
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(rep); err != nil {
			return err
		}
	} else {
		printIngest(stdout, rep)
	}
	if rep.Missing != 0 || rep.Written != int64(*a+*b) {
		return fmt.Errorf("demo ingest: %d records missing, %d written for %d", rep.Missing, rep.Written, *a+*b)
	}
	return nil
}

// readAddr reads the "listening on ADDR" line a child prints first.
func readAddr(ctx context.Context, r io.Reader, cmd *exec.Cmd) (string, error) {
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		if sc.Scan() {
			got <- strings.TrimPrefix(sc.Text(), "listening on ")
		}
		close(got)
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case a, ok := <-got:
		if !ok || a == "" {
			return "", errors.New("demo ingest: the API process printed no address")
		}
		return a, nil
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("demo ingest: no address from the API process (pid %d) in 30 s", cmd.Process.Pid)
	}
}

// submitRecords POSTs a records of type A and b of type B to url, 32 at a
// time, each until it is accepted. It closes queued once a record of each
// type has been.
func submitRecords(ctx context.Context, url string, a, b int, queued chan<- struct{}) error {
	type record struct {
		typ  string
		body []byte
	}
	jobs := make(chan record)
	errc := make(chan error, 1)
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for rec := range jobs {
				if err := postRecord(ctx, url, rec.body); err != nil {
					select {
					case errc <- err:
					default:
					}
					continue
				}
				mu.Lock()
				if !seen[rec.typ] {
					if seen[rec.typ] = true; len(seen) == 2 {
						close(queued)
					}
				}
				mu.Unlock()
			}
		})
	}
	ia, ib := 0, 0
	for ia < a || ib < b {
		typ, n := "A", &ia
		// A and B in proportion, as they would arrive.
		if ia >= a || (ib < b && ib*a < ia*b) {
			typ, n = "B", &ib
		}
		*n++
		body := fmt.Appendf(nil, `{"id":"%s-%d","type":%q,"payload":"record %d of type %s"}`, typ, *n, typ, *n, typ)
		select {
		case jobs <- record{typ, body}:
		case err := <-errc:
			close(jobs)
			wg.Wait()
			return err
		case <-ctx.Done():
			close(jobs)
			wg.Wait()
			return ctx.Err()
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func postRecord(ctx context.Context, url string, body []byte) error {
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode == http.StatusAccepted {
				return nil
			}
			err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
			if resp.StatusCode != http.StatusServiceUnavailable {
				return err
			}
		}
		if attempt == 4 || ctx.Err() != nil {
			return err
		}
		select {
		case <-time.After(100 * time.Millisecond << attempt):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// report sums the database's record.
func (d *ingestDB) report(a, b int) ingestReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.db.Stats()
	rep := ingestReport{A: a, B: b, Requests: st.Requests, Throttled: st.Throttled, Written: st.Written, Redelivered: st.Replayed}
	rep.Missing = a + b - d.first['A'] - d.first['B']
	for _, e := range d.ev {
		s := int(e.at / time.Second)
		for len(rep.PerSecond) <= s {
			rep.PerSecond = append(rep.PerSecond, [3]int{})
		}
		switch {
		case e.status == http.StatusTooManyRequests:
			rep.PerSecond[s][2]++
		case e.status == http.StatusCreated && e.typ == 'A':
			rep.PerSecond[s][0]++
			rep.FinishA = max(rep.FinishA, e.at.Seconds())
		case e.status == http.StatusCreated && e.typ == 'B':
			rep.PerSecond[s][1]++
			rep.FinishB = max(rep.FinishB, e.at.Seconds())
		}
	}
	return rep
}

func printIngest(w io.Writer, rep ingestReport) {
	fmt.Fprintf(w, "%4s %6s %6s %6s\n", "t(s)", "A/s", "B/s", "429s")
	for s, x := range rep.PerSecond {
		fmt.Fprintf(w, "%4d %6d %6d %6d\n", s, x[0], x[1], x[2])
	}
	fmt.Fprintf(w, "A: %d records, finished at %.1f s\n", rep.A, rep.FinishA)
	fmt.Fprintf(w, "B: %d records, finished at %.1f s\n", rep.B, rep.FinishB)
	fmt.Fprintf(w, "requests %d, throttled %d (%.2f%%), written %d, redelivered and answered as already written %d, missing %d\n",
		rep.Requests, rep.Throttled, 100*float64(rep.Throttled)/float64(max(1, rep.Requests)), rep.Written, rep.Redelivered, rep.Missing)
	if rep.Missing == 0 && rep.Written == int64(rep.A+rep.B) {
		fmt.Fprintln(w, "every record written exactly once")
	}
}

// writeIngestPlot draws the writes per second of each type, and the
// 429s, to path.
func writeIngestPlot(path string, rep ingestReport, capacity int) error {
	series := []chart.Series{{Name: "A written/s"}, {Name: "B written/s"}, {Name: "429s/s"}}
	for _, x := range rep.PerSecond {
		for i := range series {
			series[i].Y = append(series[i].Y, float64(x[i]))
		}
	}
	title := fmt.Sprintf("sluice demo ingest: %d A and %d B records, %d writes/s leased in shares", rep.A, rep.B, capacity)
	if rep.Killed {
		title += ", processor A killed half-way"
	}
	return writeChart(path, chart.Chart{Title: title, XLabel: "seconds since the records were submitted", YLabel: "per second", Series: series})
}

// writeChart draws c as a PNG image to the file path.
func writeChart(path string, c chart.Chart) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.WritePNG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stopProcess ends a child: SIGTERM, then SIGKILL after 10 s.
func stopProcess(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}
