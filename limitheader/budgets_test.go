package limitheader

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// header builds an http.Header from lower-case field names, as they come
// over HTTP/2, canonicalising them as net/http does.
func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// The responses below are written for these tests in the shape of each
// service's documented fields; the instants are fixed.
var (
	annNow  = time.Date(2026, 12, 7, 9, 30, 0, 0, time.UTC)
	annDate = annNow.Format(http.TimeFormat)
)

func openAIResponse() http.Header {
	return header(
		"date", annDate,
		"x-ratelimit-limit-requests", "5000",
		"x-ratelimit-limit-tokens", "800000",
		"x-ratelimit-remaining-requests", "4999",
		"x-ratelimit-remaining-tokens", "799620",
		"x-ratelimit-reset-requests", "12ms",
		"x-ratelimit-reset-tokens", "28ms",
	)
}

func anthropicResponse() http.Header {
	return header(
		"date", annDate,
		"anthropic-ratelimit-requests-limit", "50",
		"anthropic-ratelimit-requests-remaining", "49",
		"anthropic-ratelimit-requests-reset", "2026-12-07T09:30:02Z",
		"anthropic-ratelimit-tokens-limit", "40000",
		"anthropic-ratelimit-tokens-remaining", "38000",
		"anthropic-ratelimit-tokens-reset", "2026-12-07T09:30:03Z",
		"anthropic-ratelimit-input-tokens-limit", "30000",
		"anthropic-ratelimit-input-tokens-remaining", "29000",
		"anthropic-ratelimit-input-tokens-reset", "2026-12-07T09:30:02Z",
		"anthropic-ratelimit-output-tokens-limit", "10000",
		"anthropic-ratelimit-output-tokens-remaining", "9000",
		"anthropic-ratelimit-output-tokens-reset", "2026-12-07T09:30:06Z",
	)
}

