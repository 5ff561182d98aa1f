package limitheader

import (
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

func TestParseRateLimitPolicy(t *testing.T) {
	tests := []struct {
		in   string
		want []PolicyItem
		err  bool
	}{
		{in: ``, want: nil},
		{in: `"burst";q=100;w=60, "daily";q=1000;w=86400`, want: []PolicyItem{
			{Name: "burst", Quota: 100, Window: 60, QuotaUnit: "requests"},
			{Name: "daily", Quota: 1000, Window: 86400, QuotaUnit: "requests"},
		}},
		{in: `"b";q=5;qu="content-bytes";pk=:AQID:;x=?1;y=1.5`, want: []PolicyItem{
			{Name: "b", Quota: 5, QuotaUnit: "content-bytes", PartitionKey: []byte{1, 2, 3}},
		}},
		{in: `tok;q=1;q=2`, want: []PolicyItem{{Name: "tok", Quota: 2, QuotaUnit: "requests"}}},
		{in: `"e\"s\\c";q=0`, want: []PolicyItem{{Name: `e"s\c`, Quota: 0, QuotaUnit: "requests"}}},
		{in: `"a";w=1`, err: true},
		{in: `"a";q=-1`, err: true},
		{in: `"a";q=1.5`, err: true},
		{in: `"a";q=1,`, err: true},
		{in: `"a";q=1 "b";q=2`, err: true},
		{in: `("a" "b");q=1`, err: true},
		{in: `7;q=1`, err: true},
		{in: `"a";Q=1`, err: true},
		{in: `"a";q=1234567890123456`, err: true},
		{in: `"unterminated;q=1`, err: true},
	}
	for _, tt := range tests {
		got, err := ParseRateLimitPolicy(tt.in)
		if (err != nil) != tt.err || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseRateLimitPolicy(%q) = %+v, %v; want %+v (error %v)", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !errors.Is(err, ErrMalformedField) {
			t.Errorf("error %v does not wrap ErrMalformedField", err)
		}
	}
}

