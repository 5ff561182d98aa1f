package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/redistest"
)

const testRuleFile = `domain: st
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
`

func rulesDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestServeStopsWithContext(t *testing.T) {
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // as if SIGTERM had already arrived
	_, stderr, err := runArgs(t, ctx, "serve", "--rules", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr)
	}
	for _, want := range []string{"sluice serving", "domains=st", "rule_count=1", "store=memory", "sluice draining", "sluice stopped"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("serve log lacks %q:\n%s", want, stderr)
		}
	}
}

func TestServeErrors(t *testing.T) {
	good := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	bad := rulesDir(t, map[string]string{"st.yaml": "domain: st\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	free := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
	tests := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"missing rules dir", []string{"--rules", filepath.Join(good, "nope")}, false, "does not exist"},
		{"broken rules", []string{"--rules", bad}, false, "st.yaml:4"},
		{"unknown store", []string{"--rules", good, "--store", "disk"}, true, `"disk"`},
		{"redis without address", []string{"--rules", good, "--store", "redis", "--redis-addr", " , "}, true, "--redis-addr"},
		// No default address: a Redis that happens to run on 6379 is never
		// used by accident.
		{"redis, no --redis-addr", []string{"--rules", good, "--store", "redis"}, true, "--store redis needs --redis-addr HOST:PORT"},
		{"redis timeout zero", []string{"--rules", good, "--store", "redis", "--redis-addr", "127.0.0.1:1", "--redis-timeout", "0s"}, true, "--redis-timeout"},
		{"redis wait timeout past the call's", []string{"--rules", good, "--store", "redis", "--redis-addr", "127.0.0.1:1", "--redis-wait-replicas", "1", "--redis-wait-timeout", "50ms"}, true, "--redis-wait-timeout must be positive and below --redis-timeout"},
		{"redis wait replicas negative", []string{"--rules", good, "--store", "redis", "--redis-addr", "127.0.0.1:1", "--redis-wait-replicas", "-1"}, true, "--redis-wait-replicas must not be negative"},
		{"redis password file missing", []string{"--rules", good, "--store", "redis", "--redis-addr", "127.0.0.1:1", "--redis-password-file", tokenFile + "x"}, false, "Redis password"},
		{"redis CA not PEM", []string{"--rules", good, "--store", "redis", "--redis-addr", "127.0.0.1:1", "--redis-tls-ca", tokenFile}, true, "no PEM"},
		{"admin without token", []string{"--rules", good, "--admin-addr", "127.0.0.1:0", "--admin-token-file", tokenFile}, true, "token"},
		{"admin token file missing", []string{"--rules", good, "--admin-addr", "127.0.0.1:0", "--admin-token-file", tokenFile + "x"}, false, "admin token"},
		{"bad log format", []string{"--rules", good, "--log-format", "xml"}, true, "xml"},
		{"bad failure default", []string{"--rules", good, "--failure-default", "default"}, true, `--failure-default "default": want local, fail_open or fail_closed`},
		{"bad body bound", []string{"--rules", good, "--max-body-bytes", "0"}, true, "max-body-bytes"},
		{"extra argument", []string{"--rules", good, "extra"}, true, "extra"},
		{"gc percent zero", []string{"--rules", good, "--gc-percent", "0"}, true, "--gc-percent"},
		{"coord wait past the write timeout", []string{"--rules", good, "--coord-max-wait", "20s", "--http-write-timeout", "15s"}, true, "--coord-max-wait 20s must be below --http-write-timeout"},
		{"coord TTLs out of order", []string{"--rules", good, "--coord-max-ttl", "1m", "--coord-default-ttl", "2m"}, true, "DefaultTTL 2m0s outside"},
		{"coord waiters negative", []string{"--rules", good, "--coord-max-waiters", "-1"}, true, "--coord-* flags"},
		{"coord lease TTL past the longest", []string{"--rules", good, "--coord-max-ttl", "1m", "--coord-lease-ttl", "2m"}, true, "LeaseTTL 2m0s outside"},
		{"coord holders negative", []string{"--rules", good, "--coord-max-holders", "-1"}, true, "--coord-* flags"},
		{"coord partitions too many", []string{"--rules", good, "--coord-max-partitions", "2000000"}, true, "MaxPartitions 2000000 above"},
		{"coord token file missing", []string{"--rules", good, "--coord-token-file", tokenFile + "x"}, false, "coordination API's token"},
		{"memory limit negative", []string{"--rules", good, "--memory-limit-mib", "-1"}, true, "--memory-limit-mib"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := runArgs(t, t.Context(), append(append([]string{"serve"}, free...), tt.args...)...)
			if err == nil {
				t.Fatalf("serve succeeded; log:\n%s", stderr)
			}
			var uerr usageError
			if errors.As(err, &uerr) != tt.usage {
				t.Errorf("usage error = %v, want %v: %v", !tt.usage, tt.usage, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
		})
	}
}

func TestCheckAdminAddr(t *testing.T) {
	tests := []struct {
		addr   string
		remote bool
		ok     bool
	}{
		{"127.0.0.1:9090", false, true},
		{"[::1]:9090", false, true},
		{"localhost:9090", false, true},
		{"127.0.0.2:0", false, true},
		{":9090", false, false},
		{"0.0.0.0:9090", false, false},
		{"10.1.2.3:9090", false, false},
		{"example.com:9090", false, false},
		{"0.0.0.0:9090", true, true},
		{"nonsense", false, false},
	}
	for _, tt := range tests {
		if err := checkAdminAddr(tt.addr, tt.remote); (err == nil) != tt.ok {
			t.Errorf("checkAdminAddr(%q, %v) = %v, want ok=%v", tt.addr, tt.remote, err, tt.ok)
		}
	}
}

func TestRulesValidate(t *testing.T) {
	good := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	bad := rulesDir(t, map[string]string{
		"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		"b.yaml": "domain: b\ndescriptors:\n  - key: \"\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	})
	counting := rulesDir(t, map[string]string{
		"c.yaml": "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_log, counting: batched}\n",
	})
	metadata := rulesDir(t, map[string]string{
		"m.yaml": "domain: m\ndescriptors:\n  - key: k\n    metadata: {owner: me}\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	})
	empty := t.TempDir()
	tests := []struct {
		name       string
		args       []string
		code       int
		wantStdout []string
	}{
		{"good", []string{"rules", "validate", good}, 0, []string{"OK", "1 domain(s) (st)", "1 rule(s)"}},
		{"bad", []string{"rules", "validate", bad}, 1, []string{"a.yaml:4: descriptors[0].rate_limit.unit:", "fortnight", "b.yaml:3: descriptors[0].key:"}},
		{"empty", []string{"rules", "validate", empty}, 1, []string{"no rule files"}},
		{"metadata", []string{"rules", "validate", metadata}, 1, []string{"m.yaml:4: descriptors[0].metadata: metadata is not supported"}},
		{"counting", []string{"rules", "validate", counting}, 1, []string{"c.yaml:4: descriptors[0].rate_limit.counting: counting batched does not support algorithm sliding_log"}},
		{"missing", []string{"rules", "validate", filepath.Join(empty, "nope")}, 1, []string{"no such file"}},
		{"no dir", []string{"rules", "validate"}, 2, nil},
		{"no verb", []string{"rules"}, 2, nil},
		{"wrong verb", []string{"rules", "check", good}, 2, nil},
		{"help", []string{"help", "rules"}, 0, []string{"validate DIR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := runArgs(t, t.Context(), tt.args...)
			var sink strings.Builder
			if got := exitCode(err, &sink); got != tt.code {
				t.Errorf("exit %d (%v), want %d", got, err, tt.code)
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout %q lacks %q", stdout, w)
				}
			}
		})
	}
}

// TestShippedRules: every rules directory the repository ships (examples,
// the benchmarks' rule sets) loads.
func TestShippedRules(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "..", "bench", "rules*"))
	if err != nil {
		t.Fatal(err)
	}
	dirs = append(dirs, filepath.Join("..", "..", "examples", "rules"))
	if len(dirs) < 4 {
		t.Fatalf("found %v, want examples/rules and bench/rules*", dirs)
	}
	for _, d := range dirs {
		if stdout, stderr, err := runArgs(t, t.Context(), "rules", "validate", d); err != nil {
			t.Errorf("%s: %v\n%s%s", d, err, stdout, stderr)
		}
	}
}

// recordHandler is a slog.Handler that passes each record's message and
// attributes (as strings) to a channel; it drops records when full.
type recordHandler struct{ ch chan map[string]string }

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h recordHandler) WithGroup(string) slog.Handler            { return h }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	select {
	case h.ch <- m:
	default:
	}
	return nil
}

