// Package storekey bounds the length of the store keys that Sluice's
// middleware and interceptors build from a request ("name|key|…").
package storekey

import (
	"crypto/sha256"
	"encoding/hex"
)

// MaxLen bounds the length of a store key. A longer one (a client can send
// a header or metadata value of a megabyte) is replaced by its rule name
// and the SHA-256 of the whole key, so that a store never holds keys of a
// size a client chooses and no crafted value can collide with another's.
const MaxLen = 256

// Bound returns key b, which begins with a rule name of n bytes and a
// separator, unchanged if it is at most MaxLen bytes long; otherwise it
// replaces what follows the rule name by "|#" and the hex SHA-256 of b,
// reusing b's array.
func Bound(b []byte, n int) []byte {
	if len(b) <= MaxLen {
		return b
	}
	sum := sha256.Sum256(b)
	b = append(b[:n], "|#"...)
	return hex.AppendEncode(b, sum[:])
}
