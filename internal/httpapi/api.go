package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/coord"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/limitheader"
)

// DefaultMaxBodyBytes bounds a request body when Options.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 1 << 20

// RLS is the part of the Envoy RLS adapter (*rls.Server) that POST /json
// calls: its translation of Envoy's conventions, so that /json and gRPC
// decide alike. ShouldRateLimitJSON returns the service's errors (see
// rls.Server.ShouldRateLimitJSON).
type RLS interface {
	ShouldRateLimitJSON(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
}

// Options configure an API.
type Options struct {
	// Service decides POST /v1/check. Required.
	Service *service.Service
	// RLS answers POST /json. Nil disables the endpoint.
	RLS RLS
	// Gatherer serves GET /metrics. Nil disables the endpoint.
	Gatherer prometheus.Gatherer
	// MaxBodyBytes bounds request bodies; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Semaphores, if set, serves the coordination API's semaphore
	// routes (POST /v1/semaphores/acquire, /renew and /release).
	Semaphores *coord.Service
	// Leases, if set, serves the coordination API's lease routes (POST
	// /v1/leases/join, /demand, /watch and /leave).
	Leases *coord.Service
	// Protect, if set, wraps the decision endpoints (POST /v1/check,
	// POST /v1/reserve and POST /json), and only them: serve puts its overload guard there,
	// so that metrics and health checks are answered whatever the load.
	Protect func(http.Handler) http.Handler
}

// API is the HTTP face of the decision service:
//
//	POST /json       Envoy's RateLimitRequest in proto3 JSON (as envoyproxy/ratelimit)
//	POST /v1/check   Sluice's native JSON schema (see the package documentation)
//	POST /v1/reserve the same request as a reservation: how long to wait before sending
//	POST /v1/settle  the actual cost of a request kept with "settle": true
//	POST /v1/semaphores/acquire, /renew, /release
//	                 the coordination API's semaphores (Options.Semaphores)
//	POST /v1/leases/join, /demand, /watch, /leave
//	                 the coordination API's capacity leases (Options.Leases)
//	GET  /metrics    Prometheus metrics
//	GET  /healthz    200 while the process runs
//	GET  /readyz     200 when ready to serve, 503 while starting or draining;
//	                 the body says when no domain is loaded (NoDomainReady)
//
// An API starts not ready; call SetReady(true) once the service is up.
// It is safe for concurrent use.
type API struct {
	svc     *service.Service
	rls     RLS
	maxBody int64
	ready   atomic.Bool
	mux     *http.ServeMux
	calls   sync.Pool // of *checkCall
	bodies  sync.Pool // of *bodyBuffer
}

// New returns an API.
func New(opts Options) (*API, error) {
	if opts.Service == nil {
		return nil, errors.New("httpapi: a service is required")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("httpapi: MaxBodyBytes %d is negative", opts.MaxBodyBytes)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	a := &API{svc: opts.Service, rls: opts.RLS, maxBody: opts.MaxBodyBytes, mux: http.NewServeMux()}
	a.calls.New = func() any { return new(checkCall) }
	a.bodies.New = func() any { return new(bodyBuffer) }
	protect := opts.Protect
	if protect == nil {
		protect = func(h http.Handler) http.Handler { return h }
	}
	// The body is read before the guard: a client slow to send it holds
	// no slot of the guard and its sending time is no latency sample.
	a.mux.Handle("POST /v1/check", a.readFirst(protect(http.HandlerFunc(a.check))))
	// Reservations: /v1/check's request, answered with the wait (reserve.go).
	a.mux.Handle("POST /v1/reserve", a.readFirst(protect(http.HandlerFunc(a.reserve))))
	// Settlements of reservations (settle.go): never shed by the guard, so
	// that what a request really cost is always counted.
	a.mux.Handle("POST /v1/settle", a.readFirst(http.HandlerFunc(a.settle)))
	if a.rls != nil {
		a.mux.Handle("POST /json", a.readFirst(protect(http.HandlerFunc(a.envoyJSON))))
	}
	if opts.Semaphores != nil {
		a.semaphoreRoutes(opts.Semaphores)
	}
	if opts.Leases != nil {
		a.leaseRoutes(opts.Leases)
	}
	if opts.Gatherer != nil {
		a.mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	}
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	a.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !a.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready\n")
			return
		}
		if len(a.svc.Rules().Domains()) == 0 {
			// Still ready, as envoyproxy/ratelimit is with no
			// configuration: the rules may come later, by reload.
			_, _ = io.WriteString(w, NoDomainReady)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return a, nil
}

// NoDomainReady is the body of /readyz while ready with no domain loaded:
// every request is then OK with no limit. It is still 200, as
// envoyproxy/ratelimit is ready without configuration, so that a
// deployment whose rules arrive later by reload starts; the body and
// serve's warning say it.
const NoDomainReady = "ready; no domain loaded: every request is allowed\n"

// SetReady turns readiness on or off: off while starting and, before a
// shutdown, so that load balancers stop sending before the listeners close.
func (a *API) SetReady(ok bool) { a.ready.Store(ok) }

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// A bodyBuffer is a request's body read whole: readFirst puts one in
// r.Body, and the decision handlers take it from there.
type bodyBuffer struct{ bytes.Buffer }

// Close implements io.Closer.
func (*bodyBuffer) Close() error { return nil }

// readFirst returns h behind the reading of the request's body, at most
// a.maxBody bytes, into a pooled bodyBuffer that replaces r.Body while h
// runs (h finds it with body); a body that cannot be read is answered
// here (413 or 400) and h does not run.
func (a *API) readFirst(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := a.bodies.Get().(*bodyBuffer)
		b.Reset()
		if readBody(w, r, a.maxBody, &b.Buffer) {
			r.Body = b
			h.ServeHTTP(w, r)
		}
		if b.Cap() <= 64<<10 { // do not keep the occasional large body alive
			a.bodies.Put(b)
		}
	})
}