// TestServeRedis runs serve in process on a Redis store it starts: the
// decisions, and an override stored in Redis for every replica.
func TestServeRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	testServeRedis(t, func(c *serveConfig) { c.redisAddrs = []string{srv.Addr()} }, func(ctx context.Context, key string) (int64, error) {
		return srv.Client().HLen(ctx, key).Result()
	})
}

// TestServeRedisBatched is TestServeRedis with the rule counted in blocks
// (counting: batched): the same decisions, remaining counts and override.
func TestServeRedisBatched(t *testing.T) {
	srv := redistest.Standalone(t)
	batched := strings.Replace(testRuleFile, "name: per_user}", "name: per_user, counting: batched}", 1)
	testServeRedis(t, func(c *serveConfig) {
		c.redisAddrs = []string{srv.Addr()}
		c.rulesDir = rulesDir(t, map[string]string{"st.yaml": batched})
	}, func(ctx context.Context, key string) (int64, error) {
		return srv.Client().HLen(ctx, key).Result()
	})
}

// TestServeRedisSentinel: with --redis-master, serve finds the master
// through the Sentinels at --redis-addr.
func TestServeRedisSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a Sentinel")
	}
	ss := redistest.Sentinel(t)
	testServeRedis(t, func(c *serveConfig) {
		c.redisAddrs, c.redisMaster = ss.Addrs(), redistest.SentinelMaster
	}, func(ctx context.Context, key string) (int64, error) {
		return ss.Master.Client().HLen(ctx, key).Result()
	})
}

