package main

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// maxOffered bounds the requests one comparison simulates, so that a typo in
// -rate or -duration cannot run for minutes or exhaust memory.
const maxOffered = 2_000_000

// A pattern names a way of offering traffic.
type pattern string

const (
	steady   pattern = "steady"
	bursty   pattern = "bursty"
	boundary pattern = "boundary"
	ramp     pattern = "ramp"
)

// load describes the traffic of one comparison and the limit it meets.
type load struct {
	Pattern  pattern
	Rate     float64       // requests offered per second (mean)
	Limit    int64         // N
	Period   time.Duration // per Period
	Duration time.Duration // simulated
}

// validate reports whether l can be simulated: known pattern, positive
// numbers, and no more than maxOffered requests.
func (l *load) validate() error {
	switch l.Pattern {
	case steady, bursty, boundary, ramp:
	default:
		return fmt.Errorf("unknown pattern %q (want steady, bursty, boundary or ramp)", l.Pattern)
	}
	switch {
	case !(l.Rate > 0) || math.IsInf(l.Rate, 0):
		return fmt.Errorf("rate must be a positive number of requests per second, not %v", l.Rate)
	case l.Limit < 1:
		return fmt.Errorf("limit must be at least 1, not %d", l.Limit)
	case l.Period <= 0:
		return fmt.Errorf("period must be positive, not %v", l.Period)
	case l.Duration <= 0:
		return fmt.Errorf("duration must be positive, not %v", l.Duration)
	}
	if l.Pattern == boundary {
		if l.Duration <= l.Period {
			return fmt.Errorf("the boundary pattern needs a duration longer than the period (%v), not %v", l.Period, l.Duration)
		}
		if int64(l.Period) < 2*l.Limit {
			return fmt.Errorf("the boundary pattern needs a period of at least 2×limit nanoseconds, not %v", l.Period)
		}
		// N requests on each side of every other boundary.
		if n := float64(l.Limit) * (float64(l.Duration) / float64(l.Period)); n > maxOffered {
			return fmt.Errorf("limit %d per %v over %v offers about %.0f requests; at most %d can be simulated", l.Limit, l.Period, l.Duration, n, maxOffered)
		}
		return nil
	}
	if n := l.Rate * l.Duration.Seconds(); n > maxOffered {
		return fmt.Errorf("rate %v for %v offers about %.0f requests; at most %d can be simulated", l.Rate, l.Duration, n, maxOffered)
	}
	return nil
}

// arrivals returns the offsets from the start of the run, in nanoseconds and
// in order, at which l's pattern offers one request of cost 1. The run starts
// at the beginning of a window, so offset k×Period is a window boundary.
func (l *load) arrivals() []int64 {
	d := int64(l.Duration)
	gap := 1e9 / l.Rate // mean nanoseconds between requests
	var out []int64
	switch l.Pattern {
	case steady, bursty:
		slot := max(int64(l.Period)/4, 1)
		for i := 0; ; i++ {
			t := int64(math.Round(float64(i) * gap))
			if t >= d {
				break
			}
			if l.Pattern == bursty {
				t -= t % slot // every request of a slot arrives at its start
			}
			out = append(out, t)
		}
	case ramp:
		// The rate grows linearly from 0 to 2×Rate, so Rate×t²/Duration
		// requests have arrived by t: request i arrives at √(i×Duration/Rate).
		for i := 0; ; i++ {
			t := int64(math.Round(math.Sqrt(float64(i) * float64(d) / l.Rate * 1e9)))
			if t >= d {
				break
			}
			out = append(out, t)
		}
	case boundary:
		// Every other boundary, N requests end just before it and N start
		// on it, spaced by 1/Rate but never wider than Period/(2N), so that
		// both halves fit in their windows.
		p := int64(l.Period)
		sp := min(int64(math.Round(gap)), p/(2*l.Limit))
		sp = max(sp, 1)
		for b := p; b < d; b += 2 * p {
			for k := l.Limit; k >= 1; k-- {
				out = append(out, b-k*sp)
			}
			for k := range l.Limit {
				if t := b + k*sp; t < d {
					out = append(out, t)
				}
			}
		}
	}
	return out
}

