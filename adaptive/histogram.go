package adaptive

import (
	"math/bits"
	"time"
)

// A histogram counts latencies in logarithmic buckets, eight per power of
// two, so that a quantile read from it is within 1/16 (6.25%) of the true
// sample's value whatever its scale, from a nanosecond to centuries. It
// never allocates: recording is an index computation and an increment, and
// reading a quantile is one pass over the buckets. The zero value is empty.
type histogram struct {
	n      uint32
	counts [histBuckets]uint32
}

const (
	histSubBits = 3 // 8 buckets per power of two
	histSub     = 1 << histSubBits
	// Values below histSub have a bucket each; above, bucket 8·(e-2)+m
	// holds the values whose top bit is e and next three bits are m.
	histBuckets = (63-histSubBits+1)*histSub + histSub
)

// bucketOf returns the bucket of v nanoseconds (v >= 0).
func bucketOf(v int64) int {
	u := uint64(v)
	if u < histSub {
		return int(u)
	}
	e := bits.Len64(u) - 1 // position of the top bit, >= histSubBits
	m := (u >> (e - histSubBits)) & (histSub - 1)
	return (e-histSubBits+1)*histSub + int(m)
}

// bucketBounds returns the smallest value of bucket i and its width.
func bucketBounds(i int) (lo, width float64) {
	if i < histSub {
		return float64(i), 1
	}
	e := i/histSub + histSubBits - 1
	m := i % histSub
	w := float64(uint64(1) << (e - histSubBits))
	return float64(histSub+m) * w, w
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(max(int64(d), 0))]++
	h.n++
}

func (h *histogram) reset() { *h = histogram{} }

// quantile returns the q-quantile (0 < q <= 1) of the recorded values,
// interpolated linearly inside its bucket, or 0 when h is empty.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := q * float64(h.n) // the rank-th smallest value, 1-based
	if rank < 1 {
		rank = 1
	}
	var cum float64
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		if cum+float64(c) >= rank {
			lo, w := bucketBounds(i)
			frac := (rank - cum) / float64(c)
			return time.Duration(lo + frac*w)
		}
		cum += float64(c)
	}
	lo, w := bucketBounds(histBuckets - 1)
	return time.Duration(lo + w)
}
