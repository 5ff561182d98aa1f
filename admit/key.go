package admit

import (
	"crypto/sha256"
	"encoding/hex"
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
// part reports false when its key, and so the policy, does not apply to
// the request (the header is absent, say); AppendKey then stops and reports
// false, and the bytes it appended are garbage. A key longer than MaxKeyLen
// bytes becomes name|# and the hex SHA-256 of the whole key (longer than
// MaxKeyLen only if the name itself is nearly as long).
//
// part is called before AppendKey returns and never kept, so a closure
// over the request costs no allocation; AppendKey allocates only when dst
// must grow.
func AppendKey(dst []byte, name string, parts int, part func(dst []byte, i int) ([]byte, bool)) ([]byte, bool) {
	start := len(dst)
	b := append(dst, name...)
	for i := range parts {
		b = append(b, '|')
		var ok bool
		if b, ok = part(b, i); !ok {
			return b, false
		}
	}
	if len(b)-start <= MaxKeyLen {
		return b, true
	}
	// bound rewrites the key within its own bytes, unless the rule name
	// alone is so long that the digest does not fit them; append copies
	// the result in place either way.
	return append(b[:start], bound(b[start:], len(name))...), true
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
