package ratelimit

// For the external tests (package ratelimit_test).
var (
	CloneState  = State.clone
	StatesEqual = statesEqual
)
