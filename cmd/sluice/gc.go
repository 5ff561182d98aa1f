package main

import (
	"flag"
	"os"
	"runtime/debug"
)

// gcConfig is how serve's garbage collector trades memory for CPU.
//
// serve's own heap is small (a few MB, plus what the memory store's keys
// hold) and every decision allocates a little (gRPC's transport most of
// it), so at Go's default, a collection each time the heap doubles, the
// collector took a fifth of a loaded serve's CPU (bench/RESULTS.md §12).
// serve lets the heap grow by gcPercent (400: five times the live heap)
// between collections instead, within a soft memory limit past which the
// collector runs as often as it must: by default 256 MiB plus twice what
// --memory-max-keys keys take, so that a full memory store is never
// collected over and over. A GOGC or GOMEMLIMIT in the environment is
// kept unless its flag is given.
type gcConfig struct {
	percent  int
	limitMiB int
}

// addGCFlags registers the flags of c on fs.
func addGCFlags(fs *flag.FlagSet, c *gcConfig) {
	fs.IntVar(&c.percent, "gc-percent", 400, "heap growth between garbage collections, in percent of the live heap (Go's GOGC; 100 is Go's default): more memory for less CPU. A GOGC in the environment is kept unless this flag (or $SLUICE_GC_PERCENT) is given")
	fs.IntVar(&c.limitMiB, "memory-limit-mib", 0, "soft limit of the heap, in MiB (Go's GOMEMLIMIT): past it the collector runs as often as it must, whatever --gc-percent says (default 256 plus twice what --memory-max-keys keys take). A GOMEMLIMIT in the environment is kept unless this flag (or $SLUICE_MEMORY_LIMIT_MIB) is given")
}

// validate refuses a percent that is not positive and a negative limit.
func (c *gcConfig) validate() error {
	if c.percent <= 0 {
		return usagef("serve: --gc-percent must be positive")
	}
	if c.limitMiB < 0 {
		return usagef("serve: --memory-limit-mib must not be negative")
	}
	return nil
}

// keyBytes is about what the memory store holds per key.
const keyBytes = 132

// apply sets the collector's target and limit, except those the
// environment sets and fs does not (given, the flags fs was given), and
// returns what restores the previous settings.
func (c *gcConfig) apply(given map[string]bool, maxKeys int) (restore func()) {
	var undo []func()
	if given["gc-percent"] || os.Getenv("GOGC") == "" {
		prev := debug.SetGCPercent(c.percent)
		undo = append(undo, func() { debug.SetGCPercent(prev) })
	}
	if given["memory-limit-mib"] || os.Getenv("GOMEMLIMIT") == "" {
		limit := int64(c.limitMiB) << 20
		if limit == 0 {
			limit = 256<<20 + 2*int64(maxKeys)*keyBytes
		}
		prev := debug.SetMemoryLimit(limit)
		undo = append(undo, func() { debug.SetMemoryLimit(prev) })
	}
	return func() {
		for _, f := range undo {
			f()
		}
	}
}
