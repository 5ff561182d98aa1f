package redisstore

import (
	"strings"

	"github.com/sluicehq/sluice/internal/rediskey"
)

// Key layout
//
// The Redis key of an item is
//
//	prefix + "{" + enc(tag) + "}" + ":" + enc(item key)
//
// or, when the item key is the tag itself, just prefix + "{" + enc(tag) + "}".
// A sliding_log item also owns the list at that key + "|l".
//
// enc is internal/rediskey's encoding (and an empty tag is encoded "~",
// which no other encoding is): unpadded URL-safe base64 for strings of up to
// rediskey.MaxRaw bytes and "~" + base64 of their SHA-256 above that, so no
// caller-chosen byte ("{", "}", ":", newlines, anything) appears raw in a
// Redis key, keys have a bounded length, and distinct (tag, key) pairs never
// share a Redis key: a caller cannot reach another tenant's counters or move
// a key to another Cluster slot except through the tag, which is the only
// thing that decides the slot.

// appendTag appends the encoded tag: enc(tag), or "~" for the empty tag,
// since Redis would not read "{}" as a tag.
func appendTag(b []byte, tag string) []byte {
	if tag == "" {
		return append(b, '~')
	}
	return rediskey.Append(b, tag)
}

// appendKey appends the Redis key of item key k, whose hash tag is tag.
func appendKey(b []byte, prefix, tag, k string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	b = appendTag(b, tag)
	b = append(b, '}')
	if k != tag {
		b = append(b, ':')
		b = rediskey.Append(b, k)
	}
	return b
}

// logSuffix names a sliding log's entry list beside its state key.
const logSuffix = "|l"

// HashTag is the default Options.HashTag: the part of k between its first
// "{" and the first "}" after it, when that part is not empty (as Redis
// Cluster itself reads tags), or else the whole of k.
func HashTag(k string) string {
	if i := strings.IndexByte(k, '{'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '}'); j > 0 {
			return k[i+1 : i+1+j]
		}
	}
	return k
}
