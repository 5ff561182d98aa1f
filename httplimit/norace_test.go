//go:build !race

package httplimit_test

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
