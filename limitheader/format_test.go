package limitheader

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

func TestPolicyAndLimitItems(t *testing.T) {
	tests := []struct {
		rule       ratelimit.Rule
		d          ratelimit.Decision
		policy, rl string
	}{
		{
			rule:   ratelimit.Rule{Name: "per_ip", Algorithm: ratelimit.FixedWindow, Quota: 100, Period: time.Minute},
			d:      ratelimit.Decision{Rule: "per_ip", Remaining: 42, ResetAfter: 29*time.Second + time.Millisecond},
			policy: `"per_ip";q=100;w=60`, rl: `"per_ip";r=42;t=30`,
		},
		{
			rule:   ratelimit.Rule{Name: "burst", Quota: 10, Period: time.Second, Burst: 20},
			d:      ratelimit.Decision{Rule: "burst", Remaining: 0, ResetAfter: 1500 * time.Millisecond},
			policy: `"burst";q=20;w=2`, rl: `"burst";r=0;t=2`,
		},
		{
			rule:   ratelimit.Rule{Name: "monthly", Algorithm: ratelimit.FixedWindow, Quota: 5000, Calendar: ratelimit.Month},
			d:      ratelimit.Decision{Rule: "monthly", Remaining: 5000},
			policy: `"monthly";q=5000;w=2592000`, rl: `"monthly";r=5000;t=0`,
		},
		{
			rule:   ratelimit.Rule{Name: "we\"ird\\näme", Quota: 1, Period: time.Millisecond},
			d:      ratelimit.Decision{Rule: "we\"ird\\näme", Remaining: -1},
			policy: `"we\"ird\\n??me";q=1;w=1`, rl: `"we\"ird\\n??me";r=0;t=0`,
		},
	}
	for _, tt := range tests {
		if got := string(AppendPolicyItem(nil, tt.rule.Name, tt.rule.Capacity(), tt.rule.QuotaWindow())); got != tt.policy {
			t.Errorf("policy item = %s, want %s", got, tt.policy)
		}
		if got := string(AppendLimitItem(nil, tt.d.Rule, tt.d.Remaining, tt.d.ResetAfter)); got != tt.rl {
			t.Errorf("limit item = %s, want %s", got, tt.rl)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int64
	}{{time.Nanosecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {0, 1}, {90 * time.Second, 90}} {
		if got := RetryAfterSeconds(tt.d); got != tt.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}
