package redisstore

import (
	"errors"
	"fmt"
)

// parseReadReply parses the raw reply of an XREADGROUP of one stream
// (StreamConsumer.ReadNow) into at most count records, each with
// Deliveries 1. The reply is RESP2 or RESP3, as the client speaks:
//
//	null (*-1 or _)                                     no new record
//	*1 (RESP2) or %1 (RESP3), then the stream's name as a bulk string and
//	  *n records, each *2: its id, and *2k field names and values (or a
//	  null, for a record deleted since: skipped)
//	-message                                            an error
//
// The records' strings share one string copy of the reply and their Data
// the reply itself, which the caller must not change afterwards: a few
// allocations a reply, none a record. The reply's values are any
// producer's, so every length is checked against what is left, and
// anything else than the shape above is an error, never a panic.
func parseReadReply(b []byte, count int) ([]StreamRecord, error) {
	r := respReader{b: b, s: string(b)}
	kind, n, err := r.header()
	switch {
	case err != nil:
		return nil, err
	case kind == respNull && r.at == len(b):
		return nil, nil
	case kind == respNull:
		return nil, fmt.Errorf("%d bytes after the reply", len(b)-r.at)
	case (kind != '*' && kind != '%') || n != 1:
		return nil, fmt.Errorf("reply of %q %d, want one stream", kind, n)
	}
	if kind == '*' {
		if kind, n, err = r.header(); err != nil {
			return nil, err
		} else if kind != '*' || n != 2 {
			return nil, fmt.Errorf("stream of %q %d, want *2", kind, n)
		}
	}
	if _, err := r.bulk(); err != nil { // the stream's name
		return nil, fmt.Errorf("stream name: %w", err)
	}
	kind, n, err = r.header()
	switch {
	case err != nil:
		return nil, err
	case kind != '*':
		return nil, fmt.Errorf("records of %q, want an array", kind)
	case n > count:
		return nil, fmt.Errorf("%d records, more than the %d asked for", n, count)
	}
	out := make([]StreamRecord, 0, n)
	for i := range n {
		if kind, m, err := r.header(); err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		} else if kind != '*' || m != 2 {
			return nil, fmt.Errorf("record %d of %q %d, want *2", i, kind, m)
		}
		id, err := r.bulk()
		if err == nil && id.empty() {
			err = errors.New("empty")
		}
		if err != nil {
			return nil, fmt.Errorf("record %d: id: %w", i, err)
		}
		kind, m, err := r.header()
		switch {
		case err != nil:
			return nil, fmt.Errorf("record %d: fields: %w", i, err)
		case kind == respNull:
			continue // deleted since it was added
		case kind != '*' || m%2 != 0:
			return nil, fmt.Errorf("record %d: fields of %q %d, want an even array", i, kind, m)
		}
		rec := StreamRecord{ID: r.str(id), Deliveries: 1}
		for j := 0; j < m; j += 2 {
			name, err := r.bulk()
			if err != nil {
				return nil, fmt.Errorf("record %d: field %d: %w", i, j/2, err)
			}
			v, err := r.bulk()
			if err != nil {
				return nil, fmt.Errorf("record %d: field %d: %w", i, j/2, err)
			}
			switch r.s[name.from:name.to] {
			case FieldKey:
				rec.Key = r.str(v)
			case FieldTenant:
				rec.Tenant = r.str(v)
			case FieldPartition:
				rec.Partition = r.str(v)
			case FieldData:
				rec.Data = b[v.from:v.to:v.to]
			}
		}
		out = append(out, rec)
	}
	if r.at != len(b) {
		return nil, fmt.Errorf("%d bytes after the reply", len(b)-r.at)
	}
	return out, nil
}

// respLen parses a header's length: -1 (a null), or digits (no leading
// zero) up to maxRESPLen.
func respLen[T string | []byte](line T) (int, bool) {
	if string(line) == "-1" {
		return -1, true
	}
	if len(line) == 0 || len(line) > 1 && line[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(line); i++ {
		c := line[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n = n*10 + int(c-'0'); n > maxRESPLen {
			return 0, false
		}
	}
	return n, true
}

// respNull is the kind header reports for a null (*-1, $-1 or _).
const respNull = '_'

// respReader reads a RESP reply held whole in b (and s, a string copy
// of it), from at on.
type respReader struct {
	b  []byte
	s  string
	at int
}

// span is a value's bytes, b[from:to].
type span struct{ from, to int }

func (p span) empty() bool { return p.from == p.to }

// str is the value of v as a string, sharing the reply's copy.
func (r *respReader) str(v span) string { return r.s[v.from:v.to] }

// maxRESPLen bounds a length or count in a header: far above any reply
// ReadNow asks for, and small enough that no sum of them overflows.
const maxRESPLen = 1 << 40

// header reads a header line: its kind ('*', '%', '$', '-' …) and
// number, or respNull for a null. An error reply is returned as an
// error.
func (r *respReader) header() (kind byte, n int, err error) {
	if r.at >= len(r.b) {
		return 0, 0, errors.New("reply cut short")
	}
	kind = r.b[r.at]
	end := r.at + 1
	for end < len(r.b) && r.b[end] != '\r' {
		end++
	}
	if end+1 >= len(r.b) || r.b[end+1] != '\n' {
		return 0, 0, errors.New("header without CRLF")
	}
	line := r.s[r.at+1 : end]
	r.at = end + 2
	switch kind {
	case '-':
		return 0, 0, fmt.Errorf("server: %.200s", line)
	case '_':
		if line != "" {
			return 0, 0, fmt.Errorf("null with %q", line)
		}
		return respNull, 0, nil
	case '*', '%', '$':
	default:
		return 0, 0, fmt.Errorf("unexpected %q", kind)
	}
	n, ok := respLen(line)
	switch {
	case !ok || n == -1 && kind == '%':
		return 0, 0, fmt.Errorf("bad length %.30q", line)
	case n == -1:
		return respNull, 0, nil
	}
	if kind != '$' && n > len(r.b)-r.at {
		// Each element takes at least one byte: a count this large is a
		// lie, and must not size an allocation.
		return 0, 0, fmt.Errorf("%d elements in %d bytes", n, len(r.b)-r.at)
	}
	return kind, n, nil
}

// bulk reads a bulk string ($n, its bytes, CRLF); a null is an error.
func (r *respReader) bulk() (span, error) {
	kind, n, err := r.header()
	switch {
	case err != nil:
		return span{}, err
	case kind != '$':
		return span{}, fmt.Errorf("%q, want a bulk string", kind)
	case n > len(r.b)-r.at-2:
		return span{}, fmt.Errorf("bulk string of %d bytes, %d left", n, len(r.b)-r.at)
	case r.b[r.at+n] != '\r' || r.b[r.at+n+1] != '\n':
		return span{}, errors.New("bulk string without CRLF")
	}
	v := span{r.at, r.at + n}
	r.at += n + 2
	return v, nil
}
