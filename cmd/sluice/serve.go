package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/concurrency"
	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/internal/coord"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/overrides"
	"github.com/sluicehq/sluice/internal/recovery"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

const serveUsage = `Usage: sluice serve [flags]

Serve runs Sluice's decision service: Envoy's rate limit service API
(envoy.service.ratelimit.v3) over gRPC, with the gRPC health service and
reflection, and over HTTP the JSON APIs (POST /json as envoyproxy/ratelimit,
POST /v1/check), GET /metrics, GET /healthz and GET /readyz.

Paced waiting: POST /v1/reserve and the gRPC service
sluice.v1.RateLimitService (proto/sluice/v1/ratelimit.proto) answer "how
long must I wait to send this?" for gcra and leaky_bucket limits: the
cost is taken now, and the caller waits the answer's wait before sending,
so that it never retries into refusals. A reservation may ask to wait at
most --max-reserve-wait.

With no flags it loads ./examples/rules, keeps counters in memory, and
listens on 127.0.0.1:8081 (gRPC) and 127.0.0.1:8080 (HTTP). The rules
directory is watched: a valid change applies at once, an invalid one is
logged (file:line) and the last good rules stay in force. A change that
removes a domain (its file deleted) is logged as such; with
--rules-refuse-empty a change that would remove every domain is refused.
With no domain loaded, every request is allowed: serve warns at start and
after such a reload, and /readyz (still 200) says so.

Envoy's runtime layout, as envoyproxy/ratelimit reads it, works too: with
RUNTIME_ROOT set (or --runtime-root), the rules are the *.yaml and *.yml
files of RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
(RUNTIME_APPDIRECTORY defaults to config), dot files included unless
RUNTIME_IGNOREDOTFILES=true, and with RUNTIME_WATCH_ROOT (true by default)
a swap of the RUNTIME_ROOT symlink reloads them. Each --runtime-* flag wins
over its variable; an explicit --rules wins over them all (giving it with
--runtime-root is an error). Unlike envoyproxy/ratelimit, subdirectories
of the config directory are not read, and RUNTIME_ROOT has no default: the
rules are then ./examples/rules or --rules. A --rules directory that holds
no rule file while its config/ subdirectory does is refused, with this
hint.

The memory store holds at most --memory-max-keys keys. When it is full, a
new key evicts the one whose loss gives back the least capacity: a key with
most of its capacity left before one that is spent, so a flood of new keys
cannot reset the counters of keys that are denied
(sluice_store_evictions_total and what they gave back are exported).

The admin API (rules, reload, key state and reset, runtime overrides, the
top keys of every rule and the live dashboard at /admin/dashboard/) is
off unless --admin-addr is given. It binds loopback only unless
--admin-allow-remote, and every request needs the bearer token read from
--admin-token-file or, failing that, the SLUICE_ADMIN_TOKEN environment
variable (the dashboard's page loads without it, and shows nothing until
it is typed in).

The coordination API hands out permits of distributed semaphores to
programs in any language: the gRPC service sluice.v1.SemaphoreService
(proto/sluice/v1/semaphore.proto) and POST /v1/semaphores/acquire, /renew
and /release on the HTTP listener (docs/openapi.yaml). Permits live in the
same store as the counters (memory, or Redis with --store redis, where
every replica shares them), carry fencing tokens, and lapse unless renewed
within their TTL. An acquire waits for room at most --coord-max-wait
(below --http-write-timeout); at most --coord-max-waiters wait at once
per semaphore. With --coord-token-file or SLUICE_COORD_TOKEN every call
needs that bearer token (Authorization: Bearer TOKEN, or gRPC metadata
authorization). It is not behind the overload guard: a waiting acquire
is slow by design.

It also shares a downstream's capacity among remote holders through
capacity leases: the gRPC service sluice.v1.LeaseService
(proto/sluice/v1/lease.proto) and POST /v1/leases/join, /demand, /watch
and /leave. Serve runs one lease holder per remote holder, on a lease
store in the same place as the counters (a holder is held by the replica
that answered its join); a holder that states no demand for longer than
its TTL (--coord-lease-ttl when its join gives none) is ended, and its
leases expire. --coord-max-holders, --coord-max-partitions and
--coord-max-services bound what joins may ask.

Every rule keeps its --top-k hottest, most denied and nearest-the-limit
keys in memory fixed per rule, whatever the number of keys (--top-k 0
turns it off); the keys of rules whose descriptors include one of
--top-secret-keys are shown hashed.

With --store redis the counters live in Redis: one server, a Cluster (two
or more --redis-addr), or the master the Sentinels at --redis-addr name
(--redis-master). The password comes from --redis-password-file or the
SLUICE_REDIS_PASSWORD environment variable; Sentinels that require their
own, from --redis-sentinel-password-file or SLUICE_REDIS_SENTINEL_PASSWORD.
A Redis that refuses the credentials stops serve at start-up; one that
cannot be reached, or is not ready (loading its data), is logged, and each
rule's failure_mode decides until it can. A rule that states no
failure_mode follows --failure-default: local (this replica's share of
the limit, limit/--replicas, decided in memory), or fail_open (admit, as
envoyproxy/ratelimit does when Redis fails) or fail_closed.

Every listener keeps at most --http-max-conns, --grpc-max-conns or
--admin-max-conns connections open; beyond them a new connection is closed
at once and counted in sluice_connections_refused_total{listener}. An HTTP
or admin request must arrive whole within --http-read-timeout (its header
within --http-read-header-timeout) and be answered within
--http-write-timeout. A gRPC connection must complete its handshake within
--grpc-handshake-timeout, carries at most --grpc-max-streams calls at once,
is closed after --grpc-max-conn-idle without a call and asked to go away
after --grpc-max-conn-age; clients that ping too often are disconnected.

The decision endpoints (gRPC ShouldRateLimit and Reserve, POST /json,
POST /v1/check, POST /v1/reserve;
not /metrics, the health checks or the admin API) are guarded against
overload: at most an adaptive limit of decisions (never above
--overload-max-concurrency) are in flight, and as their p99 latency
(serve's own: the time a decision waits on Redis is left out, which
--redis-timeout and the rule's failure_mode govern) approaches
--overload-objective a growing share of the lowest priorities
(the Sluice-Priority header or sluice-priority metadata, trusted up to
normal) is shed. A refused decision is answered at once, 503 or
UNAVAILABLE with a Retry-After or RetryInfo computed from the load, instead
of queueing; sluice_overload_* metrics show the limit and what is refused.
Envoy lets a request through unlimited when its rate limit service answers
UNAVAILABLE (failure_mode_deny: false, its default), so a ShouldRateLimit
call the guard refuses is answered OVER_LIMIT instead (--shed-answer
over_limit, the default; --shed-answer unavailable answers UNAVAILABLE).
--overload-off turns it off.

On SIGINT or SIGTERM, readiness goes off first (/readyz 503, gRPC health
NOT_SERVING), in-flight calls finish within --shutdown-timeout, and the
connections still open then (clients too slow to finish) are closed. Then
the store is closed and serve exits 0; it exits 1 only if the service
itself failed, such as a call still running after its connection was
closed.
`

