package ratelimit

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func recordSeeds() [][]byte {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	rec, err := appendRecord(nil, 1234, []Reserved{
		{Key: "tenant/a", Rule: &Rule{Name: "g", Quota: 10, Period: time.Second, Burst: 20}, Estimate: 5, Tag: "0"},
		{Key: "b", Rule: &Rule{Name: "cal", Algorithm: FixedWindow, Quota: 100, Calendar: Month, Location: berlin, Counting: Batched}, Estimate: 1, Tag: "1/tokens"},
		{Key: "skipped", Rule: &Rule{Name: "g", Quota: 10, Period: time.Second}, Estimate: 0},
	})
	if err != nil {
		panic(err)
	}
	return [][]byte{rec, {}, {recordVersion}, rec[:len(rec)-1]}
}

// TestRecordRoundTrip: a record decodes to what was encoded, items with
// nothing to settle left out, and every truncation is an error.
func TestRecordRoundTrip(t *testing.T) {
	rec := recordSeeds()[0]
	var tab ruleTable
	at, items, err := tab.decodeRecord(rec)
	if err != nil || at != 1234 || len(items) != 2 {
		t.Fatalf("decodeRecord = %d, %+v, %v", at, items, err)
	}
	if items[1].Rule.Location.String() != "Europe/Berlin" || items[1].Rule.Counting != Batched || items[1].Tag != "1/tokens" || items[0].Rule.Burst != 20 {
		t.Fatalf("decoded %+v %+v", items[0].Rule, items[1].Rule)
	}
	for n := range len(rec) {
		if _, _, err := tab.decodeRecord(rec[:n]); !errors.Is(err, ErrBadReservation) {
			t.Fatalf("a record cut to %d of %d bytes decoded: %v", n, len(rec), err)
		}
	}
}

func TestReservationID(t *testing.T) {
	id := NewReservationID()
	if len(id) != 22 || CheckReservationID(id) != nil || id == NewReservationID() {
		t.Fatalf("NewReservationID = %q", id)
	}
	for _, bad := range []string{"", "a b", "a/b", "é", string(make([]byte, 65))} {
		if !errors.Is(CheckReservationID(bad), ErrBadReservation) {
			t.Errorf("CheckReservationID(%q) accepted", bad)
		}
	}
}

// TestSettling: the settling rule keeps the interval and windows, admits a
// charge far past the capacity, and is strict and fail-closed.
func TestSettling(t *testing.T) {
	for a := GCRA; a < numAlgorithms; a++ {
		r := &Rule{Name: a.String(), Algorithm: a, Quota: 10, Period: 10 * time.Second, Counting: Approximate}
		if !Approximate.Supports(a) {
			r.Counting = Strict
		}
		s := r.Settling()
		if err := s.Validate(); err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		if (a == GCRA || a == LeakyBucket) && s.Interval() != r.Interval() || s.Period != r.Period || s.Counting != Strict || s.Failure != FailClosed {
			t.Fatalf("%s: settling rule %+v", a, s)
		}
		most := int64(MaxQuota)
		switch a {
		case SlidingLog:
			most = MaxSlidingLogQuota
		case GCRA, LeakyBucket:
			most = int64(MaxSettleDebt / r.Interval())
		}
		if s.Capacity() != most {
			t.Fatalf("%s: settling capacity %d, want %d", a, s.Capacity(), most)
		}
		var st State
		now := time.Unix(0, 0)
		if d := s.Decide(&st, now, 1000); !d.Allowed {
			t.Fatalf("%s: a charge of 100× the capacity was denied: %+v", a, d)
		}
		if d := r.Decide(&st, now, 1); d.Allowed {
			t.Fatalf("%s: admitted after a debt of 1000", a)
		}
	}
	if z := (&Rule{Name: "z", Block: true}); z.Settling() != z {
		t.Fatal("a blocking rule's settling rule is not itself")
	}
}

// FuzzRecord: decodeRecord never panics, bounds what it reads, and what
// it accepts encodes back to the same bytes.
func FuzzRecord(f *testing.F) {
	for _, s := range recordSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		var tab ruleTable
		at, items, err := tab.decodeRecord(rec)
		if err != nil {
			if !errors.Is(err, ErrBadReservation) {
				t.Fatalf("error not wrapping ErrBadReservation: %v", err)
			}
			return
		}
		again, err := appendRecord(nil, at, items)
		if err != nil || !bytes.Equal(again, rec) {
			t.Fatalf("re-encoded %x (%v), decoded from %x", again, err, rec)
		}
	})
}
