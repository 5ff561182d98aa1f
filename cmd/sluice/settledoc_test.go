package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/internal/rls"
)

// TestSettleEnvoyDoc decodes the Envoy configuration of docs/service.md's
// stream-done section as Envoy does (unknown fields refused, then Envoy's
// validation rules) and checks that it reserves and settles: a rate limit
// at request time with ReserveKey and a hits_addend, one at stream end
// with SettleKey, the same other descriptor keys, and a hits_addend.
func TestSettleEnvoyDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/service.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "### Costs known only when the stream ends")
	_, block, ok2 := strings.Cut(sec, "```yaml\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/service.md has no yaml block in its stream-done section")
	}
	var tree struct {
		PerFilter map[string]any `yaml:"typed_per_filter_config"`
	}
	if err := yaml.Unmarshal([]byte(block), &tree); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(tree.PerFilter["envoy.filters.http.ratelimit"])
	if err != nil {
		t.Fatal(err)
	}
	var typed anypb.Any // decoded as Envoy does: by its @type
	if err := protojson.Unmarshal(js, &typed); err != nil {
		t.Fatalf("typed_per_filter_config: %v", err)
	}
	var per ratelimitfilterv3.RateLimitPerRoute
	if err := typed.UnmarshalTo(&per); err != nil {
		t.Fatalf("not a RateLimitPerRoute: %v", err)
	}
	if err := per.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	keys := map[bool][]string{} // apply_on_stream_done → descriptor keys
	for _, rl := range per.GetRateLimits() {
		if rl.GetHitsAddend().GetFormat() == "" {
			t.Errorf("rate limit %v has no hits_addend format", rl)
		}
		for _, a := range rl.GetActions() {
			keys[rl.GetApplyOnStreamDone()] = append(keys[rl.GetApplyOnStreamDone()], a.GetRequestHeaders().GetDescriptorKey())
		}
	}
	req, done := strings.Join(keys[false], ","), strings.Join(keys[true], ",")
	if req != "user,"+rls.ReserveKey || done != "user,"+rls.SettleKey {
		t.Errorf("descriptor keys %q at request time and %q at stream end; want user and %s, user and %s", req, done, rls.ReserveKey, rls.SettleKey)
	}
}
