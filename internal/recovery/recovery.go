// Package recovery keeps a panic in one call from stopping sluice serve,
// and makes it loud.
//
// A Recoverer wraps every listener's calls: HTTP handlers (Middleware)
// and gRPC methods, unary and streaming (UnaryInterceptor,
// StreamInterceptor). When a call panics, its caller gets an answer — 500
// with an application/problem+json body over HTTP, INTERNAL over gRPC —
// the log gets one record at ERROR with the listener, the call, the
// panic's value and its stack (one JSON object under a JSON handler), the
// counter sluice_panics_total{listener} goes up, and the process goes on
// serving the other calls.
//
// Containment must not hide bugs, so every recovered panic is also
// counted process-wide (Total): test suites that run serve assert that it
// stayed at the number of panics they injected.
//
// http.ErrAbortHandler is not a bug but net/http's way to abort a
// response; it passes through untouched. An HTTP handler that panics after
// it started its response cannot be answered 500 any more: its connection
// is aborted instead (as net/http does), after the record and the count.
package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// total counts the panics every Recoverer of the process recovered.
var total atomic.Int64

// Total returns how many panics the Recoverers of this process have
// recovered since it started.
func Total() int64 { return total.Load() }

// A Recoverer contains the panics of the calls it wraps. It is safe for
// concurrent use.
type Recoverer struct {
	log    *slog.Logger
	panics *prometheus.CounterVec
}

// New returns a Recoverer that logs to log and registers
// sluice_panics_total on reg (nil: not exported), with a zero series for
// each of listeners so that a scrape shows them before any panic.
func New(log *slog.Logger, reg prometheus.Registerer, listeners ...string) *Recoverer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Recoverer{
		log: log,
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_panics_total",
			Help: "Panics recovered in a call, by listener (grpc, http, admin). Each is a bug: the call was answered INTERNAL or 500, the stack logged at ERROR.",
		}, []string{"listener"}),
	}
	for _, l := range listeners {
		r.panics.WithLabelValues(l)
	}
	if reg != nil {
		reg.MustRegister(r.panics)
	}
	return r
}

// Report records a panic recovered by someone else (v, with its stack)
// in call on listener: the log record and the counts, nothing else.
func (r *Recoverer) Report(listener, call string, v any, stack []byte) {
	total.Add(1)
	r.panics.WithLabelValues(listener).Inc()
	r.log.Error("panic recovered", "listener", listener, "call", call, "panic", fmt.Sprint(v), "stack", string(stack))
}

// Middleware returns HTTP middleware that contains the panics of the
// handler it wraps, served on listener.
func (r *Recoverer) Middleware(listener string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			tw := writers.Get().(*trackingWriter)
			tw.ResponseWriter, tw.started = w, false
			defer func() {
				v := recover()
				if v == nil {
					tw.ResponseWriter = nil
					writers.Put(tw)
					return
				}
				if v == http.ErrAbortHandler {
					panic(v)
				}
				r.Report(listener, req.Method+" "+req.URL.Path, v, debug.Stack())
				if tw.started {
					panic(http.ErrAbortHandler) // too late for a 500: abort the response
				}
				h := w.Header()
				clear(h)
				h["Content-Type"] = []string{"application/problem+json"}
				h["Cache-Control"] = []string{"no-store"}
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write(internalProblem)
			}()
			next.ServeHTTP(tw, req)
		})
	}
}

// internalProblem is the body of a call that panicked.
var internalProblem = []byte(`{"type":"about:blank","title":"Internal Server Error","status":500,"detail":"the server failed while handling this request; the failure is logged"}` + "\n")

// A trackingWriter tells whether the response was started. Pooled, so
// that containment costs no allocation per call.
type trackingWriter struct {
	http.ResponseWriter
	started bool
}

var writers = sync.Pool{New: func() any { return new(trackingWriter) }}

func (w *trackingWriter) WriteHeader(code int) {
	if code >= 200 { // an informational response starts nothing
		w.started = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *trackingWriter) Write(b []byte) (int, error) {
	w.started = true
	return w.ResponseWriter.Write(b)
}

// Flush keeps http.Flusher for a handler that asserts it.
func (w *trackingWriter) Flush() {
	w.started = true
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// internalError is the status of a gRPC call that panicked.
var internalError = status.Error(codes.Internal, "the server failed while handling this call; the failure is logged")

// UnaryInterceptor returns a gRPC interceptor that contains the panics of
// the unary calls served on listener. It must come first in the chain,
// so that it also contains those of the interceptors after it.
func (r *Recoverer) UnaryInterceptor(listener string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				r.Report(listener, info.FullMethod, v, debug.Stack())
				resp, err = nil, internalError
			}
		}()
		return handler(ctx, req)
	}
}

// StreamInterceptor is UnaryInterceptor for streaming calls.
func (r *Recoverer) StreamInterceptor(listener string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if v := recover(); v != nil {
				r.Report(listener, info.FullMethod, v, debug.Stack())
				err = internalError
			}
		}()
		return handler(srv, ss)
	}
}
