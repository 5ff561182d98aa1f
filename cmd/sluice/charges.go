package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/httplimit/rudb"
	"github.com/sluicehq/sluice/internal/chart"
	"github.com/sluicehq/sluice/ratelimit"
)

const chargesUsage = `Usage: sluice demo charges [flags]

Demo charges writes -records records, in a process of their own, to a
simulated database on loopback that grants -capacity request units (RU)
per fixed one-second window, as Azure Cosmos DB grants its provisioned
throughput, and charges each write a cost it draws at random from
-min-charge to -max-charge RU, said only in the answer's
x-ms-request-charge: the writer cannot know it in advance.

The job runs three times (the two baselines unless -baselines=false),
each against a fresh database:

  budgets  an httplimit.Client whose Budgets reserve -estimate RU for each
           write before it is sent, paced to the capacity
           (Budgets.SetCapacity), and settle it with the charge the
           answer announces: a write that cost more than its estimate
           leaves a debt the next writes wait out, one that cost less
           gives the difference back;
  estimate the same Client paced by a ratelimit.Limiter at the
           capacity (ratelimit.WindowPacing's bucket) that takes -estimate
           RU for each write and never learns what it cost;
  retry    the same Client without pacing: every worker sends at once,
           and a 429 pauses them all for the x-ms-retry-after-ms it asks.

It prints what each sent, how many 429s it got, the RU charged and how long
the writes took at the database (from its first request to its last write),
beside the ideal time: the RU charged over the capacity. -plot FILE draws
the RU charged per tenth of a second as a PNG chart; -json prints the
figures as one JSON object.
`

// chargesRun is one job of the charges demo, as the database saw it.
type chargesRun struct {
	Requests  int64   `json:"requests"`
	Throttled int64   `json:"throttled"`
	Written   int64   `json:"written"`
	RU        int64   `json:"ru"`
	Seconds   float64 `json:"seconds"`       // first request to last write
	Ideal     float64 `json:"ideal_seconds"` // RU / capacity
	// PerTenth is the RU charged and the 429s answered in each tenth of a
	// second from the first request.
	PerTenth [][2]int64 `json:"per_tenth"`
}

type chargesReport struct {
	Records   int        `json:"records"`
	Capacity  int        `json:"capacity"`
	MinCharge int        `json:"min_charge"`
	MaxCharge int        `json:"max_charge"`
	Budgets   chargesRun `json:"budgets"`
	Estimate  chargesRun `json:"estimate"`
	Retry     chargesRun `json:"retry"`
}

