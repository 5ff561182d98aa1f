package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// byAlgorithm indexes results by algorithm name.
func byAlgorithm(t *testing.T, c *comparison) map[string]result {
	t.Helper()
	m := make(map[string]result, len(c.Results))
	for _, r := range c.Results {
		if r.Error != "" {
			t.Fatalf("%s did not run: %s", r.Algorithm, r.Error)
		}
		m[r.Algorithm] = r
	}
	if len(m) != 5 {
		t.Fatalf("got results for %d algorithms, want 5: %+v", len(m), c.Results)
	}
	return m
}

// TestCompareBoundary pins the numbers of the boundary pattern: a fixed
// window admits 2N within one period across a boundary, a sliding log never
// more than N.
func TestCompareBoundary(t *testing.T) {
	tests := []struct {
		name string
		load load
		// offered, and per algorithm {admitted, max/period}
		offered int
		want    map[string][2]int
	}{
		{
			name:    "defaults",
			load:    load{Pattern: boundary, Rate: 100, Limit: 10, Period: time.Second, Duration: 10 * time.Second},
			offered: 100, // 5 boundaries (1s, 3s, 5s, 7s, 9s) × 2N
			want: map[string][2]int{
				"fixed_window":   {100, 20},
				"sliding_log":    {50, 10},
				"sliding_window": {50, 10},
				// A full bucket of 10 plus one interval (100 ms) of refill
				// between the first request and the boundary.
				"gcra":         {55, 11},
				"leaky_bucket": {55, 11},
			},
		},
		{
			// Spacing is min(1/rate, period/(2N)) = min(1 s, 10 s) = 1 s:
			// each half spans 3 s on its side of the boundary.
			name:    "three per minute",
			load:    load{Pattern: boundary, Rate: 1, Limit: 3, Period: time.Minute, Duration: 4 * time.Minute},
			offered: 12, // boundaries at 1 and 3 minutes
			want: map[string][2]int{
				"fixed_window": {12, 6},
				"sliding_log":  {6, 3},
				"gcra":         {6, 3},
				"leaky_bucket": {6, 3},
			},
		},
		{
			// A slow offered rate is squeezed to period/(2N) = 50 ms so
			// that both halves stay in their windows.
			name:    "squeezed spacing",
			load:    load{Pattern: boundary, Rate: 0.5, Limit: 10, Period: time.Second, Duration: 2 * time.Second},
			offered: 20,
			want: map[string][2]int{
				"fixed_window": {20, 20},
				"sliding_log":  {10, 10},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.load.validate(); err != nil {
				t.Fatal(err)
			}
			c := compare(&tt.load)
			if c.Offered != tt.offered {
				t.Errorf("offered = %d, want %d", c.Offered, tt.offered)
			}
			got := byAlgorithm(t, c)
			for alg, w := range tt.want {
				r := got[alg]
				if r.Admitted != w[0] || r.MaxInPeriod != w[1] {
					t.Errorf("%s: admitted %d, max/period %d; want %d, %d", alg, r.Admitted, r.MaxInPeriod, w[0], w[1])
				}
			}
			n := int(tt.load.Limit)
			if fw := got["fixed_window"].MaxInPeriod; fw != 2*n {
				t.Errorf("fixed_window max/period = %d, want 2N = %d", fw, 2*n)
			}
			if sl := got["sliding_log"].MaxInPeriod; sl > n {
				t.Errorf("sliding_log max/period = %d, want at most N = %d", sl, n)
			}
		})
	}
}

// TestCompareInvariants runs every pattern and checks what must hold
// whatever the numbers: counts add up, a sliding log never admits more than
// N per period, a fixed window never more than 2N.
func TestCompareInvariants(t *testing.T) {
	for _, p := range []pattern{steady, bursty, boundary, ramp} {
		for _, l := range []load{
			{Pattern: p, Rate: 100, Limit: 10, Period: time.Second, Duration: 10 * time.Second},
			{Pattern: p, Rate: 7, Limit: 5, Period: 2 * time.Second, Duration: time.Minute},
			{Pattern: p, Rate: 3, Limit: 100, Period: time.Second, Duration: 5 * time.Second}, // under the limit
		} {
			t.Run(fmt.Sprintf("%s/%v per %v at %v", p, l.Limit, l.Period, l.Rate), func(t *testing.T) {
				if err := l.validate(); err != nil {
					t.Fatal(err)
				}
				c := compare(&l)
				if c.Offered == 0 {
					t.Fatal("nothing offered")
				}
				n := int(l.Limit)
				for alg, r := range byAlgorithm(t, c) {
					if r.Admitted+r.Denied != c.Offered {
						t.Errorf("%s: admitted %d + denied %d != offered %d", alg, r.Admitted, r.Denied, c.Offered)
					}
					if r.MaxInTenth > r.MaxInPeriod || r.MaxInPeriod > r.Admitted {
						t.Errorf("%s: max/(period/10) %d, max/period %d, admitted %d out of order", alg, r.MaxInTenth, r.MaxInPeriod, r.Admitted)
					}
					if r.CV < 0 || math.IsNaN(r.CV) {
						t.Errorf("%s: cv = %v", alg, r.CV)
					}
				}
				got := byAlgorithm(t, c)
				if m := got["sliding_log"].MaxInPeriod; m > n {
					t.Errorf("sliding_log admitted %d in one period, limit %d", m, n)
				}
				if m := got["fixed_window"].MaxInPeriod; m > 2*n {
					t.Errorf("fixed_window admitted %d in one period, more than 2×%d", m, n)
				}
			})
		}
	}
}

