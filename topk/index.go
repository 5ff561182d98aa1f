package topk

// An index maps keys to the numbers of their counters: open addressing with
// linear probing in a table of fixed size, at most half full so that
// probes are short, and never grown: it never allocates. The caller hashes
// the key once.
type index struct {
	slots []slot
	mask  uint64
}

type slot struct {
	key  string
	hash uint64
	n    int32 // the counter's number + 1; 0 is empty
}

func newIndex(entries int) index {
	size := 2
	for size < 2*entries {
		size <<= 1
	}
	return index{slots: make([]slot, size), mask: uint64(size - 1)}
}

// find returns the counter of key, or -1.
func (x *index) find(hash uint64, key string) int32 {
	for i := hash & x.mask; ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.n == 0 {
			return -1
		}
		if s.hash == hash && s.key == key {
			return s.n - 1
		}
	}
}

// insert adds key, which must not be present, for counter n.
func (x *index) insert(hash uint64, key string, n int32) {
	i := hash & x.mask
	for x.slots[i].n != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = slot{key: key, hash: hash, n: n + 1}
}

// remove deletes key, which must be present, shifting back the keys that
// probed past it so that no lookup stops short of them.
func (x *index) remove(hash uint64, key string) {
	i := hash & x.mask
	for x.slots[i].hash != hash || x.slots[i].key != key {
		i = (i + 1) & x.mask
	}
	for j := i; ; {
		j = (j + 1) & x.mask
		if x.slots[j].n == 0 {
			break
		}
		home := x.slots[j].hash & x.mask
		// Move slot j into the hole at i unless its home lies in (i, j],
		// cyclically.
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = slot{}
}
