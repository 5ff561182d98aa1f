package dashboard

import (
	"time"

	"github.com/sluicehq/sluice/topk"
)

// Status is what status.json answers: everything the page shows.
type Status struct {
	Time       time.Time         `json:"time"`
	Title      string            `json:"title"`
	Rules      *RuleSet          `json:"rules,omitempty"`
	Limits     []LimitStatus     `json:"limits"`
	Leases     []LeaseStatus     `json:"leases"`
	Semaphores []SemaphoreStatus `json:"semaphores"`
	// Coordination is what a coordination service (sluice serve's
	// semaphores for programs in any language) holds for its callers, as
	// this process sees it; nil without Options.Coordination.
	Coordination *CoordinationStatus `json:"coordination,omitempty"`
	Store        *StoreStatus        `json:"store,omitempty"`
}

// A LimitStatus is one limit's totals and top-K tables.
type LimitStatus struct {
	Domain string `json:"domain,omitempty"`
	Name   string `json:"name"`
	// Limit and Window are the limit's configured capacity and window
	// ("" when not known); CostUnit what Limit counts ("" for requests'
	// costs).
	Limit    int64  `json:"limit,omitempty"`
	CostUnit string `json:"cost_unit,omitempty"`
	Window   string `json:"window,omitempty"`
	topk.Snapshot
}

// A RuleSet is the rules in force, by domain, and how their last reload went.
type RuleSet struct {
	Domains []RuleDomain `json:"domains"`
	Reload  *Reload      `json:"reload,omitempty"`
}

// A RuleDomain is one domain's rules and the file they came from.
type RuleDomain struct {
	Name  string `json:"name"`
	File  string `json:"file"`
	Rules []Rule `json:"rules"`
}

// A Rule is one configured limit.
type Rule struct {
	Name        string    `json:"name"`
	Source      string    `json:"source"`
	Unlimited   bool      `json:"unlimited,omitempty"`
	Shadow      bool      `json:"shadow,omitempty"`
	Algorithm   string    `json:"algorithm,omitempty"`
	Limit       int64     `json:"limit"`
	CostUnit    string    `json:"cost_unit,omitempty"` // what Limit counts; empty: the request's cost
	Period      string    `json:"period,omitempty"`
	Burst       int64     `json:"burst,omitempty"`
	Unit        string    `json:"unit,omitempty"`
	Calendar    string    `json:"calendar,omitempty"`
	Timezone    string    `json:"timezone,omitempty"`
	FailureMode string    `json:"failure_mode,omitempty"`
	Counting    string    `json:"counting,omitempty"`
	Replaces    []string  `json:"replaces,omitempty"`
	Override    *Override `json:"override,omitempty"`
}

// An Override is a runtime override of a rule's limit.
type Override struct {
	Domain      string `json:"domain"`
	Rule        string `json:"rule"`
	Limit       int64  `json:"limit"`
	Burst       int64  `json:"burst,omitempty"`
	ExpiresInMS int64  `json:"expires_in_ms"`
	By          string `json:"by,omitempty"`
	Reason      string `json:"reason,omitempty"`
}

