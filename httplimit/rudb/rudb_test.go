package rudb

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"
)

// TestDBWindows: a window admits its budget, refuses the rest with the
// milliseconds to its end, charges nothing for a refusal, and the next
// window starts afresh.
func TestDBWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &DB{Budget: 30, WriteCost: 10}
		time.Sleep(250 * time.Millisecond) // a quarter into a window (synctest starts on a second)
		send := func(method string) (int, string) {
			rec := httptest.NewRecorder()
			db.ServeHTTP(rec, httptest.NewRequest(method, "/items", nil))
			return rec.Code, rec.Header().Get("X-Ms-Retry-After-Ms")
		}
		type step struct {
			method string
			code   int
			retry  string
		}
		for i, s := range []step{
			{"POST", 201, ""}, {"POST", 201, ""}, {"GET", 200, ""},
			{"POST", 429, "750"}, {"GET", 200, ""}, {"GET", 200, ""}, {"GET", 200, ""},
			{"GET", 200, ""}, {"GET", 200, ""}, {"GET", 200, ""}, {"GET", 200, ""}, {"GET", 200, ""},
			{"GET", 200, ""}, {"GET", 429, "750"},
		} {
			if code, retry := send(s.method); code != s.code || retry != s.retry {
				t.Fatalf("step %d %s: %d (retry %q), want %d (%q)", i, s.method, code, retry, s.code, s.retry)
			}
		}
		time.Sleep(750 * time.Millisecond)
		if code, _ := send(http.MethodPost); code != 201 {
			t.Errorf("new window: %d, want 201", code)
		}
		if st := db.Stats(); st != (Stats{Requests: 15, Throttled: 2, Written: 3, RU: 40}) {
			t.Errorf("stats = %+v", st)
		}
	})
}

// TestDBIdempotent: a write whose key was written before is answered 200
// and marked replayed, at no cost; a refused write is not remembered, so
// its resend takes effect; writes without a key are not deduplicated.
func TestDBIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &DB{Budget: 20, WriteCost: 10, Idempotent: true}
		send := func(key string) (int, string) {
			req := httptest.NewRequest(http.MethodPost, "/items", nil)
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			rec := httptest.NewRecorder()
			db.ServeHTTP(rec, req)
			return rec.Code, rec.Header().Get(ReplayedHeader)
		}
		type step struct {
			key      string
			code     int
			replayed string
		}
		for i, s := range []step{
			{"a", 201, ""}, {"a", 200, "true"}, {"b", 201, ""}, {"c", 429, ""}, {"a", 200, "true"},
		} {
			if code, rep := send(s.key); code != s.code || rep != s.replayed {
				t.Fatalf("step %d key %q: %d (replayed %q), want %d (%q)", i, s.key, code, rep, s.code, s.replayed)
			}
		}
		time.Sleep(time.Second)
		for i, s := range []step{{"c", 201, ""}, {"", 201, ""}, {"", 429, ""}, {"c", 200, "true"}} {
			if code, rep := send(s.key); code != s.code || rep != s.replayed {
				t.Fatalf("next window, step %d key %q: %d (replayed %q), want %d (%q)", i, s.key, code, rep, s.code, s.replayed)
			}
		}
		if st := db.Stats(); st != (Stats{Requests: 9, Throttled: 2, Written: 4, Replayed: 3, RU: 40}) {
			t.Errorf("stats = %+v", st)
		}
	})
}

// TestDBChargeDrawn: with WriteCostMax, each write costs a whole number of
// RU from WriteCost to WriteCostMax, both reached, said in
// x-ms-request-charge and summed in Stats.RU; the draws are uniform (each
// of the 11 values within a third of its expected count), and the same
// Seed draws the same charges.
func TestDBChargeDrawn(t *testing.T) {
	charges := func(seed uint64) []int {
		db := &DB{Budget: 1 << 40, Window: time.Hour, WriteCost: 5, WriteCostMax: 15, Seed: seed}
		var got []int
		sum := 0
		for range 11000 {
			rec := httptest.NewRecorder()
			db.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/items", nil))
			if rec.Code != http.StatusCreated {
				t.Fatalf("write answered %d", rec.Code)
			}
			c, err := strconv.Atoi(rec.Header().Get("X-Ms-Request-Charge"))
			if err != nil || c < 5 || c > 15 {
				t.Fatalf("charge %q (%v), want 5 to 15", rec.Header().Get("X-Ms-Request-Charge"), err)
			}
			got = append(got, c)
			sum += c
		}
		if st := db.Stats(); st.RU != int64(sum) || st.Written != 11000 {
			t.Errorf("stats %+v, want RU %d and 11000 written", st, sum)
		}
		return got
	}
	a := charges(7)
	counts := map[int]int{}
	for _, c := range a {
		counts[c]++
	}
	for c := 5; c <= 15; c++ {
		if counts[c] < 667 || counts[c] > 1333 {
			t.Errorf("charge %d drawn %d times in 11,000, want about 1,000", c, counts[c])
		}
	}
	if b := charges(7); !slices.Equal(a, b) {
		t.Error("the same seed drew other charges")
	}
	if b := charges(8); slices.Equal(a, b) {
		t.Error("another seed drew the same charges")
	}
}
