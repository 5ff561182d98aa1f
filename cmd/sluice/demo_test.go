package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestDemoJSON runs the demo scaled down (200 records at 4,000 RU/s: 0.5 s
// predicted) and checks the JSON shape and the figures that pacing makes
// certain.
func TestDemoJSON(t *testing.T) {
	var out, errb bytes.Buffer
	err := runDemo(t.Context(), []string{"throttled-db", "-json", "-records", "200", "-budget", "4000"}, &out, &errb)
	if err != nil {
		t.Fatalf("runDemo: %v\n%s", err, errb.String())
	}
	var raw map[string]map[string]float64
	if err := json.Unmarshal(out.Bytes(), &raw); err != nil {
		t.Fatalf("output is not the JSON object: %v\n%s", err, out.String())
	}
	want := map[string][]string{
		"naive":  {"sent", "throttled", "seconds"},
		"sluice": {"sent", "throttled", "seconds", "predicted_seconds"},
	}
	if len(raw) != len(want) {
		t.Errorf("keys %v, want naive and sluice", raw)
	}
	for side, keys := range want {
		if len(raw[side]) != len(keys) {
			t.Errorf("%s has %d members, want %v", side, len(raw[side]), keys)
		}
		for _, k := range keys {
			if _, ok := raw[side][k]; !ok {
				t.Errorf("%s lacks %q: %s", side, k, out.String())
			}
		}
	}
	s, n := raw["sluice"], raw["naive"]
	if s["predicted_seconds"] != 0.5 {
		t.Errorf("predicted %v s, want 0.5", s["predicted_seconds"])
	}
	if s["sent"] < 200 || s["sent"] > 202 {
		t.Errorf("sluice sent %v, want 200 to 202", s["sent"])
	}
	// 200 writes against 400 per window: the naive job fits in one window
	// only if all arrive in it; it must at least have sent every record.
	if n["sent"] < 200 {
		t.Errorf("naive sent %v, want at least 200", n["sent"])
	}
}

func TestDemoTable(t *testing.T) {
	var out, errb bytes.Buffer
	err := runDemo(t.Context(), []string{"throttled-db", "-records", "100", "-naive-records", "50", "-budget", "4000", "-processes", "2"}, &out, &errb)
	if err != nil {
		t.Fatalf("runDemo: %v\n%s", err, errb.String())
	}
	for _, w := range []string{"sent", "throttled", "predicted", "naive (50 records)", "sluice (2 clients)", "0.25"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, out.String())
		}
	}
}

func TestDemoUsage(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "want a scenario"},
		{[]string{"nope"}, "unknown scenario"},
		{[]string{"throttled-db", "-records", "0"}, "-records"},
		{[]string{"throttled-db", "-cost", "0"}, "-cost"},
		{[]string{"throttled-db", "extra"}, "unexpected argument"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		err := runDemo(t.Context(), tt.args, &out, &errb)
		var uerr usageError
		if !errors.As(err, &uerr) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("runDemo(%q) = %v, want a usage error containing %q", tt.args, err, tt.want)
		}
	}
	var out bytes.Buffer
	if err := runDemo(t.Context(), []string{"-h"}, &out, &out); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v\n%s", err, out.String())
	}
	for _, d := range []string{"\tthrottled-db ", "\tingest "} { // every demo
		if !strings.Contains(out.String(), d) {
			t.Errorf("demo -h does not list %q:\n%s", strings.TrimSpace(d), out.String())
		}
	}
	out.Reset()
	if err := runDemo(t.Context(), []string{"throttled-db", "-h"}, &out, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage: sluice demo throttled-db") || !strings.Contains(out.String(), "-budget") {
		t.Errorf("throttled-db -h: %v\n%s", err, out.String())
	}
}
