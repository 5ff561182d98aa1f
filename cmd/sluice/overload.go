package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/ratelimit"
)

// shouldRateLimit is the one gRPC method serve guards against overload:
// health checks and reflection are answered whatever the load.
const shouldRateLimit = "/" + rlsName + "/ShouldRateLimit"

// overload is serve's protection against overload: a Guard in front of the
// decision endpoints, the middleware and interceptor that apply it, and
// its metrics. The zero value (protection off) wraps nothing.
type overload struct {
	guard    *adaptive.Guard
	shed     shedAnswer
	features []string // the Guard's features, by name
}

// shedAnswer is what serve answers a ShouldRateLimit call its overload
// guard refuses (--shed-answer). Envoy's rate limit filter treats any
// gRPC error, UNAVAILABLE included, by its failure_mode_deny, false by
// default: the request goes through unlimited. So the zero value,
// shedOverLimit, answers OVER_LIMIT: serve protecting itself never opens
// the limit at the proxy; shedUnavailable answers UNAVAILABLE with
// RetryInfo, as every other guarded endpoint does, for a proxy whose
// failure_mode_deny is true or a client that retries elsewhere.
type shedAnswer int

const (
	shedOverLimit shedAnswer = iota
	shedUnavailable
)

func (a shedAnswer) String() string {
	if a == shedUnavailable {
		return "unavailable"
	}
	return "over_limit"
}

func (a *shedAnswer) Set(v string) error {
	switch v {
	case "over_limit":
		*a = shedOverLimit
	case "unavailable":
		*a = shedUnavailable
	default:
		return fmt.Errorf("%q: want over_limit or unavailable", v)
	}
	return nil
}

// newOverload returns the overload protection that l configures.
func newOverload(l *limitsConfig) (*overload, error) {
	if l.overloadOff {
		return &overload{}, nil
	}
	// The limit starts at its maximum and aims at half the objective:
	// a decision takes microseconds, and its latency grows with the
	// callers on a saturated CPU long before anything is overloaded, so a
	// limit relative to the lowest latency seen (Gradient's default) would
	// refuse healthy load; this one refuses only when decisions get slow.
	// (A refusal over Envoy's API is answered by --shed-answer: see
	// shedAnswer.)
	g, err := adaptive.NewGuard(adaptive.GuardOptions{
		Concurrency: adaptive.ConcurrencyOptions{
			Max:        l.overloadMaxConcurrency,
			Initial:    l.overloadMaxConcurrency,
			Controller: &adaptive.Gradient{Target: l.overloadObjective / 2},
		},
		Shedder: &adaptive.ShedderOptions{Objective: adaptive.Objective{Quantile: 0.99, Latency: l.overloadObjective}},
	})
	if err != nil {
		return nil, fmt.Errorf("serve: overload protection: %w", err)
	}
	return &overload{guard: g, shed: l.overloadShedAnswer}, nil
}

// http returns the middleware for the decision endpoints, or nil when
// protection is off. A 429 of theirs is an answer ("over limit"), not an
// overload from below; only their 503 (the store could not decide) is.
func (o *overload) http() func(http.Handler) http.Handler {
	if o.guard == nil {
		return nil
	}
	return httplimit.Protect(o.guard, httplimit.ProtectOptions{
		Overloaded: func(status int) bool { return status == http.StatusServiceUnavailable },
	})
}

// grpcOptions are the gRPC server options that guard ShouldRateLimit
// and Reserve (sluice.v1.RateLimitService).
func (o *overload) grpcOptions() []grpc.ServerOption {
	if o.guard == nil {
		return nil
	}
	protect := grpclimit.ProtectUnary(o.guard, grpclimit.ProtectOptions{
		Skip: func(m string) bool { return m != shouldRateLimit && m != reserve.ReserveMethod },
	})
	if o.shed == shedUnavailable {
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(protect)}
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != shouldRateLimit {
			return protect(ctx, req, info, handler)
		}
		called := false
		resp, err := protect(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			called = true
			return handler(ctx, req)
		})
		if err == nil || called || status.Code(err) != codes.Unavailable {
			return resp, err
		}
		return shedOverLimitResponse(req, err), nil
	})}
}

