package rls_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/ratelimit"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// The conformance corpus: testdata/conformance/*.yaml each hold rules and
// ordered requests with the exact statuses expected, sent over a real gRPC
// connection on loopback. See 02-per-second.yaml for the format.

type corpusCase struct {
	Independent bool       `yaml:"independent"`
	Rules       string     `yaml:"rules"`
	Start       string     `yaml:"start"`
	Steps       []caseStep `yaml:"steps"`
}

type caseStep struct {
	Advance     string       `yaml:"advance"`
	Domain      string       `yaml:"domain"`
	Descriptors []descriptor `yaml:"descriptors"`
	Hits        uint32       `yaml:"hits"`
	Repeat      int          `yaml:"repeat"`
	Want        struct {
		Overall  string       `yaml:"overall"`
		Statuses []wantStatus `yaml:"statuses"`
	} `yaml:"want"`
}

// A descriptor is written [k=v, ...] or {entries: [k=v], hits, refund,
// inline: N/unit}, the last an inline limit.
type descriptor struct {
	Entries []string `yaml:"entries"`
	Hits    *uint64  `yaml:"hits"`
	Refund  bool     `yaml:"refund"`
	Inline  string   `yaml:"inline"`
}

func (d *descriptor) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		return n.Decode(&d.Entries)
	}
	type plain descriptor
	return n.Decode((*plain)(d))
}

type wantStatus struct {
	Code      string `yaml:"code"`
	None      bool   `yaml:"none"`
	Unlimited bool   `yaml:"unlimited"`
	Name      string `yaml:"name"`
	Limit     uint32 `yaml:"limit"`
	Unit      string `yaml:"unit"`
	Remaining *int   `yaml:"remaining"`
	Step      int    `yaml:"step"` // added to remaining at each repeat
	Reset     string `yaml:"reset"`
}

// A storeFactory returns a new, empty store whose clock is now.
type storeFactory func(t *testing.T, now func() time.Time) ratelimit.Store

func memoryStore(t *testing.T, now func() time.Time) ratelimit.Store {
	s := memstore.New(memstore.Options{Now: now, JanitorInterval: -1})
	t.Cleanup(func() { s.Close() })
	return s
}

// redisStores returns a factory of stores on the Redis at addrs, each with
// a key prefix of its own. The corpus checks decisions, not the failure
// policy: the timeout is long enough for a loaded machine (a call that
// timed out after Redis applied it would be answered by the policy and
// leave its count behind), and a store that fell back fails the test.
func redisStores(addrs []string) storeFactory {
	n := 0
	return func(t *testing.T, now func() time.Time) ratelimit.Store {
		n++
		c, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: addrs, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := redisstore.New(c, redisstore.Options{Now: now, Prefix: fmt.Sprintf("conformance%d:", n), Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if st := s.Stats(); st.Errors > 0 {
				t.Errorf("the store had %d Redis errors: %+v", st.Errors, st)
			}
			s.Close()
		})
		return s
	}
}

func TestConformance(t *testing.T) {
	files, err := filepath.Glob("testdata/conformance/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	stores := []struct {
		name string
		new  func(t *testing.T) storeFactory
	}{
		{"memory", func(*testing.T) storeFactory { return memoryStore }},
		{"redis", func(t *testing.T) storeFactory { return redisStores([]string{redistest.Standalone(t).Addr()}) }},
		{"redis-cluster", func(t *testing.T) storeFactory { return redisStores(redistest.Cluster(t).Addrs()) }},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			newStore := st.new(t)
			for _, f := range files {
				t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
					runCase(t, f, newStore)
				})
			}
		})
	}
}

func runCase(t *testing.T, file string, newStore storeFactory) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var c corpusCase
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	dom, err := rules.Parse(file+":rules", []byte(c.Rules))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(dom)
	if err != nil {
		t.Fatal(err)
	}
	clk := storetest.NewClock(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC))
	if c.Start != "" {
		start, err := time.Parse(time.RFC3339Nano, c.Start)
		if err != nil {
			t.Fatal(err)
		}
		clk.Set(start)
	}
	svc, err := service.New(service.Options{Store: newStore(t, clk.Now), Rules: set, Independent: c.Independent})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, rls.New(svc, rls.Options{}))
	for i, st := range c.Steps {
		if st.Advance != "" {
			d, err := time.ParseDuration(st.Advance)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			clk.Advance(d)
		}
		req := st.request(t, dom.Name())
		for r := range max(st.Repeat, 1) {
			resp, err := client.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatalf("step %d, request %d: %v", i, r+1, err)
			}
			if msg := st.check(resp, r); msg != "" {
				t.Fatalf("step %d, request %d: %s\nresponse: %v", i, r+1, msg, resp)
			}
		}
	}
}