// runCharges runs `sluice demo charges`.
func runCharges(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo charges", chargesUsage, stderr)
	records := fs.Int("records", 10000, "records the job writes")
	capacity := fs.Int("capacity", 20000, "request units the database grants per one-second window")
	minCharge := fs.Int("min-charge", 5, "the least RU a write costs")
	maxCharge := fs.Int("max-charge", 15, "the most RU a write costs")
	estimate := fs.Int("estimate", 10, "the RU the writer reserves for a write before sending it")
	workers := fs.Int("workers", 32, "goroutines of the writer")
	baselines := fs.Bool("baselines", true, "run the estimate and retry-on-429 jobs too")
	plot := fs.String("plot", "", "draw the RU charged over time as a PNG chart to this file")
	asJSON := fs.Bool("json", false, "print the figures as one JSON object")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up when a job is not done by then")
	self := fs.String("self", "", "the sluice binary the writer runs; empty: this one")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *records < 1 || *records > 1e7:
		return usagef("demo charges: -records must be from 1 to 10,000,000")
	case *minCharge < 1 || *maxCharge < *minCharge || *capacity < *maxCharge:
		return usagef("demo charges: want 1 <= -min-charge <= -max-charge <= -capacity")
	case *estimate < 1 || *workers < 1 || *workers > 1024:
		return usagef("demo charges: want -estimate >= 1 and -workers from 1 to 1024")
	case *timeout <= 0:
		return usagef("demo charges: -timeout must be positive")
	}
	if *self == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		*self = exe
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep := chargesReport{Records: *records, Capacity: *capacity, MinCharge: *minCharge, MaxCharge: *maxCharge}
	job := func(mode string, seed uint64) (chargesRun, error) {
		db := &chargesDB{db: &rudb.DB{Budget: int64(*capacity), WriteCost: int64(*minCharge),
			WriteCostMax: int64(*maxCharge), Seed: seed}}
		addr, stop, err := serveLoopback(db, demoConns)
		if err != nil {
			return chargesRun{}, err
		}
		defer stop() //nolint:errcheck // the figures are in; a slow shutdown changes none
		cmd := exec.CommandContext(ctx, *self, "demo", "charges-writer", "-mode", mode,
			"-url", "http://"+addr+"/items", "-records", strconv.Itoa(*records),
			"-capacity", strconv.Itoa(*capacity), "-estimate", strconv.Itoa(*estimate),
			"-workers", strconv.Itoa(*workers))
		cmd.Stdout, cmd.Stderr = io.Discard, stderr // the database has the figures
		dieWithParent(cmd)
		if err := cmd.Run(); err != nil {
			return chargesRun{}, fmt.Errorf("demo charges: the %s writer: %w", mode, err)
		}
		r := db.run(*capacity)
		if r.Written != int64(*records) {
			return r, fmt.Errorf("demo charges: the %s writer wrote %d records of %d", mode, r.Written, *records)
		}
		return r, nil
	}
	var err error
	if rep.Budgets, err = job("budgets", 1); err != nil {
		return err
	}
	if *baselines {
		if rep.Estimate, err = job("estimate", 2); err != nil {
			return err
		}
		if rep.Retry, err = job("retry", 3); err != nil {
			return err
		}
	}
	if *plot != "" {
		if err := writeChargesPlot(*plot, rep, *baselines); err != nil {
			return err
		}
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	fmt.Fprintf(stdout, "charges: %d records of %d to %d RU each (drawn by the database) into %d RU per 1 s window, over loopback\n\n",
		*records, *minCharge, *maxCharge, *capacity)
	tw := tabwriter.NewWriter(stdout, 0, 0, 3, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\trequests\t429s\tRU\tseconds\tideal\tratio\t\n")
	row := func(name string, r chargesRun) {
		fmt.Fprintf(tw, "%s\t%d\t%d (%.2f%%)\t%d\t%.2f\t%.2f\t%.3f\t\n", name, r.Requests, r.Throttled,
			100*float64(r.Throttled)/float64(max(1, r.Requests)), r.RU, r.Seconds, r.Ideal, r.Seconds/r.Ideal)
	}
	row("budgets", rep.Budgets)
	if *baselines {
		row("estimate only", rep.Estimate)
		row("retry on 429", rep.Retry)
	}
	return tw.Flush()
}

// chargesDB is the demo's database with a record of when it charged what.
type chargesDB struct {
	db    *rudb.DB
	mu    sync.Mutex
	first time.Time // the first request's arrival
	last  time.Time // the last write's
	ev    []chargeEvent
}

type chargeEvent struct {
	at time.Duration // since first
	ru int64         // charged; 0 for a 429
}

func (d *chargesDB) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	d.db.ServeHTTP(sw, r)
	ru, _ := strconv.ParseInt(sw.Header().Get("X-Ms-Request-Charge"), 10, 64)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.first.IsZero() {
		d.first = now
	}
	if sw.status == http.StatusCreated {
		d.last = now
	}
	d.ev = append(d.ev, chargeEvent{at: now.Sub(d.first), ru: ru})
}

