package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
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

	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
)

const serveUsage = `Usage: sluice serve [flags]

Serve runs Sluice's decision service: Envoy's rate limit service API
(envoy.service.ratelimit.v3) over gRPC, with the gRPC health service and
reflection, and over HTTP the JSON APIs (POST /json as envoyproxy/ratelimit,
POST /v1/check), GET /metrics, GET /healthz and GET /readyz.

With no flags it loads ./examples/rules, keeps counters in memory, and
listens on 127.0.0.1:8081 (gRPC) and 127.0.0.1:8080 (HTTP). The rules
directory is watched: a valid change applies at once, an invalid one is
logged (file:line) and the last good rules stay in force.

The admin API (rules, reload, key state and reset, runtime overrides) is
off unless --admin-addr is given. It binds loopback only unless
--admin-allow-remote, and every request needs the bearer token read from
--admin-token-file or, failing that, the SLUICE_ADMIN_TOKEN environment
variable.

With --store redis the counters live in Redis: one server, a Cluster (two
or more --redis-addr), or the master the Sentinels at --redis-addr name
(--redis-master). The password comes from --redis-password-file or the
SLUICE_REDIS_PASSWORD environment variable; Sentinels that require their
own, from --redis-sentinel-password-file or SLUICE_REDIS_SENTINEL_PASSWORD.
A Redis that refuses the credentials stops serve at start-up; one that
cannot be reached, or is not ready (loading its data), is logged, and each
rule's failure_mode decides until it can.

On SIGINT or SIGTERM, readiness goes off first (/readyz 503, gRPC health
NOT_SERVING), in-flight calls finish within --shutdown-timeout, then the
store is closed and serve exits 0.
`

// serveConfig is everything serve needs, from flags and the environment.
type serveConfig struct {
	rulesDir         string
	store            string
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
	replicas         int
	grpcAddr         string
	httpAddr         string
	adminAddr        string
	adminToken       string
	adminAllowRemote bool
	independent      bool
	headers          bool
	maxBodyBytes     int64
	shutdownTimeout  time.Duration
	logFormat        string
}

// adminTokenEnv names the environment variable holding the admin token
// when --admin-token-file is not given.
const adminTokenEnv = "SLUICE_ADMIN_TOKEN"

// redisPasswordEnv names the environment variable holding the Redis
// password when --redis-password-file is not given.
const redisPasswordEnv = "SLUICE_REDIS_PASSWORD"

// sentinelPasswordEnv names the environment variable holding the
// Sentinels' password when --redis-sentinel-password-file is not given.
const sentinelPasswordEnv = "SLUICE_REDIS_SENTINEL_PASSWORD"