// serveConfig is everything serve needs, from flags and the environment.
type serveConfig struct {
	rulesDir         string
	rulesRoot        string // a symlink above rulesDir to follow (RUNTIME_WATCH_ROOT)
	rulesDotFiles    bool   // read dot files (RUNTIME_IGNOREDOTFILES=false)
	rulesNote        string // logged at start: how rulesDir was chosen
	rulesRefuseEmpty bool
	detailedKeys     int
	store            string
	memoryMaxKeys    int
	redisAddrs       []string
	redisMaster      string
	redisUsername    string
	redisPassword    string
	sentinelUsername string
	sentinelPassword string
	redisTLS         *tls.Config
	redisPrefix      string
	redisPipelines   int
	redisWindow      time.Duration
	redisTimeout     time.Duration
	redisWait        redisstore.Replicated // of permit and lease grants
	replicas         int
	failureDefault   ratelimit.FailureMode // of rules that state no failure_mode
	grpcAddr         string
	httpAddr         string
	adminAddr        string
	adminToken       string
	adminAllowRemote bool
	independent      bool
	maxReserveWait   time.Duration // the longest wait a reservation may ask for (POST /v1/reserve, RateLimitService.Reserve)
	headers          bool
	maxBodyBytes     int64
	shutdownTimeout  time.Duration
	logFormat        string
	coordToken       string // the coordination API's bearer token; "" for none
	coord            coord.Limits
	limits           limitsConfig
	top              topConfig
	// clockOffset (--clock-offset, for fault tests) is added to every
	// clock reading the stores decide by in this process; Redis's TIME
	// is not moved.
	clockOffset time.Duration
	// hooks are set by tests only, never by a flag.
	hooks *serveHooks
}

// serveHooks let tests put code inside serve's servers, behind the
// recovery of panics (to inject one). The nil *serveHooks adds nothing.
type serveHooks struct {
	// http wraps the handler of the listener named "http" or "admin".
	http func(listener string, h http.Handler) http.Handler
	// unary and stream are gRPC interceptors.
	unary  grpc.UnaryServerInterceptor
	stream grpc.StreamServerInterceptor
	// now is the stores' clock (memstore.Options.Now,
	// redisstore.Options.Now), through which the model-checked test
	// (model_test.go) steps a virtual clock.
	now func() time.Time
	// noMetrics builds the service without Metrics (service.Options.
	// Metrics nil: no decision is counted, /metrics still serves the
	// rest), for the model-checked test's configurations with metrics
	// off. Test-only: no flag turns the service's metrics off.
	noMetrics bool
}

// serviceMetrics returns the Metrics the service is built with: m, but
// nil when a test's hooks turn them off.
func (h *serveHooks) serviceMetrics(m *service.Metrics) *service.Metrics {
	if h != nil && h.noMetrics {
		return nil
	}
	return m
}

// clock returns the stores' clock: nil, the default, but in tests.
func (h *serveHooks) clock() func() time.Time {
	if h == nil {
		return nil
	}
	return h.now
}

// localClock returns the clock of what this process decides itself (the
// memory store; on Redis, the failure mode's local counts, the denial
// cache, batched and approximate counters): the test hook's, else the
// system clock moved by --clock-offset, else nil (time.Now).
func (c *serveConfig) localClock() func() time.Time {
	if now := c.hooks.clock(); now != nil {
		return now
	}
	if off := c.clockOffset; off != 0 {
		return func() time.Time { return time.Now().Add(off) }
	}
	return nil
}

func (h *serveHooks) wrap(listener string, next http.Handler) http.Handler {
	if h == nil || h.http == nil {
		return next
	}
	return h.http(listener, next)
}

func (h *serveHooks) grpcOptions() []grpc.ServerOption {
	if h == nil {
		return nil
	}
	var opts []grpc.ServerOption
	if h.unary != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(h.unary))
	}
	if h.stream != nil {
		opts = append(opts, grpc.ChainStreamInterceptor(h.stream))
	}
	return opts
}

// adminTokenEnv names the environment variable holding the admin token
// when --admin-token-file is not given.
const adminTokenEnv = "SLUICE_ADMIN_TOKEN"

// minAdminTokenLen is the length below which serve warns that the admin
// token could be guessed: the right token is always accepted, so the
// failed-authentication budget does not stop guessing.
const minAdminTokenLen = 16

// coordTokenEnv names the environment variable holding the coordination
// API's bearer token when --coord-token-file is not given.
const coordTokenEnv = "SLUICE_COORD_TOKEN"

// redisPasswordEnv names the environment variable holding the Redis
// password when --redis-password-file is not given.
const redisPasswordEnv = "SLUICE_REDIS_PASSWORD"

// sentinelPasswordEnv names the environment variable holding the
// Sentinels' password when --redis-sentinel-password-file is not given.
const sentinelPasswordEnv = "SLUICE_REDIS_SENTINEL_PASSWORD"

