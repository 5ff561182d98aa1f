package main

import (
	"runtime/debug"
	"testing"
)

// TestGCApply: serve sets the collector's percent and limit (the limit
// derived from the memory store's bound unless given), keeps a GOGC or
// GOMEMLIMIT from the environment unless its flag is given, and restores
// what was set before.
func TestGCApply(t *testing.T) {
	current := func() (int, int64) {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p, debug.SetMemoryLimit(-1)
	}
	p0, l0 := current()
	for _, tt := range []struct {
		name      string
		env       map[string]string
		given     map[string]bool
		c         gcConfig
		wantP     int
		wantLimit int64
	}{
		{"defaults", nil, nil, gcConfig{percent: 400}, 400, 256<<20 + 2*1000*keyBytes},
		{"flags", nil, map[string]bool{"gc-percent": true, "memory-limit-mib": true}, gcConfig{percent: 150, limitMiB: 64}, 150, 64 << 20},
		{"environment kept", map[string]string{"GOGC": "80", "GOMEMLIMIT": "1GiB"}, nil, gcConfig{percent: 400}, p0, l0},
		{"flags over the environment", map[string]string{"GOGC": "80", "GOMEMLIMIT": "1GiB"}, map[string]bool{"gc-percent": true, "memory-limit-mib": true}, gcConfig{percent: 300, limitMiB: 100}, 300, 100 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			restore := tt.c.apply(tt.given, 1000)
			p, l := current()
			restore()
			if p != tt.wantP || l != tt.wantLimit {
				t.Errorf("set percent %d, limit %d; want %d, %d", p, l, tt.wantP, tt.wantLimit)
			}
			if p, l := current(); p != p0 || l != l0 {
				t.Errorf("restored percent %d, limit %d; want %d, %d", p, l, p0, l0)
			}
		})
	}
}
