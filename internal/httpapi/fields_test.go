package httpapi

import (
	"strings"
	"testing"
)

// TestAnswerFields checks the RateLimit and Retry-After values that
// share one allocation, in the buffer and past it (a long list of limits).
func TestAnswerFields(t *testing.T) {
	long := strings.Repeat(`"api.tenant.user.second";r=0;t=1, `, 5)
	for _, tt := range []struct {
		limit string
		retry int64
		want  string // Retry-After; "" when not set
	}{
		{`"bench.remote_address.hour";r=0;t=3599`, 3599, "3599"},
		{`"bench.remote_address.second";r=999;t=1`, 0, ""},
		{long, 7, "7"},
		{long, 0, ""},
		{strings.Repeat("x", 118), 3600, "3600"}, // the number crosses the end of buf
	} {
		f := newAnswerFields([]byte(tt.limit), tt.retry)
		if f.limit[0] != tt.limit || f.retry[0] != tt.want {
			t.Errorf("newAnswerFields(%q, %d) = %q, %q; want %q, %q", tt.limit, tt.retry, f.limit[0], f.retry[0], tt.limit, tt.want)
		}
	}
}