// runServe parses serve's flags, reads the admin token, and serves until
// ctx is done.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newEnvFlagSet("serve", serveUsage, serveEnvPrefix, stderr)
	var cfg serveConfig
	var redisAddr, tokenFile, coordTokenFile, redisPasswordFile, sentinelPasswordFile, redisCA string
	var redisTLS bool
	fs.StringVar(&cfg.rulesDir, "rules", "examples/rules", "`directory` of rule files (*.yaml), relative to the working directory")
	fs.StringVar(&cfg.store, "store", "memory", "where counters live: memory or redis")
	fs.IntVar(&cfg.memoryMaxKeys, "memory-max-keys", 1<<20, "with --store memory, the most keys held (about 132 bytes each); past it, new keys evict those whose loss gives back the least capacity")
	fs.BoolVar(&cfg.rulesRefuseEmpty, "rules-refuse-empty", false, "refuse a reload that would leave no domain (such as every rule file deleted), keeping the rules in force")
	fs.StringVar(&redisAddr, "redis-addr", "", "Redis `address`es, comma-separated (two or more: Redis Cluster; with --redis-master: the Sentinels); required with --store redis")
	fs.StringVar(&cfg.redisMaster, "redis-master", "", "Sentinel mode: the `name` of the master the Sentinels at --redis-addr monitor")
	fs.StringVar(&cfg.redisUsername, "redis-username", "", "Redis ACL user (default: the default user)")
	fs.StringVar(&redisPasswordFile, "redis-password-file", "", "`file` holding the Redis password (default: $"+redisPasswordEnv+")")
	fs.StringVar(&cfg.sentinelUsername, "redis-sentinel-username", "", "ACL user of the Sentinels, when they require one (with --redis-master)")
	fs.StringVar(&sentinelPasswordFile, "redis-sentinel-password-file", "", "`file` holding the Sentinels' password, when they require one (default: $"+sentinelPasswordEnv+")")
	fs.BoolVar(&redisTLS, "redis-tls", false, "connect to Redis over TLS, verified with the system's roots")
	fs.StringVar(&redisCA, "redis-tls-ca", "", "PEM `file` of the CAs that verify Redis's certificate (implies --redis-tls)")
	fs.StringVar(&cfg.redisPrefix, "redis-prefix", redisstore.DefaultPrefix, "prefix of every Redis key")
	fs.DurationVar(&cfg.redisTimeout, "redis-timeout", redisstore.DefaultTimeout, "bound on each decision's Redis call; past it, the rule's failure_mode decides")
	fs.IntVar(&cfg.redisPipelines, "redis-pipelines", redisstore.DefaultPipelines, "Redis pipelines in flight at once; concurrent decisions wait for one and share it")
	fs.DurationVar(&cfg.redisWindow, "redis-batch-window", 0, "how long a Redis pipeline waits for more decisions before it is sent")
	fs.IntVar(&cfg.redisWait.Replicas, "redis-wait-replicas", 0, "count a semaphore permit or lease granted (or renewed) only once this `many` Redis replicas acknowledged it (WAIT); 0: do not wait")
	fs.DurationVar(&cfg.redisWait.Timeout, "redis-wait-timeout", 0, "bound on each WAIT of --redis-wait-replicas; below --redis-timeout (default: half of it)")
	fs.IntVar(&cfg.replicas, "replicas", 1, "replicas sharing the limits: while Redis is down, a rule with failure_mode local admits Limit/replicas here")
	failureDefault := fs.String("failure-default", "local", "failure_mode of rules that state none: local (this replica's share, Limit/replicas), fail_open or fail_closed")
	fs.StringVar(&cfg.grpcAddr, "grpc-addr", "127.0.0.1:8081", "gRPC listen `address` (host:port; port 0 picks a free one)")
	fs.StringVar(&cfg.httpAddr, "http-addr", "127.0.0.1:8080", "HTTP listen `address`")
	fs.StringVar(&cfg.adminAddr, "admin-addr", "", "admin API listen `address`; empty disables it")
	fs.StringVar(&tokenFile, "admin-token-file", "", "`file` holding the admin API bearer token (default: $"+adminTokenEnv+")")
	fs.BoolVar(&cfg.adminAllowRemote, "admin-allow-remote", false, "allow the admin API on a non-loopback address")
	fs.BoolVar(&cfg.independent, "independent", false, "count every descriptor on its own, as envoyproxy/ratelimit (default: all or nothing)")
	fs.DurationVar(&cfg.maxReserveWait, "max-reserve-wait", service.DefaultMaxReserveWait, "reservations (POST /v1/reserve, sluice.v1.RateLimitService): the longest wait one may ask for; a longer max_wait is refused")
	fs.BoolVar(&cfg.headers, "headers", false, "add RateLimit-Policy, RateLimit and Retry-After to gRPC responses")
	fs.Int64Var(&cfg.maxBodyBytes, "max-body-bytes", httpapi.DefaultMaxBodyBytes, "bound on HTTP request bodies and gRPC messages, in bytes")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight calls may take to finish on shutdown")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log format: text or json")
	fs.DurationVar(&cfg.clockOffset, "clock-offset", 0, "for fault tests only: move this process's clock by this `duration` (e.g. 700ms, -1.3s) in what it decides itself (the memory store; on Redis, failure_mode local, batched and approximate counting), as a machine whose clock is off; Redis's TIME is not moved")
	fs.IntVar(&cfg.detailedKeys, "detailed-metric-keys", service.DefaultDetailedKeys, "most keys per rule in sluice_detailed_decisions_total (rules with detailed_metric or value_to_metric); the decisions of further keys count under key _overflow")
	fs.StringVar(&coordTokenFile, "coord-token-file", "", "`file` holding the bearer token the coordination API (semaphores, over gRPC and HTTP) requires; with neither it nor the variable set, none is required (default: $"+coordTokenEnv+")")
	fs.DurationVar(&cfg.coord.DefaultTTL, "coord-default-ttl", coord.DefaultTTL, "coordination API: a permit's TTL when the request gives none")
	fs.DurationVar(&cfg.coord.MaxTTL, "coord-max-ttl", coord.DefaultMaxTTL, "coordination API: the longest TTL a permit may ask for, the longest a crashed holder keeps it")
	fs.DurationVar(&cfg.coord.MaxWait, "coord-max-wait", coord.DefaultMaxWait, "coordination API: the longest an acquire may wait for a permit; below --http-write-timeout")
	fs.IntVar(&cfg.coord.MaxWaiters, "coord-max-waiters", coord.DefaultMaxWaiters, "coordination API: acquires that may wait at once on one semaphore in this process; one more is refused (429, RESOURCE_EXHAUSTED)")
	fs.DurationVar(&cfg.coord.LeaseTTL, "coord-lease-ttl", coord.DefaultLeaseTTL, "coordination API: a lease holder's TTL when its join gives none (it states its demand at least this often; a silent one's leases are free within it)")
	fs.IntVar(&cfg.coord.MaxHolders, "coord-max-holders", coord.DefaultMaxHolders, "coordination API: lease holders of one service this process holds at once; one more is refused (429, RESOURCE_EXHAUSTED)")
	fs.IntVar(&cfg.coord.MaxPartitions, "coord-max-partitions", coord.DefaultMaxPartitions, "coordination API: the most partitions a leased service may be cut into")
	fs.IntVar(&cfg.coord.MaxServices, "coord-max-services", coord.DefaultMaxServices, "coordination API: leased services this process keeps (each one's store is kept while serve runs); one more is refused (429, RESOURCE_EXHAUSTED)")
	var rt runtimeFlags
	addRuntimeFlags(fs, &rt)
	var gc gcConfig
	addLimitFlags(fs, &cfg.limits)
	addTopFlags(fs, &cfg.top)
	addGCFlags(fs, &gc)
	if err := parseFlagsEnv(fs, args, serveEnvPrefix, os.LookupEnv); err != nil {
		return err
	}
	if err := gc.validate(); err != nil {
		return err
	}
	if err := cfg.top.validate(); err != nil {
		return err
	}
	if err := cfg.limits.validate(); err != nil {
		return err
	}
	mode, err := ratelimit.ParseFailureMode(*failureDefault)
	if err != nil {
		return usagef("serve: --failure-default %q: want local, fail_open or fail_closed", *failureDefault)
	}
	cfg.failureDefault = mode
	switch cfg.store {
	case "memory":
	case "redis":
		for a := range strings.SplitSeq(redisAddr, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.redisAddrs = append(cfg.redisAddrs, a)
			}
		}
		if len(cfg.redisAddrs) == 0 {
			return usagef("serve: --store redis needs --redis-addr HOST:PORT: one server, two or more Cluster nodes, or the Sentinels with --redis-master NAME")
		}
		if cfg.redisTimeout <= 0 {
			return usagef("serve: --redis-timeout must be positive")
		}
		if cfg.redisWait.Timeout == 0 {
			cfg.redisWait.Timeout = cfg.redisTimeout / 2
		}
		if cfg.redisWait.Replicas < 0 || cfg.redisWait.Timeout < 0 || cfg.redisWait.Timeout >= cfg.redisTimeout {
			// The WAIT rides in the grant's call, bounded by --redis-timeout.
			return usagef("serve: --redis-wait-replicas must not be negative and --redis-wait-timeout must be positive and below --redis-timeout")
		}
		var err error
		if cfg.redisPassword, err = secret(redisPasswordFile, redisPasswordEnv); err != nil {
			return fmt.Errorf("serve: reading the Redis password: %w", err)
		}
		if cfg.sentinelPassword, err = secret(sentinelPasswordFile, sentinelPasswordEnv); err != nil {
			return fmt.Errorf("serve: reading the Sentinels' password: %w", err)
		}
		if cfg.redisTLS, err = redisTLSConfig(redisTLS, redisCA); err != nil {
			return err
		}
	default:
		return usagef("serve: --store %q: want memory or redis", cfg.store)
	}
	if cfg.logFormat != "text" && cfg.logFormat != "json" {
		return usagef("serve: --log-format %q: want text or json", cfg.logFormat)
	}
	if cfg.maxBodyBytes <= 0 {
		return usagef("serve: --max-body-bytes must be positive")
	}
	if cfg.shutdownTimeout <= 0 {
		return usagef("serve: --shutdown-timeout must be positive")
	}
	if cfg.maxReserveWait <= 0 {
		return usagef("serve: --max-reserve-wait must be positive")
	}
	if cfg.memoryMaxKeys <= 0 {
		return usagef("serve: --memory-max-keys must be positive")
	}
	if cfg.adminAddr != "" {
		token, err := secret(tokenFile, adminTokenEnv)
		if err != nil {
			return fmt.Errorf("serve: reading the admin token: %w", err)
		}
		cfg.adminToken = strings.TrimSpace(token)
		if cfg.adminToken == "" {
			return usagef("serve: --admin-addr needs a token: --admin-token-file FILE or $%s", adminTokenEnv)
		}
		if err := checkAdminAddr(cfg.adminAddr, cfg.adminAllowRemote); err != nil {
			return err
		}
	}
	coordToken, err := secret(coordTokenFile, coordTokenEnv)
	if err != nil {
		return fmt.Errorf("serve: reading the coordination API's token: %w", err)
	}
	cfg.coordToken = strings.TrimSpace(coordToken)
	if err := cfg.coord.Validate(); err != nil {
		return usagef("serve: the --coord-* flags: %v", err)
	}
	if cfg.coord.MaxWait >= cfg.limits.httpWriteTimeout {
		return usagef("serve: --coord-max-wait %v must be below --http-write-timeout %v, or a waiting acquire's answer could not be written", cfg.coord.MaxWait, cfg.limits.httpWriteTimeout)
	}
	if cfg.detailedKeys <= 0 {
		return usagef("serve: --detailed-metric-keys must be positive")
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := rt.resolve(&cfg, given, os.Getenv); err != nil {
		return err
	}
	defer gc.apply(given, cfg.memoryMaxKeys)()
	return serve(ctx, cfg, newLogger(cfg.logFormat, stderr))
}