// serve starts srv on a loopback port and returns a client connected to it.
func serve(t *testing.T, srv *rls.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return rlsv3.NewRateLimitServiceClient(conn)
}

var units = map[string]typev3.RateLimitUnit{"second": 1, "minute": 2, "hour": 3, "day": 4, "month": 5, "year": 6, "week": 7}

func (st *caseStep) request(t *testing.T, domain string) *rlsv3.RateLimitRequest {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: st.Hits}
	if st.Domain != "" {
		req.Domain = st.Domain
	}
	for _, d := range st.Descriptors {
		pd := &commonv3.RateLimitDescriptor{IsNegativeHits: d.Refund}
		for _, e := range d.Entries {
			k, v, _ := strings.Cut(e, "=")
			pd.Entries = append(pd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if d.Hits != nil {
			pd.HitsAddend = wrapperspb.UInt64(*d.Hits)
		}
		if d.Inline != "" {
			n, unit, _ := strings.Cut(d.Inline, "/")
			rpu, err := strconv.ParseUint(n, 10, 32)
			if err != nil || units[unit] == 0 {
				t.Fatalf("bad inline limit %q", d.Inline)
			}
			pd.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(rpu), Unit: units[unit]}
		}
		req.Descriptors = append(req.Descriptors, pd)
	}
	return req
}

// check compares a response with the step's expectations at repeat r.
func (st *caseStep) check(resp *rlsv3.RateLimitResponse, r int) string {
	if got := resp.GetOverallCode().String(); got != st.Want.Overall {
		return fmt.Sprintf("overall code %s, want %s", got, st.Want.Overall)
	}
	if len(resp.GetStatuses()) != len(st.Descriptors) {
		return fmt.Sprintf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(st.Descriptors))
	}
	for i, w := range st.Want.Statuses {
		s := resp.GetStatuses()[i]
		lim := s.GetCurrentLimit()
		bad := func(format string, a ...any) string {
			return fmt.Sprintf("status %d: ", i) + fmt.Sprintf(format, a...)
		}
		switch {
		case s.GetCode().String() != w.Code:
			return bad("code %s, want %s", s.GetCode(), w.Code)
		case w.None && (lim != nil || s.GetLimitRemaining() != 0):
			return bad("a limit where none applies")
		case w.Unlimited && (lim != nil || s.GetLimitRemaining() != 1<<32-1):
			return bad("unlimited: want no current_limit and remaining 2^32-1")
		case w.None || w.Unlimited:
			continue
		case lim == nil:
			return bad("no current_limit")
		case w.Name != "" && lim.GetName() != w.Name:
			return bad("limit name %q, want %q", lim.GetName(), w.Name)
		case w.Limit != 0 && lim.GetRequestsPerUnit() != w.Limit:
			return bad("requests_per_unit %d, want %d", lim.GetRequestsPerUnit(), w.Limit)
		case w.Unit != "" && lim.GetUnit().String() != w.Unit:
			return bad("unit %s, want %s", lim.GetUnit(), w.Unit)
		case w.Remaining != nil && int(s.GetLimitRemaining()) != *w.Remaining+w.Step*r:
			return bad("limit_remaining %d, want %d", s.GetLimitRemaining(), *w.Remaining+w.Step*r)
		}
		reset := s.GetDurationUntilReset().AsDuration()
		if w.Reset != "" {
			want, err := time.ParseDuration(w.Reset)
			if err != nil {
				return bad("bad reset %q", w.Reset)
			}
			if reset != want {
				return bad("duration_until_reset %v, want %v", reset, want)
			}
		} else if window := rules.Unit(lim.GetUnit()).Duration(); window > 0 && (reset < 0 || reset > window) {
			return bad("duration_until_reset %v outside [0, %v]", reset, window)
		}
	}
	return ""
}