func TestParseRateLimit(t *testing.T) {
	tests := []struct {
		in   string
		want []LimitItem
		err  bool
	}{
		{in: `"burst";r=50;t=30`, want: []LimitItem{{Name: "burst", Remaining: 50, Reset: 30}}},
		{in: `"a";r=0,	"b";r=3;t=0;pk=:cGs=:`, want: []LimitItem{{Name: "a", Remaining: 0, Reset: -1}, {Name: "b", Remaining: 3, Reset: 0, PartitionKey: []byte("pk")}}},
		{in: `"a";t=1`, err: true},
		{in: `"a";r=1;t=-1`, err: true},
		{in: `"a";r="1"`, err: true},
	}
	for _, tt := range tests {
		got, err := ParseRateLimit(tt.in)
		if (err != nil) != tt.err || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseRateLimit(%q) = %+v, %v; want %+v (error %v)", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// TestFieldsRoundTrip: what the middleware writes, the client parses back.
func TestFieldsRoundTrip(t *testing.T) {
	r := ratelimit.Rule{Name: `we"ird`, Quota: 10, Period: time.Minute, Burst: 20}
	d := ratelimit.Decision{Rule: r.Name, Remaining: 7, ResetAfter: 1500 * time.Millisecond}
	ps, err := ParseRateLimitPolicy(string(AppendPolicyItem(nil, r.Name, r.Capacity(), r.QuotaWindow())))
	if err != nil || len(ps) != 1 || ps[0].Name != r.Name || ps[0].Quota != 20 || ps[0].Window != PolicyWindow(r.QuotaWindow()) {
		t.Errorf("policy round trip: %+v, %v", ps, err)
	}
	ls, err := ParseRateLimit(string(AppendLimitItem(nil, d.Rule, d.Remaining, d.ResetAfter)))
	if err != nil || len(ls) != 1 || ls[0].Name != r.Name || ls[0].Remaining != 7 || ls[0].Reset != 2 {
		t.Errorf("limit round trip: %+v, %v", ls, err)
	}
}

func TestRetryDelay(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
		ok     bool
	}{
		{"none", http.Header{}, 0, false},
		{"seconds", http.Header{"Retry-After": {"7"}}, 7 * time.Second, true},
		{"seconds zero", http.Header{"Retry-After": {"0"}}, 0, true},
		{"seconds spaces", http.Header{"Retry-After": {" 3 "}}, 3 * time.Second, true},
		{"seconds huge", http.Header{"Retry-After": {"99999999999999999999999"}}, 1<<63 - 1, true},
		{"negative", http.Header{"Retry-After": {"-5"}}, 0, false},
		{"date relative to Date", http.Header{
			"Retry-After": {"Mon, 30 Nov 2026 09:00:30 GMT"},
			"Date":        {"Mon, 30 Nov 2026 09:00:00 GMT"}, // an hour behind our clock
		}, 30 * time.Second, true},
		{"date without Date", http.Header{"Retry-After": {"Mon, 30 Nov 2026 10:00:12 GMT"}}, 12 * time.Second, true},
		{"date RFC 850", http.Header{"Retry-After": {"Monday, 30-Nov-26 10:00:05 GMT"}}, 5 * time.Second, true},
		{"date asctime", http.Header{"Retry-After": {"Mon Nov 30 10:00:04 2026"}}, 4 * time.Second, true},
		{"date in the past", http.Header{"Retry-After": {"Mon, 30 Nov 2026 09:59:00 GMT"}}, 0, true},
		{"garbage", http.Header{"Retry-After": {"soon"}}, 0, false},
		{"retry-after-ms", http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"9"}}, 250 * time.Millisecond, true},
		{"x-ms-retry-after-ms", http.Header{"X-Ms-Retry-After-Ms": {"1500"}}, 1500 * time.Millisecond, true},
		{"ms decimal", http.Header{"X-Ms-Retry-After-Ms": {"12.5"}}, 12500 * time.Microsecond, true},
		{"ms garbage falls back", http.Header{"X-Ms-Retry-After-Ms": {"abc"}, "Retry-After": {"2"}}, 2 * time.Second, true},
		{"ratelimit t", http.Header{"Ratelimit": {`"burst";r=0;t=4, "day";r=10;t=8000`}}, 4 * time.Second, true},
		{"ratelimit two exhausted", http.Header{"Ratelimit": {`"a";r=0;t=4`, `"b";r=0;t=9`}}, 9 * time.Second, true},
		{"ratelimit none exhausted", http.Header{"Ratelimit": {`"a";r=3;t=4`}}, 0, false},
		{"retry-after wins over t", http.Header{"Ratelimit": {`"a";r=0;t=4`}, "Retry-After": {"6"}}, 6 * time.Second, true},
		{"malformed ratelimit", http.Header{"Ratelimit": {`"a";r=0;t=`}}, 0, false},
		{"legacy seconds", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"42"}}, 42 * time.Second, true},
		{"legacy epoch", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {strconv.FormatInt(now.Unix()+9, 10)}}, 9 * time.Second, true},
		{"legacy epoch relative to Date", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {strconv.FormatInt(now.Unix()+9, 10)},
			"Date": {now.Add(5 * time.Second).Format(http.TimeFormat)}}, 4 * time.Second, true},
		{"legacy date", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {now.Add(3 * time.Second).Format(http.TimeFormat)}}, 3 * time.Second, true},
		{"legacy with quota left", http.Header{"X-Ratelimit-Remaining": {"5"}, "X-Ratelimit-Reset": {"42"}}, 0, false},
		{"ratelimit wins over legacy", http.Header{"Ratelimit": {`"a";r=0;t=4`}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"42"}}, 4 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RetryDelay(tt.header, now)
			if got != tt.want || ok != tt.ok {
				t.Errorf("RetryDelay = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestParseBounds: values over the bounds are malformed, just under them
// they parse.
func TestParseBounds(t *testing.T) {
	member := func(i int) string { return `"p` + strconv.Itoa(i) + `";q=1` }
	list := func(n int) string {
		ms := make([]string, n)
		for i := range ms {
			ms[i] = member(i)
		}
		return strings.Join(ms, ", ")
	}
	params := func(n int) string {
		var b strings.Builder
		b.WriteString(`"a";q=1`)
		for i := 1; i < n; i++ {
			b.WriteString(";x" + strconv.Itoa(i))
		}
		return b.String()
	}
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"members at the bound", list(maxMembers), true},
		{"members over the bound", list(maxMembers + 1), false},
		{"parameters at the bound", params(maxParams), true},
		{"parameters over the bound", params(maxParams + 1), false},
		{"repeated parameters count once", `"a";q=1` + strings.Repeat(";x", 2*maxParams), true},
		{"long value", `"` + strings.Repeat("n", maxFieldLen) + `";q=1`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRateLimitPolicy(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("ParseRateLimitPolicy(%d bytes) = %v, want ok %v", len(tt.in), err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrMalformedField) {
				t.Errorf("error %v does not wrap ErrMalformedField", err)
			}
		})
	}
}