// TestServeRedisSentinelAuth: Sentinels that require a password are
// reached with --redis-sentinel-password-file (or
// $SLUICE_REDIS_SENTINEL_PASSWORD); without the right one, serve stops at
// start-up with the Sentinels' answer.
func TestServeRedisSentinelAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a Sentinel")
	}
	ss := redistest.SentinelAuth(t, "sentinel-s3cret")
	testServeRedis(t, func(c *serveConfig) {
		c.redisAddrs, c.redisMaster, c.sentinelPassword = ss.Addrs(), redistest.SentinelMaster, "sentinel-s3cret"
	}, func(ctx context.Context, key string) (int64, error) {
		return ss.Master.Client().HLen(ctx, key).Result()
	})

	args := []string{"--redis-addr", ss.Addrs()[0], "--redis-master", redistest.SentinelMaster}
	for _, c := range []struct {
		env   string
		extra []string
		want  string
	}{
		{"", nil, "NOAUTH"},
		{"also-wrong", nil, "WRONGPASS"},
		{"sentinel-s3cret", []string{"--redis-sentinel-password-file", wrongPasswordFile(t)}, "WRONGPASS"},
	} {
		t.Setenv(sentinelPasswordEnv, c.env)
		refusedAtStart(t, c.want, append(args, c.extra...)...)
	}
}

// TestServeRedisTLS: --redis-tls-ca makes serve verify Redis's
// certificate with the CAs of a PEM file.
func TestServeRedisTLS(t *testing.T) {
	srv := redistest.StandaloneTLS(t)
	tlsCfg, err := redisTLSConfig(false, srv.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	testServeRedis(t, func(c *serveConfig) { c.redisAddrs, c.redisTLS = []string{srv.Addr()}, tlsCfg }, func(ctx context.Context, key string) (int64, error) {
		return srv.Client().HLen(ctx, key).Result()
	})
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{notPEM, filepath.Join(t.TempDir(), "missing.pem")} {
		if _, err := redisTLSConfig(false, f); err == nil {
			t.Errorf("redisTLSConfig(%s) succeeded", f)
		}
	}
	if c, err := redisTLSConfig(true, ""); err != nil || c == nil || c.RootCAs != nil {
		t.Errorf("--redis-tls alone: %+v, %v; want the system's roots", c, err)
	}
	if c, err := redisTLSConfig(false, ""); c != nil || err != nil {
		t.Errorf("no TLS flag: %+v, %v; want nil", c, err)
	}
	// A certificate the system's roots do not verify is a mistake in the
	// flags, which no wait mends: serve stops.
	refusedAtStart(t, "certificate signed by unknown authority", "--redis-addr", srv.Addr(), "--redis-tls")
}

// aclArgs start a Redis whose default user is off: only "sluice", with its
// password, may connect.
var aclArgs = []string{"--user", "default", "off", "--user", "sluice", "on", ">s3cret", "~*", "&*", "+@all"}

// TestServeRedisACL: serve connects as an ACL user with its password.
func TestServeRedisACL(t *testing.T) {
	srv := redistest.StandaloneWith(t, aclArgs...)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "sluice", Password: "s3cret"})
	t.Cleanup(func() { c.Close() })
	testServeRedis(t, func(cfg *serveConfig) {
		cfg.redisAddrs, cfg.redisUsername, cfg.redisPassword = []string{srv.Addr()}, "sluice", "s3cret"
	}, func(ctx context.Context, key string) (int64, error) {
		return c.HLen(ctx, key).Result()
	})
}

