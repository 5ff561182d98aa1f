package rules

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestValues decodes each kind of scalar of a rule file with yaml.Unmarshal,
// which calls its UnmarshalYAML as it would for any document.
func TestValues(t *testing.T) {
	var (
		unit   Unit
		count  int64
		window time.Duration
		alg    ratelimit.Algorithm
		mode   ratelimit.FailureMode
		loc    *time.Location
		on     bool
		str    string
	)
	tests := []struct {
		in   string
		dst  yaml.Unmarshaler
		got  func() any // the decoded value, for inputs that decode
		want any
		err  string
		how  string // "soft" or "atKey": how the error is marked
	}{
		{in: "Minute", dst: (*unitName)(&unit), got: func() any { return unit }, want: Minute},
		{in: "fortnight", dst: (*unitName)(&unit), err: `invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		{in: "[second]", dst: (*unitName)(&unit), err: "want a string, got a list"},

		{in: "0", dst: (*quota)(&count), got: func() any { return count }, want: int64(0)},
		{in: "1099511627776", dst: (*quota)(&count), got: func() any { return count }, want: int64(ratelimit.MaxQuota)},
		{in: "1099511627777", dst: (*quota)(&count), err: "requests_per_unit 1099511627777 exceeds 1099511627776"},
		{in: "-1", dst: (*quota)(&count), err: "requests_per_unit -1 is negative"},
		{in: `"10"`, dst: (*quota)(&count), err: `want an integer, got "10"`},
		{in: "!!int 99999999999999999999", dst: (*quota)(&count), err: "integer 99999999999999999999 out of range"},
		{in: "1", dst: (*burst)(&count), got: func() any { return count }, want: int64(1)},
		{in: "0", dst: (*burst)(&count), err: "burst 0 must be at least 1 (omit it to mean requests_per_unit)"},
		{in: "1.5", dst: (*burst)(&count), err: "want an integer, got the number 1.5"},

		{in: "90m", dst: (*period)(&window), got: func() any { return window }, want: 90 * time.Minute},
		{in: "-5s", dst: (*period)(&window), err: "period -5s must be positive"},
		{in: "876001h", dst: (*period)(&window), err: "period 876001h exceeds 876000h0m0s"},
		{in: "10", dst: (*period)(&window), err: `invalid period "10": want a Go duration such as 1s, 90s or 1h30m`},

		{in: "leaky_bucket", dst: (*algorithmName)(&alg), got: func() any { return alg }, want: ratelimit.LeakyBucket},
		{in: "token_bucket", dst: (*algorithmName)(&alg), err: `invalid algorithm "token_bucket" (want gcra, fixed_window, sliding_log, sliding_window or leaky_bucket)`},
		{in: "local", dst: (*failureMode)(&mode), got: func() any { return mode }, want: ratelimit.FailLocal},
		{in: "fail_open", dst: (*failureMode)(&mode), got: func() any { return mode }, want: ratelimit.FailOpen},
		{in: "default", dst: (*failureMode)(&mode), err: `invalid failure_mode "default" (want fail_open, fail_closed or local)`},
		{in: "fail_maybe", dst: (*failureMode)(&mode), err: `invalid failure_mode "fail_maybe" (want fail_open, fail_closed or local)`},

		{in: "Europe/Paris", dst: &timezone{&loc}, got: func() any { return loc.String() }, want: "Europe/Paris"},
		{in: "Local", dst: &timezone{&loc}, err: `invalid timezone "Local": name an IANA zone such as Europe/Paris or UTC`},
		{in: "Mars/Olympus_Mons", dst: &timezone{&loc}, err: `unknown timezone "Mars/Olympus_Mons" (want an IANA zone such as Europe/Paris)`},

		{in: "TRUE", dst: (*boolean)(&on), got: func() any { return on }, want: true},
		{in: "yes", dst: (*boolean)(&on), err: `want true or false, got "yes"`, how: "soft"},
		{in: "!!bool yes", dst: (*boolean)(&on), err: `want true or false, got the boolean yes`, how: "soft"},

		{in: "30", dst: (*descriptorValue)(&str), got: func() any { return str }, want: "30"},
		{in: `""`, dst: (*descriptorKey)(&str), err: "descriptor has empty key", how: "atKey"},
		{in: strings.Repeat("v", MaxKeyValueBytes+1), dst: (*descriptorValue)(&str), err: "value is 257 bytes; the bound is 256 (MaxKeyValueBytes)", how: "atKey"},
		{in: "{a: b}", dst: (*text)(&str), err: "want a string, got a mapping"},
		{in: `""`, dst: (*ruleName)(&str), err: "empty name; remove the key to have one generated"},
	}
	for _, tt := range tests {
		err := yaml.Unmarshal([]byte(tt.in), tt.dst)
		if tt.err == "" {
			if err != nil {
				t.Errorf("%T %q: %v", tt.dst, tt.in, err)
			} else if got := tt.got(); got != tt.want {
				t.Errorf("%T %q = %v, want %v", tt.dst, tt.in, got, tt.want)
			}
			continue
		}
		if err == nil || err.Error() != tt.err {
			t.Errorf("%T %q: error %v, want %s", tt.dst, tt.in, err, tt.err)
			continue
		}
		how := ""
		if h := (*hint)(nil); errors.As(err, &h) {
			how = "atKey"
			if h.soft {
				how = "soft"
			}
		}
		if how != tt.how {
			t.Errorf("%T %q: error marked %q, want %q", tt.dst, tt.in, how, tt.how)
		}
	}
}
