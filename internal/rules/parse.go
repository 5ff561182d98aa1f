package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/ratelimit"
)

// Keys accepted at each level of a rule file.
var (
	rootKeys       = []string{"domain", "descriptors", "metadata"}
	descriptorKeys = []string{"key", "value", "descriptors", "rate_limit", "limits", "shadow_mode",
		"quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata"}
	limitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "burst", "period", "calendar", "timezone", "failure_mode", "metadata"}
	replacesKeys = []string{"name"}
)

// rawDesc is one descriptor as written, before the tree is built.
type rawDesc struct {
	line          int
	path          string
	key, value    string
	limits        []*rawLimit
	children      []*rawDesc
	shadow        bool
	quota         bool
	detailed      bool
	valueToMetric bool
	share         bool
	shareLine     int
}

// rawLimit is one rate_limit block or limits entry as written.
type rawLimit struct {
	line     int
	path     string
	extended bool // an entry of limits:

	name      string
	nameLine  int
	replaces  []string
	replLines []int
	replPaths []string

	unlimited  bool
	unit       Unit
	rpu        int64
	hasRPU     bool
	alg        ratelimit.Algorithm
	hasAlg     bool
	burst      int64
	hasBurst   bool
	period     time.Duration
	periodLine int
	calendar   bool
	loc        *time.Location
	tzLine     int
	failure    ratelimit.FailureMode
}

type parser struct {
	file      string
	errs      []error
	truncated bool
	nDesc     int
	overDesc  bool
}

func (p *parser) add(line int, key string, err error) {
	if len(p.errs) >= maxErrorsPerFile {
		p.truncated = true
		return
	}
	if line < 1 {
		line = 1
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Key: key, Err: err})
}

func (p *parser) errorf(n *yaml.Node, key, format string, a ...any) {
	line := 1
	if n != nil {
		line = n.Line
	}
	p.add(line, key, fmt.Errorf(format, a...))
}

func (p *parser) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	errs := p.errs
	if p.truncated {
		last := errs[len(errs)-1].(*Error)
		errs = append(errs, &Error{File: p.file, Line: last.Line,
			Err: fmt.Errorf("too many errors; only the first %d are shown", maxErrorsPerFile)})
	}
	return errors.Join(errs...)
}

// Parse parses one rule file: filename is used in errors and in
// Spec.Source, data is its content. It returns every error it finds,
// joined; each is an *Error naming the file, the line and the key.
func Parse(filename string, data []byte) (*Domain, error) {
	p := &parser{file: filename}
	if len(data) > MaxFileBytes {
		p.add(1, "", fmt.Errorf("file is larger than %d bytes (MaxFileBytes)", MaxFileBytes))
		return nil, p.err()
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.add(1, "", errors.New("empty file: want a mapping with domain and descriptors"))
		} else {
			p.yamlError(err)
		}
		return nil, p.err()
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.add(extra.Line, "", errors.New("more than one YAML document; put each domain in its own file"))
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(err)
	}
	if len(p.errs) > 0 {
		return nil, p.err()
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	var (
		domain     string
		domainOK   bool
		domainNode *yaml.Node
		descs      []*rawDesc
	)
	root = p.resolve(root)
	if root.Kind != yaml.MappingNode {
		p.errorf(root, "", "want a mapping with domain and descriptors, got %s", describe(root))
		return nil, p.err()
	}
	p.fields(root, "", rootKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "domain":
			domainNode = k
			domain, domainOK = p.str(v, "domain")
		case "descriptors":
			descs = p.descriptors(v, "descriptors", 1)
		}
	})
	switch {
	case domainNode == nil:
		p.errorf(root, "domain", "missing domain")
	case !domainOK:
	case domain == "":
		p.errorf(domainNode, "domain", "empty domain")
	case len(domain) > MaxKeyValueBytes:
		p.errorf(domainNode, "domain", "domain is %d bytes; the bound is %d (MaxKeyValueBytes)", len(domain), MaxKeyValueBytes)
	}
	// Build even after errors, to report duplicates too; build skips the
	// checks that partial input would make wrong.
	d := p.build(domain, descs, len(p.errs) == 0)
	if domainNode != nil {
		d.line = domainNode.Line
	}
	if len(p.errs) > 0 {
		return nil, p.err()
	}
	return d, nil
}