// newLogger returns serve's logger in format "text" or "json". Durations
// print as Go durations ("1.5s") in both, not as integer nanoseconds.
func newLogger(format string, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// checkAdminAddr refuses a non-loopback admin address unless allowed.
func checkAdminAddr(addr string, allowRemote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("serve: --admin-addr %q: %v", addr, err)
	}
	if allowRemote || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return usagef("serve: --admin-addr %q is not a loopback address; use 127.0.0.1 or pass --admin-allow-remote", addr)
	}
	return nil
}

// A backend is where the service keeps its state, and what else comes
// with it: key inspection and reset for the admin API, where runtime
// overrides live, and how to close it all.
type backend struct {
	store ratelimit.Store
	// ledger keeps reservations (POST /v1/settle, gRPC's Settle, Envoy's
	// stream-done settlements): the store itself, in memory or on Redis.
	ledger    ratelimit.Ledger
	keys      httpapi.KeyStore
	overrides overrides.Store
	// semaphores holds the coordination API's permits: a
	// concurrency.MemoryStore, or a redisstore.SemaphoreStore on the same
	// Redis as the counters.
	semaphores concurrency.Store
	// leases opens the lease store of a service the coordination API's
	// holders lease: a lease.MemoryStore, or a redisstore.LeaseStore on
	// the same Redis.
	leases func(service string) (lease.Store, error)
	// shared reports that other replicas see the same state, across the
	// network: the overrides must be polled for their changes, and the
	// time a decision waits on the store is no overload of serve (see
	// waitedStore).
	shared bool
	// errors counts the calls to the store's backend that failed, when the
	// store answers them by each rule's failure_mode instead of an error.
	errors func() uint64
	// metrics, when not nil, are the store's own metrics, registered with
	// the service's.
	metrics prometheus.Collector
	// health reports the store's health to the admin status and dashboard.
	health func(context.Context) *dashboard.StoreStatus
	// closers close what was opened, last first.
	closers []func() error
}

