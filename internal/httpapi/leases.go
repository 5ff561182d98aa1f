package httpapi

import (
	"net/http"

	"github.com/sluicehq/sluice/internal/coord"
	"github.com/sluicehq/sluice/lease"
)

// The bodies of the lease routes (see the package documentation and
// docs/openapi.yaml). Durations are integer milliseconds.
type (
	joinBody struct {
		Service    string  `json:"service"`
		Capacity   float64 `json:"capacity"`
		Partitions int     `json:"partitions"`
		TTLMs      int64   `json:"ttl_ms"`
		Weight     float64 `json:"weight"`
		WindowMs   int64   `json:"window_ms"`
		Rate       float64 `json:"rate"`
		Backlog    int64   `json:"backlog"`
	}
	demandBody struct {
		Service  string  `json:"service"`
		HolderID string  `json:"holder_id"`
		Rate     float64 `json:"rate"`
		Backlog  int64   `json:"backlog"`
		Version  uint64  `json:"version"`
	}
	watchBody struct {
		Service  string `json:"service"`
		HolderID string `json:"holder_id"`
		Version  uint64 `json:"version"`
		WaitMs   int64  `json:"wait_ms"`
	}
	leaveBody struct {
		Service  string `json:"service"`
		HolderID string `json:"holder_id"`
	}
	leaseGrantBody struct {
		HolderID   string      `json:"holder_id"`
		Version    uint64      `json:"version"`
		Rate       float64     `json:"rate"`
		PaceRate   float64     `json:"pace_rate"`
		Burst      int         `json:"burst"`
		WindowMs   int64       `json:"window_ms"`
		ValidForMs int64       `json:"valid_for_ms"`
		Leases     []leaseBody `json:"leases"`
	}
	leaseBody struct {
		Partition int    `json:"partition"`
		Epoch     uint64 `json:"epoch"`
	}
)

// leaseRoutes registers the lease routes of s on mux, as semaphoreRoutes
// does: behind s's bearer token and readFirst, not behind Options.Protect
// (a watch is a long poll, slow by design).
func (a *API) leaseRoutes(s *coord.Service) {
	a.coordRoute(s, "/v1/leases/join", leaseJoin)
	a.coordRoute(s, "/v1/leases/demand", leaseDemand)
	a.coordRoute(s, "/v1/leases/watch", leaseWatch)
	a.coordRoute(s, "/v1/leases/leave", leaseLeave)
}

func leaseJoin(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	var in joinBody
	if err := decodeBodyStrict(body(r), &in, new(strictScan)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	g, err := s.Join(r.Context(), coord.JoinRequest{Service: in.Service, Capacity: in.Capacity, Partitions: in.Partitions,
		TTL: millis(in.TTLMs), Weight: in.Weight, Window: millis(in.WindowMs), Rate: in.Rate, Backlog: in.Backlog})
	writeGrant(w, r, g, err)
}

func leaseDemand(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	var in demandBody
	if err := decodeBodyStrict(body(r), &in, new(strictScan)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	g, err := s.Demand(r.Context(), coord.DemandRequest{Service: in.Service, HolderID: in.HolderID,
		Rate: in.Rate, Backlog: in.Backlog, Version: in.Version})
	writeGrant(w, r, g, err)
}

func leaseWatch(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	var in watchBody
	if err := decodeBodyStrict(body(r), &in, new(strictScan)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	g, err := s.Watch(r.Context(), in.Service, in.HolderID, in.Version, millis(in.WaitMs))
	writeGrant(w, r, g, err)
}

func leaseLeave(s *coord.Service, w http.ResponseWriter, r *http.Request) {
	var in leaveBody
	if err := decodeBodyStrict(body(r), &in, new(strictScan)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.Leave(r.Context(), in.Service, in.HolderID); err != nil {
		semError(w, r, err)
		return
	}
	w.Header()["Cache-Control"] = noStore
	w.WriteHeader(http.StatusNoContent)
}

// writeGrant answers a grant, or the error of the call that made it.
func writeGrant(w http.ResponseWriter, r *http.Request, g coord.LeaseGrant, err error) {
	if err != nil {
		semError(w, r, err)
		return
	}
	out := leaseGrantBody{HolderID: g.HolderID, Version: g.Version, Rate: g.Rate, PaceRate: g.PaceRate, Burst: g.Burst,
		WindowMs: g.Window.Milliseconds(), ValidForMs: g.ValidFor.Milliseconds(), Leases: leaseBodies(g.Leases)}
	writeJSON(w, http.StatusOK, out)
}

// leaseBodies are the bodies of leases, never null.
func leaseBodies(ls []lease.Grant) []leaseBody {
	out := make([]leaseBody, 0, len(ls))
	for _, l := range ls {
		out = append(out, leaseBody{Partition: l.Partition, Epoch: l.Epoch})
	}
	return out
}
