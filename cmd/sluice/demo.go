package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/httplimit/rudb"
	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/ratelimit"
)

const demoUsage = `Usage: sluice demo throttled-db [flags]

Demo throttled-db writes records to a simulated throttled database on a
loopback server: it grants -budget request units (RU) per fixed one-second
window, like Azure Cosmos DB; a write costs -cost RU; over budget it answers
429 with x-ms-retry-after-ms. The job runs twice, in real time:

  naive   sends every write at once and resends each refused one after the
          delay its 429 asks for;
  sluice  writes through httplimit.Client paced at -budget RU/s (split over
          -processes independent clients at 1/N of the rate each), with the
          shared pause, the retry budget and AIMD.

It prints what each sent, how many 429s it got and how long it took, with
the time the budget predicts (records × cost / budget). -json prints the
same as one JSON object.
`

// demos are the scenarios of sluice demo, as its -h lists them.
var demos = []struct{ name, summary string }{
	{"throttled-db", "a job writing to a simulated throttled database, naive and through httplimit.Client"},
	{"ingest", "the ingestion example in real processes: an API, two drain processors sharing leased capacity, an idempotent throttled database"},
	{"charges", "writes whose cost the database draws and says only in its answer: an estimate reserved, the charge settled"},
}

// printDemos writes demo's own usage: every scenario, one a line.
func printDemos(w io.Writer) {
	fmt.Fprint(w, "Usage: sluice demo SCENARIO [flags]\n\nScenarios:\n\n")
	for _, d := range demos {
		fmt.Fprintf(w, "\t%-13s %s\n", d.name, d.summary)
	}
	fmt.Fprint(w, "\nRun 'sluice demo SCENARIO -h' for a scenario's flags.\n")
}

// demoRun is one side of the demo, as -json prints it.
type demoRun struct {
	Sent      int64    `json:"sent"`
	Throttled int64    `json:"throttled"`
	Seconds   float64  `json:"seconds"`
	Predicted *float64 `json:"predicted_seconds,omitempty"`
}

type demoReport struct {
	Naive  demoRun `json:"naive"`
	Sluice demoRun `json:"sluice"`
}

