package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
)

// DefaultMaxBodyBytes bounds a request body when Options.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 1 << 20

// RLS is the part of the Envoy RLS adapter (*rls.Server) that POST /json
// calls: the gRPC method itself, so both APIs answer alike.
type RLS interface {
	ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
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
}

// API is the HTTP face of the decision service:
//
//	POST /json       Envoy's RateLimitRequest in proto3 JSON (as envoyproxy/ratelimit)
//	POST /v1/check   Sluice's native JSON schema (see the package documentation)
//	GET  /metrics    Prometheus metrics
//	GET  /healthz    200 while the process runs
//	GET  /readyz     200 when ready to serve, 503 while starting or draining
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
	bodies  sync.Pool // of *bytes.Buffer
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
	a.bodies.New = func() any { return new(bytes.Buffer) }
	a.mux.HandleFunc("POST /v1/check", a.check)
	if a.rls != nil {
		a.mux.HandleFunc("POST /json", a.envoyJSON)
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
		_, _ = io.WriteString(w, "ready\n")
	})
	return a, nil
}

// SetReady turns readiness on or off: off while starting and, before a
// shutdown, so that load balancers stop sending before the listeners close.
func (a *API) SetReady(ok bool) { a.ready.Store(ok) }

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// readBody reads r's body, at most a.maxBody bytes, into a pooled buffer;
// on error it has answered the request. Put the buffer back with putBody.
func (a *API) readBody(w http.ResponseWriter, r *http.Request) (*bytes.Buffer, bool) {
	buf := a.bodies.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, a.maxBody))
	if err != nil {
		a.putBody(buf)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeProblem(w, r, http.StatusBadRequest, fmt.Sprintf("request body exceeds %d bytes (MaxBodyBytes)", mbe.Limit))
		} else {
			writeProblem(w, r, http.StatusBadRequest, "reading the request body: "+err.Error())
		}
		return nil, false
	}
	return buf, true
}

func (a *API) putBody(buf *bytes.Buffer) {
	if buf.Cap() > 64<<10 {
		return // do not keep the occasional large body alive
	}
	a.bodies.Put(buf)
}

// envoyJSON answers POST /json: a RateLimitRequest in proto3 JSON, decided
// by the gRPC method itself; 200 with the RateLimitResponse when OK, 429
// when OVER_LIMIT.
func (a *API) envoyJSON(w http.ResponseWriter, r *http.Request) {
	buf, ok := a.readBody(w, r)
	if !ok {
		return
	}
	var in rlsv3.RateLimitRequest
	err := protojson.Unmarshal(buf.Bytes(), &in)
	a.putBody(buf)
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, "decoding the RateLimitRequest: "+err.Error())
		return
	}
	out, err := a.rls.ShouldRateLimit(r.Context(), &in)
	if err != nil {
		st, _ := status.FromError(err)
		writeProblem(w, r, httpStatus(st.Code()), st.Message())
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

// httpStatus maps the gRPC code of a failed decision to an HTTP status.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unavailable, codes.Canceled:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// decisionError answers a failed service decision.
func decisionError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, service.ErrInvalidRequest), errors.Is(err, rules.ErrBound):
		writeProblem(w, r, http.StatusBadRequest, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		writeProblem(w, r, http.StatusGatewayTimeout, err.Error())
	default:
		writeProblem(w, r, http.StatusServiceUnavailable, "the store could not decide: "+err.Error())
	}
}
