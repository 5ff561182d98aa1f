package recovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// newTest returns a Recoverer logging JSON into the returned buffer.
func newTest(t *testing.T) (*Recoverer, *bytes.Buffer, *prometheus.Registry) {
	t.Helper()
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	return New(slog.New(slog.NewJSONHandler(&buf, nil)), reg, "http", "grpc"), &buf, reg
}

// oneRecord decodes the log, which must hold exactly one record.
func oneRecord(t *testing.T, log *bytes.Buffer) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("log has %d records, want 1:\n%s", len(lines), log)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("log record is not one JSON object: %v\n%s", err, lines[0])
	}
	return rec
}

func TestMiddlewareBeforeTheResponse(t *testing.T) {
	r, log, reg := newTest(t)
	before := Total()
	h := r.Middleware("http")(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("RateLimit", "x") // set, then lost with the panic
		panic("boom")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/check", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	srv.Close() // waits for the handler: its record is written
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("answer %d %q, want 500 application/problem+json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp.Header.Get("RateLimit") != "" {
		t.Errorf("the handler's header fields were kept: %v", resp.Header)
	}
	var p struct{ Status int }
	if err := json.Unmarshal(body, &p); err != nil || p.Status != 500 {
		t.Errorf("body %q: %v", body, err)
	}
	rec := oneRecord(t, log)
	if rec["level"] != "ERROR" || rec["msg"] != "panic recovered" || rec["listener"] != "http" || rec["call"] != "POST /v1/check" || rec["panic"] != "boom" {
		t.Errorf("record %v", rec)
	}
	if s, _ := rec["stack"].(string); !strings.Contains(s, "TestMiddlewareBeforeTheResponse") {
		t.Errorf("stack does not show the handler:\n%s", s)
	}
	if got := testutil.ToFloat64(r.panics.WithLabelValues("http")); got != 1 {
		t.Errorf("sluice_panics_total{listener=http} = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "sluice_panics_total"); err != nil || n != 2 {
		t.Errorf("%d series (%v), want one per listener", n, err)
	}
	if Total() != before+1 {
		t.Errorf("Total went from %d to %d", before, Total())
	}
}

func TestMiddlewareAfterTheResponseStarted(t *testing.T) {
	r, log, _ := newTest(t)
	h := r.Middleware("http")(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(strings.Repeat("x", 10)))
		w.(http.Flusher).Flush() // the wrapper keeps Flusher
		panic("late")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("a response aborted half-way read as complete")
	}
	srv.Close() // waits for the handler: its record is written
	if rec := oneRecord(t, log); rec["panic"] != "late" {
		t.Errorf("record %v", rec)
	}
}

func TestMiddlewareLetsAbortThrough(t *testing.T) {
	r, log, _ := newTest(t)
	before := Total()
	h := r.Middleware("http")(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Errorf("recovered %v, want http.ErrAbortHandler", v)
		}
		if log.Len() != 0 || Total() != before {
			t.Errorf("an abort was reported as a bug: %s", log)
		}
	}()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
}

func TestMiddlewareAllocatesNothing(t *testing.T) {
	r, _, _ := newTest(t)
	h := r.Middleware("http")(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	w, req := discard{}, httptest.NewRequest("GET", "/", nil)
	if n := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, req) }); n != 0 {
		t.Errorf("%v allocations per call", n)
	}
}

type discard struct{}

func (discard) Header() http.Header         { return nil }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

func TestInterceptors(t *testing.T) {
	r, log, _ := newTest(t)
	_, err := r.UnaryInterceptor("grpc")(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/a.B/C"},
		func(context.Context, any) (any, error) { panic(errors.New("unary")) })
	if status.Code(err) != codes.Internal {
		t.Errorf("unary: %v, want INTERNAL", err)
	}
	err = r.StreamInterceptor("grpc")(nil, nil, &grpc.StreamServerInfo{FullMethod: "/a.B/D"},
		func(any, grpc.ServerStream) error { panic("stream") })
	if status.Code(err) != codes.Internal {
		t.Errorf("stream: %v, want INTERNAL", err)
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"call":"/a.B/C"`) || !strings.Contains(lines[1], `"call":"/a.B/D"`) {
		t.Errorf("log:\n%s", log)
	}
	if got := testutil.ToFloat64(r.panics.WithLabelValues("grpc")); got != 2 {
		t.Errorf("sluice_panics_total{listener=grpc} = %v, want 2", got)
	}
	// A call that does not panic is untouched.
	resp, err := r.UnaryInterceptor("grpc")(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return 7, nil })
	if resp != 7 || err != nil {
		t.Errorf("got %v, %v", resp, err)
	}
}

func BenchmarkMiddleware(b *testing.B) {
	r := New(nil, nil)
	h := r.Middleware("http")(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest("GET", "/", nil)
		for pb.Next() {
			h.ServeHTTP(discard{}, req)
		}
	})
}
