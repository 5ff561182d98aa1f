package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/longtest"
	"github.com/twmb/franz-go/pkg/kfake"
)

// needRedis skips a test without redis-server on PATH, except under
// CI=true, where .ci/run has installed it.
func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed; .ci/run installs it")
		}
		t.Skip("redis-server is not installed")
	}
}

// runIngestDemo runs sluice demo ingest in this process (under the race
// detector when the test is), its API and processors as processes of the
// built binary, and returns what it printed as JSON.
func runIngestDemo(t *testing.T, args ...string) ingestReport {
	t.Helper()
	bin := buildSluice(t)
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := run(ctx, append([]string{"demo", "ingest", "-self", bin, "-json", "-v"}, args...), &out, &errb)
	if err != nil {
		t.Fatalf("demo ingest: %v\n%s", err, errb.String())
	}
	var rep ingestReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decoding the report: %v\n%s", err, out.String())
	}
	var tab strings.Builder
	printIngest(&tab, rep)
	t.Logf("\n%s", tab.String())
	return rep
}

// TestDemoIngestKill: 2,000 records of type A and 1,000 of type B at 500
// writes/s, processor A killed with SIGKILL half-way and started again:
// every record is written exactly once, nothing is throttled beyond 1 %,
// and the chart is a PNG.
func TestDemoIngestKill(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("real processes: about 10 s")
	}
	needRedis(t)
	plot := filepath.Join(t.TempDir(), "ingest.png")
	rep := runIngestDemo(t, "-a", "2000", "-b", "1000", "-kill", "-plot", plot)
	if !rep.Killed || rep.Missing != 0 || rep.Written != 3000 {
		t.Errorf("killed %v, missing %d, written %d, want true, 0, 3000", rep.Killed, rep.Missing, rep.Written)
	}
	if float64(rep.Throttled) > 0.01*float64(rep.Requests) {
		t.Errorf("throttled %d of %d requests, want ≤ 1%%", rep.Throttled, rep.Requests)
	}
	if rep.FinishA <= rep.FinishB {
		t.Errorf("A finished at %.1f s, B at %.1f s: want B first (half the records, half the rate)", rep.FinishA, rep.FinishB)
	}
	checkPNG(t, plot)
}

// checkPNG fails t unless the file path is a PNG image.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("the plot: %v", err)
	}
}

// TestDemoIngestExample is the example at full size, as the demo runs on
// its defaults: 10,000 records of type A and 5,000 of type B, 500
// writes/s leased as 20 × 25. B finishes within 10 % of 20 s (half the
// capacity while both run) and A within 10 % of 30 s (all 15,000 at
// 500/s), with ≤ 1 % of the requests throttled and every record written
// once. It holds bounds in real time, so make test runs it alone.
func TestDemoIngestExample(t *testing.T) {
	longtest.Run(t)
	if testing.Short() {
		t.Skip("real processes: 31 s")
	}
	needRedis(t)
	rep := runIngestDemo(t)
	if rep.FinishB < 18 || rep.FinishB > 22 {
		t.Errorf("B finished at %.1f s, want within 10%% of 20 s", rep.FinishB)
	}
	if rep.FinishA < 27 || rep.FinishA > 33 {
		t.Errorf("A finished at %.1f s, want within 10%% of 30 s", rep.FinishA)
	}
	if float64(rep.Throttled) > 0.01*float64(rep.Requests) {
		t.Errorf("throttled %d of %d requests, want ≤ 1%%", rep.Throttled, rep.Requests)
	}
	if rep.Missing != 0 || rep.Written != 15000 {
		t.Errorf("missing %d, written %d, want 0 and 15000", rep.Missing, rep.Written)
	}
}

