// Package bench holds Sluice's comparative benchmarks and load tools: each
// benchmark here measures Sluice and a named baseline in the same run, so
// that bench/RESULTS.md can report ratios rather than absolutes.
package bench