// close closes the backend, logging what fails.
func (b *backend) close(log *slog.Logger) {
	for i := len(b.closers) - 1; i >= 0; i-- {
		if err := b.closers[i](); err != nil {
			log.Error("closing the store", "err", err)
		}
	}
}

// memstoreCollector exports a memory store's eviction counters.
type memstoreCollector struct{ s *memstore.Store }

var (
	memKeysDesc      = prometheus.NewDesc("sluice_store_keys", "Keys held by the memory store.", nil, nil)
	memEvictionsDesc = prometheus.NewDesc("sluice_store_evictions_total", "Live keys the memory store forgot to make room for new ones.", nil, nil)
	memExhaustedDesc = prometheus.NewDesc("sluice_store_evicted_exhausted_total", "Evicted keys that had nothing of their capacity left.", nil, nil)
	memGaveBackDesc  = prometheus.NewDesc("sluice_store_evictions_gave_back_total", "Capacity units that evicted and unkept keys had in use when they were forgotten: what a key flood gave back.", nil, nil)
	memUnkeptDesc    = prometheus.NewDesc("sluice_store_unkept_total", "New keys decided but not kept, because every key their shard could evict had used more of its capacity (a sign that --memory-max-keys is too small, or of a key flood).", nil, nil)
	memReclaimedDesc = prometheus.NewDesc("sluice_store_reclaimed_total", "Expired keys removed.", nil, nil)
)

func (memstoreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{memKeysDesc, memEvictionsDesc, memExhaustedDesc, memGaveBackDesc, memUnkeptDesc, memReclaimedDesc} {
		ch <- d
	}
}

