package main

// The model-checked test of the decision service: random rule files and
// request sequences (model_gen_test.go) on a virtual clock, driven
// through serve's real code path on every transport (gRPC RLS, POST
// /json, POST /v1/check), with --independent, --headers and the top-K
// trackers on and off, metrics on and off, on the memory store, on Redis
// and on Redis stopped (the failure modes), and compared, field by field,
// with a plain reference model of the decided semantics
// (model_ref_test.go); after the cases of a configuration, one scrape of
// /metrics is compared with the model's sluice_decisions_total and
// sluice_detailed_decisions_total of every case's domain. A failure is
// shrunk and printed as the YAML and requests that reproduce it, with the
// seed that reruns it:
//
//	go test -race -run 'TestModel/<config>' ./cmd/sluice/ -model.seed=SEED -model.cases=1

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/redistest"
)

var (
	modelSeed  = flag.Uint64("model.seed", 0, "TestModel: the first case's seed (0: from the clock, printed)")
	modelKnown = flag.Bool("model.known", false, "TestModelRegressions: run on Redis the cases of known Redis defects too")
	modelCases = flag.Int("model.cases", 0, "TestModel: cases per configuration (0: the default)")
)

// modelConfig is one configuration of serve the cases run on.
type modelConfig struct {
	name        string
	redis       bool
	independent bool
	headers     bool
	top         bool
	metricsOff  bool // serveHooks.noMetrics: the service counts nothing
	detailKeys  int  // --detailed-metric-keys; 0: the default (100)
	// down: Redis is stopped once serve has started (the freed port then
	// accepts and closes every connection), so every decision is its
	// rule's failure mode; replicas is --replicas (local's share).
	down     bool
	replicas int
}

// modelConfigs are the configurations: the memory store with every
// combination of --independent, --headers and top-K (two of them with
// metrics off and two with --detailed-metric-keys=3), Redis with each
// switch on and off (one with metrics off, one with 3 keys), and Redis
// down, all or nothing and independent.
func modelConfigs() []modelConfig {
	var cs []modelConfig
	for _, redis := range []bool{false, true} {
		i := 0
		for _, ind := range []bool{false, true} {
			for _, hd := range []bool{false, true} {
				for _, top := range []bool{false, true} {
					if redis && hd == top { // Redis: half the combinations, each switch on and off
						continue
					}
					store := "memory"
					if redis {
						store = "redis"
					}
					mc := modelConfig{redis: redis, independent: ind, headers: hd, top: top}
					mc.name = fmt.Sprintf("%s/independent=%v/headers=%v/top=%v", store, ind, hd, top)
					switch {
					case !redis && i%4 == 1, redis && i == 2:
						mc.detailKeys = 3
						mc.name += "/detailed-keys=3"
					case !redis && i%4 == 2, redis && i == 1:
						mc.metricsOff = true
						mc.name += "/metrics=off"
					}
					cs = append(cs, mc)
					i++
				}
			}
		}
	}
	for _, ind := range []bool{false, true} {
		mc := modelConfig{redis: true, down: true, independent: ind, headers: !ind, top: ind, replicas: 2}
		mc.name = fmt.Sprintf("redis-down/independent=%v/headers=%v/top=%v/replicas=2", ind, mc.headers, mc.top)
		if ind {
			mc.detailKeys = 3
			mc.name += "/detailed-keys=3"
		}
		cs = append(cs, mc)
	}
	return cs
}

const modelToken = "model-token"

// modelServer is one serve running in process, with its clock.
type modelServer struct {
	cfg   modelConfig
	up    map[string]string
	dir   string
	clock atomic.Int64 // Unix ns
	rls   rlsv3.RateLimitServiceClient
	http  *http.Client
	n     atomic.Int64 // domains used
	// Metrics: with perCase, runCase scrapes /metrics after a case and
	// compares its domain's series with the model's; otherwise, unless
	// noMetricsCheck, it keeps the model's counts in pending, for
	// checkMetrics to compare in one scrape.
	perCase        bool
	noMetricsCheck bool
	pending        []pendingMetrics
	seen           map[string]int // what the cases exercised (refModel.seen)
}

// pendingMetrics are the model's metrics of one case run, to compare.
type pendingMetrics struct {
	domain string
	mc     *mCase
	model  *refModel
}

