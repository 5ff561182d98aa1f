package rules

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// decodedLevel and decodedKey are a storage key parsed back, to show that
// AppendKey is injective: decode(encode(x)) == x.
type decodedLevel struct {
	key      string
	kind     kind
	pattern  string
	share    bool
	value    string
	hasValue bool
}

type decodedKey struct {
	domain string
	levels []decodedLevel
	tail   string
}

func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if mustEscape(c) && c != '%' {
			return "", fmt.Errorf("unescaped %q in %q", c, s)
		}
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("short escape in %q", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] {
			return "", fmt.Errorf("bad escape in %q", s)
		}
		if !mustEscape(byte(v)) {
			return "", fmt.Errorf("needless escape %%%s in %q", s[i+1:i+3], s)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

func decodeKey(k string) (decodedKey, error) {
	var d decodedKey
	head, tail, ok := strings.Cut(k, "#")
	if !ok {
		return d, errors.New("no #")
	}
	d.tail = tail
	parts := strings.Split(head, "|")
	var err error
	if d.domain, err = unescape(parts[0]); err != nil {
		return d, err
	}
	for _, p := range parts[1:] {
		i := strings.IndexAny(p, "=:~")
		if i < 0 {
			return d, fmt.Errorf("level %q has no marker", p)
		}
		var lv decodedLevel
		if lv.key, err = unescape(p[:i]); err != nil {
			return d, err
		}
		rest := p[i+1:]
		switch p[i] {
		case '=':
			lv.kind = kindExact
			lv.pattern, err = unescape(rest)
		case ':':
			lv.kind, lv.hasValue = kindAny, true
			lv.value, err = unescape(rest)
		case '~':
			lv.kind = kindWild
			if pat, ok := strings.CutSuffix(rest, "*"); ok && !strings.ContainsAny(pat, "=*") {
				lv.share = true
				lv.pattern, err = unescape(pat)
			} else {
				pat, val, ok := strings.Cut(rest, "=")
				if !ok {
					return d, fmt.Errorf("wildcard level %q has no = or *", p)
				}
				lv.hasValue = true
				if lv.pattern, err = unescape(pat); err == nil {
					lv.value, err = unescape(val)
				}
			}
		}
		if err != nil {
			return d, err
		}
		d.levels = append(d.levels, lv)
	}
	return d, nil
}

func TestAppendKeyFormat(t *testing.T) {
	d := mustParse(t, "k.yaml", `domain: "my dom|ain"
descriptors:
  - key: "t|x"
    value: "a=b"
    descriptors:
      - key: user
        limits:
          - {unit: second, requests_per_unit: 1}
          - {unit: day, requests_per_unit: 100, calendar: true, timezone: Europe/Paris}
  - key: api
    value: "pre/*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: api
    value: "x*"
    rate_limit: {unit: minute, requests_per_unit: 5}
`)
	tests := []struct {
		entries []Entry
		want    []string
	}{
		{e("t|x", "a=b", "user", "{ab}\x00 é%"), []string{
			"my%20dom%7Cain|t%7Cx=a%3Db|user:%7Bab%7D%00%20%C3%A9%25#gcra/1s",
			"my%20dom%7Cain|t%7Cx=a%3Db|user:%7Bab%7D%00%20%C3%A9%25#fixed_window/cal.day@Europe/Paris",
		}},
		{e("api", "pre/1"), []string{"my%20dom%7Cain|api~pre%2F*#fixed_window/60s"}},
		{e("api", "pre/2"), []string{"my%20dom%7Cain|api~pre%2F*#fixed_window/60s"}},
		{e("api", "x:y"), []string{"my%20dom%7Cain|api~x=x%3Ay#fixed_window/60s"}},
	}
	for _, tt := range tests {
		ls := d.Match(0, tt.entries, nil)
		if len(ls) != len(tt.want) {
			t.Fatalf("%v matched %d limits, want %d", tt.entries, len(ls), len(tt.want))
		}
		for i, l := range ls {
			if got := string(l.AppendKey([]byte("prefix:"), tt.entries)); got != "prefix:"+tt.want[i] {
				t.Errorf("AppendKey(%v) = %q, want %q", tt.entries, got, "prefix:"+tt.want[i])
			}
			if got := l.AppendKey(nil, tt.entries[:len(tt.entries)-1]); got != nil {
				t.Errorf("AppendKey with the wrong depth = %q, want nothing", got)
			}
		}
	}
}

// TestAppendKeyNoCollisions builds the keys of every rule of the fixtures
// and the examples for many tricky values and checks that two keys are
// equal only when they should be: same limit, and same values at the
// levels whose value is part of the key.
func TestAppendKeyNoCollisions(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.good.yaml")
	examples, _ := filepath.Glob("../../examples/rules/*.yaml")
	files = append(files, examples...)
	values := []string{"", "a", "a|b", "a%7Cb", "a=b", "a:b", "a~b", "a*", "a#b", "a/b", "{a}", "\x00", "\xff", " ", "%", "%25", "é",
		"premium-1", "trial-1", "10.0.0.1", "value1", "/api/x"}
	seen := make(map[string]string)
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Parse(file, data)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range d.Specs() {
			if s.Unlimited {
				continue
			}
			entries := make([]Entry, s.Depth())
			for _, v := range values {
				for i := range entries {
					entries[i].Value = v
					if !s.levels[i].value {
						entries[i].Value = "" // not part of the key
					}
				}
				k := string(s.AppendKey(nil, entries))
				id := fmt.Sprintf("%s %s %q", d.Name(), s.Name, entries)
				if prev, dup := seen[k]; dup && prev != id {
					t.Errorf("key %q of %s also for %s", k, id, prev)
				}
				seen[k] = id
				if _, err := decodeKey(k); err != nil {
					t.Errorf("key %q does not decode: %v", k, err)
				}
			}
		}
	}
	if len(seen) < 100 {
		t.Fatalf("only %d keys built", len(seen))
	}
}