// result is what one algorithm made of a load.
type result struct {
	Algorithm string `json:"algorithm"`
	Admitted  int    `json:"admitted"`
	Denied    int    `json:"denied"`
	// MaxInPeriod is the most requests admitted in any window (t-Period, t].
	MaxInPeriod int `json:"max_in_period"`
	// MaxInTenth is the largest burst: the most admitted in any window
	// (t-Period/10, t].
	MaxInTenth int `json:"max_in_tenth"`
	// CV is the coefficient of variation (standard deviation / mean) of the
	// admissions counted in consecutive buckets of Period/10 over the run;
	// 0 is perfectly even. It is 0 when nothing was admitted.
	CV float64 `json:"cv"`
	// Error says why the algorithm could not run this rule (e.g. a limit
	// above what sliding_log keeps); the counts are then zero.
	Error string `json:"error,omitempty"`
}

// simulate runs arr, the arrivals of l, through every algorithm in simulated time,
// one Rule.Decide per request with cost 1, and measures what each admitted.
//
// The run starts at a fixed instant (2026-01-01 UTC) aligned down to a
// multiple of Period: window algorithms align their windows to the Unix
// epoch, so the first window starts with the run.
func simulate(l *load, arr []int64) []result {
	p := int64(l.Period)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	start = start.Add(-time.Duration(start.UnixNano() % p))
	admitted := make([]int64, 0, len(arr))
	algorithms := []ratelimit.Algorithm{
		ratelimit.GCRA,
		ratelimit.FixedWindow,
		ratelimit.SlidingLog,
		ratelimit.SlidingWindow,
		ratelimit.LeakyBucket,
	}
	var out []result
	for _, alg := range algorithms {
		rule := ratelimit.Rule{Name: alg.String(), Algorithm: alg, Quota: l.Limit, Period: l.Period}
		res := result{Algorithm: alg.String()}
		if err := rule.Validate(); err != nil {
			res.Error = err.Error()
			out = append(out, res)
			continue
		}
		var st ratelimit.State
		admitted = admitted[:0]
		for _, t := range arr {
			if rule.Decide(&st, start.Add(time.Duration(t)), 1).Allowed {
				admitted = append(admitted, t)
			}
		}
		tenth := max(p/10, 1)
		res.Admitted = len(admitted)
		res.Denied = len(arr) - len(admitted)
		res.MaxInPeriod = maxInWindow(admitted, p)
		res.MaxInTenth = maxInWindow(admitted, tenth)
		res.CV = bucketCV(admitted, tenth, int64(l.Duration))
		out = append(out, res)
	}
	return out
}

// maxInWindow returns the most instants of the sorted ts that fall in any
// window (t-w, t]: the half-open window a sliding log of length w enforces.
func maxInWindow(ts []int64, w int64) int {
	best, lo := 0, 0
	for hi, t := range ts {
		for ts[lo] <= t-w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// bucketCV returns the coefficient of variation of the counts of the sorted
// ts in the buckets [k×w, (k+1)×w) that cover [0, d), empty buckets included.
func bucketCV(ts []int64, w, d int64) float64 {
	if len(ts) == 0 {
		return 0
	}
	buckets := float64((d + w - 1) / w)
	var sumSq float64
	for i := 0; i < len(ts); {
		j := i
		for j < len(ts) && ts[j]/w == ts[i]/w {
			j++
		}
		c := float64(j - i)
		sumSq += c * c
		i = j
	}
	mean := float64(len(ts)) / buckets
	variance := max(sumSq/buckets-mean*mean, 0)
	return math.Sqrt(variance) / mean
}