// runServe parses serve's flags, reads the admin token, and serves until
// ctx is done.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", serveUsage, stderr)
	var cfg serveConfig
	var redisAddr, tokenFile, redisPasswordFile, sentinelPasswordFile, redisCA string
	var redisTLS bool
	fs.StringVar(&cfg.rulesDir, "rules", "examples/rules", "`directory` of rule files (*.yaml), relative to the working directory")
	fs.StringVar(&cfg.store, "store", "memory", "where counters live: memory or redis")
	fs.StringVar(&redisAddr, "redis-addr", "127.0.0.1:6379", "Redis `address`es, comma-separated (two or more: Redis Cluster; with --redis-master: the Sentinels)")
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
	fs.IntVar(&cfg.replicas, "replicas", 1, "replicas sharing the limits: while Redis is down, a rule with failure_mode local admits Limit/replicas here")
	fs.StringVar(&cfg.grpcAddr, "grpc-addr", "127.0.0.1:8081", "gRPC listen `address` (host:port; port 0 picks a free one)")
	fs.StringVar(&cfg.httpAddr, "http-addr", "127.0.0.1:8080", "HTTP listen `address`")
	fs.StringVar(&cfg.adminAddr, "admin-addr", "", "admin API listen `address`; empty disables it")
	fs.StringVar(&tokenFile, "admin-token-file", "", "`file` holding the admin API bearer token (default: $"+adminTokenEnv+")")
	fs.BoolVar(&cfg.adminAllowRemote, "admin-allow-remote", false, "allow the admin API on a non-loopback address")
	fs.BoolVar(&cfg.independent, "independent", false, "count every descriptor on its own, as envoyproxy/ratelimit (default: all or nothing)")
	fs.BoolVar(&cfg.headers, "headers", false, "add RateLimit-Policy, RateLimit and Retry-After to gRPC responses")
	fs.Int64Var(&cfg.maxBodyBytes, "max-body-bytes", httpapi.DefaultMaxBodyBytes, "bound on HTTP request bodies and gRPC messages, in bytes")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight calls may take to finish on shutdown")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log format: text or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch cfg.store {
	case "memory":
	case "redis":
		for a := range strings.SplitSeq(redisAddr, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.redisAddrs = append(cfg.redisAddrs, a)
			}
		}
		if len(cfg.redisAddrs) == 0 {
			return usagef("serve: --store redis needs --redis-addr")
		}
		if cfg.redisTimeout <= 0 {
			return usagef("serve: --redis-timeout must be positive")
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
	var h slog.Handler
	if cfg.logFormat == "json" {
		h = slog.NewJSONHandler(stderr, nil)
	} else {
		h = slog.NewTextHandler(stderr, nil)
	}
	return serve(ctx, cfg, slog.New(h))
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

// closer is a store that must be closed.
type closer interface{ Close() error }

// openStore opens the configured store, with its key inspection and reset
// for the admin API and where it keeps runtime overrides.
func openStore(cfg *serveConfig) (ratelimit.Store, closer, httpapi.KeyStore, httpapi.OverrideStore, error) {
	if cfg.store == "memory" {
		m := memstore.New(memstore.Options{})
		return m, m, httpapi.LocalKeys(m), &httpapi.MemoryOverrides{}, nil
	}
	rs, err := redisstore.New(redisstore.Options{
		Addrs: cfg.redisAddrs, MasterName: cfg.redisMaster,
		Username: cfg.redisUsername, Password: cfg.redisPassword, TLS: cfg.redisTLS,
		SentinelUsername: cfg.sentinelUsername, SentinelPassword: cfg.sentinelPassword,
		Prefix: cfg.redisPrefix, Replicas: cfg.replicas,
		Pipelines: cfg.redisPipelines, BatchWindow: cfg.redisWindow, Timeout: cfg.redisTimeout,
	})
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("serve: %w", err)
	}
	return rs, rs, rs, httpapi.NewRedisOverrides(rs.Client(), cfg.redisPrefix), nil
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
// --redis-tls-ca, or nil for none.
func redisTLSConfig(enabled bool, caFile string) (*tls.Config, error) {
	if !enabled && caFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("serve: reading --redis-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usagef("serve: --redis-tls-ca %s: no PEM certificate in it", caFile)
		}
	}
	return cfg, nil
}

// checkRedis pings Redis once at start-up. A refusal (a wrong password, a
// user without the rights) is a configuration error, returned; a Redis
// that cannot be reached, or is not ready yet, is only logged: it may come
// later, and meanwhile every rule's failure_mode decides.
func checkRedis(ctx context.Context, c redis.UniversalClient, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := c.Ping(ctx).Err()
	switch {
	case err == nil:
		return nil
	case refused(err):
		return fmt.Errorf("serve: Redis refused the connection: %w", err)
	default:
		log.Warn("Redis is not reachable or not ready; each rule's failure_mode decides until it is", "err", err)
		return nil
	}
}

