package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

const compareUsage = `Usage: sluice compare [flags]

Compare offers one traffic pattern to every algorithm of package ratelimit
(gcra, fixed_window, sliding_log, sliding_window, leaky_bucket), each with the
rule "limit requests per period" and no extra burst, and prints what each
admitted. Time is simulated: nothing sleeps, and the run starts at the
beginning of a window. Every request costs 1.

Patterns (rate is the mean offered rate in requests per second):

  steady    evenly spaced requests at rate.
  bursty    the same requests, but each period/4's requests all arrive at
            the start of that quarter period.
  boundary  every other window boundary, limit requests end just before it
            and limit requests start on it, spaced 1/rate apart (at most
            period/(2×limit)). A fixed window admits 2×limit within one
            period here; a sliding log never more than limit.
  ramp      the rate grows linearly from 0 to 2×rate over the duration.

Columns:

  admitted, denied  requests admitted and denied over the run.
  max/period        the most admitted in any window (t-period, t]: the
                    number to hold against "limit per period".
  max/(period/10)   the largest burst: the most admitted in any window
                    (t-period/10, t].
  cv                smoothness: the coefficient of variation (standard
                    deviation / mean) of the admissions counted in
                    consecutive buckets of period/10; 0 is perfectly even.
`

// A comparison is the report of one compare run; -json prints it as is.
type comparison struct {
	Pattern  pattern `json:"pattern"`
	Rate     float64 `json:"rate"`
	Limit    int64   `json:"limit"`
	Period   string  `json:"period"`
	Duration string  `json:"duration"`
	Offered  int     `json:"offered"`
	// MeanRate is what was offered per second on average. It is Rate but
	// for the boundary pattern, which spaces its requests at Rate and
	// offers them in bursts.
	MeanRate float64  `json:"mean_rate"`
	Results  []result `json:"results"`
}

// runCompare parses the compare flags, runs the simulation and prints it.
func runCompare(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("compare", compareUsage, stderr)
	var (
		l      load
		pat    string
		asJSON bool
	)
	fs.StringVar(&pat, "pattern", string(boundary), "traffic `pattern`: steady, bursty, boundary or ramp")
	fs.Float64Var(&l.Rate, "rate", 100, "mean offered `rate` in requests per second")
	fs.Int64Var(&l.Limit, "limit", 10, "requests admitted per period (`N`)")
	fs.DurationVar(&l.Period, "period", time.Second, "the limit's `period`")
	fs.DurationVar(&l.Duration, "duration", 10*time.Second, "simulated `duration` of the run")
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	l.Pattern = pattern(pat)
	if err := l.validate(); err != nil {
		return usagef("compare: %v", err)
	}
	c := compare(&l)
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(c)
	}
	return c.print(stdout)
}

// compare simulates l and returns the report.
func compare(l *load) *comparison {
	arr := l.arrivals()
	return &comparison{
		Pattern:  l.Pattern,
		Rate:     l.Rate,
		Limit:    l.Limit,
		Period:   l.Period.String(),
		Duration: l.Duration.String(),
		Offered:  len(arr),
		MeanRate: float64(len(arr)) / l.Duration.Seconds(),
		Results:  simulate(l, arr),
	}
}

// print writes c as a table.
func (c *comparison) print(w io.Writer) error {
	fmt.Fprintf(w, "pattern %s: %d requests offered over %s (%.3g/s on average); limit %d per %s\n\n",
		c.Pattern, c.Offered, c.Duration, c.MeanRate, c.Limit, c.Period)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "algorithm\tadmitted\tdenied\tmax/period\tmax/(period/10)\tcv")
	for _, r := range c.Results {
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\n", r.Algorithm)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.2f\n",
			r.Algorithm, r.Admitted, r.Denied, r.MaxInPeriod, r.MaxInTenth, r.CV)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range c.Results {
		if r.Error != "" {
			fmt.Fprintf(w, "\n%s: not run: %s\n", r.Algorithm, r.Error)
		}
	}
	_, err := fmt.Fprintf(w, "\nmax/period is the most admitted in any window of %s (the limit is %d); see 'sluice compare -h'.\n",
		c.Period, c.Limit)
	return err
}
