package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// A strictScan finds in a JSON body what encoding/json decodes without an
// error but loses, so that two different bodies would decode to one
// request (and count on one key):
//
//   - invalid UTF-8 in a string, which encoding/json replaces by U+FFFD;
//   - an escaped lone surrogate, such as "\ud800", also decoded as U+FFFD;
//   - with dups, two members of one object whose names encoding/json
//     matches to one field (bytes.EqualFold, the decoder's own
//     comparison): the decoder keeps the last.
//
// Its errors are *inputError values naming the field. The zero value is
// ready to use; a strictScan keeps its stacks between calls (it is pooled
// with a checkCall) and is not safe for concurrent use.
type strictScan struct {
	body  []byte
	dups  bool
	depth int
	names []span     // the member names of the objects being scanned
	path  []pathStep // where the scan is, for error messages
}

// A span is a string's raw bytes, between its quotes.
type span struct {
	start, end int
	escaped    bool // holds a backslash escape
}

// A pathStep is a member name or, when index >= 0, an array index.
type pathStep struct {
	name  span
	index int
}

// maxScanDepth bounds the nesting the scan follows, as encoding/json's own
// limit does; deeper bodies are left to the decoder.
const maxScanDepth = 10000

// An inputError is a refused JSON input: Field is the path of the value it
// concerns (descriptors[0].entries[1].key), "" for the whole body.
type inputError struct {
	Field   string
	Problem string
	// Surrogate reports an escaped lone surrogate.
	Surrogate bool
}

func (e *inputError) Error() string {
	if e.Field == "" {
		return e.Problem
	}
	return fmt.Sprintf("field %q: %s", e.Field, e.Problem)
}

// errNotJSON stops a scan of a body that is not well-formed JSON; the
// decoder reports what is wrong with it.
var errNotJSON = errors.New("not JSON")

// check scans body, one JSON value, and returns the first loss it finds
// (an *inputError), or nil. Callers run it on what a decoder has accepted,
// or to explain a decoder's error: of a body that is not well-formed JSON
// it reports a loss it found before the malformation, or nothing.
func (s *strictScan) check(body []byte, dups bool) error {
	s.body, s.dups, s.depth = body, dups, 0
	s.names, s.path = s.names[:0], s.path[:0]
	_, err := s.value(s.space(0))
	s.body = nil
	if errors.Is(err, errNotJSON) {
		return nil
	}
	return err
}

func (s *strictScan) at(i int) byte {
	if i < len(s.body) {
		return s.body[i]
	}
	return 0
}