func TestParseAnnouncement(t *testing.T) {
	const u = Unknown
	tests := []struct {
		name    string
		h       http.Header
		want    Announcement
		errWith []string // each must appear in the error; none means no error
	}{
		{name: "nothing", h: header("content-type", "application/json"),
			want: Announcement{RetryAfter: u, Charge: u}},
		{name: "openai", h: openAIResponse(), want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{
			{DialectOpenAI, "requests", "requests", 5000, 4999, 12 * time.Millisecond, u},
			{DialectOpenAI, "tokens", "tokens", 800000, 799620, 28 * time.Millisecond, u},
		}}},
		{name: "openai long resets and a 429", h: header(
			"x-ratelimit-limit-requests", "200", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "6m0s",
			"x-ratelimit-limit-tokens", "40000", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "1h2m3.5s",
			"retry-after", "20", "retry-after-ms", "19875"),
			want: Announcement{RetryAfter: 19875 * time.Millisecond, Charge: u, Budgets: []Budget{
				{DialectOpenAI, "requests", "requests", 200, 0, 6 * time.Minute, u},
				{DialectOpenAI, "tokens", "tokens", 40000, 0, time.Hour + 2*time.Minute + 3500*time.Millisecond, u},
			}}},
		{name: "azure openai sentinels", h: header(
			"x-ratelimit-limit-requests", "-1", "x-ratelimit-remaining-requests", "0",
			"x-ratelimit-limit-tokens", "-1", "x-ratelimit-remaining-tokens", "-1", "x-ratelimit-reset-tokens", "-1"),
			want: Announcement{RetryAfter: u, Charge: u}},
		{name: "openai remaining only, no reset", h: header("x-ratelimit-remaining-tokens", "17"),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectOpenAI, "tokens", "tokens", u, 17, u, u}}}},
		{name: "openai malformed fields", h: header(
			"x-ratelimit-limit-requests", "lots", "x-ratelimit-remaining-requests", "-4",
			"x-ratelimit-reset-requests", "-6s",
			"x-ratelimit-limit-tokens", "99999999999999999999", "x-ratelimit-remaining-tokens", "10",
			"x-ratelimit-reset-tokens", "9999999h"),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectOpenAI, "tokens", "tokens", u, 10, u, u}}},
			errWith: []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
				"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Reset-Tokens"}},
		{name: "anthropic", h: anthropicResponse(), want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{
			{DialectAnthropic, "requests", "requests", 50, 49, 2 * time.Second, u},
			{DialectAnthropic, "tokens", "tokens", 40000, 38000, 3 * time.Second, u},
			{DialectAnthropic, "input-tokens", "tokens", 30000, 29000, 2 * time.Second, u},
			{DialectAnthropic, "output-tokens", "tokens", 10000, 9000, 6 * time.Second, u},
		}}},
		{name: "anthropic 429, resets relative to Date", h: header(
			"date", annNow.Add(-time.Hour).Format(http.TimeFormat), // the server's clock is an hour behind
			"anthropic-ratelimit-output-tokens-limit", "8000", "anthropic-ratelimit-output-tokens-remaining", "0",
			"anthropic-ratelimit-output-tokens-reset", "2026-12-07T08:30:07.5Z",
			"anthropic-ratelimit-requests-reset", "2026-12-07T08:29:00+00:00", // past: full now
			"retry-after", "8"),
			want: Announcement{RetryAfter: 8 * time.Second, Charge: u, Budgets: []Budget{
				{DialectAnthropic, "requests", "requests", u, u, 0, u},
				{DialectAnthropic, "output-tokens", "tokens", 8000, 0, 7500 * time.Millisecond, u},
			}}},
		{name: "anthropic reset relative to now without Date", h: header(
			"anthropic-ratelimit-input-tokens-reset", "2026-12-07T10:30:05+01:00"),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectAnthropic, "input-tokens", "tokens", u, u, 5 * time.Second, u}}}},
		{name: "anthropic malformed reset", h: header(
			"anthropic-ratelimit-tokens-remaining", "5", "anthropic-ratelimit-tokens-reset", "in 5 seconds"),
			want:    Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectAnthropic, "tokens", "tokens", u, 5, u, u}}},
			errWith: []string{"Anthropic-Ratelimit-Tokens-Reset", "RFC 3339"}},
		{name: "ietf joined by name", h: header(
			"ratelimit-policy", `"burst";q=100;w=60, "daily";q=1000;w=86400;qu="content-bytes"`,
			"ratelimit-policy", `"hourly";q=500;w=3600`,
			"ratelimit", `"daily";r=400;t=7200, "burst";r=50;t=30`,
			"ratelimit", `"other";r=3`),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{
				{DialectIETF, "burst", "requests", 100, 50, 30 * time.Second, time.Minute},
				{DialectIETF, "daily", "content-bytes", 1000, 400, 2 * time.Hour, 24 * time.Hour},
				{DialectIETF, "hourly", "requests", 500, u, u, time.Hour},
				{DialectIETF, "other", "requests", u, 3, u, u},
			}}},
		{name: "ietf first member of a name wins", h: header(
			"ratelimit-policy", `"a";q=10;w=1, "a";q=20;w=2`, "ratelimit", `"a";r=1;t=1, "a";r=2;t=2`),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectIETF, "a", "requests", 10, 1, time.Second, time.Second}}}},
		{name: "ietf malformed RateLimit ignored as a whole", h: header(
			"ratelimit-policy", `"a";q=10;w=1`, "ratelimit", `"a";r=1;t=-1`),
			want:    Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectIETF, "a", "requests", 10, u, u, time.Second}}},
			errWith: []string{"RateLimit: limitheader: malformed structured field"}},
		{name: "ietf older draft", h: header(
			"ratelimit-limit", "100, 100;w=60, 1000;w=3600", "ratelimit-remaining", "42", "ratelimit-reset", "17"),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectIETFOld, "", "requests", 100, 42, 17 * time.Second, time.Minute}}}},
		{name: "ietf older draft, reset an instant", h: header(
			"date", annDate, "ratelimit-remaining", "0", "ratelimit-reset", annNow.Add(time.Minute).Format(http.TimeFormat)),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectIETFOld, "", "requests", u, 0, time.Minute, u}}}},
		{name: "x-ratelimit with an epoch reset", h: header(
			"date", annDate, "x-ratelimit-limit", "60", "x-ratelimit-remaining", "0", "x-ratelimit-reset", "1796635845"),
			want: Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectXRateLimit, "", "requests", 60, 0, 45 * time.Second, u}}}},
		{name: "older forms malformed", h: header(
			"ratelimit-limit", "100;w=x", "ratelimit-remaining", "1", "ratelimit-reset", "99999999999999999",
			"x-ratelimit-reset", "tomorrow"),
			want:    Announcement{RetryAfter: u, Charge: u, Budgets: []Budget{{DialectIETFOld, "", "requests", u, 1, u, u}}},
			errWith: []string{"Ratelimit-Limit", "Ratelimit-Reset", "X-Ratelimit-Reset"}},
		{name: "cosmos db", h: header("x-ms-request-charge", "5.71", "x-ms-retry-after-ms", "1250"),
			want: Announcement{RetryAfter: 1250 * time.Millisecond, Charge: 5.71}},
		{name: "cosmos db whole charge", h: header("x-ms-request-charge", "10"),
			want: Announcement{RetryAfter: u, Charge: 10}},
		{name: "cosmos db malformed", h: header("x-ms-request-charge", "1e3", "x-ms-retry-after-ms", "soon", "retry-after", "2"),
			want: Announcement{RetryAfter: 2 * time.Second, Charge: u}, errWith: []string{"X-Ms-Request-Charge"}},
		{name: "retry-after date", h: header("date", annDate, "retry-after", annNow.Add(90*time.Second).Format(http.TimeFormat)),
			want: Announcement{RetryAfter: 90 * time.Second, Charge: u}},
		{name: "retry-after malformed", h: header("retry-after", "-3"),
			want: Announcement{RetryAfter: u, Charge: u}, errWith: []string{"Retry-After"}},
		{name: "over-long value", h: header("x-ratelimit-remaining-tokens", strings.Repeat("1", 300)),
			want: Announcement{RetryAfter: u, Charge: u}, errWith: []string{"X-Ratelimit-Remaining-Tokens", "…"}},
		{name: "empty values are absent", h: header("x-ratelimit-remaining-tokens", "", "retry-after", " ", "x-ms-request-charge", ""),
			want: Announcement{RetryAfter: u, Charge: u}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAnnouncement(tt.h, annNow)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseAnnouncement =\n%+v\nwant\n%+v", got, tt.want)
			}
			if len(tt.errWith) == 0 {
				if err != nil {
					t.Errorf("error %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %q", tt.errWith)
			}
			if !errors.Is(err, ErrMalformedValue) && !errors.Is(err, ErrMalformedField) {
				t.Errorf("error %v wraps neither ErrMalformedValue nor ErrMalformedField", err)
			}
			for _, s := range tt.errWith {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestAnnouncementBudget(t *testing.T) {
	a, err := ParseAnnouncement(anthropicResponse(), annNow)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := a.Budget("output-tokens"); !ok || b.Remaining != 9000 {
		t.Errorf("Budget(output-tokens) = %+v, %v", b, ok)
	}
	if b, ok := a.Budget("images"); ok {
		t.Errorf("Budget(images) = %+v, want none", b)
	}
}

func TestDialectString(t *testing.T) {
	for d, want := range map[Dialect]string{DialectIETF: "ietf", DialectIETFOld: "ietf-old", DialectXRateLimit: "x-ratelimit",
		DialectOpenAI: "openai", DialectAnthropic: "anthropic", 0: "dialect(0)"} {
		if got := d.String(); got != want {
			t.Errorf("Dialect(%d).String() = %q, want %q", d, got, want)
		}
	}
}

// FuzzAnnouncement: whatever a response holds, ParseAnnouncement neither
// panics nor announces a value that is negative without being Unknown, and
// a value it reads as unknown it reads so without an error only for the
// sentinels.
func FuzzAnnouncement(f *testing.F) {
	for _, h := range []http.Header{openAIResponse(), anthropicResponse()} {
		for name, vs := range h {
			f.Add(name, vs[0], annDate)
		}
	}
	f.Add("Ratelimit", `"a";r=1;t=2`, "")
	f.Add("Ratelimit-Policy", `"a";q=10;w=1`, "")
	f.Add("Ratelimit-Limit", "100, 100;w=60", "")
	f.Add("X-Ratelimit-Reset", "1796635845", annDate)
	f.Add("X-Ms-Request-Charge", "5.71", "")
	f.Add("Retry-After", "Mon, 07 Dec 2026 09:31:00 GMT", annDate)
	f.Add("X-Ratelimit-Reset-Tokens", "1h2m3.5s", "")
	f.Fuzz(func(t *testing.T, name, value, date string) {
		h := anthropicResponse()
		h.Set("Date", date)
		h.Set(name, value)
		h.Set("Ratelimit-Policy", `"a";q=10;w=1`)
		a, err := ParseAnnouncement(h, annNow)
		if a.RetryAfter < Unknown || a.Charge < Unknown || (a.Charge < 0 && a.Charge != Unknown) {
			t.Fatalf("%s: %q: RetryAfter %v, Charge %v", name, value, a.RetryAfter, a.Charge)
		}
		for _, b := range a.Budgets {
			if b.Limit < Unknown || b.Remaining < Unknown || b.Reset < Unknown || b.Window < Unknown {
				t.Fatalf("%s: %q: %+v", name, value, b)
			}
			if b.Limit < 0 && b.Remaining < 0 && b.Reset < 0 && b.Window < 0 {
				t.Fatalf("%s: %q: a budget of which nothing is known: %+v", name, value, b)
			}
		}
		if err != nil && !errors.Is(err, ErrMalformedValue) && !errors.Is(err, ErrMalformedField) {
			t.Fatalf("%s: %q: error %v wraps neither error", name, value, err)
		}
		// The other dimensions are read whatever this field holds.
		if b, ok := a.Budget("input-tokens"); http.CanonicalHeaderKey(name) != "Anthropic-Ratelimit-Input-Tokens-Limit" &&
			http.CanonicalHeaderKey(name) != "Anthropic-Ratelimit-Input-Tokens-Remaining" &&
			(!ok || b.Remaining != 29000) {
			t.Fatalf("%s: %q: input-tokens lost: %+v, %v", name, value, b, ok)
		}
	})
}

func BenchmarkParseAnnouncement(b *testing.B) {
	for _, bc := range []struct {
		name string
		h    http.Header
	}{{"openai", openAIResponse()}, {"anthropic", anthropicResponse()}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseAnnouncement(bc.h, annNow); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
