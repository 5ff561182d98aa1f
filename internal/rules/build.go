package rules

import (
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/ratelimit"
)

// kind is how a descriptor of a rule file matches a request entry.
type kind uint8

const (
	kindExact kind = iota // key and value
	kindWild              // key and a value prefix (value ending in *)
	kindAny               // key only: any value
)

// A node is one descriptor of the matching tree.
type node struct {
	kind     kind
	pattern  string // the exact value, or the wildcard's prefix
	specs    []*Spec
	children level // nil when the descriptor has no nested descriptors
}

// A level is the descriptors of one nesting level, grouped by key.
type level map[string]*group

// A group is the descriptors of one level that share a key, in the order
// envoyproxy/ratelimit tries them: exact values, then wildcards in file
// order, then the key-only descriptor.
type group struct {
	exact map[string]*node
	wild  []*node
	any   *node
	// lines of the descriptors, for duplicate errors.
	exactLine map[string]int
	wildLine  []int
	anyLine   int
}

// ancestor is what a descriptor contributes to the names and storage keys
// of the limits below it.
type ancestor struct {
	stat string   // key or key_value, as in envoyproxy/ratelimit's stats keys
	key  keyLevel // its part of the storage key
}

type builder struct {
	p       *parser
	d       *Domain
	names   map[string]int // rule name → line
	pending []*pendingReplace
}

type pendingReplace struct {
	spec    *Spec
	entries []*replaceConfig
}

// build turns the parsed descriptors into a Domain. complete says whether
// parsing found no error; when it did, the limits that failed are missing,
// so replaces are not checked against the names.
func (p *parser) build(domain string, descs []*descriptorConfig, complete bool) *Domain {
	b := &builder{p: p, d: &Domain{name: domain, file: p.file}, names: make(map[string]int)}
	b.d.root = b.level(descs, nil)
	for _, pr := range b.pending {
		for _, r := range pr.entries {
			switch _, ok := b.names[r.Name]; {
			case r.Name == pr.spec.Name:
				p.add(r.line, r.path, fmt.Errorf("replaces should not name its own rule %q", r.Name))
			case !ok && complete:
				p.add(r.line, r.path, fmt.Errorf("replaces names no rule %q of domain %q", r.Name, domain))
			}
		}
	}
	return b.d
}

func (b *builder) level(descs []*descriptorConfig, path []ancestor) level {
	if len(descs) == 0 {
		return nil
	}
	lv := make(level)
	for _, rd := range descs {
		g := lv[rd.Key]
		if g == nil {
			g = &group{}
			lv[rd.Key] = g
		}
		n := &node{}
		stat := rd.Key
		if rd.Value != "" {
			stat += "_" + rd.Value
		}
		full := b.statPath(path, stat)
		switch {
		case rd.Value == "":
			n.kind = kindAny
			if g.any != nil {
				b.p.add(rd.line, rd.path, fmt.Errorf("duplicate descriptor %q (first at line %d)", full, g.anyLine))
				continue
			}
			g.any, g.anyLine = n, rd.line
		case strings.HasSuffix(rd.Value, "*"):
			n.kind = kindWild
			n.pattern = rd.Value[:len(rd.Value)-1]
			dup := false
			for i, w := range g.wild {
				if w.pattern == n.pattern {
					b.p.add(rd.line, rd.path, fmt.Errorf("duplicate descriptor %q (first at line %d)", full, g.wildLine[i]))
					dup = true
				}
			}
			if dup {
				continue
			}
			g.wild = append(g.wild, n)
			g.wildLine = append(g.wildLine, rd.line)
		default:
			n.kind = kindExact
			n.pattern = rd.Value
			if line, dup := g.exactLine[rd.Value]; dup {
				b.p.add(rd.line, rd.path, fmt.Errorf("duplicate descriptor %q (first at line %d)", full, line))
				continue
			}
			if g.exact == nil {
				g.exact, g.exactLine = make(map[string]*node), make(map[string]int)
			}
			g.exact[rd.Value], g.exactLine[rd.Value] = n, rd.line
		}
		kl := newKeyLevel(rd.Key, n.kind, n.pattern, rd.ShareThreshold)
		kl.valueToMetric = rd.ValueToMetric
		here := append(path[:len(path):len(path)], ancestor{stat: stat, key: kl})
		b.specs(n, rd, here)
		n.children = b.level(rd.Descriptors, here)
	}
	return lv
}