// yamlError turns an error of the YAML decoder into an *Error, taking the
// line from its "yaml: line N: " prefix when there is one.
func (p *parser) yamlError(err error) {
	msg := err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	line := 1
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				line = n
				msg = strings.TrimSpace(rest[i+1:])
			}
		}
	}
	p.add(line, "", fmt.Errorf("invalid YAML: %s", msg))
}

// resolve follows aliases.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	if n == nil || n.Kind == yaml.AliasNode {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
	}
	return n
}

// describe names the kind of a node for errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return strconv.Quote(n.Value)
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return n.ShortTag() + " " + strconv.Quote(n.Value)
	}
	return "an empty document"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// fields calls f for every key of the mapping n, in order, after checking
// that the key is a string, allowed and not a duplicate.
func (p *parser) fields(n *yaml.Node, path string, allowed []string, f func(key string, k, v *yaml.Node)) {
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := p.resolve(n.Content[i]), p.resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
			p.errorf(k, path, "a key must be a string, got %s", describe(k))
			continue
		}
		key := k.Value
		if k.ShortTag() == "!!merge" {
			p.errorf(k, path, "merge keys (<<) are not supported; repeat the keys or use an alias for the whole block")
			continue
		}
		if line, dup := seen[key]; dup {
			p.errorf(k, join(path, key), "duplicate key %q (first at line %d)", key, line)
			continue
		}
		seen[key] = k.Line
		found := false
		for _, a := range allowed {
			if a == key {
				found = true
				break
			}
		}
		if !found {
			p.errorf(k, join(path, key), "unknown key %q (want one of %s)", key, strings.Join(allowed, ", "))
			continue
		}
		f(key, k, v)
	}
}

// str returns the text of a scalar. Numbers and booleans are taken as
// written (value: 30 is the string "30"), as envoyproxy/ratelimit does.
func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.errorf(n, path, "want a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) boolean(n *yaml.Node, path string) bool {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		p.errorf(n, path, "want true or false, got %s", describe(n))
		return false
	}
	b, err := strconv.ParseBool(strings.ToLower(n.Value))
	if err != nil {
		p.errorf(n, path, "want true or false, got %s", describe(n))
	}
	return b
}

func (p *parser) integer(n *yaml.Node, path string) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		p.errorf(n, path, "want an integer, got %s", describe(n))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		p.errorf(n, path, "integer %s out of range", n.Value)
		return 0, false
	}
	return v, true
}

// list returns the items of a sequence; null is an empty list.
func (p *parser) list(n *yaml.Node, path string) []*yaml.Node {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, "want a list, got %s", describe(n))
		return nil
	}
	return n.Content
}

func (p *parser) descriptors(n *yaml.Node, path string, depth int) []*rawDesc {
	items := p.list(n, path)
	if len(items) > 0 && depth > MaxDepth {
		p.errorf(n, path, "descriptors nested deeper than %d levels (MaxDepth) can never match a request", MaxDepth)
		return nil
	}
	var out []*rawDesc
	for i, item := range items {
		if p.overDesc {
			return out
		}
		p.nDesc++
		if p.nDesc > MaxDescriptorsPerDomain {
			p.overDesc = true
			p.errorf(item, path, "more than %d descriptors in one domain (MaxDescriptorsPerDomain)", MaxDescriptorsPerDomain)
			return out
		}
		ipath := fmt.Sprintf("%s[%d]", path, i)
		item = p.resolve(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item, ipath, "want a descriptor mapping, got %s", describe(item))
			continue
		}
		if d := p.descriptor(item, ipath, depth); d != nil {
			out = append(out, d)
		}
	}
	return out
}