func startModelServe(t testing.TB, mc modelConfig, redisAddr string) *modelServer {
	ms := &modelServer{cfg: mc, http: &http.Client{Timeout: 20 * time.Second}, seen: map[string]int{}}
	// An instant off every unit's boundary, so that windows do not align
	// with the cases.
	ms.clock.Store(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano() + 12_345_678_901)
	ms.dir = t.TempDir()
	cfg := serveConfig{
		rulesDir: ms.dir, store: "memory", memoryMaxKeys: 1 << 20,
		grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0", adminAddr: "127.0.0.1:0", adminToken: modelToken,
		maxBodyBytes: 1 << 20, shutdownTimeout: 5 * time.Second,
		independent: mc.independent, headers: mc.headers,
		hooks:        &serveHooks{now: func() time.Time { return time.Unix(0, ms.clock.Load()) }, noMetrics: mc.metricsOff},
		detailedKeys: 100, // service.DefaultDetailedKeys
	}
	if mc.detailKeys > 0 {
		cfg.detailedKeys = mc.detailKeys
	}
	cfg.limits.overloadOff = true
	if mc.top {
		cfg.top.k = 20
	}
	var down *redistest.Server
	if mc.down {
		down = redistest.Standalone(t)
		redisAddr = down.Addr()
	}
	if mc.redis {
		cfg.store, cfg.redisAddrs, cfg.redisPrefix = "redis", []string{redisAddr}, fmt.Sprintf("model%d:", time.Now().UnixNano())
		cfg.redisTimeout = 5 * time.Second // -race on a busy machine: never a failure mode here
		cfg.replicas = max(mc.replicas, 1)
	}
	if mc.down {
		cfg.redisTimeout = 200 * time.Millisecond
	}
	up := serveInProcessTB(t, cfg)
	if down != nil {
		down.Stop()
		holdPort(t, redisAddr)
	}
	ms.up = up
	conn, err := grpc.NewClient(up["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ms.rls = rlsv3.NewRateLimitServiceClient(conn)
	return ms
}

// holdPort listens on addr, the address of a Redis this test stopped,
// and closes every connection it accepts, so that no other process's
// server can take the port while serve still calls it: every call fails
// at once, and the breaker decides by the failure modes.
func holdPort(t testing.TB, addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("holding the stopped Redis's port: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// serveInProcessTB is serveInProcess for a testing.TB (the fuzz target's
// too).
func serveInProcessTB(t testing.TB, cfg serveConfig) map[string]string {
	h := recordHandler{ch: make(chan map[string]string, 1024)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(h)) }()
	timeout := time.After(10 * time.Second)
	var up map[string]string
	for up == nil {
		select {
		case r := <-h.ch:
			if r["msg"] == "sluice serving" {
				up = r
			}
		case err := <-done:
			t.Fatalf("serve returned: %v", err)
		case <-timeout:
			t.Fatal("serve did not start")
		}
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return up
}

// admin calls the admin API.
func (ms *modelServer) admin(method, path, body string) (int, string, error) {
	req, err := http.NewRequest(method, "http://"+ms.up["admin"]+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+modelToken)
	resp, err := ms.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// load puts yaml in force: the rules file is replaced, then reloaded
// synchronously through the admin API, which returns once the new rules
// are the service's. (The directory watcher may load the same file again
// later; that changes nothing.)
func (ms *modelServer) load(yaml string) error {
	tmp := filepath.Join(ms.dir, ".model.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(ms.dir, "model.yaml")); err != nil {
		return err
	}
	code, body, err := ms.admin("POST", "/admin/v1/reload", "")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("reload: %d %s", code, body)
	}
	return nil
}

// runCase runs mc on ms under a fresh domain and returns the first
// difference from the model, or "".
func (ms *modelServer) runCase(mc *mCase) (failure string, err error) {
	domain := fmt.Sprintf("m%x-%d", mc.Seed, ms.n.Add(1))
	if err := ms.load(mc.YAML(domain)); err != nil {
		return "", err
	}
	model := newRefModel(mc, domain, ms.cfg)
	overridden := map[string]bool{}
	defer func() {
		for r := range overridden {
			if code, body, derr := ms.admin("DELETE", "/admin/v1/overrides/"+domain+"/"+r, ""); derr != nil || (code != 200 && code != 204 && code != 404) {
				err = errors.Join(err, fmt.Errorf("deleting override %s: %d %s %v", r, code, body, derr))
			}
		}
	}()
	for i := range mc.Steps {
		st := &mc.Steps[i]
		now := ms.clock.Add(int64(st.Advance))
		want := model.apply(st, now)
		switch st.Kind {
		case sOverride:
			overridden[st.Rule] = true
			code, body, err := ms.admin("PUT", "/admin/v1/overrides/"+domain+"/"+st.Rule, fmt.Sprintf(`{"limit":%d,"ttl":"1h"}`, st.Quota))
			if err != nil {
				return "", err
			}
			if code != http.StatusOK {
				return fmt.Sprintf("step %d: override: %d %s", i, code, body), nil
			}
			continue
		case sDeleteOverride:
			code, body, err := ms.admin("DELETE", "/admin/v1/overrides/"+domain+"/"+st.Rule, "")
			if err != nil {
				return "", err
			}
			if code != 200 && code != 204 && code != 404 {
				return fmt.Sprintf("step %d: deleting override: %d %s", i, code, body), nil
			}
			continue
		}
		dom := domain
		if st.Unknown {
			dom += "-unknown"
		}
		var diffs []string
		var err error
		switch st.Transport {
		case tGRPC:
			diffs, err = ms.viaGRPC(dom, st, want, mc.Batched)
		case tJSON:
			diffs, err = ms.viaJSON(dom, st, want, mc.Batched)
		default:
			diffs, err = ms.viaCheck(dom, st, want, mc.Batched)
		}
		if err != nil {
			return "", fmt.Errorf("step %d: %w", i, err)
		}
		if len(diffs) > 0 {
			return fmt.Sprintf("step %d (%s): %s", i, st.String(), strings.Join(diffs, "; ")), nil
		}
	}
	for k, v := range model.seen {
		ms.seen[k] += v
	}
	switch {
	case ms.noMetricsCheck:
	case ms.perCase:
		got, err := ms.scrapeMetrics()
		if err != nil {
			return "", err
		}
		if diffs := ms.compareMetrics(got, domain, model); len(diffs) > 0 {
			return "after the last step, /metrics: " + strings.Join(diffs, "; "), nil
		}
	default:
		ms.pending = append(ms.pending, pendingMetrics{domain, mc, model})
	}
	return "", nil
}

// modelMetrics are the series of one scrape, by domain: "rule|outcome"
// of sluice_decisions_total and "rule|key|outcome" of
// sluice_detailed_decisions_total, each with its value.
type modelMetrics map[string]map[string]int64

var promLabel = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// scrapeMetrics reads the decisions' counters from /metrics.
func (ms *modelServer) scrapeMetrics() (modelMetrics, error) {
	resp, err := ms.http.Get("http://" + ms.up["http"] + "/metrics?name[]=sluice_decisions_total&name[]=sluice_detailed_decisions_total")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := modelMetrics{}
	for _, line := range strings.Split(string(b), "\n") {
		detailed := strings.HasPrefix(line, "sluice_detailed_decisions_total{")
		if !detailed && !strings.HasPrefix(line, "sluice_decisions_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil || end < 0 {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		if v == 0 {
			continue // a key's series are made for every outcome at once
		}
		l := map[string]string{}
		for _, m := range promLabel.FindAllStringSubmatch(line[:end], -1) {
			l[m[1]] = m[2]
		}
		k := "total|" + l["rule"] + "|" + l["outcome"]
		if detailed {
			k = "detailed|" + l["rule"] + "|" + l["key"] + "|" + l["outcome"]
		}
		if out[l["domain"]] == nil {
			out[l["domain"]] = map[string]int64{}
		}
		out[l["domain"]][k] = int64(v)
	}
	return out, nil
}

// compareMetrics compares domain's counters with the model's (none with
// metrics off).
func (ms *modelServer) compareMetrics(got modelMetrics, domain string, model *refModel) []string {
	want := map[string]int64{}
	if !ms.cfg.metricsOff {
		for k, v := range model.counts {
			want["total|"+k] = v
		}
		for k, v := range model.detailed {
			want["detailed|"+k] = v
		}
	}
	var diffs []string
	g := got[domain]
	for k, v := range want {
		if g[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s = %d, want %d", k, g[k], v))
		}
	}
	for k, v := range g {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s = %d, want none", k, v))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// checkMetrics compares, in one scrape, the metrics of the cases run
// since the last call with the model's; a case that differs is run
// again alone, comparing its metrics at once, and shrunk.
func (ms *modelServer) checkMetrics(t testing.TB) {
	pend := ms.pending
	ms.pending = nil
	if len(pend) == 0 {
		return
	}
	got, err := ms.scrapeMetrics()
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, p := range pend {
		diffs := ms.compareMetrics(got, p.domain, p.model)
		if len(diffs) == 0 {
			continue
		}
		ms.perCase = true
		if ms.checkCase(t, p.mc) {
			t.Errorf("%s(it did not fail again alone, so it was not shrunk)", report(p.mc, ms.cfg, "/metrics: "+strings.Join(diffs, "; ")))
		}
		ms.perCase = false
		if failed++; failed >= 3 {
			break
		}
	}
}

func rlsRequest(domain string, st *mStep) *rlsv3.RateLimitRequest {
	in := &rlsv3.RateLimitRequest{Domain: domain}
	if st.HasCost {
		in.HitsAddend = uint32(st.Cost)
	}
	for _, d := range st.Descs {
		rd := &commonv3.RateLimitDescriptor{IsNegativeHits: d.Negative}
		for _, e := range d.Entries {
			rd.Entries = append(rd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if d.HasCost {
			rd.HitsAddend = wrapperspb.UInt64(uint64(d.Cost))
		}
		if l := d.Inline; l != nil {
			rd.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: l.RPU, Unit: typev3.RateLimitUnit(l.Unit)}
			if l.Mult > 0 {
				rd.Limit.UnitMultiplier = wrapperspb.UInt32(l.Mult)
			}
		}
		in.Descriptors = append(in.Descriptors, rd)
	}
	return in
}

func (ms *modelServer) viaGRPC(domain string, st *mStep, want *refResponse, batched bool) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := ms.rls.ShouldRateLimit(ctx, rlsRequest(domain, st))
	if err != nil {
		return []string{fmt.Sprintf("gRPC error %v", err)}, nil
	}
	return ms.compareRLS(out, want, batched), nil
}

func (ms *modelServer) viaJSON(domain string, st *mStep, want *refResponse, batched bool) ([]string, error) {
	body, err := protojson.Marshal(rlsRequest(domain, st))
	if err != nil {
		return nil, err
	}
	resp, err := ms.http.Post("http://"+ms.up["http"]+"/json", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var diffs []string
	if d := wantUnavailable(resp, b, want); d != nil || want.Unavailable {
		return d, nil
	}
	wantCode := http.StatusOK
	if want.Over {
		wantCode = http.StatusTooManyRequests
	}
	if resp.StatusCode != wantCode {
		return []string{fmt.Sprintf("HTTP %d, want %d: %s", resp.StatusCode, wantCode, b)}, nil
	}
	var out rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(b, &out); err != nil {
		return []string{fmt.Sprintf("body %s: %v", b, err)}, nil
	}
	diffs = ms.compareRLS(&out, want, batched)
	if !batched {
		wh := wantHeaders(want, ms.cfg.headers)
		for _, k := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if got := resp.Header.Get(k); got != wh[k] {
				diffs = append(diffs, fmt.Sprintf("HTTP header %s = %q, want %q", k, got, wh[k]))
			}
		}
	}
	return diffs, nil
}

// wantUnavailable checks an HTTP answer when the model says the request
// is denied only by limits that failed closed: 503 with Retry-After of
// the breaker's cooldown (1 s), never 429; and that the answer is not 503
// otherwise.
func wantUnavailable(resp *http.Response, body []byte, want *refResponse) []string {
	switch {
	case !want.Unavailable && resp.StatusCode == http.StatusServiceUnavailable:
		return []string{fmt.Sprintf("HTTP 503, want a decision: %s", body)}
	case !want.Unavailable:
		return nil
	case resp.StatusCode != http.StatusServiceUnavailable:
		return []string{fmt.Sprintf("HTTP %d, want 503 (denied only by fail_closed limits): %s", resp.StatusCode, body)}
	case resp.Header.Get("Retry-After") != "1":
		return []string{fmt.Sprintf("HTTP 503 with Retry-After %q, want \"1\"", resp.Header.Get("Retry-After"))}
	}
	return nil
}

// compareRLS compares an RLS answer (gRPC or /json) with the model's.
func (ms *modelServer) compareRLS(out *rlsv3.RateLimitResponse, want *refResponse, batched bool) []string {
	var diffs []string
	wantOver := rlsv3.RateLimitResponse_OK
	if want.Over {
		wantOver = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if out.GetOverallCode() != wantOver {
		diffs = append(diffs, fmt.Sprintf("overall_code %v, want %v", out.GetOverallCode(), wantOver))
	}
	if got, exp := rlsQuotaMeta(out), wantQuotaMeta(want, want.Domain); got != exp {
		diffs = append(diffs, fmt.Sprintf("dynamic_metadata %s, want %s", got, exp))
	}
	if len(out.GetStatuses()) != len(want.Statuses) {
		return append(diffs, fmt.Sprintf("%d statuses, want %d", len(out.GetStatuses()), len(want.Statuses)))
	}
	for i, s := range out.GetStatuses() {
		w := &want.Statuses[i]
		wc := rlsv3.RateLimitResponse_OK
		if w.Over {
			wc = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if s.GetCode() != wc {
			diffs = append(diffs, fmt.Sprintf("descriptor %d: code %v, want %v", i, s.GetCode(), wc))
		}
		if batched {
			continue
		}
		var wl *rlsv3.RateLimitResponse_RateLimit
		var wrem uint32
		var wreset time.Duration
		hasReset := false
		switch {
		case w.Rule != nil && w.D.Reason == "fail_open":
			// nothing is known of the key: the rule's limit, no reset
			wl = &rlsv3.RateLimitResponse_RateLimit{Name: w.Rule.Name, RequestsPerUnit: uint32(min(max(w.Rule.Quota, 0), math.MaxUint32)), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(w.Rule.Unit)}
			wrem = uint32(min(max(w.D.Capacity, 0), math.MaxUint32))
		case w.Rule != nil:
			wl = &rlsv3.RateLimitResponse_RateLimit{Name: w.Rule.Name, RequestsPerUnit: uint32(min(max(w.Rule.Quota, 0), math.MaxUint32)), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(w.Rule.Unit)}
			wrem = uint32(min(max(w.D.Remaining, 0), math.MaxUint32))
			wreset, hasReset = w.D.ResetAfter, true
		case w.Unlimited:
			wrem = math.MaxUint32
		}
		gl := s.GetCurrentLimit()
		if (gl == nil) != (wl == nil) || (gl != nil && (gl.GetName() != wl.GetName() || gl.GetRequestsPerUnit() != wl.GetRequestsPerUnit() || gl.GetUnit() != wl.GetUnit())) {
			diffs = append(diffs, fmt.Sprintf("descriptor %d: current_limit %v, want %v", i, gl, wl))
		}
		if s.GetLimitRemaining() != wrem {
			diffs = append(diffs, fmt.Sprintf("descriptor %d: limit_remaining %d, want %d", i, s.GetLimitRemaining(), wrem))
		}
		if (s.GetDurationUntilReset() != nil) != hasReset || (hasReset && s.GetDurationUntilReset().AsDuration() != wreset) {
			diffs = append(diffs, fmt.Sprintf("descriptor %d: duration_until_reset %v, want %v", i, s.GetDurationUntilReset().AsDuration(), wreset))
		}
	}
	if !batched {
		wh := wantHeaders(want, ms.cfg.headers)
		gh := map[string]string{}
		for _, h := range out.GetResponseHeadersToAdd() {
			gh[h.GetKey()] = h.GetValue()
		}
		for _, k := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if gh[k] != wh[k] {
				diffs = append(diffs, fmt.Sprintf("response_headers_to_add %s = %q, want %q", k, gh[k], wh[k]))
			}
		}
		if len(gh) > len(wh) {
			diffs = append(diffs, fmt.Sprintf("response_headers_to_add %v, want %v", gh, wh))
		}
	}
	return diffs
}

// rlsQuotaMeta prints an answer's dynamic_metadata, canonically.
func rlsQuotaMeta(out *rlsv3.RateLimitResponse) string {
	md := out.GetDynamicMetadata()
	if md == nil {
		return "none"
	}
	b, err := json.Marshal(md.AsMap()) // sorted keys
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// wantQuotaMeta prints the dynamic_metadata internal/rls documents for
// the model's answer: none unless a quota_mode limit decided a
// descriptor; else the domain, quotaModeEnabled and, when some are, the
// indexes of the descriptors over their quota.
func wantQuotaMeta(want *refResponse, domain string) string {
	on, over := want.quotaMeta()
	if !on {
		return "none"
	}
	m := map[string]any{"domain": domain, "quotaModeEnabled": true}
	if len(over) > 0 {
		var v []any
		for _, i := range over {
			v = append(v, float64(i))
		}
		m["quotaModeViolations"] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// wantHeaders are the RateLimit fields of the model's answer: a policy
// and a limit item for every descriptor a limit decided, and Retry-After
// (seconds, rounded up) of the latest retry among the denying limits when
// the request is over and can succeed later.
func wantHeaders(want *refResponse, on bool) map[string]string {
	h := map[string]string{}
	if !on {
		return h
	}
	var pol, lim []string
	var retry time.Duration
	for _, s := range want.Statuses {
		if s.Rule == nil {
			continue
		}
		p := fmt.Sprintf("%q;q=%d;w=%d", s.Rule.Name, s.Rule.capacity(), s.Rule.window())
		if s.Rule.CostUnit != "" {
			p += fmt.Sprintf(";qu=%q", s.Rule.CostUnit)
		}
		pol = append(pol, p)
		if s.D.Reason != "fail_open" { // nothing is known of a key that failed open
			lim = append(lim, fmt.Sprintf("%q;r=%d;t=%d", s.D.Rule, max(0, s.D.Remaining), ceilDiv(s.D.ResetAfter, time.Second)))
		}
		if s.Over {
			retry = max(retry, s.D.RetryAfter)
		}
	}
	if len(pol) == 0 {
		return h
	}
	h["RateLimit-Policy"] = strings.Join(pol, ", ")
	if len(lim) > 0 {
		h["RateLimit"] = strings.Join(lim, ", ")
	}
	if want.Over && retry > 0 && retry != never {
		h["Retry-After"] = strconv.FormatInt(max(1, ceilDiv(retry, time.Second)), 10)
	}
	return h
}

func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(d/unit) + btoi(d%unit != 0)
}

func btoi(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// checkAnswer is the body of a /v1/check answer.
type checkAnswer struct {
	Allowed     bool   `json:"allowed"`
	Code        string `json:"code"`
	Descriptors []struct {
		Allowed      bool   `json:"allowed"`
		Code         string `json:"code"`
		Matched      bool   `json:"matched"`
		Rule         string `json:"rule"`
		Limit        *int64 `json:"limit"`
		CostUnit     string `json:"cost_unit"`
		Remaining    *int64 `json:"remaining"`
		ResetAfterMS *int64 `json:"reset_after_ms"`
		RetryAfterMS *int64 `json:"retry_after_ms"`
		Reason       string `json:"reason"`
		Shadow       bool   `json:"shadow"`
		Unlimited    bool   `json:"unlimited"`
		QuotaMode    bool   `json:"quota_mode"`
		QuotaOver    bool   `json:"quota_exceeded"`
	} `json:"descriptors"`
}

func (ms *modelServer) viaCheck(domain string, st *mStep, want *refResponse, batched bool) ([]string, error) {
	type entry struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	type desc struct {
		Entries []entry          `json:"entries"`
		Cost    *int64           `json:"cost,omitempty"`
		Costs   map[string]int64 `json:"costs,omitempty"`
	}
	body := struct {
		Domain      string           `json:"domain"`
		Descriptors []desc           `json:"descriptors"`
		Cost        *int64           `json:"cost,omitempty"`
		Costs       map[string]int64 `json:"costs,omitempty"`
	}{Domain: domain, Costs: st.Costs}
	if st.HasCost {
		body.Cost = &st.Cost
	}
	for i := range st.Descs {
		d := &st.Descs[i]
		jd := desc{Costs: d.Costs}
		for _, e := range d.Entries {
			jd.Entries = append(jd.Entries, entry(e))
		}
		if d.HasCost {
			jd.Cost = &d.Cost
		}
		body.Descriptors = append(body.Descriptors, jd)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	resp, err := ms.http.Post("http://"+ms.up["http"]+"/v1/check", "application/json", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if d := wantUnavailable(resp, rb, want); d != nil || want.Unavailable {
		return d, nil
	}
	wantCode, wantOverall := http.StatusOK, "OK"
	if want.Over {
		wantCode, wantOverall = http.StatusTooManyRequests, "OVER_LIMIT"
	}
	if resp.StatusCode != wantCode {
		return []string{fmt.Sprintf("HTTP %d, want %d: %s", resp.StatusCode, wantCode, rb)}, nil
	}
	var out checkAnswer
	dec := json.NewDecoder(bytes.NewReader(rb))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return []string{fmt.Sprintf("body %s: %v", rb, err)}, nil
	}
	var diffs []string
	if out.Allowed != !want.Over || out.Code != wantOverall {
		diffs = append(diffs, fmt.Sprintf("allowed=%v code=%s, want %s", out.Allowed, out.Code, wantOverall))
	}
	if len(out.Descriptors) != len(want.Statuses) {
		return append(diffs, fmt.Sprintf("%d descriptors, want %d", len(out.Descriptors), len(want.Statuses))), nil
	}
	for i, g := range out.Descriptors {
		w := &want.Statuses[i]
		wc := "OK"
		if w.Over {
			wc = "OVER_LIMIT"
		}
		if g.Allowed != !w.Over || g.Code != wc {
			diffs = append(diffs, fmt.Sprintf("descriptor %d: allowed=%v code=%s, want %s", i, g.Allowed, g.Code, wc))
		}
		if g.QuotaMode != w.Quota || g.QuotaOver != w.QuotaExceeded {
			diffs = append(diffs, fmt.Sprintf("descriptor %d: quota_mode=%v quota_exceeded=%v, want %v %v", i, g.QuotaMode, g.QuotaOver, w.Quota, w.QuotaExceeded))
		}
		if batched {
			continue
		}
		var got, exp string
		got = fmt.Sprintf("matched=%v rule=%q unit=%q reason=%s shadow=%v unlimited=%v limit=%s remaining=%s reset_ms=%s retry_ms=%s",
			g.Matched, g.Rule, g.CostUnit, g.Reason, g.Shadow, g.Unlimited, ip(g.Limit), ip(g.Remaining), ip(g.ResetAfterMS), ip(g.RetryAfterMS))
		switch {
		case w.Rule != nil:
			retry := ceilDiv(w.D.RetryAfter, time.Millisecond)
			if w.D.RetryAfter == never {
				retry = -1
			}
			rem, reset := strconv.FormatInt(max(0, w.D.Remaining), 10), strconv.FormatInt(ceilDiv(w.D.ResetAfter, time.Millisecond), 10)
			if w.D.Reason == "fail_open" { // nothing is known of the key
				rem, reset = "-", "-"
			}
			exp = fmt.Sprintf("matched=true rule=%q unit=%q reason=%s shadow=%v unlimited=false limit=%d remaining=%s reset_ms=%s retry_ms=%d",
				w.D.Rule, w.Rule.CostUnit, w.D.Reason, w.Shadow, w.D.Capacity, rem, reset, retry)
		case w.Unlimited:
			exp = fmt.Sprintf(`matched=true rule=%q unit="" reason=ok shadow=false unlimited=true limit=- remaining=- reset_ms=- retry_ms=-`, w.UnlimName)
		default:
			exp = `matched=false rule="" unit="" reason=ok shadow=false unlimited=false limit=- remaining=- reset_ms=- retry_ms=-`
		}
		if got != exp {
			diffs = append(diffs, fmt.Sprintf("descriptor %d: %s, want %s", i, got, exp))
		}
	}
	if !batched {
		// /v1/check always sends the fields, whatever --headers says.
		wh := wantHeaders(want, true)
		for _, k := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if got := resp.Header.Get(k); got != wh[k] {
				diffs = append(diffs, fmt.Sprintf("HTTP header %s = %q, want %q", k, got, wh[k]))
			}
		}
	}
	return diffs, nil
}

func ip(p *int64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(*p, 10)
}

// shrink deletes steps, descriptors, entries, limits and descriptors of
// the rule file from a failing case, one at a time, keeping each deletion
// after which the case still fails, until none does; at most budget runs.
func (ms *modelServer) shrink(mc *mCase, budget int) (*mCase, string) {
	if !ms.noMetricsCheck {
		defer func(old bool) { ms.perCase = old }(ms.perCase)
		ms.perCase = true
	}
	fails := func(c *mCase) string {
		if budget <= 0 {
			return ""
		}
		budget--
		f, err := ms.runCase(c)
		if err != nil {
			return ""
		}
		return f
	}
	last := ""
	for progress := true; progress && budget > 0; {
		progress = false
		for _, cand := range shrinkCandidates(mc) {
			if f := fails(cand); f != "" {
				mc, last, progress = cand, f, true
				break
			}
		}
	}
	return mc, last
}

// shrinkCandidates returns the cases one deletion smaller than mc.
func shrinkCandidates(mc *mCase) []*mCase {
	var out []*mCase
	for i := range mc.Steps {
		c := cloneCase(mc)
		c.Steps = append(c.Steps[:i], c.Steps[i+1:]...)
		if len(c.Steps) > 0 {
			out = append(out, c)
		}
	}
	for i := range mc.Steps {
		if mc.Steps[i].Advance != 0 {
			c := cloneCase(mc)
			c.Steps[i].Advance = 0
			out = append(out, c)
		}
		for j := range mc.Steps[i].Descs {
			if len(mc.Steps[i].Descs) > 1 {
				c := cloneCase(mc)
				c.Steps[i].Descs = append(c.Steps[i].Descs[:j], c.Steps[i].Descs[j+1:]...)
				out = append(out, c)
			}
		}
	}
	for p := range len(paths(mc.Nodes, nil, nil)) {
		c := cloneCase(mc)
		path := paths(c.Nodes, nil, nil)[p]
		removeNode(c, path)
		out = append(out, c)
		c = cloneCase(mc)
		n := paths(c.Nodes, nil, nil)[p][len(path)-1]
		for li := range n.Limits {
			c2 := cloneCase(mc)
			n2 := paths(c2.Nodes, nil, nil)[p][len(path)-1]
			dropped := n2.Limits[li].Name
			n2.Limits = append(n2.Limits[:li], n2.Limits[li+1:]...)
			dropRule(c2, dropped)
			out = append(out, c2)
		}
	}
	return out
}

// removeNode deletes the last node of path and every rule under it.
func removeNode(c *mCase, path []*mNode) {
	n := path[len(path)-1]
	for _, p := range paths([]*mNode{n}, nil, nil) {
		for _, l := range p[len(p)-1].Limits {
			dropRule(c, l.Name)
		}
	}
	parent := &c.Nodes
	if len(path) > 1 {
		parent = &path[len(path)-2].Children
	}
	for i, x := range *parent {
		if x == n {
			*parent = append((*parent)[:i], (*parent)[i+1:]...)
			break
		}
	}
}

// dropRule removes what names a deleted rule: replaces and overrides.
func dropRule(c *mCase, name string) {
	for _, p := range paths(c.Nodes, nil, nil) {
		for _, l := range p[len(p)-1].Limits {
			var keep []string
			for _, r := range l.Replaces {
				if r != name {
					keep = append(keep, r)
				}
			}
			l.Replaces = keep
		}
	}
	var steps []mStep
	for _, s := range c.Steps {
		if s.Kind == sRequest || s.Rule != name {
			steps = append(steps, s)
		}
	}
	c.Steps = steps
}

func cloneCase(mc *mCase) *mCase {
	b, err := json.Marshal(mc)
	if err != nil {
		panic(err)
	}
	var c mCase
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return &c
}

// report prints a failing case as what reproduces it.
func report(mc *mCase, cfg modelConfig, failure string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d on %s: %s\n", mc.Seed, cfg.name, failure)
	if mc.Hand {
		fmt.Fprintf(&b, "rerun: go test -race -run 'TestModelRegressions/%s' ./cmd/sluice/ (case %d)\n", cfg.name, mc.Seed)
	} else {
		fmt.Fprintf(&b, "rerun: go test -race -run 'TestModel/%s' ./cmd/sluice/ -model.seed=%d -model.cases=1\n", cfg.name, mc.Seed)
	}
	b.WriteString("rules (the domain is renamed per run):\n")
	b.WriteString(mc.YAML("DOMAIN"))
	b.WriteString("steps (after each +advance of the virtual clock):\n")
	for i := range mc.Steps {
		fmt.Fprintf(&b, "  %d. %s\n", i, mc.Steps[i].String())
	}
	return b.String()
}

// checkCase runs one case and, when it fails, shrinks it and fails t.
func (ms *modelServer) checkCase(t testing.TB, mc *mCase) bool {
	f, err := ms.runCase(mc)
	if err != nil {
		t.Fatalf("seed %d on %s: %v", mc.Seed, ms.cfg.name, err)
	}
	if f == "" {
		return true
	}
	small, sf := ms.shrink(mc, 400)
	if sf == "" {
		t.Errorf("%s(it did not fail again alone, so it was not shrunk: an earlier case may have left state behind)", report(mc, ms.cfg, f))
		return false
	}
	t.Errorf("%sshrunk from %d steps:\n%s", report(mc, ms.cfg, f), len(mc.Steps), report(small, ms.cfg, sf))
	return false
}

// assertNoPanics scrapes /metrics: every sluice_panics_total, where serve
// has it, must be 0.
func (ms *modelServer) assertNoPanics(t testing.TB) {
	resp, err := ms.http.Get("http://" + ms.up["http"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "sluice_panics_total") && !strings.HasSuffix(line, " 0") {
			t.Errorf("serve recovered panics: %s", line)
		}
	}
	if code, _, err := ms.admin("GET", "/admin/v1/status", ""); err != nil || code != http.StatusOK {
		t.Errorf("admin status after the run: %d %v", code, err)
	}
}

// TestModel runs random cases on every configuration and compares every
// answer with the reference model.
func TestModel(t *testing.T) {
	cases := *modelCases
	if cases == 0 {
		cases = 200 // 14 configurations: 2,800 cases, under a minute under -race
		if testing.Short() {
			cases = 40
		}
	}
	base := *modelSeed
	if base == 0 {
		base = uint64(time.Now().UnixNano())
		t.Logf("seed %d (rerun with -model.seed=%d)", base, base)
	}
	redisAddr := modelRedis(t)
	for _, mc := range modelConfigs() {
		t.Run(mc.name, func(t *testing.T) {
			if mc.redis && redisAddr == "" {
				t.Skip("no redis-server on PATH")
			}
			ms := startModelServe(t, mc, redisAddr)
			start := time.Now()
			failed := 0
			for i := range cases {
				seed := base + uint64(i)
				c := genCase(rngChooser{rand.New(rand.NewPCG(seed, 0x5eed))}, genOpts{redis: mc.redis, down: mc.down}, seed)
				if !ms.checkCase(t, c) {
					if failed++; failed >= 3 {
						break
					}
				}
			}
			ms.checkMetrics(t)
			ms.assertNoPanics(t)
			t.Logf("%d cases in %v; exercised: %s", cases, time.Since(start).Round(time.Millisecond), seenString(ms.seen))
		})
	}
}

func seenString(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

// modelRedis starts one redis-server for every Redis configuration of t
// and returns its address; without redis-server on PATH it returns "" and
// they are skipped, except under CI=true (redistest fails then).
func modelRedis(t *testing.T) string {
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") != "true" {
		return ""
	}
	return redistest.Standalone(t).Addr()
}

// FuzzModel runs the generator on the fuzzer's bytes, one case per input,
// on one serve (memory store, headers and top-K on) started once per
// fuzzing process.
func FuzzModel(f *testing.F) {
	for _, s := range [][]byte{{}, {1, 2, 3, 4, 5, 6, 7, 8}, bytes.Repeat([]byte{0x9d, 0x31, 0x07}, 40)} {
		f.Add(s)
	}
	ms := startModelServe(f, modelConfig{name: "fuzz/memory/headers=true/top=true", headers: true, top: true}, "")
	ms.noMetricsCheck = true // one scrape per input would grow with the run
	var n atomic.Uint64
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 512 {
			b = b[:512] // a bounded case
		}
		c := genCase(&byteChooser{b: b}, genOpts{}, n.Add(1))
		ms.checkCase(t, c)
	})
}

// modelRegressions are cases written by hand: shapes the generator finds
// rarely, and the shrunk reproductions of defects the test found.
func modelRegressions() []*mCase {
	inline := func(v string) mDesc {
		return mDesc{Entries: []mEntry{{"k0", v}}, Inline: &mInline{RPU: 1, Unit: 2}}
	}
	cs := []*mCase{
		// Two descriptors matching an unlimited key-only rule, each
		// with its own inline limit: two counters.
		{Seed: 1, Nodes: []*mNode{{ID: 0, Key: "k0", Limits: []*mLimit{{Name: "r0", Unlimited: true}}}},
			Steps: []mStep{
				{Transport: tGRPC, Descs: []mDesc{inline("a")}},
				{Transport: tGRPC, Descs: []mDesc{inline("b")}},
				{Transport: tJSON, Descs: []mDesc{inline("a"), inline("c")}},
			}},
		// Redis's denial cache: a remembered denial of one item, and a
		// cost beyond another's capacity.
		{Seed: 4, Nodes: []*mNode{
			{ID: 0, Key: "k0", Limits: []*mLimit{{Name: "r0", Unit: 1, Quota: 1, Algorithm: algFixed}}},
			{ID: 1, Key: "k1", Limits: []*mLimit{{Name: "r1", Unit: 2, Quota: 2, Algorithm: algFixed}}}},
			Steps: []mStep{
				{Transport: tCheck, Descs: []mDesc{{Entries: []mEntry{{"k1", "a"}}}}},
				{Transport: tCheck, HasCost: true, Cost: 2, Descs: []mDesc{{Entries: []mEntry{{"k1", "a"}}}}},
				{Transport: tCheck, HasCost: true, Cost: 2, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}}, {Entries: []mEntry{{"k1", "a"}}}}},
			}},
		// A batched bucket on Redis, one item admitted and the next
		// denied in one request: the first's unit must not be consumed.
		{Seed: 5, Batched: true, Nodes: []*mNode{
			{ID: 0, Key: "k1", Value: "ab", Limits: []*mLimit{{Name: "r0", Unit: 1, Quota: 2, Algorithm: algGCRA, WriteAlg: true, Counting: "batched"}}}},
			Steps: []mStep{
				{Transport: tJSON, Descs: []mDesc{{Entries: []mEntry{{"k1", "ab"}}}}},
				{Transport: tCheck, Descs: []mDesc{{Entries: []mEntry{{"k1", "ab"}}}, {Entries: []mEntry{{"k1", "ab"}}}}},
				{Transport: tCheck, Descs: []mDesc{{Entries: []mEntry{{"k1", "ab"}}}}},
			}},
		// A request refused by its quota-mode limit, with a refund
		// beside a consumption: the consumption is given back, the
		// refund (of nothing) is not made a consumption (the service
		// negated every cost in one all-or-nothing call, which the
		// store denied, so the consumption was kept).
		{Seed: 6, Nodes: []*mNode{
			{ID: 0, Key: "k0", Limits: []*mLimit{{Name: "r0", Unit: 3, Quota: 5, Algorithm: algFixed}}},
			{ID: 1, Key: "k1", Limits: []*mLimit{{Name: "r1", Unit: 3, Quota: 1, Algorithm: algFixed}}},
			{ID: 2, Key: "k2", Value: "a", Quota: true, Limits: []*mLimit{{Name: "r2", Unit: 3, Quota: 1, Algorithm: algFixed}}}},
			Steps: []mStep{
				{Transport: tCheck, Descs: []mDesc{{Entries: []mEntry{{"k2", "a"}}}}},
				{Transport: tCheck, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}}, {Entries: []mEntry{{"k1", "a"}}, HasCost: true, Cost: -5}, {Entries: []mEntry{{"k2", "a"}}}}},
				{Transport: tCheck, HasCost: true, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}}, {Entries: []mEntry{{"k1", "a"}}}}},
			}},
		// A GCRA bucket whose rate an override changes (denied under
		// the new rate), then decided 110ms later: Redis answered a
		// reset 55ms shorter than the model and the memory store, from
		// its denial cache, which took the rescaled debt to run down one
		// for one with the clock (found by TestModel, fixed).
		{Seed: 7, Nodes: []*mNode{{ID: 0, Key: "k0", Value: "b", Quota: true, Limits: []*mLimit{{Name: "r0", Unit: 2, Quota: 2, Burst: 6, Algorithm: algGCRA, WriteAlg: true}}}},
			Steps: []mStep{
				{Transport: tGRPC, Descs: []mDesc{{Entries: []mEntry{{"k0", "b"}}, HasCost: true, Cost: 1}}},
				{Transport: tCheck, HasCost: true, Cost: 3, Descs: []mDesc{{Entries: []mEntry{{"k0", "b"}}}}},
				{Kind: sOverride, Rule: "r0", Quota: 4},
				{Transport: tJSON, HasCost: true, Cost: 1, Descs: []mDesc{{Entries: []mEntry{{"k0", "b"}}}}},
				{Advance: 110 * time.Millisecond, Transport: tJSON, Descs: []mDesc{{Entries: []mEntry{{"k0", "b"}}, HasCost: true, Cost: 1}}},
			}},
		// Costs per unit on v1/check: a limit of a unit the costs name,
		// one they do not (0: a check), one without a unit (the cost),
		// the request's costs and a descriptor's own.
		{Seed: 8, Nodes: []*mNode{
			{ID: 0, Key: "k0", List: true, Limits: []*mLimit{
				{Name: "r0", Unit: 2, Quota: 3, Algorithm: algFixed, WriteAlg: true},
				{Name: "r1", Unit: 1, Quota: 5, Algorithm: algFixed, WriteAlg: true, CostUnit: "tok"},
				{Name: "r2", Unit: 3, Quota: 2, Algorithm: algGCRA, CostUnit: "ru"}}}},
			Steps: []mStep{
				{Transport: tCheck, Costs: map[string]int64{"tok": 4}, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}}}},
				{Transport: tCheck, Costs: map[string]int64{"tok": 4}, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}, Costs: map[string]int64{"ru": 2, "zz": 9}}}},
				{Transport: tCheck, HasCost: true, Cost: 2, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}, Costs: map[string]int64{"tok": 1}}}},
				{Transport: tGRPC, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}, HasCost: true, Cost: 1}}},
			}},
		// A shadow limit beside fewer real ones (the top-K panic).
		{Seed: 2, Nodes: []*mNode{
			{ID: 0, Key: "k0", Shadow: true, List: true, Limits: []*mLimit{{Name: "s0", Unit: 1, Quota: 1, Algorithm: algGCRA}, {Name: "s1", Unit: 2, Quota: 1, Algorithm: algFixed, WriteAlg: true}}},
			{ID: 1, Key: "k1", Limits: []*mLimit{{Name: "r0", Unit: 1, Quota: 2, Algorithm: algFixed}}}},
			Steps: []mStep{
				{Transport: tGRPC, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}}, {Entries: []mEntry{{"k1", "a"}}}}},
				{Transport: tGRPC, Descs: []mDesc{{Entries: []mEntry{{"k0", "a"}}}, {Entries: []mEntry{{"k0", "b"}}}}},
				{Transport: tCheck, Descs: []mDesc{{Entries: []mEntry{{"k1", "a"}}}, {Entries: []mEntry{{"k0", "a"}}}}},
			}},
	}
	for _, c := range cs {
		c.Hand = true
	}
	return cs
}

// TestModelRegressions runs modelRegressions on every configuration.
func TestModelRegressions(t *testing.T) {
	redisAddr := modelRedis(t)
	for _, mc := range modelConfigs() {
		t.Run(mc.name, func(t *testing.T) {
			if mc.redis && redisAddr == "" {
				t.Skip("no redis-server on PATH")
			}
			ms := startModelServe(t, mc, redisAddr)
			ms.perCase = true
			for _, c := range modelRegressions() {
				if mc.redis && c.KnownRedis != "" && !*modelKnown {
					t.Logf("case %d skipped on Redis, a known defect (-model.known runs it): %s", c.Seed, c.KnownRedis)
					continue
				}
				if mc.down && c.overrides() {
					continue // overrides live in Redis: genCase makes none when it is down
				}
				ms.checkCase(t, c)
			}
			ms.assertNoPanics(t)
		})
	}
}
