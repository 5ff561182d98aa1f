package main

import (
	"context"
	"log/slog"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluicehq/sluice/drain"
	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/lease"
)

// drainCollector exports a drainer's figures, and its lease holder's when
// it leases its capacity, as Prometheus metrics read at each scrape: what
// the dashboard's "Drain and leases" row shows.
type drainCollector struct {
	d       *drain.Drainer
	h       *lease.Holder // nil without leases
	service string        // the lease service's name
	// capacity and partitions are the leased service's.
	capacityValue float64
	partitions    int

	done, throttled, failed, dead, redelivered *prometheus.Desc
	duplicates, drainPauses, ackErrors         *prometheus.Desc
	backlog, inFlight, rate, eta               *prometheus.Desc
	waiting, parked, total                     *prometheus.Desc

	capacity, granted, used, wanted, leases *prometheus.Desc
	leaseThrottled, cuts, pauses, outages   *prometheus.Desc
}

func newDrainCollector(d *drain.Drainer, h *lease.Holder, service string, capacity float64, partitions int) *drainCollector {
	lab := []string{"service", "member"}
	c := &drainCollector{
		d: d, h: h, service: service,
		done:           prometheus.NewDesc("sluice_drain_done_total", "Records the drainer's sink accepted and the queue acknowledged, each key once (see sluice_drain_duplicates_total).", nil, nil),
		duplicates:     prometheus.NewDesc("sluice_drain_duplicates_total", "Records acknowledged whose key this drainer had acknowledged before (of the last 32,768 at least): a record queued twice, or an acknowledgement the queue lost.", nil, nil),
		drainPauses:    prometheus.NewDesc("sluice_drain_pauses_total", "Throttled answers that began or extended a pause of the drainer (of its -pause-scope).", nil, nil),
		ackErrors:      prometheus.NewDesc("sluice_drain_ack_errors_total", "Acknowledgements and NAKs the queue did not take (the record is delivered again).", nil, nil),
		waiting:        prometheus.NewDesc("sluice_drain_waiting", "Records the drainer holds that wait for the rate, a pause or a worker (each kept from redelivery).", nil, nil),
		parked:         prometheus.NewDesc("sluice_drain_parked", "Of the records waiting, those set aside until their scope's pause ends.", nil, nil),
		total:          prometheus.NewDesc("sluice_drain_records", "Records the drainer has known of: settled by its last backlog poll plus that backlog (never decreases).", nil, nil),
		throttled:      prometheus.NewDesc("sluice_drain_throttled_total", "Records put back because the sink asked to slow down (429, 503, RESOURCE_EXHAUSTED); not failures.", nil, nil),
		failed:         prometheus.NewDesc("sluice_drain_failed_total", "Failed attempts (retried with backoff, then dead-lettered).", nil, nil),
		dead:           prometheus.NewDesc("sluice_drain_dead_lettered_total", "Records sent to the dead-letter subject after too many failures.", nil, nil),
		redelivered:    prometheus.NewDesc("sluice_drain_redelivered_total", "Records delivered more than once (after a drainer died or a record was put back).", nil, nil),
		backlog:        prometheus.NewDesc("sluice_drain_backlog", "Records in the queue not yet acknowledged, at the last poll.", nil, nil),
		inFlight:       prometheus.NewDesc("sluice_drain_in_flight", "Records being sent now.", nil, nil),
		rate:           prometheus.NewDesc("sluice_drain_rate", "The recent rate of records done, per second.", nil, nil),
		eta:            prometheus.NewDesc("sluice_drain_eta_seconds", "The estimated time to finish the backlog at the recent rate (0 when unknown).", nil, nil),
		capacity:       prometheus.NewDesc("sluice_lease_capacity", "The whole capacity of the leased service, per second, shared by its members.", lab, nil),
		granted:        prometheus.NewDesc("sluice_lease_granted", "The capacity this member holds leases on, per second.", lab, nil),
		used:           prometheus.NewDesc("sluice_lease_used", "The recent rate this member used of its leased capacity, per second.", lab, nil),
		wanted:         prometheus.NewDesc("sluice_lease_wanted", "The capacity this member wants (its demand with headroom), per second.", lab, nil),
		leases:         prometheus.NewDesc("sluice_lease_partitions", "The partitions this member holds valid leases on.", lab, nil),
		leaseThrottled: prometheus.NewDesc("sluice_lease_throttled_total", "Throttled answers of the service reported to this member's holder.", lab, nil),
		cuts:           prometheus.NewDesc("sluice_lease_ceiling_cuts_total", "Times repeated throttling lowered this member's ceiling.", lab, nil),
		pauses:         prometheus.NewDesc("sluice_lease_pauses_total", "Retry hints that paused this member's limiter.", lab, nil),
		outages:        prometheus.NewDesc("sluice_lease_store_errors_total", "Lease store calls that failed.", lab, nil),
	}
	c.capacityValue, c.partitions = capacity, partitions
	return c
}

func (c *drainCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

func (c *drainCollector) descs() []*prometheus.Desc {
	ds := []*prometheus.Desc{c.done, c.throttled, c.failed, c.dead, c.redelivered, c.duplicates, c.drainPauses, c.ackErrors,
		c.backlog, c.inFlight, c.rate, c.eta, c.waiting, c.parked, c.total}
	if c.h != nil {
		ds = append(ds, c.capacity, c.granted, c.used, c.wanted, c.leases, c.leaseThrottled, c.cuts, c.pauses, c.outages)
	}
	return ds
}

func (c *drainCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.d.Stats()
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter(c.done, float64(st.Done))
	counter(c.throttled, float64(st.Throttled))
	counter(c.failed, float64(st.Failed))
	counter(c.dead, float64(st.DeadLettered))
	counter(c.redelivered, float64(st.Redelivered))
	counter(c.duplicates, float64(st.Duplicates))
	counter(c.drainPauses, float64(st.Pauses))
	counter(c.ackErrors, float64(st.AckErrors))
	gauge(c.waiting, float64(st.Waiting))
	gauge(c.parked, float64(st.Parked))
	gauge(c.total, float64(st.Total))
	gauge(c.backlog, float64(st.Backlog))
	gauge(c.inFlight, float64(st.InFlight))
	gauge(c.rate, st.Rate)
	gauge(c.eta, st.ETA.Seconds())
	if c.h == nil {
		return
	}
	hs := c.h.Stats()
	l := []string{c.service, c.h.ID()}
	per := c.capacityValue / float64(max(1, c.partitions))
	gauge(c.capacity, c.capacityValue, l...)
	gauge(c.granted, hs.Granted, l...)
	gauge(c.used, hs.Used, l...)
	gauge(c.wanted, math.Min(c.capacityValue, float64(hs.Want)*per), l...)
	gauge(c.leases, float64(hs.Leases), l...)
	counter(c.leaseThrottled, float64(hs.Throttled), l...)
	counter(c.cuts, float64(hs.Cuts), l...)
	counter(c.pauses, float64(hs.Pauses), l...)
	counter(c.outages, float64(hs.Outages), l...)
}

// serveDrainMetrics serves /metrics of reg on addr until ctx ends, with
// the bounds every Sluice listener has (timeouts, a connection cap), and
// logs the address it listens on.
func serveDrainMetrics(ctx context.Context, addr string, reg *prometheus.Registry, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	cl, err := connlimit.New(ln, 64)
	if err != nil {
		ln.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Timeout: 5 * time.Second}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(cl) }()
	log.Info("drain: metrics", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}