func (c memstoreCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(memKeysDesc, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(memEvictionsDesc, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(memExhaustedDesc, prometheus.CounterValue, float64(st.EvictedExhausted))
	ch <- prometheus.MustNewConstMetric(memGaveBackDesc, prometheus.CounterValue, float64(st.GaveBack))
	ch <- prometheus.MustNewConstMetric(memUnkeptDesc, prometheus.CounterValue, float64(st.Unkept))
	ch <- prometheus.MustNewConstMetric(memReclaimedDesc, prometheus.CounterValue, float64(st.Reclaimed))
}

// openBackend opens the configured store. A Redis that refuses the
// credentials is an error; one that is not reachable yet is only logged.
func openBackend(ctx context.Context, cfg *serveConfig, log *slog.Logger) (*backend, error) {
	if cfg.clockOffset != 0 {
		log.Warn("the stores' clock is moved (--clock-offset, for fault tests only)", "clock_offset", cfg.clockOffset.String())
	}
	if cfg.store == "memory" {
		m := memstore.New(memstore.Options{MaxKeys: cfg.memoryMaxKeys, Now: cfg.localClock()})
		return &backend{store: m, ledger: m, keys: httpapi.LocalKeys(m), overrides: &overrides.MemoryStore{}, semaphores: concurrency.NewMemoryStore(),
			leases:  func(string) (lease.Store, error) { return lease.NewMemoryStore(), nil },
			metrics: memstoreCollector{m}, health: memoryHealth(m), closers: []func() error{m.Close}}, nil
	}
	redisstore.LogTo(log)
	c, err := redisstore.NewClient(redisstore.ClientOptions{
		Addrs: cfg.redisAddrs, MasterName: cfg.redisMaster,
		Username: cfg.redisUsername, Password: cfg.redisPassword, TLS: cfg.redisTLS,
		SentinelUsername: cfg.sentinelUsername, SentinelPassword: cfg.sentinelPassword,
		Timeout: cfg.redisTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	b := &backend{shared: true, closers: []func() error{c.Close}}
	// A Redis that cannot be reached, or is not ready yet, may come later,
	// and meanwhile every rule's failure_mode decides.
	if refusal, err := pingRedis(ctx, c); refusal {
		b.close(log)
		return nil, fmt.Errorf("serve: Redis refused the connection: %w", err)
	} else if err != nil {
		log.Warn("Redis is not reachable or not ready; each rule's failure_mode decides until it is", "err", err)
	}
	rs, err := redisstore.New(c, redisstore.Options{
		Prefix: cfg.redisPrefix, Replicas: cfg.replicas, Failure: cfg.failureDefault,
		Pipelines: cfg.redisPipelines, BatchWindow: cfg.redisWindow, Timeout: cfg.redisTimeout,
		Logger: log, Now: cfg.hooks.clock(), LocalNow: cfg.localClock(),
	})
	if err != nil {
		b.close(log)
		return nil, fmt.Errorf("serve: %w", err)
	}
	b.closers = append(b.closers, rs.Close)
	h, err := redisstore.NewExpiringHash(c, cfg.redisPrefix+"overrides")
	if err != nil {
		b.close(log)
		return nil, fmt.Errorf("serve: %w", err)
	}
	sems, err := redisstore.NewSemaphoreStore(c, redisstore.SemaphoreOptions{Prefix: cfg.redisPrefix + "sem:", Replicated: cfg.redisWait})
	if err != nil {
		b.close(log)
		return nil, fmt.Errorf("serve: %w", err)
	}
	b.store, b.ledger, b.keys, b.overrides, b.semaphores = rs, rs, rs, overrides.NewRedisStore(h), sems
	b.leases = func(service string) (lease.Store, error) {
		return redisstore.NewLeaseStore(c, service, redisstore.LeaseOptions{Prefix: cfg.redisPrefix + "lease:", Timeout: cfg.redisTimeout, Replicated: cfg.redisWait})
	}
	b.health = redisHealth(c, rs, cfg)
	b.errors = func() uint64 { return rs.Stats().Errors }
	return b, nil
}

// secret returns the content of file without its line ending, or the
// environment variable env when file is "".
func secret(file, env string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	b, err := os.ReadFile(file)
	return strings.TrimRight(string(b), "\r\n"), err
}

// redisTLSConfig returns the TLS configuration of --redis-tls and
// --redis-tls-ca (serve's, and the queue's of drain and enqueue), or nil
// for none.
func redisTLSConfig(enabled bool, caFile string) (*tls.Config, error) {
	if !enabled && caFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("reading --redis-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usagef("--redis-tls-ca %s: no PEM certificate in it", caFile)
		}
	}
	return cfg, nil
}

// pingRedis pings c once, within 2 s, and returns the error, if any,
// and whether it is Redis refusing this client (refused): a mistake in
// the flags, which no wait mends, where a Redis that cannot be reached or
// is not ready yet may come later. serve and drain's -lease-redis check
// their Redis with it at start.
func pingRedis(ctx context.Context, c redis.UniversalClient) (refusal bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = c.Ping(ctx).Err()
	return err != nil && refused(err), err
}

// refused reports whether err is Redis refusing this client (its
// credentials or rights, or a certificate that does not verify against
// the CAs given), rather than a state Redis passes through and leaves by
// itself: loading its data after a restart, a master down during a
// failover, a cluster that is down or resharding.
func refused(err error) bool {
	var rerr redis.Error
	var cv *tls.CertificateVerificationError
	return errors.As(err, &cv) || errors.As(err, &rerr) && !redis.IsLoadingError(err) && !redis.IsMasterDownError(err) &&
		!redis.IsClusterDownError(err) && !redis.IsTryAgainError(err)
}

// ruleCount is the number of limits of set.
func ruleCount(set *rules.Set) int {
	n := 0
	for _, name := range set.Domains() {
		d, _ := set.Domain(name)
		n += len(d.Specs())
	}
	return n
}

// serve runs the service until ctx is done: it loads the rules, opens the
// store, listens, builds the servers, and runs them until ctx ends or one
// fails; then it drains.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger) error {
	cfg.limits = cfg.limits.withDefaults()
	set, err := loadRulesDir(cfg.rulesDir, rules.DirOptions{DotFiles: cfg.rulesDotFiles})
	if err != nil {
		return err
	}
	if cfg.rulesNote != "" {
		log.Info(cfg.rulesNote, "rules", cfg.rulesDir)
	}
	warnNoDomain(log, set, cfg.rulesDir)
	b, err := openBackend(ctx, &cfg, log)
	if err != nil {
		return err
	}
	defer b.close(log)
	lns, err := listen(ctx, &cfg)
	if err != nil {
		return err
	}
	defer lns.close()
	srv, err := newServers(&cfg, set, b, lns, log)
	if err != nil {
		return err
	}
	return srv.run(ctx, &cfg, set, lns, log)
}

// loadRulesDir loads the rules directory with its options, with an error
// that says what to do when it is missing.
func loadRulesDir(dir string, opts rules.DirOptions) (*rules.Set, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("serve: rules directory %q does not exist (paths are relative to the working directory; run from the repository root or pass --rules DIR)", dir)
		}
		if err == nil {
			err = errors.New("not a directory")
		}
		return nil, fmt.Errorf("serve: rules directory %q: %w", dir, err)
	}
	set, err := rules.LoadDir(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("serve: loading the rules:\n%w", err)
	}
	if len(set.Files()) == 0 {
		config := filepath.Join(dir, "config")
		if inner, err := rules.LoadDir(config, opts); err == nil && len(inner.Files()) > 0 {
			return nil, fmt.Errorf("serve: rules directory %q holds no rule file but %q does: that is Envoy's runtime layout; pass --runtime-root %s (or set RUNTIME_ROOT) or --rules %s", dir, config, dir, config)
		}
	}
	return set, nil
}

// noDomainMsg is the warning of a rule set without a domain.
const noDomainMsg = "no domain loaded: every request is allowed; add rule files (*.yaml) to the rules directory"

// warnNoDomain warns when set holds no domain.
func warnNoDomain(log *slog.Logger, set *rules.Set, dir string) {
	if len(set.Domains()) == 0 {
		log.Warn(noDomainMsg, "rules", dir)
	}
}

// servers are the service and everything that serves it.
type servers struct {
	watcher      *rules.Watcher
	overrideSync *overrides.Sync
	pollShared   bool // poll the overrides: other replicas change them
	grpc         *grpc.Server
	health       *health.Server
	api          *httpapi.API
	semaphores   *coord.Service // the coordination API
	http         *httpServer
	admin        *httpServer // nil when the admin API is off
}

// rlsName is the gRPC service name of Envoy's rate limit service, as the
// health service reports it.
const rlsName = "envoy.service.ratelimit.v3.RateLimitService"