func (p *parser) descriptor(n *yaml.Node, path string, depth int) *rawDesc {
	d := &rawDesc{line: n.Line, path: path}
	hasKey, keyOK, ok := false, true, true
	var rateLimitNode, limitsNode *yaml.Node
	p.fields(n, path, descriptorKeys, func(key string, k, v *yaml.Node) {
		kp := join(path, key)
		switch key {
		case "key":
			hasKey = true
			d.key, keyOK = p.str(v, kp)
			if keyOK && d.key == "" {
				p.errorf(k, kp, "descriptor has empty key")
				keyOK = false
			}
			if len(d.key) > MaxKeyValueBytes {
				p.errorf(k, kp, "key is %d bytes; the bound is %d (MaxKeyValueBytes)", len(d.key), MaxKeyValueBytes)
				keyOK = false
			}
		case "value":
			var vok bool
			d.value, vok = p.str(v, kp)
			ok = ok && vok
			if len(d.value) > MaxKeyValueBytes {
				p.errorf(k, kp, "value is %d bytes; the bound is %d (MaxKeyValueBytes)", len(d.value), MaxKeyValueBytes)
				ok = false
			}
		case "descriptors":
			d.children = p.descriptors(v, kp, depth+1)
		case "rate_limit":
			rateLimitNode = k
			if v.Kind != yaml.MappingNode {
				p.errorf(v, kp, "want a mapping, got %s", describe(v))
				return
			}
			if l := p.limit(v, kp, false); l != nil {
				d.limits = append(d.limits, l)
			}
		case "limits":
			limitsNode = k
			items := p.list(v, kp)
			if len(items) == 0 {
				p.errorf(v, kp, "empty limits list; give at least one limit or remove the key")
			}
			if len(items) > MaxLimitsPerDescriptor {
				p.errorf(v, kp, "%d limits on one descriptor; the bound is %d (MaxLimitsPerDescriptor)", len(items), MaxLimitsPerDescriptor)
				items = items[:MaxLimitsPerDescriptor]
			}
			for i, it := range items {
				ip := fmt.Sprintf("%s[%d]", kp, i)
				it = p.resolve(it)
				if it.Kind != yaml.MappingNode {
					p.errorf(it, ip, "want a limit mapping, got %s", describe(it))
					continue
				}
				if l := p.limit(it, ip, true); l != nil {
					d.limits = append(d.limits, l)
				}
			}
		case "shadow_mode":
			d.shadow = p.boolean(v, kp)
		case "quota_mode":
			d.quota = p.boolean(v, kp)
		case "detailed_metric":
			d.detailed = p.boolean(v, kp)
		case "value_to_metric":
			d.valueToMetric = p.boolean(v, kp)
		case "share_threshold":
			d.share = p.boolean(v, kp)
			d.shareLine = k.Line
		case "metadata":
			// Accepted and ignored: free-form data for tools.
		}
	})
	if !hasKey {
		p.errorf(n, join(path, "key"), "descriptor has empty key")
		keyOK = false
	}
	if rateLimitNode != nil && limitsNode != nil {
		p.errorf(limitsNode, join(path, "limits"), "give rate_limit or limits, not both")
	}
	if d.share && !strings.HasSuffix(d.value, "*") {
		p.add(d.shareLine, join(path, "share_threshold"), errors.New("share_threshold applies to wildcard values (ending in *) only"))
	}
	if !keyOK || !ok {
		return nil
	}
	return d
}

