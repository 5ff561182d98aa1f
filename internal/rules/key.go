package rules

import "strings"

// A keyLevel is one level of a limit's storage key: the escaped key and
// match kind (and value or prefix), followed by the request's escaped
// value when value is set.
type keyLevel struct {
	prefix string
	value  bool
	key    string // the descriptor key, unescaped

	// For AppendMetricKey: how the descriptor matches, its value or
	// prefix, and its share_threshold and value_to_metric flags.
	kind          kind
	pattern       string
	share         bool
	valueToMetric bool
}

// newKeyLevel returns the storage key part of a descriptor of the given
// key, kind and pattern (see AppendKey).
func newKeyLevel(key string, k kind, pattern string, share bool) keyLevel {
	kl := makeKeyLevel(key, k, pattern, share)
	kl.key, kl.kind, kl.pattern, kl.share = key, k, pattern, share
	return kl
}

// PerValueMetric reports whether the metrics of s are kept per descriptor
// value: its descriptor has detailed_metric, or a descriptor of its path
// has value_to_metric. AppendMetricKey then names the series.
func (s *Spec) PerValueMetric() bool { return s.perValue }

// AppendMetricKey appends to dst the key envoyproxy/ratelimit gives the
// stats of limit s for a request descriptor with the given entries (those
// it matched with), and returns the extended slice: the domain, then per
// level "." and the key, followed by "_" and a value where there is one.
// With detailed_metric, every level writes the request's value ("key_"
// when it is empty); otherwise a level writes the request's value if its
// descriptor has value_to_metric, else what the rule file says (the exact
// value; "prefix*" for a wildcard; nothing for a key-only descriptor). A
// wildcard with share_threshold always writes "prefix*", so its values
// share one series. It does not allocate when dst has room; if
// len(entries) is not s.Depth(), it appends nothing.
func (s *Spec) AppendMetricKey(dst []byte, entries []Entry) []byte {
	if len(entries) != len(s.levels) {
		return dst
	}
	dst = append(dst, s.Domain...)
	for i := range s.levels {
		l := &s.levels[i]
		dst = append(append(dst, '.'), l.key...)
		switch {
		case l.kind == kindWild && l.share:
			dst = append(append(append(dst, '_'), l.pattern...), '*')
		case s.DetailedMetric:
			dst = append(append(dst, '_'), entries[i].Value...)
		case l.valueToMetric:
			if entries[i].Value != "" {
				dst = append(append(dst, '_'), entries[i].Value...)
			}
		case l.kind == kindExact:
			dst = append(append(dst, '_'), l.pattern...)
		case l.kind == kindWild:
			dst = append(append(append(dst, '_'), l.pattern...), '*')
		}
	}
	return dst
}

func makeKeyLevel(key string, k kind, pattern string, share bool) keyLevel {
	b := append([]byte{'|'}, escape(key)...)
	switch k {
	case kindExact:
		b = appendEscaped(append(b, '='), pattern)
		return keyLevel{prefix: string(b)}
	case kindWild:
		b = appendEscaped(append(b, '~'), pattern)
		if share {
			return keyLevel{prefix: string(append(b, '*'))}
		}
		return keyLevel{prefix: string(append(b, '=')), value: true}
	}
	return keyLevel{prefix: string(append(b, ':')), value: true}
}

// HasKey reports whether a level of the limit's descriptor path has the
// descriptor key key: the service shows the storage keys of such limits
// hashed when key names a secret (an address, an API key).
func (s *Spec) HasKey(key string) bool {
	for _, l := range s.levels {
		if l.key == key {
			return true
		}
	}
	return false
}

// ShortKey returns the part of key, a storage key AppendKey made for s,
// that names the request's entries: without the domain before it and the
// algorithm and window after it ("remote_address:10.0.0.1"). It is a
// substring of key, for display.
func (s *Spec) ShortKey(key string) string {
	key = strings.TrimSuffix(strings.TrimPrefix(key, s.domainKey), s.tail)
	return strings.TrimPrefix(key, "|")
}

// AppendKey appends to dst the storage key of limit s for a request
// descriptor with the given entries (those it matched with) and returns
// the extended slice. It does not allocate when dst has room. If
// len(entries) is not s.Depth(), it appends nothing.
//
// The key is readable and unambiguous:
//
//	domain|key=value|key:value|key~prefix=value|key~prefix*#algorithm/window
//	domain|key:value#cost_unit#algorithm/window
//
// One part per level of the matched path: "key=value" for an exact
// descriptor (the value is the rule's), "key:value" for a key-only one
// (the request's value), "key~prefix=value" for a wildcard (the request's
// value), and "key~prefix*" for a wildcard with share_threshold, whose
// matching values all share one key. The tail names the limit's cost
// unit if it has one, the algorithm and the window ("60s", or
// "cal.month@Europe/Paris" for calendar windows).
//
// Every byte of the domain, keys, values and prefixes outside printable
// ASCII, and every byte of " %|=:~*#/{}", is written as %XX, so the parts
// can be told apart whatever bytes the request carries: different domains,
// paths, values or windows never give one key. The braces are escaped so
// that no request value can form a Redis Cluster hash tag.
//
// What the key leaves out is deliberate: the rule's name and limit (a
// changed requests_per_unit, burst or name keeps the count, so limit
// changes apply at once against what was consumed), and its shadow,
// metric and failure flags. A changed window, algorithm or cost unit
// gives a new key, since the old state means something else under them.
func (s *Spec) AppendKey(dst []byte, entries []Entry) []byte {
	if len(entries) != len(s.levels) || s.tail == "" {
		return dst
	}
	dst = append(dst, s.domainKey...)
	for i := range s.levels {
		dst = append(dst, s.levels[i].prefix...)
		if s.levels[i].value {
			dst = appendEscaped(dst, entries[i].Value)
		}
	}
	return append(dst, s.tail...)
}

// mustEscape reports whether appendEscaped writes c as %XX.
func mustEscape(c byte) bool {
	switch c {
	case '%', '|', '=', ':', '~', '*', '#', '/', '{', '}':
		return true
	}
	return c <= ' ' || c >= 0x7f
}

const hexDigits = "0123456789ABCDEF"

func appendEscaped(dst []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !mustEscape(c) {
			continue
		}
		dst = append(dst, s[start:i]...)
		dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
		start = i + 1
	}
	return append(dst, s[start:]...)
}

func escape(s string) string { return string(appendEscaped(nil, s)) }