// FuzzStorageKey checks that the key encoding is injective: the key of
// random domains, keys, patterns and values decodes back to them.
func FuzzStorageKey(f *testing.F) {
	f.Add("d", "k", "v", "k2", "p", "v2", uint8(0), "#gcra/1s")
	f.Add("a|b", "=", ":", "~", "*", "%", uint8(1), "#fixed_window/60s")
	f.Add("", "", "", "", "", "", uint8(2), "#x")
	f.Add("{x}", "k", "\x00", "k", "/", "\xff", uint8(3), "#sliding_log/cal.month@Europe/Paris")
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, pattern, v2 string, shape uint8, tail string) {
		kinds := []kind{kindExact, kindAny, kindWild, kindWild}
		kind1, kind2 := kinds[shape&3], kinds[(shape>>2)&3]
		share2 := (shape>>2)&3 == 3
		s := &Spec{
			domainKey: escape(domain),
			levels: []keyLevel{
				newKeyLevel(k1, kind1, v1, false),
				newKeyLevel(k2, kind2, pattern, share2),
			},
			tail: tail,
		}
		if !strings.HasPrefix(tail, "#") {
			s.tail = "#" + tail
		}
		entries := []Entry{{k1, v1}, {k2, v2}}
		key := s.AppendKey(nil, entries)
		if bytes.Count(key, []byte("#")) == 0 {
			t.Fatalf("key %q has no tail", key)
		}
		got, err := decodeKey(string(key))
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		want := decodedKey{domain: domain, tail: s.tail[1:]}
		l1 := decodedLevel{key: k1, kind: kind1}
		switch kind1 {
		case kindExact:
			l1.pattern = v1
		case kindAny:
			l1.value, l1.hasValue = v1, true
		case kindWild:
			l1.pattern, l1.value, l1.hasValue = v1, v1, true
		}
		l2 := decodedLevel{key: k2, kind: kind2}
		switch {
		case kind2 == kindExact:
			l2.pattern = pattern
		case kind2 == kindAny:
			l2.value, l2.hasValue = v2, true
		case share2:
			l2.pattern, l2.share = pattern, true
		default:
			l2.pattern, l2.value, l2.hasValue = pattern, v2, true
		}
		want.levels = []decodedLevel{l1, l2}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("key %q decodes to %+v, want %+v", key, got, want)
		}
		if n := testing.AllocsPerRun(1, func() { key = s.AppendKey(key[:0], entries) }); n != 0 {
			t.Fatalf("AppendKey into a large enough buffer allocated %v times", n)
		}
	})
}