// body returns the body readFirst read.
func body(r *http.Request) []byte { return r.Body.(*bodyBuffer).Bytes() }

// readBody reads r's body, at most limit bytes, into buf. On error it has
// answered the request: 413 Content Too Large past the limit, which it
// names, 400 otherwise.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, buf *bytes.Buffer) bool {
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	if err == nil {
		return true
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeProblem(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes (MaxBodyBytes)", mbe.Limit))
	} else {
		writeProblem(w, r, http.StatusBadRequest, "reading the request body: "+err.Error())
	}
	return false
}

// envoyJSON answers POST /json: a RateLimitRequest in proto3 JSON, decided
// as gRPC decides it; 200 with the RateLimitResponse when OK, 429 when
// OVER_LIMIT, and a problem as decisionError says otherwise.
func (a *API) envoyJSON(w http.ResponseWriter, r *http.Request) {
	var in rlsv3.RateLimitRequest
	err := protojson.Unmarshal(body(r), &in)
	if err != nil {
		// protojson refuses what encoding/json would decode with a
		// loss, but says of an escaped lone surrogate only "unexpected
		// EOF": name it.
		var scan strictScan
		var ie *inputError
		if errors.As(scan.check(body(r), false), &ie) && ie.Surrogate {
			err = ie
		}
	}
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, "decoding the RateLimitRequest: "+err.Error())
		return
	}
	out, err := a.rls.ShouldRateLimitJSON(r.Context(), &in)
	if err != nil {
		decisionError(w, r, err)
		return
	}
	body, err := protojson.Marshal(out)
	if err != nil {
		writeProblem(w, r, http.StatusInternalServerError, "encoding the RateLimitResponse: "+err.Error())
		return
	}
	code := http.StatusOK
	if out.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = http.StatusTooManyRequests
	}
	for _, hv := range out.GetResponseHeadersToAdd() {
		w.Header().Set(hv.GetKey(), hv.GetValue())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// decisionError answers a failed decision: 400 for an invalid request, 504
// when the deadline passed, and otherwise (a *service.UnavailableError: the
// store could not decide, or a limit failed closed) 503, with Retry-After
// when the store said when it retries. Never 429: the request was not
// found over a limit.
func decisionError(w http.ResponseWriter, r *http.Request, err error) {
	var ue *service.UnavailableError
	switch {
	case errors.Is(err, service.ErrInvalidRequest):
		writeProblem(w, r, http.StatusBadRequest, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		writeProblem(w, r, http.StatusGatewayTimeout, err.Error())
	default:
		if errors.As(err, &ue) && ue.RetryAfter > 0 {
			w.Header()["Retry-After"] = []string{strconv.FormatInt(limitheader.RetryAfterSeconds(ue.RetryAfter), 10)}
		}
		writeProblem(w, r, http.StatusServiceUnavailable, err.Error())
	}
}
