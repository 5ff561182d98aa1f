package rules

import (
	"strings"
)

// Bounds on a request, checked by internal/service's Request.Validate (an
// adapter that must refuse a request before copying it calls the same
// checks first: service.CheckDescriptorCount and CheckEntryCount). Sluice
// rejects a request beyond them (gRPC INVALID_ARGUMENT, HTTP 400) rather
// than truncate it. MaxKeyValueBytes also bounds a rule file's descriptor
// keys and values.
const (
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors = 64
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries = 16
	// MaxKeyValueBytes bounds the domain and every key and value, in bytes.
	MaxKeyValueBytes = 256
)

// Match appends to dst the limits of domain that apply to one request
// descriptor and returns the extended slice; their Descriptor is 0. An
// unknown domain, like a descriptor that matches no rule, appends nothing;
// use Set.Domain to tell them apart. Match does not allocate when dst has
// room.
func (s *Set) Match(domain string, entries []Entry, dst []Match) []Match {
	d, ok := s.Domain(domain)
	if !ok {
		return dst
	}
	return d.Match(0, entries, dst)
}

// Match appends to dst the limits that apply to descriptor number i of a
// request, whose entries are entries, with Descriptor set to i.
//
// Matching is envoyproxy/ratelimit's: entry k of the descriptor is matched
// against the descriptors of nesting level k; at each level an exact
// key and value wins, then the first wildcard (in file order) whose prefix
// the value has, then the key-only descriptor. There is no backtracking:
// once a level has matched, only that descriptor's nested descriptors are
// tried for the next entry. The limits are those of the descriptor matched
// by the last entry; a descriptor with N entries never gets the limits of a
// shallower or deeper rule.
func (d *Domain) Match(i int, entries []Entry, dst []Match) []Match {
	n := d.find(entries)
	if n == nil {
		return dst
	}
	for _, s := range n.specs {
		dst = append(dst, Match{Spec: s, Descriptor: i})
	}
	return dst
}

// find returns the descriptor matched by entries, or nil.
func (d *Domain) find(entries []Entry) *node {
	if d == nil || len(entries) == 0 {
		return nil
	}
	lv := d.root
	for i := range entries {
		n := lv.find(entries[i].Key, entries[i].Value)
		if n == nil {
			return nil
		}
		if i == len(entries)-1 {
			return n
		}
		if n.children == nil {
			return nil
		}
		lv = n.children
	}
	return nil
}

func (lv level) find(key, value string) *node {
	g := lv[key]
	if g == nil {
		return nil
	}
	if n := g.exact[value]; n != nil {
		return n
	}
	for _, w := range g.wild {
		if strings.HasPrefix(value, w.pattern) {
			return w
		}
	}
	return g.any
}

// ApplyReplaces removes from limits, in place and keeping the order, every
// limit whose name another limit of the same request replaces (the
// `replaces` of envoyproxy/ratelimit), and returns the shortened slice.
// A replaced limit's own replaces still apply. It does not allocate for up
// to MaxDescriptors×MaxLimitsPerDescriptor limits.
func ApplyReplaces(limits []Match) []Match {
	any := false
	for i := range limits {
		if len(limits[i].Replaces) > 0 {
			any = true
			break
		}
	}
	if !any {
		return limits
	}
	var buf [MaxDescriptors * MaxLimitsPerDescriptor]bool
	var drop []bool
	if len(limits) <= len(buf) {
		drop = buf[:len(limits)]
	} else {
		drop = make([]bool, len(limits))
	}
	for j := range limits {
		for _, r := range limits[j].Replaces {
			for i := range limits {
				if limits[i].Name == r {
					drop[i] = true
				}
			}
		}
	}
	out := limits[:0]
	for i := range limits {
		if !drop[i] {
			out = append(out, limits[i])
		}
	}
	clear(limits[len(out):])
	return out
}
