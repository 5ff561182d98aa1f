package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/longtest"
)

// runChargesDemo runs sluice demo charges as a process of the built
// binary (its database and its writer out of the race detector's reach,
// so that the times are the code's, not the detector's), and returns its
// report.
func runChargesDemo(t *testing.T, args ...string) chargesReport {
	t.Helper()
	bin := buildSluice(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"demo", "charges", "-json"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo charges: %v\n%s", err, errb.String())
	}
	var rep chargesReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decoding the report: %v\n%s", err, out.String())
	}
	for _, r := range []struct {
		name string
		run  chargesRun
	}{{"budgets", rep.Budgets}, {"estimate only", rep.Estimate}, {"retry on 429", rep.Retry}} {
		t.Logf("%-12s requests %d, 429s %d (%.2f%%), RU %d, %.2f s, ideal %.2f s, ratio %.3f", r.name, r.run.Requests,
			r.run.Throttled, 100*float64(r.run.Throttled)/float64(max(1, r.run.Requests)), r.run.RU, r.run.Seconds, r.run.Ideal, r.run.Seconds/r.run.Ideal)
	}
	return rep
}

// checkCharges holds a charges report to the proof's bounds: every record
// written, each charge within 5 to 15 RU (the RU over the records), under
// 1 % of the paced job's requests answered 429, and its writes done
// within slow of the ideal time (the RU charged over the capacity); the
// baselines, measured in the same run, wrote them all too.
func checkCharges(t *testing.T, rep chargesReport, slow float64) {
	t.Helper()
	n := int64(rep.Records)
	for _, r := range []chargesRun{rep.Budgets, rep.Estimate, rep.Retry} {
		if r.Written != n || r.RU < 5*n || r.RU > 15*n {
			t.Errorf("written %d of %d, RU %d: want all, at 5 to 15 RU each", r.Written, n, r.RU)
		}
	}
	b := rep.Budgets
	if float64(b.Throttled) >= 0.01*float64(b.Requests) {
		t.Errorf("budgets: %d of %d requests answered 429, want under 1%%", b.Throttled, b.Requests)
	}
	if b.Seconds > (1+slow)*b.Ideal {
		t.Errorf("budgets: the writes took %.2f s, want within %.0f%% of the ideal %.2f s", b.Seconds, 100*slow, b.Ideal)
	}
}

// TestDemoCharges is the short proof of costs known after the answer:
// 1,000 records costing 5 to 15 RU each, drawn by the database and said
// only in x-ms-request-charge, into 4,000 RU/s; the writer reserves 10 RU
// a write and settles the charge. The chart is a PNG. Beside make test's
// other packages, a loaded machine's scheduler slows any pacing (the
// estimate-only Limiter's too), so the time is held within 25 % of the
// ideal here, and within 5 % by TestDemoChargesExample, which runs alone.
func TestDemoCharges(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes: about 6 s")
	}
	plot := filepath.Join(t.TempDir(), "charges.png")
	rep := runChargesDemo(t, "-records", "1000", "-capacity", "4000", "-plot", plot)
	checkCharges(t, rep, 0.25)
	checkPNG(t, plot)
}

// TestDemoChargesExample is the proof at full size: 10,000 records of 5
// to 15 RU into 20,000 RU/s. It holds a bound in real time, so make test
// leaves it to make test-long.
func TestDemoChargesExample(t *testing.T) {
	longtest.Run(t)
	checkCharges(t, runChargesDemo(t, "-records", "10000", "-capacity", "20000"), 0.05)
}

// TestDemoChargesUsage: bad flags are refused with what is wanted.
func TestDemoChargesUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-records", "0"}, "-records must be"},
		{[]string{"-min-charge", "10", "-max-charge", "5"}, "-min-charge <= -max-charge"},
		{[]string{"-capacity", "10", "-max-charge", "15"}, "<= -capacity"},
		{[]string{"-workers", "0"}, "-workers from 1"},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), append([]string{"demo", "charges"}, tc.args...), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}