// TestAppendKeyRuleChanges checks what a changed rule keeps: the count
// survives a changed limit, burst, name, shadow flag or failure mode, and
// starts afresh with a changed window or algorithm.
func TestAppendKeyRuleChanges(t *testing.T) {
	key := func(rateLimit string) string {
		t.Helper()
		d := mustParse(t, "c.yaml", "domain: c\ndescriptors:\n  - key: k\n    rate_limit: "+rateLimit+"\n")
		return string(d.Specs()[0].AppendKey(nil, e("k", "v")))
	}
	base := key("{unit: minute, requests_per_unit: 10}")
	tests := []struct {
		rateLimit string
		same      bool
	}{
		{"{unit: minute, requests_per_unit: 20}", true},
		{"{unit: MINUTE, requests_per_unit: 10, name: renamed}", true},
		{"{unit: minute, requests_per_unit: 10, failure_mode: fail_closed}", true},
		{"{period: 60s, requests_per_unit: 10, algorithm: fixed_window}", true},
		{"{unit: hour, requests_per_unit: 10}", false},
		{"{unit: minute, requests_per_unit: 10, algorithm: gcra}", false},
		{"{unit: minute, requests_per_unit: 10, calendar: true}", false},
		{"{unit: minute, requests_per_unit: 10, calendar: true, timezone: Asia/Kolkata}", false},
	}
	for _, tt := range tests {
		if got := key(tt.rateLimit); (got == base) != tt.same {
			t.Errorf("rate_limit %s: key %q, base %q; want same=%v", tt.rateLimit, got, base, tt.same)
		}
	}
	// The same limit on another descriptor, or in another domain, is
	// another counter.
	d := mustParse(t, "c.yaml", "domain: c2\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	if got := string(d.Specs()[0].AppendKey(nil, e("k", "v"))); got == base {
		t.Errorf("two domains share key %q", got)
	}
}

// TestAppendMetricKey checks the per-value metric key against what
// envoyproxy/ratelimit writes in its stats key for each flag.
func TestAppendMetricKey(t *testing.T) {
	d := mustParse(t, "m.yaml", `domain: m
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: remote
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    value_to_metric: true
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    descriptors:
      - key: path
        value: /api/*
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: tier
    value: gold
    descriptors:
      - key: file
        value: f*
        share_threshold: true
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: site
    detailed_metric: true
    descriptors:
      - key: page
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	for _, tt := range []struct {
		entries  []Entry
		perValue bool
		want     string
	}{
		{[]Entry{{"plain", "x"}}, false, "m.plain"},
		{[]Entry{{"remote", "10.0.0.1"}}, true, "m.remote_10.0.0.1"},
		{[]Entry{{"remote", ""}}, true, "m.remote_"},
		{[]Entry{{"tenant", "acme"}, {"path", "/api/v1"}}, true, "m.tenant_acme.path_/api/*"},
		{[]Entry{{"user", "bob"}, {"path", "/api/v1"}}, true, "m.user.path_/api/v1"},
		{[]Entry{{"tier", "gold"}, {"file", "f1"}}, true, "m.tier_gold.file_f*"},
		// detailed_metric applies to the limits of its own descriptor only.
		{[]Entry{{"site", "s"}, {"page", "p"}}, false, "m.site.page"},
	} {
		ms := d.Match(0, tt.entries, nil)
		if len(ms) != 1 {
			t.Fatalf("%v: %d matches, want 1", tt.entries, len(ms))
		}
		s := ms[0].Spec
		if got := string(s.AppendMetricKey(nil, tt.entries)); got != tt.want || s.PerValueMetric() != tt.perValue {
			t.Errorf("%v: AppendMetricKey = %q, PerValueMetric = %v; want %q, %v", tt.entries, got, s.PerValueMetric(), tt.want, tt.perValue)
		}
	}
}
