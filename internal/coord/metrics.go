package coord

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// codeNames are the outcome labels of the Codes.
var codeNames = [...]string{
	Invalid:        "invalid",
	NoPermit:       "no_permit",
	TooManyWaiters: "too_many_waiters",
	NotFound:       "not_found",
	Unavailable:    "unavailable",
	Gone:           "gone",
	TooMany:        "too_many",
}

// String returns the Code's name, as the metrics' outcome label says it.
func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", int(c))
}

// metrics are the Service's Prometheus metrics; the nil *metrics counts
// nothing.
type metrics struct {
	calls, leaseCalls *prometheus.CounterVec
	storeErrors       prometheus.Counter
}

// newMetrics registers s's metrics with reg; nil reg registers none.
func newMetrics(s *Service, reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{calls: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_semaphore_calls_total",
		Help: "Calls of the coordination API's semaphores that reached the service (with the bearer token, when one is set), by method (acquire, renew, release, holders) and outcome (ok, invalid, no_permit, too_many_waiters, not_found, unavailable, gone).",
	}, []string{"method", "outcome"})}
	m.leaseCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_lease_calls_total",
		Help: "Calls of the coordination API's leases that reached the service (with the bearer token, when one is set), by method (join, demand, watch, stream, leave) and outcome (ok, invalid, not_found, too_many, unavailable, gone).",
	}, []string{"method", "outcome"})
	holders := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_lease_holders",
		Help: "Lease holders this process runs for remote clients of the coordination API, over every service.",
	}, func() float64 { return float64(s.LeaseHolders()) })
	watches := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_lease_watches",
		Help: "Long polls and streams of the coordination API's leases waiting in this process for a holder's next answer.",
	}, func() float64 { return float64(s.LeaseWatches()) })
	waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_semaphore_waiting",
		Help: "Acquires of the coordination API waiting for a permit in this process, over every semaphore.",
	}, func() float64 { return float64(s.waitingTotal()) })
	m.storeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_semaphore_store_errors_waited_total",
		Help: "Store errors (a Redis call past --redis-timeout, a connection refused or lost) that the waiting acquires of the coordination API waited through, asking the store again after their backoff, rather than failing.",
	})
	for _, c := range []prometheus.Collector{m.calls, waiting, m.leaseCalls, holders, watches, m.storeErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("coord: registering the metrics: %w", err)
		}
	}
	return m, nil
}

// count counts a call of a semaphore method that returned err.
func (m *metrics) count(method string, err error) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(method, outcome(err)).Inc()
}

// storeError counts a store error that a waiting acquire waited through
// (concurrency.DistributedOptions.OnStoreError).
func (m *metrics) storeError(error) {
	if m == nil {
		return
	}
	m.storeErrors.Inc()
}

// countLease counts a call of a lease method that returned err.
func (m *metrics) countLease(method string, err error) {
	if m == nil {
		return
	}
	m.leaseCalls.WithLabelValues(method, outcome(err)).Inc()
}

// outcome is the outcome label of err.
func outcome(err error) string {
	outcome := "ok"
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			outcome = e.Code.String()
		} else {
			outcome = "error"
		}
	}
	return outcome
}