func (b *builder) statPath(path []ancestor, last string) string {
	var sb strings.Builder
	sb.WriteString(b.d.name)
	for _, a := range path {
		sb.WriteByte('.')
		sb.WriteString(a.stat)
	}
	sb.WriteByte('.')
	sb.WriteString(last)
	return sb.String()
}

// specs turns the limits of rd into Specs of n.
func (b *builder) specs(n *node, rd *descriptorConfig, path []ancestor) {
	stat := b.statPath(path[:len(path)-1], path[len(path)-1].stat)
	levels := make([]keyLevel, len(path))
	perValue := rd.DetailedMetric
	for i, a := range path {
		levels[i] = a.key
		perValue = perValue || a.key.valueToMetric
	}
	domainKey := escape(b.d.name)
	seenWindow := make(map[string]int)
	for _, l := range rd.Limits {
		s := &Spec{
			Domain:         b.d.name,
			Source:         fmt.Sprintf("%s:%d", b.p.file, l.line),
			Unit:           l.Unit,
			CostUnit:       l.CostUnit,
			Unlimited:      l.Unlimited,
			Shadow:         rd.ShadowMode,
			QuotaMode:      rd.QuotaMode,
			DetailedMetric: rd.DetailedMetric,
			ValueToMetric:  rd.ValueToMetric,
			domainKey:      domainKey,
			levels:         levels,
			perValue:       perValue,
		}
		for _, r := range l.Replaces {
			s.Replaces = append(s.Replaces, r.Name)
		}
		if l.Unlimited {
			s.Name = stat
		} else {
			name, key, cal := l.window()
			s.Name = stat + "." + name
			s.tail = "#" + l.Algorithm.String() + "/" + key
			// The limits of one cost unit need their own windows.
			what, whose := "", "each limit"
			if l.CostUnit != "" {
				s.Name += "." + l.CostUnit
				s.tail = "#" + l.CostUnit + s.tail
				what, whose = " of cost unit "+l.CostUnit, "each limit of one cost unit"
			}
			ok := true
			for _, w := range []string{"name:" + name, "key:" + key} {
				w = l.CostUnit + "/" + w
				if line, dup := seenWindow[w]; dup {
					if ok {
						b.p.add(l.line, l.path, fmt.Errorf("a second limit%s with window %s on one descriptor (first at line %d); %s needs its own window", what, name, line, whose))
					}
					ok = false
				}
				seenWindow[w] = l.line
			}
			if !ok {
				continue
			}
			s.Rule = &ratelimit.Rule{
				Algorithm: l.Algorithm,
				Quota:     l.RequestsPerUnit,
				Block:     l.RequestsPerUnit == 0,
				Period:    l.Period,
				Burst:     l.Burst,
				Calendar:  cal,
				Location:  l.Timezone,
				Failure:   l.FailureMode,
				Counting:  l.Counting,
			}
		}
		if l.Name != "" {
			s.Name = l.Name
		}
		if s.Rule != nil {
			s.Rule.Name = s.Name
			if err := s.Rule.Validate(); err != nil {
				b.p.add(l.line, l.path, err)
				continue
			}
		}
		line := l.line
		if name := l.given.get("name"); name != nil {
			line = name.key.Line
		}
		if first, dup := b.names[s.Name]; dup {
			what := "rule name"
			if l.Name == "" {
				what = "generated rule name"
			}
			b.p.add(line, l.path, fmt.Errorf("duplicate %s %q (first at line %d); names must be unique in a domain", what, s.Name, first))
			continue
		}
		b.names[s.Name] = line
		if len(s.Replaces) > 0 {
			b.pending = append(b.pending, &pendingReplace{spec: s, entries: l.Replaces})
		}
		n.specs = append(n.specs, s)
		b.d.specs = append(b.d.specs, s)
	}
}
