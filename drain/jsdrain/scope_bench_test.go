package jsdrain_test

import "github.com/sluicehq/sluice/drain"

// pauseScopes are the scopes BenchmarkRequests compares under 429s.
var pauseScopes = []string{"all", "partition"}

// setPauseScope sets o's PauseScope by name.
func setPauseScope(o *drain.Options, name string) {
	s, err := drain.ParsePauseScope(name)
	if err != nil {
		panic(err)
	}
	o.PauseScope = s
}
