package admit

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
)

// MaxKeyLen bounds the length of a store key. A longer one (a client can
// send a header or metadata value of a megabyte) is replaced by its rule
// name and the SHA-256 of the whole key, so that a store never holds keys
// of a size a client chooses and no crafted value can collide with
// another's.
const MaxKeyLen = 256

// AppendKey appends to dst the store key of one policy for one request and
// returns the extended slice: the policy's rule name, then for each of its
// parts (0 to parts-1) a '|' and what part(dst, i) appends — the value the
// transport takes from the request for the policy's i-th key, such as the
// client's address, a header or a metadata value.
//
// In the name and in every part, '%', '|' and '#' are escaped as "%25",
// "%7C" and "%23", so the key is injective: two policies or two requests
// that differ in any name or part never share a key (unescaped, the parts
// "a|b", "c" and "a", "b|c" would, and a client could send a part that
// reads as another key's digest). Values without those bytes are kept as
// they are.
//
// part reports false when its key, and so the policy, does not apply to
// the request (the header is absent, say); AppendKey then stops and reports
// false, and the bytes it appended are garbage. A key longer than MaxKeyLen
// bytes becomes the escaped name, "|#" and the hex SHA-256 of the whole
// key (longer than MaxKeyLen only if the name itself is nearly as long); no
// unhashed key has a raw '#', so no value can pass for a digest.
//
// part is called before AppendKey returns and never kept, so a closure
// over the request costs no allocation; AppendKey allocates only when dst
// must grow.
func AppendKey(dst []byte, name string, parts int, part func(dst []byte, i int) ([]byte, bool)) ([]byte, bool) {
	start := len(dst)
	b := escape(append(dst, name...), start)
	nameLen := len(b) - start
	for i := range parts {
		b = append(b, '|')
		from := len(b)
		var ok bool
		if b, ok = part(b, i); !ok {
			return b, false
		}
		b = escape(b, from)
	}
	if len(b)-start <= MaxKeyLen {
		return b, true
	}
	// bound rewrites the key within its own bytes, unless the rule name
	// alone is so long that the digest does not fit them; append copies
	// the result in place either way.
	return append(b[:start], bound(b[start:], nameLen)...), true
}

// escape percent-encodes the bytes of b from index from on that a key uses
// as delimiters ('%', '|', '#'), in place, growing b only if there is one.
func escape(b []byte, from int) []byte {
	n := 0
	for _, c := range b[from:] {
		if c == '%' || c == '|' || c == '#' {
			n++
		}
	}
	if n == 0 {
		return b
	}
	end := len(b)
	b = slices.Grow(b, 2*n)[:end+2*n]
	j := len(b)
	for i := end - 1; i >= from; i-- {
		switch c := b[i]; c {
		case '%':
			j -= 3
			copy(b[j:], "%25")
		case '|':
			j -= 3
			copy(b[j:], "%7C")
		case '#':
			j -= 3
			copy(b[j:], "%23")
		default:
			j--
			b[j] = c
		}
	}
	return b
}

// bound returns key b, which begins with a rule name of n bytes, unchanged
// if it is at most MaxKeyLen bytes long; otherwise it replaces what follows
// the rule name by "|#" and the hex SHA-256 of b, in b's array when it fits
// there.
func bound(b []byte, n int) []byte {
	if len(b) <= MaxKeyLen {
		return b
	}
	sum := sha256.Sum256(b)
	b = append(b[:n], "|#"...)
	return hex.AppendEncode(b, sum[:])
}
