package fence

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestMiddleware sends a sequence of requests through a Guard's
// middleware and checks each answer, and that the handler ran exactly
// for those admitted.
func TestMiddleware(t *testing.T) {
	var g Guard
	calls := 0
	h := g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++ }))
	steps := []struct {
		name   string
		header http.Header
		want   int
	}{
		{"first token of a resource", fenced("db", 5), http.StatusOK},
		{"the same token again", fenced("db", 5), http.StatusOK},
		{"a stale token", fenced("db", 4), http.StatusConflict},
		{"a newer token", fenced("db", 7), http.StatusOK},
		{"the old highest, now stale", fenced("db", 5), http.StatusConflict},
		{"another resource is separate", fenced("queue", 1), http.StatusOK},
		{"resource names are exact", fenced("DB", 1), http.StatusOK},
		{"no header", http.Header{}, http.StatusPreconditionRequired},
		{"no resource", http.Header{Header: {"9"}}, http.StatusPreconditionRequired},
		{"no token", http.Header{ResourceHeader: {"db"}}, http.StatusPreconditionRequired},
		{"token with a leading zero", http.Header{Header: {"09"}, ResourceHeader: {"db"}}, http.StatusBadRequest},
		{"token zero", http.Header{Header: {"0"}, ResourceHeader: {"db"}}, http.StatusBadRequest},
		{"token negative", http.Header{Header: {"-9"}, ResourceHeader: {"db"}}, http.StatusBadRequest},
		{"token above 2^64-1", http.Header{Header: {"18446744073709551616"}, ResourceHeader: {"db"}}, http.StatusBadRequest},
		{"two tokens", http.Header{Header: {"8", "9"}, ResourceHeader: {"db"}}, http.StatusBadRequest},
		{"two resources", http.Header{Header: {"9"}, ResourceHeader: {"db", "queue"}}, http.StatusBadRequest},
		{"broken escape", http.Header{Header: {"9"}, ResourceHeader: {"d%zb"}}, http.StatusBadRequest},
		{"malformed, not admitted", fenced("db", 7), http.StatusOK},
	}
	wantCalls := 0
	for _, s := range steps {
		req := httptest.NewRequest(http.MethodPost, "/write", nil)
		req.Header = s.header
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != s.want {
			t.Fatalf("%s: status %d, want %d (%s)", s.name, rec.Code, s.want, rec.Body)
		}
		if s.want == http.StatusOK {
			wantCalls++
		} else {
			checkProblem(t, s.name, rec)
		}
		if calls != wantCalls {
			t.Fatalf("%s: handler called %d times in all, want %d", s.name, calls, wantCalls)
		}
	}
	if st := g.Stats(); st.Refused != 2 || st.Resources != 3 || st.Forgotten != 0 {
		t.Fatalf("Stats = %+v, want 2 refused, 3 resources, none forgotten", st)
	}
}

func fenced(resource string, token uint64) http.Header {
	h := http.Header{}
	Set(h, resource, token)
	return h
}

// checkProblem checks that rec is a problem+json answer that repeats its
// status.
func checkProblem(t *testing.T, step string, rec *httptest.ResponseRecorder) {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%s: Content-Type %q", step, ct)
	}
	var p struct {
		Status int
		Detail string
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != rec.Code || p.Detail == "" {
		t.Fatalf("%s: body %s (%v), want a problem of status %d with a detail", step, rec.Body, err, rec.Code)
	}
}