func (s *strictScan) space(i int) int {
	for i < len(s.body) {
		switch s.body[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value scans the value at i and returns the index after it.
func (s *strictScan) value(i int) (int, error) {
	switch s.at(i) {
	case '{':
		return s.object(i)
	case '[':
		return s.array(i)
	case '"':
		end, _, err := s.str(i, false)
		return end, err
	case 0:
		return i, errNotJSON
	}
	// A number, true, false or null: nothing to lose.
	for i < len(s.body) {
		switch s.body[i] {
		case ',', ']', '}', ' ', '\t', '\n', '\r':
			return i, nil
		}
		i++
	}
	return i, nil
}

// object scans the object at i, which opens one more level.
func (s *strictScan) object(i int) (int, error) {
	if s.depth == maxScanDepth {
		return i, errNotJSON
	}
	s.depth++
	mark := len(s.names)
	i, err := s.members(i)
	s.names = s.names[:mark]
	s.depth--
	return i, err
}

// members scans the object at i, whose names are appended to s.names.
func (s *strictScan) members(i int) (int, error) {
	mark := len(s.names)
	i = s.space(i + 1)
	if s.at(i) == '}' {
		return i + 1, nil
	}
	for {
		if s.at(i) != '"' {
			return i, errNotJSON
		}
		start := i
		end, name, err := s.str(i, true)
		if err != nil {
			return end, err
		}
		if s.dups {
			for _, prev := range s.names[mark:] {
				if s.sameName(prev, name) {
					return start, &inputError{Field: s.field(&name), Problem: fmt.Sprintf("given twice (at offsets %d and %d); a member may appear once in its object", prev.start-1, start)}
				}
			}
			s.names = append(s.names, name)
		}
		i = s.space(end)
		if s.at(i) != ':' {
			return i, errNotJSON
		}
		s.path = append(s.path, pathStep{name: name, index: -1})
		i, err = s.value(s.space(i + 1))
		s.path = s.path[:len(s.path)-1]
		if err != nil {
			return i, err
		}
		i = s.space(i)
		switch s.at(i) {
		case ',':
			i = s.space(i + 1)
		case '}':
			return i + 1, nil
		default:
			return i, errNotJSON
		}
	}
}

// array scans the array at i, which opens one more level.
func (s *strictScan) array(i int) (int, error) {
	if s.depth == maxScanDepth {
		return i, errNotJSON
	}
	s.depth++
	i, err := s.elements(i)
	s.depth--
	return i, err
}

func (s *strictScan) elements(i int) (int, error) {
	i = s.space(i + 1)
	if s.at(i) == ']' {
		return i + 1, nil
	}
	for k := 0; ; k++ {
		s.path = append(s.path, pathStep{index: k})
		var err error
		i, err = s.value(i)
		s.path = s.path[:len(s.path)-1]
		if err != nil {
			return i, err
		}
		i = s.space(i)
		switch s.at(i) {
		case ',':
			i = s.space(i + 1)
		case ']':
			return i + 1, nil
		default:
			return i, errNotJSON
		}
	}
}

// str scans the string at i, a member name if name, and returns the index
// after it and its span.
func (s *strictScan) str(i int, name bool) (int, span, error) {
	sp := span{start: i + 1}
	j := i + 1
	for j < len(s.body) {
		c := s.body[j]
		switch {
		case c == '"':
			sp.end = j
			return j + 1, sp, nil
		case c == '\\':
			sp.escaped = true
			if s.at(j+1) != 'u' {
				j += 2
				continue
			}
			r, ok := s.hex4(j + 2)
			if !ok {
				return j, sp, errNotJSON
			}
			switch {
			case r < 0xd800 || r > 0xdfff:
				j += 6
			case r <= 0xdbff && s.at(j+6) == '\\' && s.at(j+7) == 'u':
				if lo, ok := s.hex4(j + 8); ok && lo >= 0xdc00 && lo <= 0xdfff {
					j += 12
					continue
				}
				fallthrough
			default:
				return j, sp, &inputError{Field: s.field(nil), Problem: inName(name) + fmt.Sprintf("%s at offset %d is a lone surrogate, which is no character (encoding/json would decode it as U+FFFD)", s.body[j:j+6], j), Surrogate: true}
			}
		case c < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(s.body[j:])
			if r == utf8.RuneError && size == 1 {
				return j, sp, &inputError{Field: s.field(nil), Problem: inName(name) + fmt.Sprintf("invalid UTF-8 (byte %#x at offset %d)", c, j)}
			}
			j += size
		}
	}
	return j, sp, errNotJSON
}

func inName(name bool) string {
	if name {
		return "a member name: "
	}
	return ""
}

// hex4 returns the value of the 4 hex digits at i.
func (s *strictScan) hex4(i int) (rune, bool) {
	if i+4 > len(s.body) {
		return 0, false
	}
	var r rune
	for _, c := range s.body[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// sameName reports whether encoding/json matches names a and b to one
// field.
func (s *strictScan) sameName(a, b span) bool {
	if !a.escaped && !b.escaped {
		return bytes.EqualFold(s.body[a.start:a.end], s.body[b.start:b.end])
	}
	return strings.EqualFold(s.unquote(a), s.unquote(b))
}

// unquote returns the decoded string of sp, which the scan found valid.
func (s *strictScan) unquote(sp span) string {
	if !sp.escaped {
		return string(s.body[sp.start:sp.end])
	}
	var v string
	_ = json.Unmarshal(s.body[sp.start-1:sp.end+1], &v)
	return v
}

// field returns the path of the value being scanned, followed by the
// member name at sp if it is not nil.
func (s *strictScan) field(name *span) string {
	var b strings.Builder
	for _, st := range s.path {
		if st.index >= 0 {
			fmt.Fprintf(&b, "[%d]", st.index)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.unquote(st.name))
	}
	if name != nil {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.unquote(*name))
	}
	return b.String()
}
