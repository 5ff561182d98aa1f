package ratelimit

import (
	"encoding/binary"
	"fmt"
	"time"
)

// The record of a reservation, as a Ledger keeps it:
//
//	version byte (1)
//	varint   the reservation's instant, Unix ns
//	uvarint  the number of items, 1 to MaxReservedItems
//	per item:
//	  bytes   key      (uvarint length, then the bytes)
//	  bytes   tag      (at most MaxReservationTag)
//	  varint  estimate (1 to MaxQuota)
//	  bytes   rule     (its own encoding, below)
//
// and a rule is
//
//	bytes name, byte algorithm, uvarint quota, byte block,
//	varint period (ns), uvarint burst, byte calendar,
//	bytes location (a zone name; empty for none), byte failure,
//	byte counting
//
// The whole record is at most MaxReservationRecord bytes. decodeRecord
// checks every length and bound, and the rule with Validate.

const recordVersion = 1

// appendRecord appends the record of items reserved at at (Unix ns) to b.
// Items with nothing to settle (a cost that is not positive, a rule that
// admits nothing) are left out.
func appendRecord(b []byte, at int64, items []Reserved) ([]byte, error) {
	n := 0
	for i := range items {
		if items[i].Estimate > 0 && items[i].Rule.Quota > 0 {
			n++
		}
	}
	if n > MaxReservedItems {
		return nil, fmt.Errorf("%w: %d items, at most %d", ErrBadReservation, n, MaxReservedItems)
	}
	b = append(b, recordVersion)
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, uint64(n))
	for i := range items {
		it := &items[i]
		if it.Estimate <= 0 || it.Rule.Quota <= 0 {
			continue
		}
		if len(it.Tag) > MaxReservationTag {
			return nil, fmt.Errorf("%w: tag of %d bytes, at most %d", ErrBadReservation, len(it.Tag), MaxReservationTag)
		}
		b = appendBytes(b, it.Key)
		b = appendBytes(b, it.Tag)
		b = binary.AppendVarint(b, it.Estimate)
		b = appendBytes(b, string(appendRule(nil, it.Rule)))
		if len(b) > MaxReservationRecord {
			return nil, fmt.Errorf("%w: record of more than %d bytes (long keys, or many items)", ErrBadReservation, MaxReservationRecord)
		}
	}
	return b, nil
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendRule appends r's encoding to b.
func appendRule(b []byte, r *Rule) []byte {
	b = appendBytes(b, r.Name)
	b = append(b, byte(r.Algorithm))
	b = binary.AppendUvarint(b, uint64(r.Quota))
	b = append(b, boolByte(r.Block))
	b = binary.AppendVarint(b, int64(r.Period))
	b = binary.AppendUvarint(b, uint64(r.Burst))
	b = append(b, byte(r.Calendar))
	loc := ""
	if r.Location != nil {
		loc = r.Location.String()
	}
	b = appendBytes(b, loc)
	b = append(b, byte(r.Failure), byte(r.Counting))
	return b
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// recordReader reads a record's fields, remembering the first error.
type recordReader struct {
	b   []byte
	err error
}

func (r *recordReader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: record: %s", ErrBadReservation, fmt.Sprintf(format, a...))
	}
}

func (r *recordReader) byte() byte {
	if len(r.b) == 0 {
		r.fail("truncated")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *recordReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 || n > 1 && r.b[n-1] == 0 {
		r.fail("bad, overlong or truncated number")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *recordReader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 || n > 1 && r.b[n-1] == 0 {
		r.fail("bad, overlong or truncated number")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *recordReader) bytes(max int) []byte {
	n := r.uvarint()
	if n > uint64(max) || n > uint64(len(r.b)) {
		r.fail("a field of %d bytes (at most %d, %d left)", n, max, len(r.b))
		return nil
	}
	s := r.b[:n]
	r.b = r.b[n:]
	return s
}

// decodeRecord decodes a record: its instant and its items, whose rules
// come from t (one *Rule per distinct rule).
func (t *ruleTable) decodeRecord(rec []byte) (int64, []Reserved, error) {
	if len(rec) > MaxReservationRecord {
		return 0, nil, fmt.Errorf("%w: record of %d bytes, at most %d", ErrBadReservation, len(rec), MaxReservationRecord)
	}
	r := recordReader{b: rec}
	if v := r.byte(); r.err == nil && v != recordVersion {
		r.fail("version %d, want %d", v, recordVersion)
	}
	at := r.varint()
	n := r.uvarint()
	if n > MaxReservedItems {
		r.fail("%d items, at most %d", n, MaxReservedItems)
	}
	if r.err != nil {
		return 0, nil, r.err
	}
	items := make([]Reserved, 0, n)
	for range n {
		key := r.bytes(MaxReservationRecord)
		tag := r.bytes(MaxReservationTag)
		est := r.varint()
		enc := r.bytes(MaxReservationRecord)
		if r.err != nil {
			return 0, nil, r.err
		}
		if est <= 0 || est > MaxQuota {
			r.fail("estimate %d out of range [1, %d]", est, int64(MaxQuota))
			return 0, nil, r.err
		}
		rule, err := t.rule(enc)
		if err != nil {
			return 0, nil, err
		}
		items = append(items, Reserved{Key: string(key), Rule: rule, Estimate: est, Tag: string(tag)})
	}
	if len(r.b) != 0 {
		r.fail("%d bytes after the last item", len(r.b))
	}
	return at, items, r.err
}

// decodeRule decodes a rule's encoding and validates it.
func decodeRule(enc []byte) (*Rule, error) {
	r := recordReader{b: enc}
	rule := &Rule{Name: string(r.bytes(MaxReservationRecord))}
	rule.Algorithm = Algorithm(r.byte())
	q := r.uvarint()
	switch r.byte() {
	case 0:
	case 1:
		rule.Block = true
	default:
		r.fail("block flag not 0 or 1")
	}
	rule.Period = time.Duration(r.varint())
	burst := r.uvarint()
	rule.Calendar = Calendar(r.byte())
	loc := string(r.bytes(256))
	rule.Failure = FailureMode(r.byte())
	rule.Counting = Counting(r.byte())
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d bytes after a rule", len(r.b))
	}
	if r.err == nil && (q > MaxQuota || burst > MaxQuota) {
		r.fail("rule %q: quota %d or burst %d above %d", rule.Name, q, burst, int64(MaxQuota))
	}
	if r.err != nil {
		return nil, r.err
	}
	rule.Quota, rule.Burst = int64(q), int64(burst)
	if loc != "" {
		l, err := time.LoadLocation(loc)
		if err != nil {
			return nil, fmt.Errorf("%w: record: rule %q: %v", ErrBadReservation, rule.Name, err)
		}
		rule.Location = l
	}
	if err := rule.Validate(); err != nil {
		return nil, fmt.Errorf("%w: record: %w", ErrBadReservation, err)
	}
	return rule, nil
}
