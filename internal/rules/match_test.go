package rules

import (
	"errors"
	"strings"
	"testing"
)

const matchRules = `domain: m
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10, name: ip_any}
  - key: ip
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 1, name: ip_exact}
  - key: ip
    value: 10.*
    rate_limit: {unit: second, requests_per_unit: 2, name: ip_wild_10}
  - key: ip
    value: 10.0.*
    rate_limit: {unit: second, requests_per_unit: 3, name: ip_wild_10_0}
  - key: ip
    value: 192.168.0.1
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5, name: acme_user}
  - key: tenant
    descriptors:
      - key: plan
        rate_limit: {unit: minute, requests_per_unit: 6, name: tenant_plan}
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 7, name: tenant_user}
  - key: route
    value: /a
    rate_limit: {unit: second, requests_per_unit: 8, name: route_a}
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: second, requests_per_unit: 9, name: route_a_post}
  - key: vip
    rate_limit: {unlimited: true, name: vip}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100, name: trial}
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 11, name: a_b}
  - key: a
    value: b_*
    rate_limit: {unit: second, requests_per_unit: 12, name: a_wild}
  - key: user
    limits:
      - {unit: second, requests_per_unit: 10, name: user_rate}
      - {unit: day, requests_per_unit: 1000, name: user_daily}
  - key: k1
    value: v1
    descriptors:
      - key: user
        value: bob
        rate_limit: {unit: second, requests_per_unit: 5, name: specific}
  - key: k2
    value: v2
    descriptors:
      - key: user
        value: bob
        rate_limit: {unit: second, requests_per_unit: 10, name: override, replaces: [{name: specific}]}
`

