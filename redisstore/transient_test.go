package redisstore

import (
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/concurrency"
)

// TestMarkTransient: the errors after which Redis may answer soon are
// concurrency.Transient once marked; the others are not, and marking
// keeps the error in the chain.
func TestMarkTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{redis.ErrPoolTimeout, true},
		{fmt.Errorf("x: %w", redis.ErrPoolTimeout), true},
		{redis.ErrPoolExhausted, true},
		{errors.New("LOADING Redis is loading the dataset in memory"), true},
		{errors.New("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT."), true},
		{errors.New("READONLY You can't write against a read only replica."), true},
		{errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{errExpired, true}, // a context.DeadlineExceeded: Transient unmarked
	} {
		got := markTransient(tc.err)
		if !errors.Is(got, tc.err) {
			t.Errorf("markTransient(%q) = %q lost the error", tc.err, got)
		}
		if concurrency.Transient(got) != tc.want {
			t.Errorf("concurrency.Transient(markTransient(%q)) = %v, want %v", tc.err, !tc.want, tc.want)
		}
	}
	if markTransient(nil) != nil {
		t.Error("markTransient(nil) is not nil")
	}
}