func FuzzRetryAfter(f *testing.F) {
	f.Add("Retry-After", "120", "")
	f.Add("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:27:00 GMT")
	f.Add("Retry-After", "Sunday, 06-Nov-94 08:49:37 GMT", "")
	f.Add("Retry-After", "Sun Nov  6 08:49:37 1994", "garbage")
	f.Add("Retry-After-Ms", "12.345", "")
	f.Add("X-Ms-Retry-After-Ms", "99999999999999999999", "")
	f.Add("Ratelimit", `"a";r=0;t=5, "b";r=0;t=7`, "")
	f.Add("X-Ratelimit-Reset", "1800000000", "Wed, 21 Oct 2015 07:27:00 GMT")
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, name, value, date string) {
		h := http.Header{}
		h.Set(name, value)
		h.Set("X-Ratelimit-Remaining", "0")
		if date != "" {
			h.Set("Date", date)
		}
		d, ok := RetryDelay(h, now)
		if d < 0 {
			t.Fatalf("RetryDelay(%s: %q) = %v < 0", name, value, d)
		}
		if !ok && d != 0 {
			t.Fatalf("RetryDelay(%s: %q) = %v but not ok", name, value, d)
		}
		// Delay-seconds round-trips exactly.
		if n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64); err == nil && n >= 0 && n < 1<<33 &&
			http.CanonicalHeaderKey(name) == "Retry-After" && isDigits(strings.TrimSpace(value)) {
			if !ok || d != time.Duration(n)*time.Second {
				t.Fatalf("Retry-After %q = %v, %v; want %ds", value, d, ok, n)
			}
		}
	})
}

func FuzzRateLimitFields(f *testing.F) {
	f.Add(`"burst";q=100;w=60, "daily";q=1000;w=86400`)
	f.Add(`"burst";r=50;t=30`)
	f.Add(`"b";q=5;qu="content-bytes";pk=:AQID:;x=?1;y=1.5`)
	f.Add(`tok;r=0;t=1, "x";r=1`)
	f.Fuzz(func(t *testing.T, v string) {
		// Whatever parses re-serialises (for names that the writer can
		// represent) to a value that parses to the same items.
		if ps, err := ParseRateLimitPolicy(v); err == nil {
			var b []byte
			for i, p := range ps {
				if p.Window == 0 || !printable(p.Name) {
					return
				}
				if i > 0 {
					b = append(b, ", "...)
				}
				b = AppendPolicyName(b, p.Name)
				b = append(b, ";q="...)
				b = strconv.AppendInt(b, p.Quota, 10)
				b = append(b, ";w="...)
				b = strconv.AppendInt(b, p.Window, 10)
			}
			again, err := ParseRateLimitPolicy(string(b))
			if err != nil || len(again) != len(ps) {
				t.Fatalf("re-parse of %q: %v, %v", b, again, err)
			}
			for i := range ps {
				if again[i].Name != ps[i].Name || again[i].Quota != ps[i].Quota || again[i].Window != ps[i].Window {
					t.Fatalf("re-parse of %q: %+v, want %+v", b, again[i], ps[i])
				}
			}
		}
		if ls, err := ParseRateLimit(v); err == nil {
			for _, l := range ls {
				if l.Remaining < 0 || l.Reset < -1 {
					t.Fatalf("ParseRateLimit(%q) gave %+v", v, l)
				}
			}
		}
	})
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzHTTPDate: parseHTTPDate agrees with net/http.ParseTime, which it
// stands in for.
func FuzzHTTPDate(f *testing.F) {
	f.Add("Wed, 21 Oct 2015 07:28:00 GMT")
	f.Add("Sunday, 06-Nov-94 08:49:37 GMT")
	f.Add("Sun Nov  6 08:49:37 1994")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, v string) {
		got, gotErr := parseHTTPDate(v)
		want, wantErr := http.ParseTime(v)
		if (gotErr == nil) != (wantErr == nil) || !got.Equal(want) {
			t.Fatalf("parseHTTPDate(%q) = %v, %v; http.ParseTime = %v, %v", v, got, gotErr, want, wantErr)
		}
	})
}
