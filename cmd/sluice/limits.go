package main

import (
	"context"
	"flag"
	"math"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/internal/httpapi"
)

// limitsConfig bounds what a client can hold on serve's listeners: how many
// connections each listener keeps open, how long an HTTP request may take
// to arrive and its response to leave, how long a connection may stay idle,
// and, on gRPC, how many calls a connection carries at once and how its
// keepalive pings are policed.
//
// A zero field means its default (defaultLimits): serve fills it in, so a
// serveConfig built in code gets the defaults. The flags set every field,
// and validate refuses a value that is zero or negative.
type limitsConfig struct {
	httpMaxConns  int
	adminMaxConns int
	grpcMaxConns  int

	// The HTTP and admin listeners.
	httpReadHeaderTimeout time.Duration
	httpReadTimeout       time.Duration
	httpWriteTimeout      time.Duration
	httpIdleTimeout       time.Duration

	// The gRPC listener.
	grpcMaxStreams        int
	grpcHandshakeTimeout  time.Duration
	grpcMaxConnIdle       time.Duration
	grpcMaxConnAge        time.Duration
	grpcMaxConnAgeGrace   time.Duration
	grpcKeepaliveTime     time.Duration
	grpcKeepaliveTimeout  time.Duration
	grpcPingMinTime       time.Duration
	grpcPingWithoutStream bool // false by default, as its zero value

	// The admin API's budget of failed authentications per client
	// address: a burst, and how long winning one back takes.
	adminAuthFailures      int
	adminAuthFailurePeriod time.Duration

	// Overload protection of the decision endpoints (gRPC ShouldRateLimit,
	// POST /json, POST /v1/check): an adaptive.Guard whose concurrency
	// limit never exceeds overloadMaxConcurrency and whose Shedder holds
	// the p99 latency under overloadObjective; off with overloadOff.
	overloadOff            bool // on by default, as its zero value
	overloadMaxConcurrency int
	overloadObjective      time.Duration
	// overloadShedAnswer is what a ShouldRateLimit call the guard refuses
	// is answered (--shed-answer; see shedAnswer).
	overloadShedAnswer shedAnswer
}

// defaultLimits are the limits serve applies unless told otherwise.
func defaultLimits() limitsConfig {
	return limitsConfig{
		httpMaxConns:  1024,
		adminMaxConns: 64,
		grpcMaxConns:  1024,

		httpReadHeaderTimeout: 5 * time.Second,
		httpReadTimeout:       10 * time.Second,
		httpWriteTimeout:      15 * time.Second,
		httpIdleTimeout:       2 * time.Minute,

		grpcMaxStreams:       256,
		grpcHandshakeTimeout: 5 * time.Second,
		grpcMaxConnIdle:      5 * time.Minute,
		grpcMaxConnAge:       30 * time.Minute,
		grpcMaxConnAgeGrace:  10 * time.Second,
		grpcKeepaliveTime:    time.Minute,
		grpcKeepaliveTimeout: 20 * time.Second,
		grpcPingMinTime:      10 * time.Second,

		adminAuthFailures:      httpapi.DefaultAuthFailures,
		adminAuthFailurePeriod: httpapi.DefaultAuthFailurePeriod,

		overloadMaxConcurrency: 256 * runtime.GOMAXPROCS(0),
		overloadObjective:      100 * time.Millisecond,
	}
}

// A limitFlag is one field of limitsConfig and the flag that sets it;
// exactly one of n, d and b is set.
type limitFlag struct {
	name, usage string
	n           *int
	d           *time.Duration
	b           *bool
}

