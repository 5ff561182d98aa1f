//go:build race

package drain_test

// raceEnabled reports whether the test binary has the race detector, which
// multiplies the CPU cost of every loopback HTTP request several times.
const raceEnabled = true