func TestArrivals(t *testing.T) {
	tests := []struct {
		name  string
		load  load
		count int
		first []int64 // the first offsets, in ns
	}{
		{"steady", load{Pattern: steady, Rate: 4, Limit: 1, Period: time.Second, Duration: time.Second},
			4, []int64{0, 250e6, 500e6, 750e6}},
		{"bursty quarters", load{Pattern: bursty, Rate: 8, Limit: 1, Period: time.Second, Duration: time.Second},
			8, []int64{0, 0, 250e6, 250e6, 500e6}},
		{"ramp", load{Pattern: ramp, Rate: 1, Limit: 1, Period: time.Second, Duration: 4 * time.Second},
			4, []int64{0, 2e9, 2828427125, 3464101615}},
		{"boundary", load{Pattern: boundary, Rate: 10, Limit: 2, Period: time.Second, Duration: 2 * time.Second},
			4, []int64{800e6, 900e6, 1000e6, 1100e6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.load.arrivals()
			if len(got) != tt.count {
				t.Fatalf("%d arrivals %v, want %d", len(got), got, tt.count)
			}
			for i, w := range tt.first {
				if got[i] != w {
					t.Errorf("arrival %d at %d ns, want %d", i, got[i], w)
				}
			}
			for i := 1; i < len(got); i++ {
				if got[i] < got[i-1] {
					t.Fatalf("arrivals out of order at %d: %v", i, got)
				}
			}
		})
	}
}

func TestMaxInWindow(t *testing.T) {
	tests := []struct {
		ts   []int64
		w    int64
		want int
	}{
		{nil, 10, 0},
		{[]int64{5}, 10, 1},
		{[]int64{0, 9, 10}, 10, 2}, // 0 has left the window (0, 10]
		{[]int64{0, 9, 9, 9}, 10, 4},
		{[]int64{0, 10, 20, 21, 22, 40}, 10, 3},
	}
	for _, tt := range tests {
		if got := maxInWindow(tt.ts, tt.w); got != tt.want {
			t.Errorf("maxInWindow(%v, %d) = %d, want %d", tt.ts, tt.w, got, tt.want)
		}
	}
}

func TestBucketCV(t *testing.T) {
	tests := []struct {
		ts   []int64
		w, d int64
		want float64
	}{
		{nil, 10, 100, 0},
		{[]int64{0, 10, 20, 30}, 10, 40, 0},         // one per bucket: even
		{[]int64{0, 1, 2, 3}, 10, 40, math.Sqrt(3)}, // all in one of four buckets
		{[]int64{0, 1, 20, 21}, 10, 40, 1},          // 2, 0, 2, 0
	}
	for _, tt := range tests {
		if got := bucketCV(tt.ts, tt.w, tt.d); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("bucketCV(%v, %d, %d) = %v, want %v", tt.ts, tt.w, tt.d, got, tt.want)
		}
	}
}

func TestCompareOutput(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := runCompare(t.Context(), nil, &out, &errOut); err != nil {
		t.Fatalf("compare: %v (stderr %q)", err, errOut.String())
	}
	text := out.String()
	for _, want := range []string{
		"pattern boundary: 100 requests offered over 10s (10/s on average); limit 10 per 1s",
		"max/period",
		"fixed_window    100       0       20",
		"sliding_log     50        50      10",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if err := runCompare(t.Context(), []string{"-json", "-pattern", "steady", "-rate", "20", "-duration", "3s"}, &out, &errOut); err != nil {
		t.Fatalf("compare -json: %v", err)
	}
	var c comparison
	if err := json.Unmarshal(out.Bytes(), &c); err != nil {
		t.Fatalf("compare -json printed invalid JSON: %v\n%s", err, out.String())
	}
	if c.Pattern != steady || c.Offered != 60 || c.Period != "1s" || len(c.Results) != 5 {
		t.Errorf("compare -json = %+v", c)
	}
	r := byAlgorithm(t, &c)["sliding_log"]
	if r.Admitted != 30 || r.MaxInPeriod != 10 {
		t.Errorf("steady sliding_log: %+v, want 30 admitted, 10 per period", r)
	}
}

func TestCompareReportsInvalidRule(t *testing.T) {
	// sliding_log keeps one entry per request and refuses huge limits; the
	// others still run.
	l := load{Pattern: steady, Rate: 10, Limit: 1 << 20, Period: time.Second, Duration: time.Second}
	c := compare(&l)
	var bad []string
	for _, r := range c.Results {
		if r.Error != "" {
			bad = append(bad, r.Algorithm)
		}
	}
	if len(bad) != 1 || bad[0] != "sliding_log" {
		t.Fatalf("algorithms that did not run: %v, want [sliding_log]", bad)
	}
	var out bytes.Buffer
	if err := c.print(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sliding_log: not run:") {
		t.Errorf("table does not explain the missing row:\n%s", out.String())
	}
}

func TestCompareFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-pattern", "spiky"}, "unknown pattern"},
		{[]string{"-rate", "0"}, "rate must be"},
		{[]string{"-rate", "NaN"}, "rate must be"},
		{[]string{"-limit", "0"}, "limit must be"},
		{[]string{"-period", "0s"}, "period must be"},
		{[]string{"-duration", "-1s"}, "duration must be"},
		{[]string{"-duration", "1s"}, "longer than the period"},
		{[]string{"-period", "10ns", "-limit", "6"}, "at least 2×limit"},
		{[]string{"-pattern", "steady", "-rate", "1e9"}, "at most"},
		{[]string{"-pattern", "steady", "extra"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := runCompare(t.Context(), tt.args, &out, &errOut)
			var uerr usageError
			if !errors.As(err, &uerr) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want a usage error containing %q", err, tt.want)
			}
		})
	}
}
