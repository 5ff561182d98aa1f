//go:build !race

package drain_test

const raceEnabled = false