// flags lists the fields of l with their flags, in the same order for
// every limitsConfig: defaults, flags and validation are all read from it.
func (l *limitsConfig) flags() []limitFlag {
	return []limitFlag{
		{name: "http-max-conns", n: &l.httpMaxConns, usage: "connections the HTTP listener keeps open at once; beyond them a new connection is closed at once and counted in sluice_connections_refused_total"},
		{name: "admin-max-conns", n: &l.adminMaxConns, usage: "connections the admin listener keeps open at once"},
		{name: "grpc-max-conns", n: &l.grpcMaxConns, usage: "connections the gRPC listener keeps open at once"},
		{name: "http-read-header-timeout", d: &l.httpReadHeaderTimeout, usage: "HTTP and admin: how long a request's header may take to arrive"},
		{name: "http-read-timeout", d: &l.httpReadTimeout, usage: "HTTP and admin: how long a whole request, header and body, may take to arrive"},
		{name: "http-write-timeout", d: &l.httpWriteTimeout, usage: "HTTP and admin: how long a response may take, from the end of the request's header to its last byte written"},
		{name: "http-idle-timeout", d: &l.httpIdleTimeout, usage: "HTTP and admin: how long a keep-alive connection may wait for its next request"},
		{name: "grpc-max-streams", n: &l.grpcMaxStreams, usage: "gRPC calls one connection may carry at once"},
		{name: "grpc-handshake-timeout", d: &l.grpcHandshakeTimeout, usage: "how long a new gRPC connection may take to complete its HTTP/2 handshake"},
		{name: "grpc-max-conn-idle", d: &l.grpcMaxConnIdle, usage: "a gRPC connection without a call for this long is closed (GOAWAY)"},
		{name: "grpc-max-conn-age", d: &l.grpcMaxConnAge, usage: "a gRPC connection is asked to go away after this long (±10%), so none is held for ever"},
		{name: "grpc-max-conn-age-grace", d: &l.grpcMaxConnAgeGrace, usage: "how long the calls of a connection past --grpc-max-conn-age may take to finish before it is closed"},
		{name: "grpc-keepalive-time", d: &l.grpcKeepaliveTime, usage: "serve pings a gRPC client it has heard nothing from for this long"},
		{name: "grpc-keepalive-timeout", d: &l.grpcKeepaliveTimeout, usage: "a gRPC client that does not answer serve's ping within this is disconnected"},
		{name: "grpc-keepalive-min-time", d: &l.grpcPingMinTime, usage: "the shortest interval between a gRPC client's pings; a client that pings more often is disconnected (GOAWAY too_many_pings)"},
		{name: "grpc-keepalive-permit-without-stream", b: &l.grpcPingWithoutStream, usage: "allow gRPC clients to ping while they have no call open (by default such pings count against the client)"},
		{name: "admin-auth-failures", n: &l.adminAuthFailures, usage: "failed admin authentications a client address (IPv6: its /64) may make before its requests with a wrong or missing token are refused with 429 (the right token always passes), counted in sluice_admin_auth_refused_total"},
		{name: "admin-auth-failure-period", d: &l.adminAuthFailurePeriod, usage: "how long a client address takes to win back one failed admin authentication"},
		{name: "overload-off", b: &l.overloadOff, usage: "turn off the overload protection of the decision endpoints (gRPC ShouldRateLimit, POST /json, POST /v1/check)"},
		{name: "overload-max-concurrency", n: &l.overloadMaxConcurrency, usage: "decisions in flight at once, at most (default 256 × GOMAXPROCS): the fixed maximum of the adaptive concurrency limit; beyond the limit a decision is refused at once, 503 or UNAVAILABLE with a computed retry hint, counted in sluice_overload_refused_total"},
		{name: "overload-objective", d: &l.overloadObjective, usage: "p99 latency objective of a decision, its time in serve (its waits on Redis left out): as it is approached, a growing share of the lowest-priority decisions (Sluice-Priority header, sluice-priority metadata) is shed"},
	}
}

// addLimitFlags registers the flags of l on fs, with the defaults.
func addLimitFlags(fs *flag.FlagSet, l *limitsConfig) {
	d := defaultLimits()
	defs := d.flags()
	for i, f := range l.flags() {
		switch {
		case f.n != nil:
			fs.IntVar(f.n, f.name, *defs[i].n, f.usage)
		case f.d != nil:
			fs.DurationVar(f.d, f.name, *defs[i].d, f.usage)
		default:
			fs.BoolVar(f.b, f.name, *defs[i].b, f.usage)
		}
	}
	l.overloadShedAnswer = d.overloadShedAnswer
	fs.Var(&l.overloadShedAnswer, "shed-answer", "what a gRPC ShouldRateLimit call the overload guard refuses is answered: over_limit (deny it: Envoy returns 429, whatever its failure_mode_deny) or unavailable (UNAVAILABLE with RetryInfo, which Envoy's default failure_mode_deny: false turns into letting the request through unlimited)")
}

