package rls

import (
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// TestQuotaModeMetadata: a descriptor over its quota_mode limit is
// OVER_LIMIT in an OK response whose dynamic_metadata names it; a response
// without quota-mode limits carries no metadata; the metadata survives
// the codec's encoding.
func TestQuotaModeMetadata(t *testing.T) {
	d, err := rules.Parse("q.yaml", []byte(`domain: q
descriptors:
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: backend
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(d)
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{JanitorInterval: -1})
	defer st.Close()
	svc, err := service.New(service.Options{Store: st, Rules: set})
	if err != nil {
		t.Fatal(err)
	}
	s := New(svc, Options{})
	req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: entries("plain", "x")}, {Entries: entries("backend", "a")}, {Entries: entries("backend", "b")},
	}}
	plain := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: req.Descriptors[:1]}
	if out, err := s.ShouldRateLimit(t.Context(), plain); err != nil || out.DynamicMetadata != nil {
		t.Fatalf("no quota mode: %v, metadata %v; want none", err, out.GetDynamicMetadata())
	}
	out, err := s.ShouldRateLimit(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	md := out.GetDynamicMetadata().GetFields()
	if !md["quotaModeEnabled"].GetBoolValue() || md["domain"].GetStringValue() != "q" || md["quotaModeViolations"] != nil {
		t.Fatalf("within quota: metadata %v; want quotaModeEnabled, domain q, no violations", out.GetDynamicMetadata())
	}
	// Only a over its quota: the request is OK.
	req.Descriptors[2] = &commonv3.RateLimitDescriptor{Entries: entries("backend", "c")}
	if out, err = s.ShouldRateLimit(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if out.OverallCode != rlsv3.RateLimitResponse_OK || out.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT || out.Statuses[2].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a over quota: %v; want OK overall, descriptor 1 OVER_LIMIT", out)
	}
	bs, err := codec{}.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var back rlsv3.RateLimitResponse
	if err := proto.Unmarshal(bs.Materialize(), &back); err != nil {
		t.Fatal(err)
	}
	v := back.GetDynamicMetadata().GetFields()["quotaModeViolations"].GetListValue().GetValues()
	if len(v) != 1 || v[0].GetNumberValue() != 1 {
		t.Errorf("quotaModeViolations = %v; want [1]", v)
	}
	// Both over: the request is OVER_LIMIT.
	req.Descriptors[2] = &commonv3.RateLimitDescriptor{Entries: entries("backend", "a")}
	if out, err = s.ShouldRateLimit(t.Context(), req); err != nil || out.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("every quota over: %v, %v; want OVER_LIMIT", out, err)
	}
}
