// Package rediskey encodes the caller-chosen strings (tags, keys, names)
// that Sluice's Redis backends put into Redis keys.
//
// The encoding of s is unpadded URL-safe base64 of s when s has at most
// MaxRaw bytes, and "~" followed by unpadded URL-safe base64 of the SHA-256
// of s above that. So no byte a caller sends ("{", "}", ":", a newline,
// anything) appears raw in a Redis key: none can end a hash tag early, move
// a key to another Cluster slot or reach another key. Encodings have a
// bounded length, and distinct strings of up to MaxRaw bytes never share
// one; a hashed one starts with "~", which base64 never produces.
//
// The encoding is part of the keys already stored in deployed Redis
// servers: changing it orphans every existing counter and semaphore.
package rediskey

import (
	"crypto/sha256"
	"encoding/base64"
)

// MaxRaw is the length of the longest string encoded as itself rather than
// as its SHA-256.
const MaxRaw = 128

var b64 = base64.RawURLEncoding

// Append appends the encoding of s to b and returns the extended slice.
func Append(b []byte, s string) []byte {
	if len(s) <= MaxRaw {
		return b64.AppendEncode(b, []byte(s))
	}
	sum := sha256.Sum256([]byte(s))
	b = append(b, '~')
	return b64.AppendEncode(b, sum[:])
}

// Len returns the length of the encoding of a string of n bytes.
func Len(n int) int {
	if n <= MaxRaw {
		return b64.EncodedLen(n)
	}
	return 1 + b64.EncodedLen(sha256.Size)
}