// validate refuses a count or a duration that is not positive, and more
// gRPC streams than HTTP/2 can announce.
func (l *limitsConfig) validate() error {
	for _, f := range l.flags() {
		if (f.n != nil && *f.n <= 0) || (f.d != nil && *f.d <= 0) {
			return usagef("serve: --%s must be positive", f.name)
		}
	}
	if int64(l.grpcMaxStreams) > math.MaxUint32 {
		return usagef("serve: --grpc-max-streams %d: at most %d", l.grpcMaxStreams, uint32(math.MaxUint32))
	}
	return nil
}

// withDefaults returns l with every zero field replaced by its default.
func (l limitsConfig) withDefaults() limitsConfig {
	d := defaultLimits()
	defs := d.flags()
	for i, f := range l.flags() {
		switch {
		case f.n != nil && *f.n == 0:
			*f.n = *defs[i].n
		case f.d != nil && *f.d == 0:
			*f.d = *defs[i].d
		}
	}
	return l
}

// grpcOptions are the gRPC server's options that enforce l.
func (l *limitsConfig) grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(l.grpcMaxStreams)),
		grpc.ConnectionTimeout(l.grpcHandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     l.grpcMaxConnIdle,
			MaxConnectionAge:      l.grpcMaxConnAge,
			MaxConnectionAgeGrace: l.grpcMaxConnAgeGrace,
			Time:                  l.grpcKeepaliveTime,
			Timeout:               l.grpcKeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             l.grpcPingMinTime,
			PermitWithoutStream: l.grpcPingWithoutStream,
		}),
	}
}

// httpServer is an HTTP server within the limits, which knows when the
// last of its connections' goroutines has returned: after Close, which
// closes the connections but does not wait for their handlers.
type httpServer struct {
	*http.Server
	live running
}

// newHTTPServer returns a server of h within l's HTTP limits.
func newHTTPServer(h http.Handler, l *limitsConfig) *httpServer {
	s := new(httpServer)
	s.Server = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.httpReadHeaderTimeout,
		ReadTimeout:       l.httpReadTimeout,
		WriteTimeout:      l.httpWriteTimeout,
		IdleTimeout:       l.httpIdleTimeout,
		// Every connection is StateNew once, then StateClosed or
		// StateHijacked once, as its goroutine ends.
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.live.add()
			case http.StateClosed, http.StateHijacked:
				s.live.done()
			}
		},
	}
	return s
}

// running counts things under way, and says when none is.
type running struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed when n last dropped to 0
}

func (r *running) add() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		r.none = make(chan struct{})
	}
	r.n++
}

func (r *running) done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n--; r.n == 0 {
		close(r.none)
	}
}

// idle returns a channel that is closed once nothing is under way.
func (r *running) idle() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		none := make(chan struct{})
		close(none)
		return none
	}
	return r.none
}

// connCollector exports the listeners' connection counts as Prometheus
// metrics, labelled by listener.
type connCollector struct {
	lns                          *listeners
	open, max, accepted, refused *prometheus.Desc
}

func newConnCollector(lns *listeners) *connCollector {
	l := []string{"listener"}
	return &connCollector{
		lns:      lns,
		open:     prometheus.NewDesc("sluice_connections_open", "Connections open now, by listener (grpc, http, admin).", l, nil),
		max:      prometheus.NewDesc("sluice_connections_max", "The cap on open connections, by listener.", l, nil),
		accepted: prometheus.NewDesc("sluice_connections_accepted_total", "Connections accepted, by listener.", l, nil),
		refused:  prometheus.NewDesc("sluice_connections_refused_total", "Connections closed at once because their listener was at its cap, by listener.", l, nil),
	}
}

func (c *connCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.open
	ch <- c.max
	ch <- c.accepted
	ch <- c.refused
}

func (c *connCollector) Collect(ch chan<- prometheus.Metric) {
	for name, ln := range c.lns.each() {
		s := ln.Stats()
		ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(s.Open), name)
		ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.Max), name)
		ch <- prometheus.MustNewConstMetric(c.accepted, prometheus.CounterValue, float64(s.Accepted), name)
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(s.Refused), name)
	}
}

// listenCapped listens on addr and caps the connections kept open at max.
func listenCapped(ctx context.Context, lc *net.ListenConfig, addr string, max int) (*connlimit.Listener, error) {
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	capped, err := connlimit.New(ln, max)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return capped, nil
}
