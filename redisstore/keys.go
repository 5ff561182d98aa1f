package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
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
// enc is appendEncoded's encoding (and an empty tag is encoded "~",
// which no other encoding is): unpadded URL-safe base64 for strings of up to
// maxRaw bytes and "~" + base64 of their SHA-256 above that, so no
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
	return appendEncoded(b, tag)
}

// appendKey appends the Redis key of item key k, whose hash tag is tag.
func appendKey(b []byte, prefix, tag, k string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	b = appendTag(b, tag)
	b = append(b, '}')
	if k != tag {
		b = append(b, ':')
		b = appendEncoded(b, k)
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

// slot is the Redis Cluster hash slot of the Redis key rk: CRC16 (XMODEM,
// as Redis computes it) of its hash tag, modulo 16384.
func slot(rk string) uint16 {
	var crc uint16
	for _, b := range []byte(HashTag(rk)) {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// Every caller-chosen string that this package puts into a Redis key (a
// rate-limit key or its hash tag, a semaphore's name, a lease service's
// name) goes through appendEncoded: unpadded URL-safe base64 of the string
// when it has at most maxRaw bytes, and "~" followed by unpadded URL-safe
// base64 of its SHA-256 above that. So no byte a caller sends ("{", "}",
// ":", a newline, anything) appears raw in a Redis key: none can end a hash
// tag early, move a key to another Cluster slot or reach another key.
// Encodings have a bounded length, and distinct strings of up to maxRaw
// bytes never share one; a hashed one starts with "~", which base64 never
// produces.
//
// The encoding is part of the keys already stored in deployed Redis
// servers: changing it orphans every existing counter and semaphore.

// maxRaw is the length of the longest string encoded as itself rather than
// as its SHA-256.
const maxRaw = 128

var b64 = base64.RawURLEncoding

// appendEncoded appends the encoding of s to b and returns the extended slice.
func appendEncoded(b []byte, s string) []byte {
	if len(s) <= maxRaw {
		return b64.AppendEncode(b, []byte(s))
	}
	sum := sha256.Sum256([]byte(s))
	b = append(b, '~')
	return b64.AppendEncode(b, sum[:])
}

// encodedLen returns the length of the encoding of a string of n bytes.
func encodedLen(n int) int {
	if n <= maxRaw {
		return b64.EncodedLen(n)
	}
	return 1 + b64.EncodedLen(sha256.Size)
}

// reservationKey is the Redis key of the reservation record id (a
// ratelimit reservation id, which CheckReservationID keeps to base64's
// URL-safe alphabet, so it is put in raw):
//
//	prefix + "r:{" + id + "}"
//
// Its own hash tag keeps it off every rate-limit key, all of which start
// prefix + "{".
func reservationKey(prefix, id string) string {
	return prefix + "r:{" + id + "}"
}