// TestParseRecord: what the API accepts, and the error for what it does
// not.
func TestParseRecord(t *testing.T) {
	for _, tc := range []struct {
		body, err string
		want      ingestRecord
	}{
		{body: `{"id":"A-1","type":"A","payload":"x"}`, want: ingestRecord{"A-1", "A"}},
		{body: `{"type":"B","id":"b.2_x"}`, want: ingestRecord{"b.2_x", "B"}},
		{body: `[1]`, err: "not a JSON object"},
		{body: `{"id":"a"}`, err: `no "type"`},
		{body: `{"id":"a","type":"C"}`, err: "neither A nor B"},
		{body: `{"id":1,"type":"A"}`, err: `"id" is not a string`},
		{body: `{"id":"","type":"A"}`, err: "1 to 128 characters"},
		{body: `{"id":"a b","type":"A"}`, err: "only letters"},
		{body: `{"id":"` + strings.Repeat("a", 129) + `","type":"A"}`, err: "1 to 128 characters"},
		{body: `{"id":"a","type":"A","payload":"` + strings.Repeat("x", maxRecordBytes) + `"}`, err: "at most 65536"},
	} {
		got, err := parseRecord([]byte(tc.body))
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%.40s: %+v, %v; want %+v", tc.body, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%.40s: error %v, want one with %q", tc.body, err, tc.err)
		}
	}
}

// FuzzParseRecord: parsing never panics, and a record it accepts is
// enriched into one that parses to the same id and type.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{`{"id":"A-1","type":"A","payload":"x"}`, `{"id":"a","id":"b","type":"B"}`, `{}`, `null`, `{"id":"\u0041","type":"A"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec, err := parseRecord(body)
		if err != nil {
			return
		}
		out, err := enrichRecord(body, "processor-A")
		if err != nil {
			t.Fatalf("accepted %q, then enriching it: %v", body, err)
		}
		if len(out) > maxRecordBytes {
			return
		}
		again, err := parseRecord(out)
		if err != nil || again != rec {
			t.Fatalf("enriched %q into %q: %+v, %v; want %+v", body, out, again, err, rec)
		}
	})
}

// kafkaBrokers starts franz-go's in-process Kafka (kfake: no broker
// installs here) for the test and returns its address; topics are made
// at their first record.
func kafkaBrokers(t *testing.T) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3),
		kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return strings.Join(c.ListenAddrs(), ",")
}

// sourceArgs are the demo's flags for source, with a fresh Kafka when it
// is kafka.
func sourceArgs(t *testing.T, source string) []string {
	args := []string{"-source", source}
	if source == sourceKafka {
		args = append(args, "-kafka-brokers", kafkaBrokers(t))
	}
	return args
}

// TestDemoIngestSources runs the ingestion example, small, on each queue
// the binary drains: the API process puts each record in its queue, two
// drainer processes share the database's capacity through leases, and
// every record is written exactly once with ≤ 1 % of the requests
// throttled.
func TestDemoIngestSources(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	needRedis(t)
	for _, source := range []string{sourceJetStream, sourceRedis, sourceKafka} {
		t.Run(source, func(t *testing.T) {
			rep := runIngestDemo(t, append(sourceArgs(t, source), "-a", "300", "-b", "150", "-capacity", "150", "-partitions", "5")...)
			if rep.Missing != 0 || rep.Written != 450 || rep.Redelivered != 0 {
				t.Errorf("missing %d, written %d, redelivered %d: want 0, 450, 0", rep.Missing, rep.Written, rep.Redelivered)
			}
			if float64(rep.Throttled) > 0.01*float64(rep.Requests) {
				t.Errorf("throttled %d of %d requests, want ≤ 1%%", rep.Throttled, rep.Requests)
			}
		})
	}
}

// TestDemoIngestKillSources is TestDemoIngestKill on Redis Streams and
// Kafka: processor A killed with SIGKILL half-way and started again, every
// record written exactly once; it logs what the restart repeated and when
// A finished (a killed drainer's records wait out the ack wait: 2 s on
// Redis, the group's 6 s session timeout on Kafka).
func TestDemoIngestKillSources(t *testing.T) {
	longtest.Run(t)
	needRedis(t)
	for _, source := range []string{sourceRedis, sourceKafka} {
		t.Run(source, func(t *testing.T) {
			rep := runIngestDemo(t, append(sourceArgs(t, source), "-a", "2000", "-b", "1000", "-kill")...)
			if !rep.Killed || rep.Missing != 0 || rep.Written != 3000 {
				t.Errorf("killed %v, missing %d, written %d, want true, 0, 3000", rep.Killed, rep.Missing, rep.Written)
			}
			t.Logf("%s: %d records sent again after the kill (answered as already written); A finished at %.1f s, B at %.1f s", source, rep.Redelivered, rep.FinishA, rep.FinishB)
		})
	}
}