// TestServeRedisRefused: a wrong password stops serve at start-up, with
// Redis's answer; the password is read from --redis-password-file, or else
// from $SLUICE_REDIS_PASSWORD.
func TestServeRedisRefused(t *testing.T) {
	srv := redistest.StandaloneWith(t, aclArgs...)
	args := []string{"--redis-addr", srv.Addr(), "--redis-username", "sluice"}
	t.Setenv(redisPasswordEnv, "also-wrong")
	for _, extra := range [][]string{{"--redis-password-file", wrongPasswordFile(t)}, nil} {
		refusedAtStart(t, "WRONGPASS", append(args, extra...)...)
	}
}

// wrongPasswordFile returns a file holding a password no server takes.
func wrongPasswordFile(t *testing.T) string {
	t.Helper()
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return pw
}

// refusedAtStart runs serve on Redis with args and checks that it stops
// at start-up, saying Redis refused it with want.
func refusedAtStart(t *testing.T, want string, args ...string) {
	t.Helper()
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // if it served after all
	defer cancel()
	_, stderr, err := runArgs(t, ctx, append([]string{"serve", "--rules", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--store", "redis"}, args...)...)
	if err == nil || !strings.Contains(err.Error(), "Redis refused") || !strings.Contains(err.Error(), want) {
		t.Errorf("serve %v: %v, want Redis refused … %s\n%s", args, err, want, stderr)
	}
}

// TestServeRedisUnreachable: a Redis that is down at start-up is logged,
// and serve serves, deciding by each rule's failure_mode; a rule that
// fails closed is answered 503 over HTTP, never 429, and OVER_LIMIT over
// gRPC (see package rls).
func TestServeRedisUnreachable(t *testing.T) {
	srv := redistest.Standalone(t)
	addr := srv.Addr()
	srv.Stop()
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile + `  - key: login
    rate_limit: {unit: minute, requests_per_unit: 5, name: login, failure_mode: fail_closed}
`})
	h := recordHandler{ch: make(chan map[string]string, 64)}
	cfg := serveConfig{
		rulesDir: dir, store: "redis", redisAddrs: []string{addr}, redisPrefix: "st:",
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second,
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(h)) }()
	warned := false
	var up map[string]string
	for up == nil {
		select {
		case r := <-h.ch:
			warned = warned || strings.Contains(r["msg"], "Redis is not reachable")
			if r["msg"] == "sluice serving" {
				up = r
			}
		case err := <-done:
			t.Fatalf("serve returned: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("serve did not start")
		}
	}
	// A decision while Redis is down follows the rule's failure_mode
	// (none stated here: --failure-default, local) and counts as a store
	// error.
	resp, err := http.Post("http://"+up["http"]+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"st","descriptors":[{"entries":[{"key":"user","value":"r"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"reason":"local"`) {
		t.Fatalf("check with Redis down: %d %s", resp.StatusCode, body)
	}
	login := `{"domain":"st","descriptors":[{"entries":[{"key":"login","value":"r"}]}]}`
	for _, path := range []string{"/v1/check", "/json"} {
		resp, err := http.Post("http://"+up["http"]+path, "application/json", strings.NewReader(login))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Content-Type") != "application/problem+json" ||
			resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `rule \"login\" of domain \"st\" fails closed`) {
			t.Errorf("%s of a fail_closed rule with Redis down: %d, Retry-After %q, %s; want 503 with Retry-After and a problem naming the rule",
				path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	conn, err := grpc.NewClient(up["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	out, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "st",
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "login", Value: "r"}}}}})
	if err != nil || out.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("gRPC of a fail_closed rule with Redis down: %v, %v; want OVER_LIMIT", out, err)
	}
	resp, err = http.Get("http://" + up["http"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if m := regexp.MustCompile(`(?m)^sluice_store_errors_total (\d+)$`).FindSubmatch(metrics); m == nil || string(m[1]) == "0" {
		t.Errorf("sluice_store_errors_total after a decision with Redis down: %q, want at least 1", m)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if !warned {
		t.Error("no warning that Redis is not reachable")
	}
}

// redisErr is an error as Redis answers it.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

// TestRefused: only Redis refusing the client (or a certificate that
// does not verify) stops serve at start-up, not a Redis that is
// unreachable or passing through a state it leaves by itself.
func TestRefused(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{redisErr("WRONGPASS invalid username-password pair or user is disabled."), true},
		{redisErr("NOAUTH Authentication required."), true},
		{redisErr("NOPERM this user has no permissions to run the 'ping' command"), true},
		{redisErr("ERR AUTH <password> called without any password configured for the default user."), true},
		{fmt.Errorf("dial: %w", redisErr("WRONGPASS invalid username-password pair")), true},
		{redisErr("LOADING Redis is loading the dataset in memory"), false},
		{redisErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), false},
		{redisErr("CLUSTERDOWN The cluster is down"), false},
		{redisErr("TRYAGAIN Multiple keys request during rehashing of slot"), false},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("handshake: %w", &tls.CertificateVerificationError{Err: errors.New("x509: certificate signed by unknown authority")}), true},
	}
	for _, tt := range tests {
		if got := refused(tt.err); got != tt.want {
			t.Errorf("refused(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestServeRedisCluster: on a Cluster, the keys of one request share a
// slot (their domain is the hash tag), so a request of two descriptors is
// decided in one script.
func TestServeRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.Cluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	testServeRedis(t, func(c *serveConfig) { c.redisAddrs = cl.Addrs() }, func(ctx context.Context, key string) (int64, error) {
		return c.HLen(ctx, key).Result()
	})
}

// longToken is an admin token long enough that serve does not warn.
const longToken = "a-test-admin-token-0123456789abcdef"

// testServeRedis serves on the Redis that mod configures: decisions, and
// an override kept in the hash that hlen measures.
func testServeRedis(t *testing.T, mod func(*serveConfig), hlen func(context.Context, string) (int64, error)) {
	dir := rulesDir(t, map[string]string{"st.yaml": testRuleFile})
	h := recordHandler{ch: make(chan map[string]string, 64)}
	cfg := serveConfig{
		rulesDir: dir, store: "redis", redisPrefix: "st:",
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", adminAddr: "127.0.0.1:0", adminToken: longToken,
		maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second,
	}
	mod(&cfg)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(h)) }()
	var up map[string]string
	for up == nil {
		select {
		case r := <-h.ch:
			if r["msg"] == "sluice serving" {
				up = r
			}
			if r["level"] == "WARN" || r["level"] == "ERROR" {
				t.Errorf("serve logged at start-up: %v", r)
			}
		case err := <-done:
			t.Fatalf("serve returned early: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("serve did not start")
		}
	}
	if up["store"] != "redis" || up["redis"] != strings.Join(cfg.redisAddrs, ",") || up["redis_master"] != cfg.redisMaster {
		t.Errorf("start-up line = %v", up)
	}
	check := func(want int) string {
		t.Helper()
		resp, err := http.Post("http://"+up["http"]+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"st","descriptors":[{"entries":[{"key":"user","value":"r"}]},{"entries":[{"key":"user","value":"s"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("check: %d, want %d: %s", resp.StatusCode, want, b)
		}
		return string(b)
	}
	for range 3 {
		check(200)
	}
	check(429)

	req, _ := http.NewRequest("PUT", "http://"+up["admin"]+"/admin/v1/overrides/st/per_user", strings.NewReader(`{"limit":10,"ttl":"1h"}`))
	req.Header.Set("Authorization", "Bearer "+longToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("override: %d", resp.StatusCode)
	}
	if body := check(200); !strings.Contains(body, `"limit":10,"remaining":6`) {
		t.Errorf("with the override: %s", body)
	}
	if n, err := hlen(t.Context(), "st:overrides"); err != nil || n != 1 {
		t.Errorf("overrides hash holds %d fields (%v), want 1", n, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// TestLoggerDurations: both log formats print durations as Go durations;
// slog's JSON handler alone would print integer nanoseconds.
func TestLoggerDurations(t *testing.T) {
	for format, want := range map[string]string{"json": `"timeout":"10s"`, "text": "timeout=10s"} {
		var b strings.Builder
		newLogger(format, &b).Info("x", "timeout", 10*time.Second)
		if !strings.Contains(b.String(), want) {
			t.Errorf("%s log %q lacks %q", format, b.String(), want)
		}
	}
}