func (p *parser) limit(n *yaml.Node, path string, extended bool) *rawLimit {
	l := &rawLimit{line: n.Line, path: path, extended: extended}
	var unitNode, unlimitedNode, burstNode, calNode, algNode *yaml.Node
	type keyAt struct {
		key  string
		node *yaml.Node
	}
	var given []keyAt // keys that conflict with unlimited
	ok := true
	p.fields(n, path, limitKeys, func(key string, k, v *yaml.Node) {
		kp := join(path, key)
		switch key {
		case "unit", "requests_per_unit", "algorithm", "burst", "period", "calendar", "timezone", "failure_mode":
			given = append(given, keyAt{key, k})
		}
		switch key {
		case "name":
			l.nameLine = k.Line
			name, sok := p.str(v, kp)
			ok = ok && sok
			if sok && name == "" {
				p.errorf(v, kp, "empty name; remove the key to have one generated")
				ok = false
			}
			l.name = name
		case "replaces":
			for i, it := range p.list(v, kp) {
				ip := fmt.Sprintf("%s[%d]", kp, i)
				it = p.resolve(it)
				if it.Kind != yaml.MappingNode {
					p.errorf(it, ip, "want a mapping {name: ...}, got %s", describe(it))
					ok = false
					continue
				}
				var name string
				p.fields(it, ip, replacesKeys, func(_ string, _, v *yaml.Node) {
					name, _ = p.str(v, join(ip, "name"))
				})
				if name == "" {
					p.errorf(it, ip, "empty replaces entry: want {name: <rule name>}")
					ok = false
					continue
				}
				l.replaces = append(l.replaces, name)
				l.replLines = append(l.replLines, it.Line)
				l.replPaths = append(l.replPaths, ip)
			}
		case "unlimited":
			unlimitedNode = k
			l.unlimited = p.boolean(v, kp)
		case "unit":
			unitNode = k
			s, sok := p.str(v, kp)
			if !sok {
				ok = false
				return
			}
			u, uok := parseUnit(s)
			if !uok {
				p.errorf(v, kp, "invalid unit %q (want second, minute, hour, day, week, month or year)", s)
				ok = false
			}
			l.unit = u
		case "requests_per_unit":
			v64, iok, good := p.quantity(v, kp, "requests_per_unit", 0, "is negative")
			ok = ok && good
			l.rpu, l.hasRPU = v64, iok
		case "algorithm":
			algNode = k
			s, sok := p.str(v, kp)
			if !sok {
				ok = false
				return
			}
			a, err := ratelimit.ParseAlgorithm(s)
			if err != nil {
				p.errorf(v, kp, "invalid algorithm %q (want gcra, fixed_window, sliding_log, sliding_window or leaky_bucket)", s)
				ok = false
			}
			l.alg, l.hasAlg = a, true
		case "burst":
			burstNode = k
			v64, iok, good := p.quantity(v, kp, "burst", 1, "must be at least 1 (omit it to mean requests_per_unit)")
			ok = ok && good
			l.burst, l.hasBurst = v64, iok
		case "period":
			l.periodLine = v.Line
			s, sok := p.str(v, kp)
			if !sok {
				ok = false
				return
			}
			d, err := time.ParseDuration(s)
			switch {
			case err != nil:
				p.errorf(v, kp, "invalid period %q: want a Go duration such as 1s, 90s or 1h30m", s)
				ok = false
			case d <= 0:
				p.errorf(v, kp, "period %s must be positive", s)
				ok = false
			case d > ratelimit.MaxPeriod:
				p.errorf(v, kp, "period %s exceeds %v", s, ratelimit.MaxPeriod)
				ok = false
			}
			l.period = d
		case "calendar":
			calNode = k
			l.calendar = p.boolean(v, kp)
		case "timezone":
			l.tzLine = v.Line
			s, sok := p.str(v, kp)
			if !sok {
				ok = false
				return
			}
			if s == "" || s == "Local" {
				p.errorf(v, kp, "invalid timezone %q: name an IANA zone such as Europe/Paris or UTC", s)
				ok = false
				return
			}
			loc, err := time.LoadLocation(s)
			if err != nil {
				p.errorf(v, kp, "unknown timezone %q (want an IANA zone such as Europe/Paris)", s)
				ok = false
				return
			}
			l.loc = loc
		case "failure_mode":
			s, sok := p.str(v, kp)
			if !sok {
				ok = false
				return
			}
			f, err := ratelimit.ParseFailureMode(s)
			if err != nil {
				p.errorf(v, kp, "invalid failure_mode %q (want fail_open, fail_closed or local)", s)
				ok = false
			}
			l.failure = f
		case "metadata":
		}
	})
	if !ok {
		return nil
	}
	if l.unlimited {
		if extended {
			p.errorf(unlimitedNode, join(path, "unlimited"), "unlimited is not allowed in a limits list; use rate_limit: {unlimited: true}")
			return nil
		}
		for _, g := range given {
			if g.key == "unit" {
				p.errorf(g.node, join(path, "unit"), "should not specify unit when unlimited")
			} else {
				p.errorf(g.node, join(path, g.key), "%s is not allowed with unlimited: true", g.key)
			}
		}
		if len(given) > 0 {
			return nil
		}
		return l
	}
	if !l.hasRPU {
		p.errorf(n, join(path, "requests_per_unit"), "missing requests_per_unit (or unlimited: true)")
		ok = false
	}
	switch {
	case unitNode == nil && l.periodLine == 0:
		p.errorf(n, join(path, "unit"), "missing unit (or period)")
		ok = false
	case unitNode != nil && l.periodLine != 0:
		p.errorf(unitNode, join(path, "unit"), "give unit or period, not both")
		ok = false
	}
	if l.calendar {
		switch {
		case l.periodLine != 0:
			p.add(calNode.Line, join(path, "calendar"), errors.New("calendar windows need a unit (minute, hour, day, week, month or year), not a period"))
			ok = false
		case l.unit == Second:
			p.add(calNode.Line, join(path, "calendar"), errors.New("calendar windows need unit minute, hour, day, week, month or year; second windows are already aligned"))
			ok = false
		}
		if l.hasAlg && l.alg != ratelimit.FixedWindow {
			p.errorf(algNode, join(path, "algorithm"), "calendar windows need algorithm fixed_window, not %s", l.alg)
			ok = false
		}
	} else if l.tzLine != 0 {
		p.add(l.tzLine, join(path, "timezone"), errors.New("timezone applies to calendar windows only; add calendar: true"))
		ok = false
	}
	if l.hasBurst {
		alg := l.algorithm()
		if alg != ratelimit.GCRA && alg != ratelimit.LeakyBucket {
			p.errorf(burstNode, join(path, "burst"), "burst applies to gcra and leaky_bucket only, not %s", alg)
			ok = false
		} else if l.hasRPU && l.rpu == 0 {
			p.errorf(burstNode, join(path, "burst"), "burst needs requests_per_unit greater than 0 to refill")
			ok = false
		}
	}
	if !ok {
		return nil
	}
	return l
}