// TestGuardForgetsLeastRecentlySeen: beyond MaxResources the Guard forgets
// the resource seen longest ago, which then accepts any token once.
func TestGuardForgetsLeastRecentlySeen(t *testing.T) {
	g := Guard{MaxResources: 2}
	for _, r := range []string{"a", "b"} {
		if err := g.Admit(r, 10); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Admit("a", 3); !errors.Is(err, ErrStale) { // a seen last, b first
		t.Fatalf("Admit(a, 3) = %v, want ErrStale", err)
	}
	if err := g.Admit("c", 1); err != nil { // forgets b
		t.Fatal(err)
	}
	if _, ok := g.Highest("b"); ok {
		t.Fatal("b remembered beyond MaxResources")
	}
	if h, ok := g.Highest("a"); !ok || h != 10 {
		t.Fatalf("Highest(a) = %d, %v; want 10, true", h, ok)
	}
	if err := g.Admit("b", 1); err != nil {
		t.Fatalf("a forgotten resource refused a token: %v", err)
	}
	if st := g.Stats(); st.Resources != 2 || st.Forgotten != 2 || st.Refused != 1 {
		t.Fatalf("Stats = %+v, want 2 resources, 2 forgotten, 1 refused", st)
	}
}

// TestGuardConcurrent: tokens admitted from many goroutines leave the
// highest as the highest, and every token below a highest already
// recorded is refused.
func TestGuardConcurrent(t *testing.T) {
	var g Guard
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				tok := uint64(i*8 + w + 1)
				if err := g.Admit("r", tok); err != nil {
					if h, _ := g.Highest("r"); h <= tok || !errors.Is(err, ErrStale) {
						t.Errorf("Admit(%d) = %v with highest %d", tok, err, h)
					}
				}
			}
		})
	}
	wg.Wait()
	if h, _ := g.Highest("r"); h != 200*8 {
		t.Fatalf("highest %d, want %d", h, 200*8)
	}
}

// TestSetParse: what Set writes, Parse reads back, for resources of any
// bytes; a resource too long is refused.
func TestSetParse(t *testing.T) {
	for _, r := range []string{"db", "a/b", "tenant 7: writes", "100%", "é", "\xff\x00", "+", strings.Repeat("x", MaxResourceLen)} {
		for _, tok := range []uint64{1, 42, math.MaxUint64} {
			got, gotTok, err := Parse(fenced(r, tok))
			if err != nil || got != r || gotTok != tok {
				t.Fatalf("Parse(Set(%q, %d)) = %q, %d, %v", r, tok, got, gotTok, err)
			}
		}
	}
	for _, r := range []string{"", strings.Repeat("x", MaxResourceLen+1), strings.Repeat("\xff", MaxResourceLen+1)} {
		if _, _, err := Parse(fenced(r, 1)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("Parse(Set(%d bytes)) = %v, want ErrMalformed", len(r), err)
		}
	}
	for _, v := range []string{"a b", "a\tb", "a\x7fb", "é"} { // not percent-encoded
		if _, err := ParseResource(v); !errors.Is(err, ErrMalformed) {
			t.Fatalf("ParseResource(%q) = %v, want ErrMalformed", v, err)
		}
	}
}

// FuzzParse: whatever the fields, Parse either fails with ErrMissing or
// ErrMalformed, or returns a token of canonical decimal form and a
// resource within bounds that Set writes back in a form that Parse reads
// as the same; and Set then Parse is the identity on valid input.
func FuzzParse(f *testing.F) {
	f.Add("1", "db", "db", uint64(1))
	f.Add("18446744073709551615", "a%2Fb", "a/b", uint64(math.MaxUint64))
	f.Add("007", "%zz", "\xff", uint64(0))
	f.Add("", "", "", uint64(9))
	f.Fuzz(func(t *testing.T, tv, rv, resource string, token uint64) {
		h := http.Header{Header: {tv}, ResourceHeader: {rv}}
		r, tok, err := Parse(h)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrMissing) {
				t.Fatalf("Parse(%q, %q) = %v", tv, rv, err)
			}
		} else {
			if strconv.FormatUint(tok, 10) != tv || tok == 0 {
				t.Fatalf("Parse(%q, %q): token %d", tv, rv, tok)
			}
			if len(r) == 0 || len(r) > MaxResourceLen {
				t.Fatalf("Parse(%q, %q): resource of %d bytes", tv, rv, len(r))
			}
			if r2, tok2, err := Parse(fenced(r, tok)); err != nil || r2 != r || tok2 != tok {
				t.Fatalf("Parse(Set(%q, %d)) = %q, %d, %v", r, tok, r2, tok2, err)
			}
		}
		r, tok, err = Parse(fenced(resource, token))
		valid := token > 0 && len(resource) > 0 && len(resource) <= MaxResourceLen
		if valid != (err == nil) || (valid && (r != resource || tok != token)) {
			t.Fatalf("Parse(Set(%q, %d)) = %q, %d, %v", resource, token, r, tok, err)
		}
	})
}
