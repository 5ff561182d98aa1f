package httpapi

import (
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/internal/coord"
)

// The bodies of the semaphore routes (see the package documentation and
// docs/openapi.yaml). Durations are integer milliseconds.
type (
	acquireBody struct {
		Name   string `json:"name"`
		Limit  int64  `json:"limit"`
		Weight int64  `json:"weight"`
		TTLMs  int64  `json:"ttl_ms"`
		WaitMs int64  `json:"wait_ms"`
		Fair   bool   `json:"fair"`
	}
	renewBody struct {
		Name     string `json:"name"`
		PermitID string `json:"permit_id"`
		TTLMs    int64  `json:"ttl_ms"`
	}
	releaseBody struct {
		Name     string `json:"name"`
		PermitID string `json:"permit_id"`
	}
	grantBody struct {
		PermitID   string `json:"permit_id"`
		Fence      uint64 `json:"fence"`
		ValidForMs int64  `json:"valid_for_ms"`
	}
	renewedBody struct {
		ValidForMs int64 `json:"valid_for_ms"`
	}
	holdersBody struct {
		Name string `json:"name"`
	}
	// holdersAnswer lists a name's permits held (fence, weight,
	// held_for_ms, absent when the store did not record the grant, and
	// expires_in_ms), never their ids, and this server's waiters.
	holdersAnswer struct {
		Name    string                      `json:"name"`
		Holders []dashboard.SemaphoreHolder `json:"holders"`
		Waiting int                         `json:"waiting"`
	}
)

// semaphoreRoutes registers the semaphore routes of s on mux, behind s's
// bearer token (checked before the body is read) and readFirst (the body
// bounded and read first). They are not behind Options.Protect: an
// acquire that waits is slow by design, and would read to the overload
// guard as a slow service.
func (a *API) semaphoreRoutes(s *coord.Service) {
	a.coordRoute(s, "/v1/semaphores/acquire", semAcquire)
	a.coordRoute(s, "/v1/semaphores/renew", semRenew)
	a.coordRoute(s, "/v1/semaphores/release", semRelease)
	a.coordRoute(s, "/v1/semaphores/holders", semHolders)
}

// coordRoute registers POST path, answered by h, behind s's bearer token
// (checked before the body is read) and readFirst.
func (a *API) coordRoute(s *coord.Service, path string, h func(s *coord.Service, w http.ResponseWriter, r *http.Request)) {
	read := a.readFirst(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(s, w, r) }))
	a.mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
		if !s.AuthorizedHeader(r.Header.Get("Authorization")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-coordination"`)
			writeProblem(w, r, http.StatusUnauthorized, "a valid bearer token is required (Authorization: Bearer TOKEN)")
			return
		}
		read.ServeHTTP(w, r)
	})
}

// decodeAcquire decodes an acquire body strictly (as /v1/check's).
func decodeAcquire(b []byte) (coord.AcquireRequest, error) {
	var in acquireBody
	if err := decodeBodyStrict(b, &in, new(strictScan)); err != nil {
		return coord.AcquireRequest{}, err
	}
	return coord.AcquireRequest{Name: in.Name, Limit: in.Limit, Weight: in.Weight, TTL: millis(in.TTLMs), Wait: millis(in.WaitMs), Fair: in.Fair}, nil
}

func semAcquire(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	req, err := decodeAcquire(body(r))
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	g, err := s.Acquire(r.Context(), req)
	if err != nil {
		semError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, grantBody{PermitID: g.PermitID, Fence: g.Fence, ValidForMs: g.ValidFor.Milliseconds()})
}

func semRenew(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	var in renewBody
	if err := decodeBodyStrict(body(r), &in, new(strictScan)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	v, err := s.Renew(r.Context(), in.Name, in.PermitID, millis(in.TTLMs))
	if err != nil {
		semError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, renewedBody{ValidForMs: v.Milliseconds()})
}

func semRelease(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	var in releaseBody
	if err := decodeBodyStrict(body(r), &in, new(strictScan)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.Release(r.Context(), in.Name, in.PermitID); err != nil {
		semError(w, r, err)
		return
	}
	w.Header()["Cache-Control"] = noStore
	w.WriteHeader(http.StatusNoContent)
}

func semHolders(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	var in holdersBody
	if err := decodeBodyStrict(body(r), &in, new(strictScan)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	h, err := s.Holders(r.Context(), in.Name)
	if err != nil {
		semError(w, r, err)
		return
	}
	out := holdersAnswer{Name: h.Name, Holders: make([]dashboard.SemaphoreHolder, 0, len(h.Holders)), Waiting: h.Waiting}
	for _, p := range h.Holders {
		out.Holders = append(out.Holders, coord.ViewHolder(p))
	}
	writeJSON(w, http.StatusOK, out)
}

// millis converts milliseconds to a Duration, saturating, so that a
// value beyond the bounds stays beyond them.
func millis(ms int64) time.Duration {
	const most = math.MaxInt64 / int64(time.Millisecond)
	return time.Duration(min(max(ms, -most), most)) * time.Millisecond
}

// semStatus is the HTTP status of each coord.Code.
var semStatus = [...]int{
	coord.Invalid:        http.StatusBadRequest,
	coord.NoPermit:       http.StatusConflict,
	coord.TooManyWaiters: http.StatusTooManyRequests,
	coord.NotFound:       http.StatusNotFound,
	coord.Unavailable:    http.StatusServiceUnavailable,
	coord.Gone:           499, // the caller left; nobody reads it
	coord.TooMany:        http.StatusTooManyRequests,
}

// semError answers an error of the coordination service.
func semError(w http.ResponseWriter, r *http.Request, err error) {
	var e *coord.Error
	if !errors.As(err, &e) {
		writeProblem(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	writeProblem(w, r, semStatus[e.Code], e.Error())
}
