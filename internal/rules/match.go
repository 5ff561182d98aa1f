package rules

import (
	"errors"
	"fmt"
	"strings"
)

// Bounds on a request, checked by CheckDomain, CheckDescriptorCount and
// CheckDescriptor (or CheckEntryCount). Sluice rejects a request beyond
// them (gRPC INVALID_ARGUMENT, HTTP 400) rather than truncate it.
const (
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors = 64
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries = 16
	// MaxKeyValueBytes bounds the domain and every key and value, in bytes.
	MaxKeyValueBytes = 256
)

// ErrBound is wrapped by every error of the request checks below. Their
// errors name the bound, and they do not allocate when the request is
// within it.
var ErrBound = errors.New("request exceeds a bound")

// CheckDomain checks the domain of a request: not empty, at most
// MaxKeyValueBytes.
func CheckDomain(domain string) error {
	if domain == "" {
		return fmt.Errorf("%w: domain is empty", ErrBound)
	}
	if len(domain) > MaxKeyValueBytes {
		return fmt.Errorf("%w: domain is %d bytes; at most %d bytes (MaxKeyValueBytes) are allowed", ErrBound, len(domain), MaxKeyValueBytes)
	}
	return nil
}

// CheckDescriptorCount checks the number of descriptors of a request:
// 1 to MaxDescriptors.
func CheckDescriptorCount(n int) error {
	if n == 0 {
		return fmt.Errorf("%w: no descriptors", ErrBound)
	}
	if n > MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors; at most %d (MaxDescriptors) are allowed", ErrBound, n, MaxDescriptors)
	}
	return nil
}

// CheckEntryCount checks the number of entries n of descriptor i of a
// request: at most MaxEntries. Adapters call it before they copy entries.
func CheckEntryCount(i, n int) error {
	if n > MaxEntries {
		return fmt.Errorf("%w: descriptor %d has %d entries; at most %d (MaxEntries) are allowed", ErrBound, i, n, MaxEntries)
	}
	return nil
}

// CheckDescriptor checks descriptor i of a request: at most MaxEntries
// entries, keys and values of at most MaxKeyValueBytes.
func CheckDescriptor(i int, entries []Entry) error {
	if err := CheckEntryCount(i, len(entries)); err != nil {
		return err
	}
	for j := range entries {
		if n := len(entries[j].Key); n > MaxKeyValueBytes {
			return fmt.Errorf("%w: descriptor %d entry %d: key is %d bytes; at most %d bytes (MaxKeyValueBytes) are allowed", ErrBound, i, j, n, MaxKeyValueBytes)
		}
		if n := len(entries[j].Value); n > MaxKeyValueBytes {
			return fmt.Errorf("%w: descriptor %d entry %d: value is %d bytes; at most %d bytes (MaxKeyValueBytes) are allowed", ErrBound, i, j, n, MaxKeyValueBytes)
		}
	}
	return nil
}

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