// run sums what the database saw.
func (d *chargesDB) run(capacity int) chargesRun {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.db.Stats()
	r := chargesRun{Requests: st.Requests, Throttled: st.Throttled, Written: st.Written, RU: st.RU,
		Seconds: d.last.Sub(d.first).Seconds(), Ideal: float64(st.RU) / float64(capacity)}
	for _, e := range d.ev {
		i := int(e.at / (100 * time.Millisecond))
		for len(r.PerTenth) <= i {
			r.PerTenth = append(r.PerTenth, [2]int64{})
		}
		if e.ru > 0 {
			r.PerTenth[i][0] += e.ru
		} else {
			r.PerTenth[i][1]++
		}
	}
	return r
}

// runChargesWriter runs the writer process of the charges demo (sluice
// demo charges-writer): it writes the records through an
// httplimit.Client, with Budgets or without, and exits when all are
// written.
func runChargesWriter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo charges-writer", "Usage: sluice demo charges-writer -url URL [flags]\n\nThe writer process of sluice demo charges.\n", stderr)
	url := fs.String("url", "", "the database's URL")
	mode := fs.String("mode", "budgets", "budgets (reserve an estimate, settle the charge), estimate (a Limiter taking the estimate) or retry (no pacing)")
	records := fs.Int("records", 10000, "records to write")
	capacity := fs.Int("capacity", 20000, "the database's RU per second")
	estimate := fs.Int("estimate", 10, "the RU reserved for a write")
	workers := fs.Int("workers", 32, "goroutines")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *url == "" || (*mode != "budgets" && *mode != "estimate" && *mode != "retry") || *records < 1 || *capacity < 1 || *estimate < 1 || *workers < 1 {
		return usagef("demo charges-writer: want -url, -mode budgets|estimate|retry, and positive -records, -capacity, -estimate and -workers")
	}
	tr := demoTransport()
	defer tr.CloseIdleConnections()
	c := &httplimit.Client{HTTP: &http.Client{Transport: tr}}
	switch *mode {
	case "budgets":
		c.Budgets = &httplimit.Budgets{}
		c.Budgets.SetCapacity("db", httplimit.RequestUnits, float64(*capacity), time.Second, time.Now())
		ctx = httplimit.WithEstimate(ctx, httplimit.Estimate{Key: "db", Cost: map[string]int64{httplimit.RequestUnits: int64(*estimate)}})
	case "estimate":
		c.Limiter = ratelimit.NewLimiter(ratelimit.WindowPacing(float64(*capacity), time.Second))
	}
	r, err := rudb.Paced(ctx, c, *url, *records, *workers, int64(*estimate))
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(r)
}

// writeChargesPlot draws the RU charged per second, in tenths of a
// second, of each job.
func writeChargesPlot(path string, rep chargesReport, withBaselines bool) error {
	perSecond := func(r chargesRun, i int) []float64 {
		y := make([]float64, len(r.PerTenth))
		for j, x := range r.PerTenth {
			y[j] = 10 * float64(x[i])
		}
		return y
	}
	series := []chart.Series{{Name: "budgets: RU/s charged", Y: perSecond(rep.Budgets, 0)}}
	if withBaselines {
		series = append(series, chart.Series{Name: "estimate only: RU/s charged", Y: perSecond(rep.Estimate, 0)},
			chart.Series{Name: "retry on 429: RU/s charged", Y: perSecond(rep.Retry, 0)},
			chart.Series{Name: "retry on 429: 429s/s", Y: perSecond(rep.Retry, 1)})
	}
	n := 0
	for _, s := range series {
		n = max(n, len(s.Y))
	}
	capLine := chart.Series{Name: "capacity", Y: make([]float64, n)}
	for i := range capLine.Y {
		capLine.Y[i] = float64(rep.Capacity)
	}
	series = append(series, capLine)
	return writeChart(path, chart.Chart{
		Title:  fmt.Sprintf("sluice demo charges: %d writes of %d-%d RU drawn by the database, %d RU/s in 1 s windows", rep.Records, rep.MinCharge, rep.MaxCharge, rep.Capacity),
		XLabel: "seconds since the first request", YLabel: "per second (tenths of a second)",
		Step: 0.1, Series: series,
	})
}