// Reload is how the rules' loads went.
type Reload struct {
	Loads     int    `json:"loads"`
	Failures  int    `json:"failures"`
	LastLoad  string `json:"last_load,omitempty"`
	LastGood  string `json:"last_good,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// A LeaseStatus is one lease holder: the service's capacity, what this
// holder was granted and uses, and, with WatchLeases, every member's.
type LeaseStatus struct {
	Name       string  `json:"name"`
	Member     string  `json:"member"`
	Capacity   float64 `json:"capacity"`
	Partitions int     `json:"partitions"`
	Granted    float64 `json:"granted"`
	Rate       float64 `json:"rate"`
	Used       float64 `json:"used"`
	Idle       float64 `json:"idle"`
	Demand     float64 `json:"demand"`
	Need       int     `json:"need"`
	Want       int     `json:"want"`
	Leases     int     `json:"leases"`
	Outage     bool    `json:"outage"`
	// Members are the service's members as the holder's last heartbeat
	// saw them, ViewAgeMS ago; nil without WatchLeases.
	Members   []MemberStatus `json:"members,omitempty"`
	ViewAgeMS int64          `json:"view_age_ms,omitempty"`
}

// A MemberStatus is one member of a leased service: the partitions it
// has, those it needs and wants, and when the first of its leases expires
// by the store's clock.
type MemberStatus struct {
	ID          string  `json:"id"`
	Weight      float64 `json:"weight"`
	Has         int     `json:"has"`
	Need        int     `json:"need"`
	Want        int     `json:"want"`
	ExpiresInMS int64   `json:"expires_in_ms,omitempty"`
}

// A SemaphoreStatus is one semaphore's size and holdings.
type SemaphoreStatus struct {
	Name    string `json:"name"`
	Limit   int64  `json:"limit"`
	Held    int64  `json:"held"`
	Waiting int    `json:"waiting"`
}

// A CoordinationStatus is what a coordination service holds for remote
// callers, as one process sees it: one table per kind of thing held, each
// row a name with its holders. The semaphores are the names acquired
// through this process since it started (a bounded number, the most
// recently acquired first), read from the store when the status is asked
// for, so holders granted by another replica on the same store are
// listed too; Waiting counts this process's waiters only.
//
// The leases are the leased services this process runs remote holders
// for now (a bounded number, the most recently joined first), each with
// its holders as this process runs them: nothing is read from the store
// for them, and holders of another replica are not listed.
//
// Each kind of thing held is one field, with rows of its own type;
// readers of the status ignore the fields they do not know.
type CoordinationStatus struct {
	Semaphores []HeldSemaphore `json:"semaphores"`
	Leases     []LeasedService `json:"leases"`
}

// A LeasedService is one leased service of a coordination service: the
// capacity its holders share, in how many partitions, and the remote
// holders this process runs for it.
type LeasedService struct {
	Service    string  `json:"service"`
	Capacity   float64 `json:"capacity"`
	Partitions int     `json:"partitions"`
	// HolderCount is how many remote holders this process runs for the
	// service; Holders lists them, the most recently joined first, at
	// most a bounded number of them.
	HolderCount int            `json:"holder_count"`
	Holders     []RemoteHolder `json:"holders"`
}

// A RemoteHolder is one remote holder of a leased service, without its
// holder id (the capability to state its demand, watch and leave): its
// member id as the lease store sees it, its weight, how long since it
// joined, the rate it may use now, the demand it stated last, how many
// leases (partitions) it holds and how long what it was told stays
// valid, and how long since its last heartbeat (join or demand).
type RemoteHolder struct {
	Member         string  `json:"member"`
	Weight         float64 `json:"weight"`
	JoinedForMS    int64   `json:"joined_for_ms"`
	Rate           float64 `json:"rate"`
	DemandRate     float64 `json:"demand_rate"`
	Backlog        int64   `json:"backlog"`
	Leases         int     `json:"leases"`
	ValidForMS     int64   `json:"valid_for_ms"`
	HeartbeatAgoMS int64   `json:"heartbeat_ago_ms"`
}

// A HeldSemaphore is one semaphore of a coordination service: its limit
// (as last asked for through this process), its holders and its waiters.
type HeldSemaphore struct {
	Name  string `json:"name"`
	Limit int64  `json:"limit"`
	// Holders are its unexpired permits, by fence.
	Holders []SemaphoreHolder `json:"holders"`
	// Held is the weight they hold.
	Held int64 `json:"held"`
	// Waiting counts the acquires waiting on it in this process; Queued
	// the fair waiters in the store's queue (of every process), -1 when
	// the store does not say.
	Waiting int `json:"waiting"`
	Queued  int `json:"queued"`
	// Error says why the holders could not be read (the store failed);
	// Holders is then empty.
	Error string `json:"error,omitempty"`
}

// A SemaphoreHolder is one permit held, without its id (the capability
// to renew or release it): its fencing token, weight, how long it has
// been held (absent when the store did not record its grant) and how
// long the store keeps it without a renewal, by the store's clock.
type SemaphoreHolder struct {
	Fence       uint64 `json:"fence"`
	Weight      int64  `json:"weight"`
	HeldForMS   *int64 `json:"held_for_ms,omitempty"`
	ExpiresInMS int64  `json:"expires_in_ms"`
}

// StoreStatus is the store's health.
type StoreStatus struct {
	// Kind is "memory" or "redis"; Mode the Redis deployment
	// (standalone, cluster, sentinel).
	Kind string `json:"kind"`
	Mode string `json:"mode,omitempty"`
	// Healthy is false while the store cannot be reached; Error says why.
	Healthy bool   `json:"healthy"`
	Error   string `json:"error,omitempty"`
	// Breaker is the circuit breaker's state (closed, open), "" without one.
	Breaker string `json:"breaker,omitempty"`
	// LatencyMS is a round trip to the store measured for this status.
	LatencyMS float64 `json:"latency_ms,omitempty"`
	// Errors counts failed store calls; FailOpen, FailClosed and Local
	// the decisions their failure modes made.
	Errors     uint64 `json:"errors"`
	FailOpen   uint64 `json:"fail_open"`
	FailClosed uint64 `json:"fail_closed"`
	Local      uint64 `json:"local"`
	// Keys is the memory store's key count.
	Keys int `json:"keys,omitempty"`
}