// newServers builds the decision service on b and the servers that will
// serve it on lns; nothing runs yet.
func newServers(cfg *serveConfig, set *rules.Set, b *backend, lns *listeners, log *slog.Logger) (*servers, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(newConnCollector(lns))
	metrics := service.NewMetrics(reg)
	metrics.SetDetailedKeys(cfg.detailedKeys)
	if b.metrics != nil {
		reg.MustRegister(b.metrics)
	}
	if b.errors != nil {
		metrics.CountStoreErrors(b.errors)
	}
	table := service.NewOverrides(set, nil) // the overrides in force, kept equal to b.overrides by overrideSync
	top, err := cfg.top.newTop()
	if err != nil {
		return nil, err
	}
	svc, err := service.New(service.Options{Store: b.decisionStore(!cfg.limits.overloadOff), Ledger: b.ledger, Rules: set, Independent: cfg.independent, MaxReserveWait: cfg.maxReserveWait, Overrides: table, Metrics: cfg.hooks.serviceMetrics(metrics), Top: top, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	watcher, err := rules.NewWatcher(cfg.rulesDir, rules.WatchOptions{
		OnLoad: func(next *rules.Set) {
			if err := svc.SetRules(next); err != nil {
				log.Warn("some overrides do not apply to the new rules", "err", err)
			}
			metrics.Reloaded(true)
			warnNoDomain(log, next, cfg.rulesDir)
		},
		OnError:     func(error) { metrics.Reloaded(false) },
		Logger:      log,
		Current:     set,
		RefuseEmpty: cfg.rulesRefuseEmpty,
		Dir:         rules.DirOptions{DotFiles: cfg.rulesDotFiles},
		Root:        cfg.rulesRoot,
	})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	ov, err := newOverload(&cfg.limits)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(newOverloadCollector(ov))
	// Recovery comes first in every chain, so that it contains the panics
	// of everything after it.
	rec := recovery.New(log, reg, "grpc", "http", "admin")
	grpcOpts := append(cfg.limits.grpcOptions(), grpc.MaxRecvMsgSize(int(min(cfg.maxBodyBytes, 1<<30))),
		grpc.ChainUnaryInterceptor(rec.UnaryInterceptor("grpc")), grpc.ChainStreamInterceptor(rec.StreamInterceptor("grpc")))
	grpcOpts = append(grpcOpts, cfg.hooks.grpcOptions()...)
	grpcOpts = append(grpcOpts, ov.grpcOptions()...)
	grpcOpts = append(grpcOpts, rls.ServerOption(func(v any, stack []byte) { rec.Report("grpc", "codec", v, stack) }))
	s := &servers{
		watcher:      watcher,
		overrideSync: &overrides.Sync{Store: b.overrides, Overrides: table, Logger: log},
		pollShared:   b.shared,
		grpc:         grpc.NewServer(grpcOpts...),
		health:       health.NewServer(),
	}
	rlsServer := rls.New(svc, rls.Options{Headers: cfg.headers})
	rlsServer.Register(s.grpc)
	sems, err := coord.New(coord.Options{Store: b.semaphores, Leases: b.leases, Limits: cfg.coord, Token: cfg.coordToken, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	s.semaphores = sems
	sems.Register(s.grpc)
	sems.RegisterLeases(s.grpc)
	if cfg.coordToken != "" && len(cfg.coordToken) < minAdminTokenLen {
		log.Warn("serve: the coordination API's token is short; nothing limits how many tokens a client may try, so use a long random one (e.g. 32 random bytes in hex)",
			slog.Int("bytes", len(cfg.coordToken)), slog.Int("recommended_min", minAdminTokenLen))
	}
	reserve.New(svc).Register(s.grpc) // sluice.v1.RateLimitService: reservations
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(rlsName, healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(coord.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(reserve.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(coord.LeaseServiceName, healthpb.HealthCheckResponse_NOT_SERVING)

	if s.api, err = httpapi.New(httpapi.Options{Service: svc, RLS: rlsServer, Semaphores: sems, Leases: sems, Gatherer: reg, MaxBodyBytes: cfg.maxBodyBytes, Protect: ov.http()}); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	s.http = newHTTPServer(rec.Middleware("http")(cfg.hooks.wrap("http", s.api)), &cfg.limits)
	if cfg.adminAddr != "" {
		admin, err := httpapi.NewAdmin(httpapi.AdminOptions{
			Token: cfg.adminToken, Service: svc, Store: b.store, Keys: b.keys,
			Overrides: table, OverrideSync: s.overrideSync,
			Reload: watcher.Reload, Status: watcher.Status, Logger: log,
			AuthFailures: cfg.limits.adminAuthFailures, AuthFailurePeriod: cfg.limits.adminAuthFailurePeriod,
			Registerer: reg, Top: top, StoreStatus: b.health,
			Coordination: sems.Status, FailureDefault: cfg.failureDefault,
		})
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		s.admin = newHTTPServer(rec.Middleware("admin")(cfg.hooks.wrap("admin", admin)), &cfg.limits)
		if len(cfg.adminToken) < minAdminTokenLen {
			log.Warn("serve: the admin token is short; the failed-authentication budget does not bound how many tokens an address may try, so use a long random one (e.g. 32 random bytes in hex)",
				slog.Int("bytes", len(cfg.adminToken)), slog.Int("recommended_min", minAdminTokenLen))
		}
	}
	return s, nil
}

// listeners are serve's listening sockets, each keeping its connections
// under its cap.
type listeners struct {
	grpc, http, admin *connlimit.Listener // admin is nil when the admin API is off
}

// listen opens every listener before anything is served, so that a taken
// port fails the start-up cleanly.
func listen(ctx context.Context, cfg *serveConfig) (*listeners, error) {
	var lc net.ListenConfig
	var l listeners
	var err error
	if l.grpc, err = listenCapped(ctx, &lc, cfg.grpcAddr, cfg.limits.grpcMaxConns); err != nil {
		return nil, fmt.Errorf("serve: gRPC listener: %w", err)
	}
	if l.http, err = listenCapped(ctx, &lc, cfg.httpAddr, cfg.limits.httpMaxConns); err != nil {
		l.close()
		return nil, fmt.Errorf("serve: HTTP listener: %w", err)
	}
	if cfg.adminAddr != "" {
		if l.admin, err = listenCapped(ctx, &lc, cfg.adminAddr, cfg.limits.adminMaxConns); err != nil {
			l.close()
			return nil, fmt.Errorf("serve: admin listener: %w", err)
		}
	}
	return &l, nil
}

// each yields the listeners that are open, by name.
func (l *listeners) each() iter.Seq2[string, *connlimit.Listener] {
	return func(yield func(string, *connlimit.Listener) bool) {
		for _, nl := range []struct {
			name string
			ln   *connlimit.Listener
		}{{"grpc", l.grpc}, {"http", l.http}, {"admin", l.admin}} {
			if nl.ln != nil && !yield(nl.name, nl.ln) {
				return
			}
		}
	}
}

func (l *listeners) close() {
	for _, ln := range l.each() {
		ln.Close()
	}
}

// run serves on lns until ctx is done or a server fails, then turns
// readiness off and drains within cfg.shutdownTimeout. Every goroutine it
// starts is waited for before it returns.
func (s *servers) run(ctx context.Context, cfg *serveConfig, set *rules.Set, lns *listeners, log *slog.Logger) error {
	bgCtx, stopBackground := context.WithCancel(context.Background())
	defer stopBackground()
	var wg sync.WaitGroup
	failed := make(chan error, 5)
	goRun := func(name string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil {
				failed <- fmt.Errorf("serve: %s: %w", name, err)
			}
		})
	}
	goRun("gRPC server", func() error {
		// A stop that comes before Serve starts is not a failure.
		if err := s.grpc.Serve(lns.grpc); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	goRun("HTTP server", func() error { return ignoreClosed(s.http.Serve(lns.http)) })
	if s.admin != nil {
		goRun("admin server", func() error { return ignoreClosed(s.admin.Serve(lns.admin)) })
	}
	goRun("rules watcher", func() error { return s.watcher.Run(bgCtx) })
	if s.pollShared {
		goRun("override poller", func() error { return s.overrideSync.Run(bgCtx) })
	}

	s.setReady(true)
	log.Info("sluice serving", servingAttrs(cfg, set, lns)...)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-failed:
		log.Error("stopping after a failure", "err", runErr)
	}

	s.setReady(false)
	log.Info("sluice draining", "timeout", cfg.shutdownTimeout)
	shutdownErr := s.drain(cfg, lns, log)
	stopBackground()
	wg.Wait()
	close(failed)
	for err := range failed {
		if runErr == nil {
			runErr = err
		}
	}
	if runErr == nil {
		runErr = shutdownErr
	}
	if runErr != nil {
		return runErr
	}
	log.Info("sluice stopped")
	return nil
}

// setReady turns readiness on or off: /readyz, and gRPC health for every
// service. Off is final: the health server answers NOT_SERVING from then on,
// and the coordination API's waiting acquires end (they would hold up the
// drain for up to --coord-max-wait).
func (s *servers) setReady(ready bool) {
	s.api.SetReady(ready)
	if !ready {
		s.health.Shutdown()
		s.semaphores.Shutdown()
		return
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(rlsName, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(coord.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(reserve.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(coord.LeaseServiceName, healthpb.HealthCheckResponse_SERVING)
}

// httpServers yields the HTTP servers, by the name their errors use.
func (s *servers) httpServers() iter.Seq2[string, *httpServer] {
	return func(yield func(string, *httpServer) bool) {
		if !yield("HTTP", s.http) {
			return
		}
		if s.admin != nil {
			yield("admin", s.admin)
		}
	}
}

// cutGrace is how long the calls of the connections closed at the shutdown
// deadline have to return. A call waiting on its client (a body still
// arriving, a response not read) returns as soon as its connection is
// closed, and one in the store within the store's own timeout; a call
// still running after that is stuck in the service itself.
func cutGrace(cfg *serveConfig) time.Duration {
	if cfg.store == "redis" {
		return time.Second + cfg.redisTimeout
	}
	return time.Second
}

// drain lets in-flight calls finish within cfg.shutdownTimeout. At the
// deadline it closes the connections still open, which cancels their calls:
// their clients were too slow to finish, which is no failure of the
// service's. It returns an error only when a server fails to shut down, or
// when calls are still running cutGrace after their connections were
// closed; their goroutines are then left behind, and serve exits 1.
func (s *servers) drain(cfg *serveConfig, lns *listeners, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	grpcStopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(grpcStopped)
	}()
	var (
		mu   sync.Mutex
		errs []error
		late []*httpServer // still serving connections at the deadline
		wg   sync.WaitGroup
	)
	for name, hs := range s.httpServers() {
		wg.Go(func() {
			err := hs.Shutdown(ctx)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
			case errors.Is(err, context.DeadlineExceeded):
				late = append(late, hs)
			default:
				errs = append(errs, fmt.Errorf("serve: %s shutdown: %w", name, err))
			}
		})
	}
	wg.Wait()
	grpcLate := false
	select {
	case <-grpcStopped:
	case <-ctx.Done():
		grpcLate = true
	}
	if len(late) == 0 && !grpcLate {
		return errors.Join(errs...)
	}

	attrs := []any{"timeout", cfg.shutdownTimeout}
	for name, ln := range lns.each() {
		attrs = append(attrs, name, ln.Stats().Open)
	}
	log.Warn("shutdown deadline passed; closing the connections still open", attrs...)
	for _, hs := range late {
		hs.Close()
	}
	if grpcLate {
		s.grpc.Stop()
	}
	gctx, gcancel := context.WithTimeout(context.Background(), cutGrace(cfg))
	defer gcancel()
	for name, hs := range s.httpServers() {
		select {
		case <-hs.live.idle():
		case <-gctx.Done():
			errs = append(errs, fmt.Errorf("serve: %s calls still running %v after their connections were closed", name, cutGrace(cfg)))
		}
	}
	select {
	case <-grpcStopped:
	case <-gctx.Done():
		errs = append(errs, fmt.Errorf("serve: gRPC calls still running %v after their connections were closed", cutGrace(cfg)))
	}
	return errors.Join(errs...)
}

// servingAttrs are the attributes of the start-up line: where serve
// listens and what it loaded.
func servingAttrs(cfg *serveConfig, set *rules.Set, lns *listeners) []any {
	attrs := []any{
		"grpc", lns.grpc.Addr().String(), "http", lns.http.Addr().String(),
		"rules", cfg.rulesDir, "domains", strings.Join(set.Domains(), ","), "rule_count", ruleCount(set),
		"store", cfg.store,
	}
	if cfg.rulesRoot != "" {
		attrs = append(attrs, "rules_root", cfg.rulesRoot)
	}
	if cfg.store == "redis" {
		attrs = append(attrs, "redis", strings.Join(cfg.redisAddrs, ","))
		if cfg.redisMaster != "" {
			attrs = append(attrs, "redis_master", cfg.redisMaster)
		}
	}
	if lns.admin != nil {
		attrs = append(attrs, "admin", lns.admin.Addr().String())
	}
	return attrs
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