// algorithm is the algorithm of l: the one it names; else fixed_window for
// calendar windows; else gcra for the extended form (an entry of limits:,
// or a rate_limit with period or burst); else fixed_window, which is how
// envoyproxy/ratelimit counts.
func (l *rawLimit) algorithm() ratelimit.Algorithm {
	switch {
	case l.hasAlg:
		return l.alg
	case l.calendar:
		return ratelimit.FixedWindow
	case l.extended || l.periodLine != 0 || l.hasBurst:
		return ratelimit.GCRA
	}
	return ratelimit.FixedWindow
}

// window returns the rule's window for names and storage keys, and its
// Period and Calendar.
func (l *rawLimit) window() (name, key string, period time.Duration, cal ratelimit.Calendar) {
	if l.calendar {
		// The calendar units bear the names of the envoy units; second
		// has none (parsing rejects it) and gives NoCalendar.
		cal, _ = ratelimit.ParseCalendar(l.unit.String())
		tz := "UTC"
		if l.loc != nil {
			tz = l.loc.String()
		}
		return "calendar_" + l.unit.String(), "cal." + l.unit.String() + "@" + tz, 0, cal
	}
	if l.periodLine != 0 {
		name = l.period.String()
		if u := unitOf(l.period); u != UnitUnknown {
			name = u.String()
		}
		return name, canonicalPeriod(l.period), l.period, 0
	}
	d := l.unit.Duration()
	return l.unit.String(), canonicalPeriod(d), d, 0
}

// canonicalPeriod writes d in one canonical form, so that equal windows
// give equal names and keys: whole seconds ("60s") when d is, else
// nanoseconds ("1500000000ns").
func canonicalPeriod(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(int64(d), 10) + "ns"
}

// unitOf returns the envoy unit whose window is exactly d, if any.
func unitOf(d time.Duration) Unit {
	for u := Second; u < numUnits; u++ {
		if unitLengths[u] == d {
			return u
		}
	}
	return UnitUnknown
}

// quantity reads an integer of at least lo and at most ratelimit.MaxQuota
// for key name, reporting "<name> <v> <below>" under lo. It returns the
// value, whether it was an integer, and whether it is within the bounds.
func (p *parser) quantity(v *yaml.Node, kp, name string, lo int64, below string) (int64, bool, bool) {
	n, isInt := p.integer(v, kp)
	switch {
	case !isInt:
		return n, false, false
	case n < lo:
		p.errorf(v, kp, "%s %d %s", name, n, below)
		return n, true, false
	case n > ratelimit.MaxQuota:
		p.errorf(v, kp, "%s %d exceeds %d", name, n, int64(ratelimit.MaxQuota))
		return n, true, false
	}
	return n, true, true
}