func mustParse(t testing.TB, name, data string) *Domain {
	t.Helper()
	d, err := Parse(name, []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustSet(t testing.TB, ds ...*Domain) *Set {
	t.Helper()
	s, err := NewSet(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func e(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func names(ls []Match) string {
	var n []string
	for _, l := range ls {
		n = append(n, l.Name)
	}
	return strings.Join(n, ",")
}

func TestMatch(t *testing.T) {
	s := mustSet(t, mustParse(t, "m.yaml", matchRules))
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		want    string // limit names, comma-separated
	}{
		{"key only", "m", e("ip", "1.2.3.4"), "ip_any"},
		{"exact beats wildcard", "m", e("ip", "10.0.0.1"), "ip_exact"},
		{"first wildcard in file order", "m", e("ip", "10.0.0.2"), "ip_wild_10"},
		{"wildcard prefix", "m", e("ip", "10.9.9.9"), "ip_wild_10"},
		{"empty value falls back to key only", "m", e("ip", ""), "ip_any"},
		{"whitelisted value: matched, no limit", "m", e("ip", "192.168.0.1"), ""},
		{"depth must be equal: too deep", "m", e("ip", "1.2.3.4", "x", "y"), ""},
		{"depth must be equal: too shallow", "m", e("tenant", "acme"), ""},
		{"nested exact parent", "m", e("tenant", "acme", "user", "alice"), "acme_user"},
		{"nested key-only parent", "m", e("tenant", "globex", "user", "bob"), "tenant_user"},
		{"no backtracking to key-only sibling", "m", e("tenant", "acme", "plan", "gold"), ""},
		{"limit on an inner descriptor", "m", e("route", "/a"), "route_a"},
		{"limit below it", "m", e("route", "/a", "method", "POST"), "route_a_post"},
		{"no match below", "m", e("route", "/a", "method", "GET"), ""},
		{"unknown key", "m", e("nope", "x"), ""},
		{"unlimited", "m", e("vip", "x"), "vip"},
		{"shadow", "m", e("trial", "x"), "trial"},
		{"keys match exactly, not through underscores", "m", e("a", "b_c"), "a_wild"},
		{"key with underscore", "m", e("a_b", "c"), "a_b"},
		{"wildcard needs its key", "m", e("a_b", "b_c"), "a_b"},
		{"several limits", "m", e("user", "u1"), "user_rate,user_daily"},
		{"no entries", "m", nil, ""},
		{"unknown domain", "zzz", e("ip", "1.2.3.4"), ""},
		{"case sensitive", "m", e("IP", "1.2.3.4"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.Match(tt.domain, tt.entries, nil)
			if n := names(got); n != tt.want {
				t.Fatalf("Match(%q, %v) = [%s], want [%s]", tt.domain, tt.entries, n, tt.want)
			}
			for _, l := range got {
				if l.Unlimited != (l.Rule == nil) {
					t.Errorf("%s: Unlimited %v with Rule %v", l.Name, l.Unlimited, l.Rule)
				}
				if l.Depth() != len(tt.entries) {
					t.Errorf("%s: Depth %d, want %d", l.Name, l.Depth(), len(tt.entries))
				}
				if l.Shadow != (l.Name == "trial") {
					t.Errorf("%s: Shadow = %v", l.Name, l.Shadow)
				}
			}
		})
	}
	if _, ok := s.Domain("zzz"); ok {
		t.Error("Domain(zzz) found")
	}
	if _, err := s.Lookup("zzz"); !errors.Is(err, ErrNoSuchDomain) {
		t.Errorf("Lookup(zzz) = %v, want ErrNoSuchDomain", err)
	}
	if d, err := s.Lookup("m"); err != nil || d.Name() != "m" {
		t.Errorf("Lookup(m) = %v, %v", d, err)
	}
	var nilSet *Set
	if got := nilSet.Match("m", e("ip", "x"), nil); len(got) != 0 {
		t.Errorf("nil Set matched %v", got)
	}
}

func TestMatchRulePointersStable(t *testing.T) {
	s := mustSet(t, mustParse(t, "m.yaml", matchRules))
	a := s.Match("m", e("ip", "1.1.1.1"), nil)
	b := s.Match("m", e("ip", "2.2.2.2"), nil)
	if a[0].Rule != b[0].Rule || a[0].Spec != b[0].Spec {
		t.Fatal("one rule matched twice gives two Rule pointers")
	}
	if a[0].Rule.Name != "ip_any" || a[0].Rule.Validate() != nil {
		t.Fatalf("Rule = %+v", a[0].Rule)
	}
}

func TestApplyReplaces(t *testing.T) {
	d := mustParse(t, "m.yaml", matchRules)
	req := [][]Entry{
		e("k1", "v1", "user", "bob"),
		e("k2", "v2", "user", "bob"),
		e("ip", "1.2.3.4"),
	}
	tests := []struct {
		name string
		req  [][]Entry
		want string
		desc []int
	}{
		{"replaced when both match", req, "override,ip_any", []int{1, 2}},
		{"kept alone", req[:1], "specific", []int{0}},
		{"replacer alone", req[1:2], "override", []int{0}},
		{"replacer first", [][]Entry{req[1], req[0]}, "override", []int{0}},
		{"nothing to replace", [][]Entry{req[2], req[2]}, "ip_any,ip_any", []int{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ls []Match
			for i, entries := range tt.req {
				ls = d.Match(i, entries, ls)
			}
			ls = ApplyReplaces(ls)
			if got := names(ls); got != tt.want {
				t.Fatalf("got [%s], want [%s]", got, tt.want)
			}
			for i, l := range ls {
				if l.Descriptor != tt.desc[i] {
					t.Errorf("limit %d (%s): Descriptor %d, want %d", i, l.Name, l.Descriptor, tt.desc[i])
				}
			}
		})
	}
}

func TestMatchAllocs(t *testing.T) {
	s := mustSet(t, mustParse(t, "m.yaml", matchRules))
	dst := make([]Match, 0, 8)
	entries := e("tenant", "acme", "user", "alice")
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		ls := s.Match("m", entries, dst[:0])
		ls = ApplyReplaces(ls)
		buf = ls[0].AppendKey(buf[:0], entries)
	}); n != 0 {
		t.Errorf("Match+ApplyReplaces+AppendKey allocate %v times", n)
	}
}

// TestExampleRules checks that the shipped example rules behave as their
// comments say.
func TestExampleRules(t *testing.T) {
	s, err := Load("../../examples/rules")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		entries []Entry
		want    string
	}{
		{e("remote_address", "203.0.113.7"), "demo.remote_address.second"},
		{e("remote_address", "198.51.100.66"), "demo.remote_address_198.51.100.66.second"},
		{e("api_key", "premium-42"), "api_key_premium"},
		{e("api_key", "basic-42"), "api_key_standard"},
		{e("api_key", "trial-42"), "api_key_trial_pool"},
		{e("tenant", "acme", "user", "alice"), "acme_user"},
		{e("tenant", "globex", "user", "bob"), "tenant_user"},
		{e("tenant", "acme"), ""},
		{e("client", "healthcheck"), "demo.client_healthcheck"},
		{e("client", "internal-batch"), ""},
		{e("user", "alice"), "user_rate,user_daily"},
		{e("downstream", "geocoder"), "geocoder"},
	}
	for _, tt := range tests {
		ls := s.Match("demo", tt.entries, nil)
		if got := names(ls); got != tt.want {
			t.Errorf("Match(%v) = [%s], want [%s]", tt.entries, got, tt.want)
		}
	}
	trial := s.Match("demo", e("api_key", "trial-1"), nil)[0]
	other := s.Match("demo", e("api_key", "trial-2"), nil)[0]
	if !trial.Shadow || string(trial.AppendKey(nil, e("api_key", "trial-1"))) != string(other.AppendKey(nil, e("api_key", "trial-2"))) {
		t.Error("trial keys are not one shared shadow counter")
	}
	if l := s.Match("demo", e("client", "healthcheck"), nil)[0]; !l.Unlimited || l.Rule != nil {
		t.Error("healthcheck is not unlimited")
	}
	ls := s.Match("demo", e("user", "alice"), nil)
	if r := ls[0].Rule; r.Algorithm.String() != "gcra" || r.Burst != 50 || r.Quota != 10 {
		t.Errorf("user_rate = %+v", r)
	}
	if r := ls[1].Rule; r.Algorithm.String() != "fixed_window" || r.Calendar.String() != "day" || r.Location.String() != "Europe/Paris" || r.Failure.String() != "local" {
		t.Errorf("user_daily = %+v", r)
	}
}