// refused reports whether err is Redis refusing this client, rather than
// a state Redis passes through and leaves by itself: loading its data
// after a restart, a master down during a failover, a cluster that is
// down or resharding.
func refused(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !redis.IsLoadingError(err) && !redis.IsMasterDownError(err) &&
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

// serve runs the service until ctx is done.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger) error {
	if fi, err := os.Stat(cfg.rulesDir); err != nil || !fi.IsDir() {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("serve: rules directory %q does not exist (paths are relative to the working directory; run from the repository root or pass --rules DIR)", cfg.rulesDir)
		}
		if err == nil {
			err = errors.New("not a directory")
		}
		return fmt.Errorf("serve: rules directory %q: %w", cfg.rulesDir, err)
	}
	set, err := rules.Load(cfg.rulesDir)
	if err != nil {
		return fmt.Errorf("serve: loading the rules:\n%w", err)
	}

	base, closeStore, keys, overrideStore, err := openStore(&cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := closeStore.Close(); err != nil {
			log.Error("closing the store", "err", err)
		}
	}()
	if rs, ok := base.(*redisstore.Store); ok {
		if err := checkRedis(ctx, rs.Client(), log); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := service.NewMetrics(reg)
	overrides := service.NewOverrides(set, nil)
	svc, err := service.New(service.Options{Store: base, Rules: set, Independent: cfg.independent, Overrides: overrides, Metrics: metrics, Logger: log})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	watcher, err := rules.NewWatcher(cfg.rulesDir, rules.WatchOptions{
		OnLoad: func(next *rules.Set) {
			_ = overrides.SetRules(next, true)
			svc.SetRules(next)
			if err := overrides.SetRules(next, false); err != nil {
				log.Warn("some overrides do not apply to the new rules", "err", err)
			}
			metrics.Reloaded(true)
		},
		OnError: func(error) { metrics.Reloaded(false) },
		Logger:  log,
	})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	overrideSync := &httpapi.OverrideSync{Store: overrideStore, Overrides: overrides, Logger: log}

	rlsServer := rls.New(svc, rls.Options{Headers: cfg.headers})
	grpcServer := grpc.NewServer(grpc.MaxRecvMsgSize(int(min(cfg.maxBodyBytes, 1<<30))))
	rlsServer.Register(grpcServer)
	healthServer := health.NewServer()
	healthpb.RegisterHealthServer(grpcServer, healthServer)
	reflection.Register(grpcServer)
	const rlsName = "envoy.service.ratelimit.v3.RateLimitService"
	healthServer.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthServer.SetServingStatus(rlsName, healthpb.HealthCheckResponse_NOT_SERVING)

	api, err := httpapi.New(httpapi.Options{Service: svc, RLS: rlsServer, Gatherer: reg, MaxBodyBytes: cfg.maxBodyBytes})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	httpServer := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}

	var adminServer *http.Server
	if cfg.adminAddr != "" {
		admin, err := httpapi.NewAdmin(httpapi.AdminOptions{
			Token: cfg.adminToken, Service: svc, Store: base, Keys: keys,
			Overrides: overrides, OverrideSync: overrideSync,
			Reload: watcher.Reload, Status: watcher.Status, Logger: log,
		})
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		adminServer = &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}
	}

	// Listen on everything before serving anything, so that a taken port
	// fails the start-up cleanly.
	var lc net.ListenConfig
	grpcLn, err := lc.Listen(ctx, "tcp", cfg.grpcAddr)
	if err != nil {
		return fmt.Errorf("serve: gRPC listener: %w", err)
	}
	defer grpcLn.Close()
	httpLn, err := lc.Listen(ctx, "tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("serve: HTTP listener: %w", err)
	}
	defer httpLn.Close()
	var adminLn net.Listener
	if adminServer != nil {
		if adminLn, err = lc.Listen(ctx, "tcp", cfg.adminAddr); err != nil {
			return fmt.Errorf("serve: admin listener: %w", err)
		}
		defer adminLn.Close()
	}

	// Every goroutine below is owned here and waited for before return.
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
		if err := grpcServer.Serve(grpcLn); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	goRun("HTTP server", func() error { return ignoreClosed(httpServer.Serve(httpLn)) })
	if adminServer != nil {
		goRun("admin server", func() error { return ignoreClosed(adminServer.Serve(adminLn)) })
	}
	goRun("rules watcher", func() error { return watcher.Run(bgCtx) })
	if cfg.store == "redis" {
		goRun("override poller", func() error { return overrideSync.Run(bgCtx) })
	}

	api.SetReady(true)
	healthServer.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthServer.SetServingStatus(rlsName, healthpb.HealthCheckResponse_SERVING)
	attrs := []any{
		"grpc", grpcLn.Addr().String(), "http", httpLn.Addr().String(),
		"rules", cfg.rulesDir, "domains", strings.Join(set.Domains(), ","), "rule_count", ruleCount(set),
		"store", cfg.store,
	}
	if cfg.store == "redis" {
		attrs = append(attrs, "redis", strings.Join(cfg.redisAddrs, ","))
		if cfg.redisMaster != "" {
			attrs = append(attrs, "redis_master", cfg.redisMaster)
		}
	}
	if adminLn != nil {
		attrs = append(attrs, "admin", adminLn.Addr().String())
	}
	log.Info("sluice serving", attrs...)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-failed:
		log.Error("stopping after a failure", "err", runErr)
	}

	// Readiness off first, then drain within the deadline.
	api.SetReady(false)
	healthServer.Shutdown() // every service NOT_SERVING
	log.Info("sluice draining", "timeout", cfg.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		grpcServer.GracefulStop()
		close(stopped)
	}()
	var shutdownErr error
	if err := httpServer.Shutdown(sctx); err != nil {
		shutdownErr = fmt.Errorf("serve: HTTP shutdown: %w", err)
	}
	if adminServer != nil {
		if err := adminServer.Shutdown(sctx); err != nil && shutdownErr == nil {
			shutdownErr = fmt.Errorf("serve: admin shutdown: %w", err)
		}
	}
	select {
	case <-stopped:
	case <-sctx.Done():
		grpcServer.Stop() // cancels the calls still running
		<-stopped
		if shutdownErr == nil {
			shutdownErr = fmt.Errorf("serve: gRPC calls still running after %v; cancelled", cfg.shutdownTimeout)
		}
	}
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

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
