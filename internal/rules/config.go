package rules

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/ratelimit"
)

// What a rule file says, decoded (see decode.go) and checked, before
// build makes a Domain of it.

// refusedMetadata is the field of `metadata`, at every level: Sluice reads
// the key only to refuse it, since it does not act on it.
var refusedMetadata = refused{"metadata is not supported: envoyproxy/ratelimit copies a descriptor's metadata into the response's dynamic metadata, which Sluice does not; remove it (a YAML comment keeps notes)"}

// fileConfig is a rule file.
type fileConfig struct {
	Domain      string
	Descriptors []*descriptorConfig

	given pairs
}

func (f *fileConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("want a mapping with domain and descriptors, got %s", describe(n))
	}
	var ps problems
	f.given = decodeMapping(n, "", []field{
		{"domain", (*text)(&f.Domain)},
		{"descriptors", &descriptorList{path: "descriptors", depth: 1, budget: new(descriptorBudget), dst: &f.Descriptors}},
		{"metadata", refusedMetadata},
	}, &ps)
	switch domain := f.given.get("domain"); {
	case domain == nil:
		ps.errorf(n, "domain", "missing domain")
	case domain.failed:
	case f.Domain == "":
		ps.errorf(domain.key, "domain", "empty domain")
	default:
		if err := checkLength("domain", f.Domain); err != nil {
			ps.errorf(domain.key, "domain", "%w", err)
		}
	}
	return ps.err()
}

// descriptorBudget counts the descriptors of one file, at every level and
// with aliases expanded, against MaxDescriptorsPerDomain. Once it is over,
// every list stops decoding.
type descriptorBudget struct {
	n    int
	over bool
}

// descriptorList decodes a descriptors list, depth levels deep, into *dst.
// It leaves out the descriptors with hard problems; the mapping holding
// the list is used all the same.
type descriptorList struct {
	path   string
	depth  int
	budget *descriptorBudget
	dst    *[]*descriptorConfig
}

func (l *descriptorList) UnmarshalYAML(n *yaml.Node) error {
	var ps problems
	items := decodeList(n, l.path, &ps)
	if len(items) > 0 && l.depth > MaxDepth {
		ps.errorf(n, l.path, "descriptors nested deeper than %d levels (MaxDepth) can never match a request", MaxDepth)
		return ps.soften()
	}
	for i, item := range items {
		if l.budget.over {
			break
		}
		l.budget.n++
		if l.budget.n > MaxDescriptorsPerDomain {
			l.budget.over = true
			ps.errorf(item, l.path, "more than %d descriptors in one domain (MaxDescriptorsPerDomain)", MaxDescriptorsPerDomain)
			break
		}
		d := &descriptorConfig{path: index(l.path, i), depth: l.depth, budget: l.budget}
		if decodeItem(item, d.path, d, &ps) {
			*l.dst = append(*l.dst, d)
		}
	}
	return ps.soften()
}

// descriptorConfig is a descriptor. Its only hard problems are those of
// its key and value: without them it has no place in the matching tree.
// The rest is reported without keeping it out.
type descriptorConfig struct {
	Key, Value  string
	Descriptors []*descriptorConfig
	// Limits are those of rate_limit and of limits, in file order.
	Limits []*limitConfig

	ShadowMode, QuotaMode, DetailedMetric, ValueToMetric, ShareThreshold bool

	path   string // "descriptors[2].descriptors[0]"
	depth  int    // of its list: 1 for the file's
	budget *descriptorBudget
	line   int
	given  pairs
}

func (d *descriptorConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("want a descriptor mapping, got %s", describe(n))
	}
	d.line = n.Line
	var ps problems
	d.given = decodeMapping(n, d.path, []field{
		{"key", (*descriptorKey)(&d.Key)},
		{"value", (*descriptorValue)(&d.Value)},
		{"descriptors", &descriptorList{path: join(d.path, "descriptors"), depth: d.depth + 1, budget: d.budget, dst: &d.Descriptors}},
		{"rate_limit", &rateLimit{path: join(d.path, "rate_limit"), dst: &d.Limits}},
		{"limits", &limitList{path: join(d.path, "limits"), dst: &d.Limits}},
		{"shadow_mode", (*boolean)(&d.ShadowMode)},
		{"quota_mode", (*boolean)(&d.QuotaMode)},
		{"detailed_metric", (*boolean)(&d.DetailedMetric)},
		{"value_to_metric", (*boolean)(&d.ValueToMetric)},
		{"share_threshold", (*boolean)(&d.ShareThreshold)},
		{"metadata", refusedMetadata},
	}, &ps)
	if d.given.get("key") == nil {
		ps.errorf(n, join(d.path, "key"), "descriptor has empty key")
	}
	if limits := d.given.get("limits"); limits != nil && d.given.get("rate_limit") != nil {
		ps.softf(limits.key, join(d.path, "limits"), "give rate_limit or limits, not both")
	}
	if d.ShareThreshold && !strings.HasSuffix(d.Value, "*") {
		ps.softf(d.given.get("share_threshold").key, join(d.path, "share_threshold"),
			"share_threshold applies to wildcard values (ending in *) only")
	}
	return ps.err()
}

