package ratelimit

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestInterval checks the emission interval: Period/Limit rounded up, at
// least 1 ns, never when Limit is 0.
func TestInterval(t *testing.T) {
	tests := []struct {
		rule Rule
		want time.Duration
	}{
		{Rule{Quota: 4, Period: time.Second}, 250 * time.Millisecond},
		{Rule{Quota: 3, Period: time.Second}, 333333334},
		{Rule{Quota: 1, Period: MaxPeriod}, MaxPeriod},
		{Rule{Quota: 10, Period: 5}, 1},
		{Rule{Quota: MaxQuota, Period: 1}, 1},
		{Rule{Algorithm: LeakyBucket, Quota: 7, Period: time.Minute, Burst: 100}, 8571428572},
		{Rule{Quota: 0, Period: time.Second}, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := tt.rule.Interval(); got != tt.want {
			t.Errorf("%+v: Interval() = %d; want %d", tt.rule, got, tt.want)
		}
	}
}

// TestWindow checks the window that holds an instant, epoch-aligned or
// calendar, through DST changes and half-hour offsets, and that it is the
// window a FixedWindow rule counts in: the state of one admitted unit starts
// at start and resets at end.
func TestWindow(t *testing.T) {
	ny := loadLocation(t, "America/New_York")
	kolkata := loadLocation(t, "Asia/Kolkata")
	utc := func(y int, m time.Month, d, h, min int) time.Time { return time.Date(y, m, d, h, min, 0, 0, time.UTC) }
	fixed := func(c Calendar, loc *time.Location) Rule {
		return Rule{Algorithm: FixedWindow, Quota: 5, Calendar: c, Location: loc}
	}
	tests := []struct {
		name       string
		rule       Rule
		now        time.Time
		start, end time.Time
	}{
		{"fixed_minute", Rule{Algorithm: FixedWindow, Quota: 5, Period: time.Minute}, epoch0.Add(90 * time.Second), epoch0.Add(time.Minute), epoch0.Add(2 * time.Minute)},
		{"fixed_at_start", Rule{Algorithm: FixedWindow, Quota: 5, Period: time.Minute}, epoch0, epoch0, epoch0.Add(time.Minute)},
		{"fixed_before_epoch", Rule{Algorithm: FixedWindow, Quota: 5, Period: time.Second}, time.Unix(0, -5e8), time.Unix(-1, 0), time.Unix(0, 0)},
		{"sliding", Rule{Algorithm: SlidingWindow, Quota: 5, Period: 10 * time.Second}, epoch0.Add(25 * time.Second), epoch0.Add(20 * time.Second), epoch0.Add(30 * time.Second)},
		{"minute_kolkata", fixed(Minute, kolkata), utc(2026, 1, 1, 0, 10).Add(30 * time.Second), utc(2026, 1, 1, 0, 10), utc(2026, 1, 1, 0, 11)},
		{"hour_kolkata", fixed(Hour, kolkata), utc(2026, 1, 1, 0, 10), utc(2025, 12, 31, 23, 30), utc(2026, 1, 1, 0, 30)},
		{"hour_dst_spring", fixed(Hour, ny), utc(2026, 3, 8, 7, 30), utc(2026, 3, 8, 7, 0), utc(2026, 3, 8, 8, 0)},
		{"day_dst_spring", fixed(Day, ny), utc(2026, 3, 8, 16, 0), utc(2026, 3, 8, 5, 0), utc(2026, 3, 9, 4, 0)},
		{"day_dst_autumn", fixed(Day, ny), utc(2026, 11, 1, 16, 0), utc(2026, 11, 1, 4, 0), utc(2026, 11, 2, 5, 0)},
		{"week_utc", fixed(Week, nil), utc(2026, 1, 1, 12, 0), utc(2025, 12, 29, 0, 0), utc(2026, 1, 5, 0, 0)},
		{"month_new_york", fixed(Month, ny), utc(2026, 2, 15, 12, 0), utc(2026, 2, 1, 5, 0), utc(2026, 3, 1, 5, 0)},
		{"month_new_york_dst", fixed(Month, ny), utc(2026, 3, 31, 12, 0), utc(2026, 3, 1, 5, 0), utc(2026, 4, 1, 4, 0)},
		{"year_utc", fixed(Year, nil), utc(2026, 6, 1, 0, 0), utc(2026, 1, 1, 0, 0), utc(2027, 1, 1, 0, 0)},
		{"year_new_york_now_in_kolkata", fixed(Year, ny), utc(2026, 1, 1, 4, 0).In(kolkata), utc(2025, 1, 1, 5, 0), utc(2026, 1, 1, 5, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.rule.Validate(); err != nil {
				t.Fatal(err)
			}
			start, end := tt.rule.Window(tt.now)
			if !start.Equal(tt.start) || !end.Equal(tt.end) {
				t.Errorf("Window(%v) = [%v, %v); want [%v, %v)", tt.now, start.UTC(), end.UTC(), tt.start, tt.end)
			}
			if start.Location() != tt.now.Location() || end.Location() != tt.now.Location() {
				t.Errorf("Window(%v) in %v and %v; want now's location %v", tt.now, start.Location(), end.Location(), tt.now.Location())
			}
			if tt.rule.Algorithm != FixedWindow || tt.now.UnixNano() < 0 {
				return // a fresh State is answered at its instant 0 at the earliest
			}
			var s State
			d := tt.rule.Decide(&s, tt.now, 1)
			if s.T != start.UnixNano() || tt.now.Add(d.ResetAfter) != end {
				t.Errorf("Decide(%v, 1) counts from %d, resets after %v; want from %d (start), until %v (end)",
					tt.now, s.T, d.ResetAfter, start.UnixNano(), end)
			}
		})
	}
}

func TestQuotaWindow(t *testing.T) {
	tests := []struct {
		r    Rule
		want time.Duration
	}{
		{Rule{Algorithm: FixedWindow, Quota: 100, Period: time.Minute}, time.Minute},
		{Rule{Algorithm: SlidingLog, Quota: 5, Period: 3 * time.Second}, 3 * time.Second},
		{Rule{Quota: 10, Period: time.Second}, time.Second},                        // GCRA: capacity = quota
		{Rule{Quota: 10, Period: time.Second, Burst: 25}, 2500 * time.Millisecond}, // 25 units at 10/s
		{Rule{Algorithm: LeakyBucket, Quota: 2, Period: time.Minute, Burst: 1}, 30 * time.Second},
		{Rule{Quota: 0, Period: time.Second}, 0},
		{Rule{Algorithm: FixedWindow, Quota: 5000, Calendar: Month}, 30 * 24 * time.Hour},
		{Rule{Algorithm: FixedWindow, Quota: 1, Calendar: Year}, 365 * 24 * time.Hour},
	}
	for _, tt := range tests {
		if got := tt.r.QuotaWindow(); got != tt.want {
			t.Errorf("%+v: QuotaWindow() = %v, want %v", tt.r, got, tt.want)
		}
	}
}

func loadLocation(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Skipf("time zone database: %v", err)
	}
	return loc
}

func TestCounting(t *testing.T) {
	for c := Strict; c < numCountings; c++ {
		got, err := ParseCounting(c.String())
		if err != nil || got != c {
			t.Errorf("ParseCounting(%q) = %v, %v", c, got, err)
		}
	}
	if _, err := ParseCounting("exact"); err == nil {
		t.Error("ParseCounting(exact): no error")
	}
	want := map[Counting][]Algorithm{
		Strict:      {GCRA, FixedWindow, SlidingLog, SlidingWindow, LeakyBucket},
		Batched:     {GCRA, FixedWindow, LeakyBucket},
		Approximate: {GCRA, LeakyBucket},
	}
	for c := Strict; c <= numCountings; c++ {
		for a := GCRA; a <= numAlgorithms; a++ {
			if got, w := c.Supports(a), slices.Contains(want[c], a); got != w {
				t.Errorf("%s.Supports(%s) = %v, want %v", c, a, got, w)
			}
		}
	}
}