// shedOverLimitResponse is the answer to req, a ShouldRateLimit call the
// guard refused with err, under --shed-answer over_limit: OVER_LIMIT
// overall and for every descriptor, each with the refusal's retry delay as
// its duration_until_reset (no current_limit: no rule decided it).
func shedOverLimitResponse(req any, err error) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
	in, _ := req.(*rlsv3.RateLimitRequest)
	var reset *durationpb.Duration
	if d, ok := grpclimit.RetryDelay(err); ok {
		reset = durationpb.New(d)
	}
	for range in.GetDescriptors() {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
			DurationUntilReset: reset,
		})
	}
	return resp
}

// overloadCollector exports a Guard's Stats as Prometheus metrics.
type overloadCollector struct {
	o                                           *overload
	limit, max, inFlight, queued, latency       *prometheus.Desc
	refused, shedFraction, level, featureEnable *prometheus.Desc
}

func newOverloadCollector(o *overload) *overloadCollector {
	return &overloadCollector{
		o:             o,
		limit:         prometheus.NewDesc("sluice_overload_limit", "The adaptive concurrency limit of the decision endpoints.", nil, nil),
		max:           prometheus.NewDesc("sluice_overload_limit_max", "The fixed maximum of the concurrency limit (--overload-max-concurrency).", nil, nil),
		inFlight:      prometheus.NewDesc("sluice_overload_in_flight", "Decisions in flight now.", nil, nil),
		queued:        prometheus.NewDesc("sluice_overload_queued", "Decisions waiting for a slot now.", nil, nil),
		latency:       prometheus.NewDesc("sluice_overload_latency_seconds", "Decision latency at a quantile, over the latest window: 0.9 is the limiter's signal, 0.99 the shedder's, held under --overload-objective.", []string{"quantile"}, nil),
		refused:       prometheus.NewDesc("sluice_overload_refused_total", "Decisions refused because serve was overloaded (503, UNAVAILABLE), by priority.", []string{"priority"}, nil),
		shedFraction:  prometheus.NewDesc("sluice_overload_shed_fraction", "The fraction of arrivals the latency shedder refuses now, lowest priorities first.", nil, nil),
		level:         prometheus.NewDesc("sluice_overload_level", "The load level: the share of the limit in use, or the latency over the objective plus the fraction shed; above 1 while refusing.", nil, nil),
		featureEnable: prometheus.NewDesc("sluice_overload_feature_enabled", "1 while the named feature is on, 0 while the load has switched it off.", []string{"feature"}, nil),
	}
}

func (c *overloadCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.limit, c.max, c.inFlight, c.queued, c.latency, c.refused, c.shedFraction, c.level, c.featureEnable} {
		ch <- d
	}
}

func (c *overloadCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.o.guard
	if g == nil {
		return
	}
	st := g.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.limit, st.Limit)
	gauge(c.max, float64(st.Max))
	gauge(c.inFlight, float64(st.InFlight))
	gauge(c.queued, float64(st.Queued))
	gauge(c.latency, st.Latency.Seconds(), "0.9")
	gauge(c.latency, st.Shedder.Quantile.Seconds(), "0.99")
	for i, n := range st.Shed {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n), (priority.Priority(i) + priority.Sheddable).String())
	}
	gauge(c.shedFraction, st.Shedder.Fraction)
	gauge(c.level, st.Level)
	for _, f := range c.o.features {
		gauge(c.featureEnable, boolGauge(g.Enabled(f)), f)
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// decisionStore returns the store the decisions use: b.store, wrapped in a
// waitedStore when it is shared across the network and an overload guard
// (guarded) reads the waits.
func (b *backend) decisionStore(guarded bool) ratelimit.Store {
	if b.shared && guarded {
		return waitedStore{b.store}
	}
	return b.store
}

// A waitedStore adds the time each decision waits on a remote store to
// the decision's wait account (adaptive.AddWait), which the overload
// guard's middleware put in its context: a store's round trip, 10ms
// away or timing out, is no overload of serve, and the store's timeout
// and each rule's failure_mode govern it. What serve does itself —
// decoding, deciding the rules, queueing for a CPU before and after the
// call — is still measured, so saturation still sheds.
type waitedStore struct{ ratelimit.Store }

func (s waitedStore) Decide(ctx context.Context, dst []ratelimit.Decision, items []ratelimit.Item) ([]ratelimit.Decision, error) {
	start := time.Now()
	dst, err := s.Store.Decide(ctx, dst, items)
	adaptive.AddWait(ctx, time.Since(start))
	return dst, err
}