// rateLimit decodes a rate_limit block, and appends it to *dst unless it
// has a hard problem.
type rateLimit struct {
	path string
	dst  *[]*limitConfig
}

func (r *rateLimit) UnmarshalYAML(n *yaml.Node) error {
	var ps problems
	if l := (&limitConfig{path: r.path}); decodeItem(n, r.path, l, &ps) {
		*r.dst = append(*r.dst, l)
	}
	return ps.soften()
}

// limitList decodes a limits list, of 1 to MaxLimitsPerDescriptor limits
// in the extended form, and appends to *dst those without hard problems.
type limitList struct {
	path string
	dst  *[]*limitConfig
}

func (ll *limitList) UnmarshalYAML(n *yaml.Node) error {
	var ps problems
	items := decodeList(n, ll.path, &ps)
	if len(items) == 0 {
		ps.errorf(n, ll.path, "empty limits list; give at least one limit or remove the key")
	}
	if len(items) > MaxLimitsPerDescriptor {
		ps.errorf(n, ll.path, "%d limits on one descriptor; the bound is %d (MaxLimitsPerDescriptor)", len(items), MaxLimitsPerDescriptor)
		items = items[:MaxLimitsPerDescriptor]
	}
	for i, item := range items {
		l := &limitConfig{path: index(ll.path, i), extended: true}
		if decodeItem(item, l.path, l, &ps) {
			*ll.dst = append(*ll.dst, l)
		}
	}
	return ps.soften()
}

// limitConfig is a rate_limit block or an entry of a limits list. Once it
// decoded without a hard problem, finish has filled in what it leaves
// out: Algorithm, and unless Calendar, Period from Unit or Unit from
// Period (UnitUnknown for a period that is not one unit long).
type limitConfig struct {
	Unit            Unit
	RequestsPerUnit int64
	Unlimited       bool
	Name            string
	Replaces        []*replaceConfig
	Algorithm       ratelimit.Algorithm
	Burst           int64
	Period          time.Duration
	Calendar        bool
	Timezone        *time.Location
	FailureMode     ratelimit.FailureMode
	Counting        ratelimit.Counting
	CostUnit        string

	path     string
	extended bool // an entry of limits, rather than a rate_limit block
	line     int
	given    pairs
}

func (l *limitConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		if l.extended {
			return fmt.Errorf("want a limit mapping, got %s", describe(n))
		}
		return fmt.Errorf("want a mapping, got %s", describe(n))
	}
	l.line = n.Line
	var ps problems
	l.given = decodeMapping(n, l.path, []field{
		{"unit", (*unitName)(&l.Unit)},
		{"requests_per_unit", (*quota)(&l.RequestsPerUnit)},
		{"unlimited", (*boolean)(&l.Unlimited)},
		{"name", (*ruleName)(&l.Name)},
		{"replaces", &replaceList{path: join(l.path, "replaces"), dst: &l.Replaces}},
		{"algorithm", (*algorithmName)(&l.Algorithm)},
		{"burst", (*burst)(&l.Burst)},
		{"period", (*period)(&l.Period)},
		{"calendar", (*boolean)(&l.Calendar)},
		{"timezone", timezone{&l.Timezone}},
		{"failure_mode", (*failureMode)(&l.FailureMode)},
		{"counting", (*counting)(&l.Counting)},
		{"cost_unit", (*costUnit)(&l.CostUnit)},
		{"metadata", refusedMetadata},
	}, &ps)
	// Checked further, a limit with a value that did not decode would be
	// reported for the zero value taken in its place.
	if !ps.hard() {
		l.finish(n, &ps)
	}
	return ps.err()
}