// runDemo runs `sluice demo throttled-db`.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", demoUsage, stderr)
	var (
		asJSON       bool
		records      int
		naiveRecords int
		budget, cost int
		processes    int
		workers      int
	)
	fs.BoolVar(&asJSON, "json", false, "print the figures as one JSON object")
	fs.IntVar(&records, "records", 10000, "records the job writes")
	fs.IntVar(&naiveRecords, "naive-records", 0, "records of the naive run (0: the same as -records; negative: skip the naive run, whose figures are then 0)")
	fs.IntVar(&budget, "budget", 20000, "request units the database grants per second")
	fs.IntVar(&cost, "cost", 10, "request units of one write")
	fs.IntVar(&processes, "processes", 1, "independent Sluice clients sharing the job, each at 1/N of the rate")
	fs.IntVar(&workers, "workers", 32, "goroutines per Sluice client")
	if len(args) == 0 {
		printDemos(stderr)
		return usagef("demo: want a scenario: sluice demo throttled-db|ingest|charges [flags]")
	}
	scenario, rest := args[0], args[1:]
	switch scenario {
	case "-h", "-help", "--help":
		printDemos(stderr)
		return flag.ErrHelp
	case "throttled-db":
	case "ingest":
		return runIngest(ctx, rest, stdout, stderr)
	case "ingest-api": // a process of the ingest demo
		return runIngestAPI(ctx, rest, stdout, stderr)
	case "ingest-processor": // a process of the ingest demo
		return runIngestProcessor(ctx, rest, stdout, stderr)
	case "charges":
		return runCharges(ctx, rest, stdout, stderr)
	case "charges-writer": // the writer process of the charges demo
		return runChargesWriter(ctx, rest, stdout, stderr)
	default:
		return usagef("demo: unknown scenario %q (want throttled-db, ingest or charges)", scenario)
	}
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if naiveRecords == 0 {
		naiveRecords = records
	}
	naiveRecords = max(0, naiveRecords)
	switch {
	case records < 1:
		return usagef("demo: -records must be at least 1")
	case budget < cost || cost < 1:
		return usagef("demo: want 1 <= -cost <= -budget")
	case processes < 1 || workers < 1:
		return usagef("demo: -processes and -workers must be at least 1")
	}

	var rep demoReport
	predicted := float64(records) * float64(cost) / float64(budget)
	rep.Sluice.Predicted = &predicted
	if naiveRecords > 0 {
		r, err := demoNaive(ctx, naiveRecords, budget, cost)
		if err != nil {
			return fmt.Errorf("demo: naive run: %w", err)
		}
		rep.Naive = demoRun{Sent: r.Sent, Throttled: r.Throttled, Seconds: r.Seconds}
	}
	r, err := demoSluice(ctx, records, budget, cost, processes, workers)
	if err != nil {
		return fmt.Errorf("demo: sluice run: %w", err)
	}
	rep.Sluice.Sent, rep.Sluice.Throttled, rep.Sluice.Seconds = r.Sent, r.Throttled, r.Seconds

	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(&rep)
	}
	fmt.Fprintf(stdout, "throttled-db: %d records × %d RU against %d RU per 1 s window, over loopback\n\n", records, cost, budget)
	tw := tabwriter.NewWriter(stdout, 0, 0, 3, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\tsent\tthrottled\tseconds\tpredicted\t\n")
	if naiveRecords > 0 {
		label := "naive"
		if naiveRecords != records {
			label = fmt.Sprintf("naive (%d records)", naiveRecords)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t\t\n", label, rep.Naive.Sent, rep.Naive.Throttled, rep.Naive.Seconds)
	}
	label := "sluice"
	if processes > 1 {
		label = fmt.Sprintf("sluice (%d clients)", processes)
	}
	fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.2f\t\n", label, rep.Sluice.Sent, rep.Sluice.Throttled, rep.Sluice.Seconds, predicted)
	return tw.Flush()
}

// demoConns bounds the connections of a demo's simulated database: its
// listener keeps at most this many open, and a job's transport opens at
// most half as many.
const demoConns = 256

// serveLoopback serves h on a free loopback port, as a real server: a
// listener that keeps at most maxConns connections open, and timeouts on
// every phase of a request. It returns the server's address and stop,
// which shuts the server down, letting requests in flight finish for up
// to five seconds before it closes their connections, and returns once
// the server has stopped.
func serveLoopback(h http.Handler, maxConns int) (addr string, stop func() error, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	capped, err := connlimit.New(ln, maxConns)
	if err != nil {
		ln.Close()
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(capped) }()
	return ln.Addr().String(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(ctx)
		if err != nil {
			err = errors.Join(err, srv.Close())
		}
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}, nil
}

// demoServer starts the simulated database on loopback and returns its URL,
// a transport with enough connections for the job, and a stop function.
func demoServer(budget, cost int) (string, *http.Transport, func() error, error) {
	addr, stopSrv, err := serveLoopback(&rudb.DB{Budget: int64(budget), WriteCost: int64(cost)}, demoConns)
	if err != nil {
		return "", nil, nil, err
	}
	tr := demoTransport()
	return "http://" + addr + "/items", tr, func() error {
		tr.CloseIdleConnections()
		return stopSrv()
	}, nil
}

// demoTransport is a job's transport to a demo's database: loopback,
// never through a proxy, with half the database's connections.
func demoTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxConnsPerHost = demoConns / 2
	tr.MaxIdleConnsPerHost = demoConns / 2
	return tr
}

func demoNaive(ctx context.Context, records, budget, cost int) (r rudb.Result, err error) {
	url, tr, stop, err := demoServer(budget, cost)
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	return rudb.Naive(ctx, &http.Client{Transport: tr}, url, records)
}

func demoSluice(ctx context.Context, records, budget, cost, processes, workers int) (_ rudb.Result, err error) {
	url, tr, stop, err := demoServer(budget, cost)
	if err != nil {
		return rudb.Result{}, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	results := make(chan rudb.Result, processes)
	errs := make(chan error, processes)
	start := time.Now()
	for p := range processes {
		n := records / processes
		if p == 0 {
			n += records % processes
		}
		go func() {
			// A burst of five writes lets a client catch up after a
			// scheduling hiccup; at worst a few writes too many land in one
			// window and are retried after the pause.
			c := &httplimit.Client{
				HTTP:    &http.Client{Transport: tr},
				Limiter: ratelimit.NewLimiter(ratelimit.Limit(float64(budget)/float64(processes)), 5*cost),
			}
			r, err := rudb.Paced(ctx, c, url, n, workers, int64(cost))
			results <- r
			errs <- err
		}()
	}
	var total rudb.Result
	for range processes {
		r := <-results
		total.Sent += r.Sent
		total.Throttled += r.Throttled
		err = errors.Join(err, <-errs)
	}
	total.Elapsed = time.Since(start)
	total.Seconds = total.Elapsed.Seconds()
	return total, err
}