// finish fills in the defaults of the keys l, the mapping n, leaves out,
// then checks how its keys combine.
func (l *limitConfig) finish(n *yaml.Node, ps *problems) {
	if l.Unlimited {
		l.checkUnlimited(ps)
		return
	}
	rpu, unit, period := l.given.get("requests_per_unit"), l.given.get("unit"), l.given.get("period")
	alg := l.given.get("algorithm")
	if alg == nil {
		l.Algorithm = l.defaultAlgorithm()
	}
	if !l.Calendar {
		if period != nil {
			l.Unit = unitOf(l.Period)
		} else {
			l.Period = l.Unit.Duration()
		}
	}

	if rpu == nil {
		ps.errorf(n, join(l.path, "requests_per_unit"), "missing requests_per_unit (or unlimited: true)")
	}
	switch {
	case unit == nil && period == nil:
		ps.errorf(n, join(l.path, "unit"), "missing unit (or period)")
	case unit != nil && period != nil:
		ps.errorf(unit.key, join(l.path, "unit"), "give unit or period, not both")
	}
	if l.Calendar {
		cal := l.given.get("calendar").key
		switch {
		case period != nil:
			ps.errorf(cal, join(l.path, "calendar"), "calendar windows need a unit (minute, hour, day, week, month or year), not a period")
		case l.Unit == Second:
			ps.errorf(cal, join(l.path, "calendar"), "calendar windows need unit minute, hour, day, week, month or year; second windows are already aligned")
		}
		if alg != nil && l.Algorithm != ratelimit.FixedWindow {
			ps.errorf(alg.key, join(l.path, "algorithm"), "calendar windows need algorithm fixed_window, not %s", l.Algorithm)
		}
	} else if tz := l.given.get("timezone"); tz != nil {
		ps.errorf(tz.value, join(l.path, "timezone"), "timezone applies to calendar windows only; add calendar: true")
	}
	if c := l.given.get("counting"); c != nil && !l.Counting.Supports(l.Algorithm) {
		ps.errorf(c.value, join(l.path, "counting"), "counting %s does not support algorithm %s (%s)", l.Counting, l.Algorithm, countingAlgorithms[l.Counting])
	}
	if burst := l.given.get("burst"); burst != nil {
		switch {
		case l.Algorithm != ratelimit.GCRA && l.Algorithm != ratelimit.LeakyBucket:
			ps.errorf(burst.key, join(l.path, "burst"), "burst applies to gcra and leaky_bucket only, not %s", l.Algorithm)
		case rpu != nil && l.RequestsPerUnit == 0:
			ps.errorf(burst.key, join(l.path, "burst"), "burst needs requests_per_unit greater than 0 to refill")
		}
	}
}

// checkUnlimited checks an unlimited limit: a rate_limit block with no
// key but name and replaces.
func (l *limitConfig) checkUnlimited(ps *problems) {
	if l.extended {
		ps.errorf(l.given.get("unlimited").key, join(l.path, "unlimited"), "unlimited is not allowed in a limits list; use rate_limit: {unlimited: true}")
		return
	}
	for _, g := range l.given {
		switch g.name {
		case "unlimited", "name", "replaces", "metadata":
		case "unit":
			ps.errorf(g.key, join(l.path, g.name), "should not specify unit when unlimited")
		default:
			ps.errorf(g.key, join(l.path, g.name), "%s is not allowed with unlimited: true", g.name)
		}
	}
}

// defaultAlgorithm is the algorithm of a limit that names none:
// fixed_window for calendar windows; else gcra for the extended form (an
// entry of limits, or a rate_limit with period or burst); else
// fixed_window, which is how envoyproxy/ratelimit counts.
func (l *limitConfig) defaultAlgorithm() ratelimit.Algorithm {
	switch {
	case l.Calendar:
		return ratelimit.FixedWindow
	case l.extended || l.given.get("period") != nil || l.given.get("burst") != nil:
		return ratelimit.GCRA
	}
	return ratelimit.FixedWindow
}

// window returns the name of the window of l, for rule names, its part of
// the storage key, and its calendar.
func (l *limitConfig) window() (name, key string, cal ratelimit.Calendar) {
	if l.Calendar {
		// The calendar units bear the names of the envoy units; second
		// has none (finish rejects it).
		cal, _ = ratelimit.ParseCalendar(l.Unit.String())
		tz := "UTC"
		if l.Timezone != nil {
			tz = l.Timezone.String()
		}
		return "calendar_" + l.Unit.String(), "cal." + l.Unit.String() + "@" + tz, cal
	}
	name = l.Period.String()
	if l.Unit != UnitUnknown {
		name = l.Unit.String()
	}
	return name, canonicalPeriod(l.Period), ratelimit.NoCalendar
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

// replaceList decodes a replaces list into *dst. Its hard problems are
// the limit's: a limit that cannot say what it replaces is left out.
type replaceList struct {
	path string
	dst  *[]*replaceConfig
}

func (rl *replaceList) UnmarshalYAML(n *yaml.Node) error {
	var ps problems
	for i, item := range decodeList(n, rl.path, &ps) {
		r := &replaceConfig{path: index(rl.path, i)}
		if decodeItem(item, r.path, r, &ps) {
			*rl.dst = append(*rl.dst, r)
		}
	}
	return ps.err()
}

// replaceConfig is an entry of a replaces list: {name: <rule name>}.
type replaceConfig struct {
	Name string

	path string
	line int
}

func (r *replaceConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("want a mapping {name: ...}, got %s", describe(n))
	}
	r.line = n.Line
	var ps problems
	decodeMapping(n, r.path, []field{{"name", (*text)(&r.Name)}}, &ps)
	if r.Name == "" {
		ps.errorf(n, r.path, "empty replaces entry: want {name: <rule name>}")
	}
	return ps.err()
}
