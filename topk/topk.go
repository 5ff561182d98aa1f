package topk

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/ratelimit"
)

// DefaultK is the number of entries a table reports when Options.K is 0.
const DefaultK = 20

// DefaultNearFrom is Options.NearFrom when it is 0.
const DefaultNearFrom = 0.5

// MaxCounters bounds Options.Counters.
const MaxCounters = 1 << 20

// DefaultFullRate is Options.FullRate when it is 0.
const DefaultFullRate = 5_000

// shards is the number of shards of a Tracker.
const shards = 8

// The sampling's measurement: a shard measures its decisions' rate over
// at least rateWindow and rateSamples of its samples (or over
// rateWindowMax, however few), looking at the clock once every lookEvery
// decisions (estimated from its samples), and samples at most one
// decision in 1<<maxShift.
const (
	rateWindow    = 20 * time.Millisecond
	rateWindowMax = time.Second
	rateSamples   = 32
	lookEvery     = 256
	maxShift      = 16
)

// Options configure a Tracker. The zero value is the defaults.
type Options struct {
	// K is the number of entries each table reports; DefaultK when 0, at
	// most MaxCounters.
	K int
	// Counters is the number of counters of the hot and denied sketch;
	// 16×K when 0. More counters lower Threshold (about N/Counters) and
	// cost memory, not time.
	Counters int
	// NearFrom is the share of its limit a decision must leave used for
	// its key to be considered near the limit; DefaultNearFrom when 0.
	NearFrom float64
	// Secret shows the keys hashed (see the package documentation).
	Secret bool
	// FullRate is the decisions a second up to which the Tracker counts
	// every one; above it, it counts one in 2ⁿ of them, as 2ⁿ each, with
	// n as small as keeps what it counts at or below FullRate (see the
	// package documentation). DefaultFullRate when 0; negative means to
	// count every decision at any rate.
	FullRate float64
	// Now is the clock read for the decisions near the limit, to measure
	// the rate of decisions and by Snapshot; nil means time.Now.
	Now func() time.Time
}

// A Limit is a tracker and the limit it follows, for a dashboard.
type Limit struct {
	// Domain is the service's domain of the rule, "" for a middleware's
	// policy; Name the rule's or policy's name.
	Domain, Name string
	// Rule is the limit, nil when not known.
	Rule *ratelimit.Rule
	// CostUnit is what Rule counts ("input_tokens"); "" when it counts
	// requests' costs, whatever they stand for.
	CostUnit string
	Tracker  *Tracker
}

// A Tracker follows the keys of one limit; see the package documentation.
type Tracker struct {
	k        int
	nearFrom float64
	secret   bool
	budget   float64 // decisions a second a shard counts one by one; 0: every one at any rate
	now      func() time.Time
	rand     func() uint64
	seed     maphash.Seed
	mac      [32]byte
	shards   [shards]*shard
	// shift is each shard's sampling: one decision in 1<<shift is
	// counted. Read by every decision, written by the shard's rate
	// measurement at most once a rateWindow.
	shift [shards]atomic.Uint32
}

type shard struct {
	mu        sync.Mutex
	decisions int64 // estimated: the sum of the samples' weights
	denied    int64
	// The rate measurement: samples counted since since (Unix ns, 0
	// before the first look), and the count at which to look next.
	samples, look, since int64
	hot                  hotTable
	near                 nearTable
	_                    [64]byte // keep neighbouring shards' locks off one cache line
}

// New returns a Tracker.
func New(opts Options) (*Tracker, error) {
	if opts.K < 0 || opts.Counters < 0 || opts.K > MaxCounters || opts.Counters > MaxCounters {
		return nil, fmt.Errorf("topk: K %d and Counters %d must be between 0 and %d", opts.K, opts.Counters, MaxCounters)
	}
	if opts.NearFrom < 0 || opts.NearFrom > 1 || opts.NearFrom != opts.NearFrom {
		return nil, fmt.Errorf("topk: NearFrom %v is not between 0 and 1", opts.NearFrom)
	}
	if opts.FullRate != opts.FullRate || math.IsInf(opts.FullRate, 0) {
		return nil, fmt.Errorf("topk: FullRate %v is not a number of decisions a second", opts.FullRate)
	}
	t := &Tracker{k: opts.K, nearFrom: opts.NearFrom, secret: opts.Secret, now: opts.Now, rand: mrand.Uint64, seed: maphash.MakeSeed()}
	switch {
	case opts.FullRate == 0:
		t.budget = DefaultFullRate / shards
	case opts.FullRate > 0:
		t.budget = opts.FullRate / shards
	}
	if t.k == 0 {
		t.k = DefaultK
	}
	if t.nearFrom == 0 {
		t.nearFrom = DefaultNearFrom
	}
	if t.now == nil {
		t.now = time.Now
	}
	counters := opts.Counters
	if counters == 0 {
		counters = 16 * t.k
	}
	counters = max(counters, t.k)
	if t.secret {
		if _, err := rand.Read(t.mac[:]); err != nil {
			return nil, errors.New("topk: no randomness for the secret keys' hash")
		}
	}
	per := (counters + shards - 1) / shards
	for i := range t.shards {
		t.shards[i] = &shard{look: lookEvery, hot: newHotTable(per), near: newNearTable(t.k)}
	}
	return t, nil
}

// K returns the number of entries each table reports by default.
func (t *Tracker) K() int { return t.k }

// Footprint returns the bytes the Tracker's tables take, fixed at New (not
// counting the key strings they keep alive).
func (t *Tracker) Footprint() int {
	n := int(unsafe.Sizeof(*t))
	for _, s := range t.shards {
		n += int(unsafe.Sizeof(*s)) +
			cap(s.hot.entries)*int(unsafe.Sizeof(hotEntry{})) + cap(s.hot.buckets)*int(unsafe.Sizeof(bucket{})) + cap(s.hot.idx.slots)*int(unsafe.Sizeof(slot{})) + cap(s.hot.cells)*8 +
			cap(s.near.entries)*int(unsafe.Sizeof(nearEntry{})) + cap(s.near.heap)*4 + cap(s.near.idx.slots)*int(unsafe.Sizeof(slot{}))
	}
	return n
}

// Observe records a decision of key, reading the clock only if the
// decision is near the limit; see ObserveAt.
func (t *Tracker) Observe(key string, d *ratelimit.Decision) { t.ObserveAt(time.Time{}, key, d) }

// ObserveAt records a decision of key made at now; a zero now means to
// read the clock, and only if the decision is near the limit or the
// rate is measured (a caller that has read it already saves that). A
// denial counts as such unless the store failed closed (an outage, not
// the key's doing). A decision made by a failure mode other than local
// says nothing of the key's use and is not considered near the limit.
// ObserveAt keeps key: the caller must not change its bytes afterwards
// (an ordinary string never changes).
func (t *Tracker) ObserveAt(now time.Time, key string, d *ratelimit.Decision) {
	h := maphash.String(t.seed, key)
	i := h >> 61
	sh := t.shift[i].Load()
	if sh > 0 && t.rand()>>(64-sh) != 0 {
		return // not among the one in 1<<sh decisions counted
	}
	w := int64(1) << sh
	s := t.shards[i]
	denied := !d.Allowed && d.Reason != ratelimit.ReasonFailClosed
	used, ok := Used(d)
	near := ok && used >= t.nearFrom
	var wholeAt int64
	if near {
		if now.IsZero() {
			now = t.now()
		}
		// To the millisecond, rounded up: keys whole again within one
		// millisecond of each other are as near, so that a stream of keys
		// all denied alike does not replace an entry at every decision.
		wholeAt = (now.UnixNano() + int64(d.ResetAfter) + 999_999) / 1_000_000 * 1_000_000
	}
	s.mu.Lock()
	s.decisions += w
	if denied {
		s.denied += w
	}
	s.hot.observe(h, key, denied, w)
	if near {
		s.near.observe(h, key, wholeAt, used)
	}
	if t.budget > 0 {
		if s.samples++; s.samples >= s.look {
			if now.IsZero() {
				now = t.now()
			}
			t.measure(int(i), s, now.UnixNano())
		}
	}
	s.mu.Unlock()
}

// measure sets shard i's sampling from the rate of its decisions since
// s.since, once that is at least rateWindow ago: the smallest shift that
// keeps the decisions counted at or below the budget. Called with s.mu
// held, when s.samples reaches s.look, and by Snapshot.
func (t *Tracker) measure(i int, s *shard, now int64) {
	sh := t.shift[i].Load()
	step := max(1, int64(lookEvery)>>sh) // samples in lookEvery decisions
	elapsed := now - s.since
	if s.since == 0 || elapsed < 0 {
		s.samples, s.look, s.since = 0, step, now
		return
	}
	if elapsed < int64(rateWindow) || (s.samples < rateSamples && elapsed < int64(rateWindowMax)) {
		s.look = s.samples + step
		return
	}
	rate := float64(s.samples<<sh) / (float64(elapsed) / 1e9)
	n := uint32(0)
	if over := rate / t.budget; over > 1 {
		n = min(maxShift, uint32(bits.Len64(uint64(math.Ceil(over))-1)))
	}
	t.shift[i].Store(n)
	s.samples, s.look, s.since = 0, max(1, int64(lookEvery)>>n), now
}

// Used returns the share of its limit's capacity that decision d left in
// use, between 0 and 1, and whether d says it: a decision made by the
// fail_open or fail_closed failure mode, or of a rule without capacity,
// does not.
func Used(d *ratelimit.Decision) (float64, bool) {
	if d.Capacity <= 0 || (d.Reason != ratelimit.ReasonOK && d.Reason != ratelimit.ReasonLimited && d.Reason != ratelimit.ReasonLocal) {
		return 0, false
	}
	return min(1, float64(d.Capacity-max(0, d.Remaining))/float64(d.Capacity)), true
}

// An Entry is a key of the hot and denied sketch.
type Entry struct {
	Key string `json:"key"`
	// Count is the key's decisions, at most Err above the true number.
	Count int64 `json:"count"`
	// Denied is the key's denials, at most Err below the true number.
	Denied int64 `json:"denied"`
	Err    int64 `json:"err"`
	// Sigma is the standard deviation of the sampling's error in Count
	// and in Denied, estimated from the key's samples; 0 while every
	// decision of the key was counted. With some 36 samples or more
	// (Count ≥ 6·Sigma) the true count is within Count − Err − 3·Sigma
	// and Count + 3·Sigma with a probability of about 99.7 %; with fewer,
	// Sigma is itself uncertain (see the package documentation).
	Sigma int64 `json:"sigma,omitempty"`
}

// A NearEntry is a key near its limit.
type NearEntry struct {
	Key string `json:"key"`
	// Used is used ÷ limit after the key's latest decision at or above
	// NearFrom.
	Used float64 `json:"used"`
	// WholeIn is the time until the key's capacity is whole again, as that
	// decision said.
	WholeIn time.Duration `json:"whole_in_ns"`
}

// A Snapshot is what a Tracker knows at one instant.
type Snapshot struct {
	// Decisions and Denied count every decision observed, and the denials
	// (estimated while the Tracker samples).
	Decisions int64 `json:"decisions"`
	Denied    int64 `json:"denied"`
	// Sample is the largest 2ⁿ among the shards' "one decision in 2ⁿ is
	// counted"; 1 while every decision is.
	Sample int64 `json:"sample"`
	// Threshold is the count above which a key is certainly tracked: a
	// key decided more often is in the sketch, and so among Hot if its
	// count is among the largest.
	Threshold int64 `json:"threshold"`
	// Hot are the keys with the most decisions, MostDenied those with the
	// most denials (only keys with some), largest first; Near those
	// nearest their limit that are not yet whole again, by Used (then the
	// latest to be whole again first).
	Hot        []Entry     `json:"hot"`
	MostDenied []Entry     `json:"denied_keys"`
	Near       []NearEntry `json:"near"`
}

// Snapshot returns the top k entries of each table (K when k ≤ 0; at most
// the counters of the sketch).
func (t *Tracker) Snapshot(k int) Snapshot {
	if k <= 0 {
		k = t.k
	}
	now := t.now().UnixNano()
	sn := Snapshot{Sample: 1}
	var hot []Entry
	var near []nearEntry
	for i, s := range t.shards {
		s.mu.Lock()
		if t.budget > 0 && s.since != 0 && now-s.since >= int64(rateWindowMax) {
			t.measure(i, s, now) // a shard whose decisions stopped samples no more
		}
		sn.Sample = max(sn.Sample, int64(1)<<t.shift[i].Load())
		sn.Decisions += s.decisions
		sn.Denied += s.denied
		if th := s.hot.threshold(); th > sn.Threshold {
			sn.Threshold = th
		}
		for n, e := range s.hot.entries {
			hot = append(hot, Entry{Key: e.key, Count: s.hot.count(int32(n)), Denied: e.denied, Err: e.err, Sigma: int64(math.Ceil(math.Sqrt(float64(e.vari))))})
		}
		for _, e := range s.near.entries {
			if e.wholeAt > now {
				near = append(near, e)
			}
		}
		s.mu.Unlock()
	}
	slices.SortFunc(hot, func(a, b Entry) int { return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Key, b.Key)) })
	sn.Hot = t.mask(slices.Clone(hot[:min(k, len(hot))]))
	slices.SortFunc(hot, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(b.Denied, a.Denied), cmp.Compare(b.Count, a.Count), cmp.Compare(a.Key, b.Key))
	})
	n := 0
	for n < len(hot) && n < k && hot[n].Denied > 0 {
		n++
	}
	sn.MostDenied = t.mask(hot[:n])
	slices.SortFunc(near, func(a, b nearEntry) int {
		return cmp.Or(cmp.Compare(b.used, a.used), cmp.Compare(b.wholeAt, a.wholeAt), cmp.Compare(a.key, b.key))
	})
	sn.Near = make([]NearEntry, 0, min(k, len(near)))
	for _, e := range near[:min(k, len(near))] {
		sn.Near = append(sn.Near, NearEntry{Key: t.show(e.key), Used: e.used, WholeIn: time.Duration(e.wholeAt - now)})
	}
	if sn.Hot == nil {
		sn.Hot = []Entry{}
	}
	return sn
}

func (t *Tracker) mask(es []Entry) []Entry {
	for i := range es {
		es[i].Key = t.show(es[i].Key)
	}
	return es
}

// show returns key as a Snapshot shows it.
func (t *Tracker) show(key string) string {
	if !t.secret {
		return key
	}
	m := hmac.New(sha256.New, t.mac[:])
	m.Write([]byte(key))
	return "#" + hex.EncodeToString(m.Sum(nil)[:6])
}

// hotTable is one shard's Space-Saving sketch, kept as its paper's
// stream summary so that every step is O(1): the counters are grouped in
// buckets of equal count, the buckets in a list by increasing count, and
// the keys found through idx. All of it lives in arrays made at New.
//
// In front of it, once every counter is in use, is an admission filter
// (in the spirit of Filtered Space-Saving, Homem and Carvalho, 2010):
// cells, each a bound on the count of every untracked key that hashes
// to it. An untracked key adds one to its cell and takes a counter over
// only when the cell passes the smallest count μ; otherwise it costs the
// lookup and the addition, not the index's removal and insertion and
// the move between buckets. The guarantees are those of the plain
// sketch, with the same counts: a cell never exceeds μ except for the
// moment its key takes a counter over, with the count μ+1 and error μ
// the plain sketch gives; after it the cell is μ again, which still
// bounds its untracked keys (none of them was decided more than μ
// times); a key losing its counter raises its cell to its count. So every
// untracked key was decided at most μ times, and a tracked key's count is
// at most its error above its true count.
type hotTable struct {
	entries []hotEntry // len grows to cap once, then counters are reused
	buckets []bucket   // cap as entries: a non-empty bucket has an entry
	free    int32      // first free bucket, -1 when none is
	head    int32      // the bucket of the smallest count, -1 when none
	idx     index
	cells   []int64 // the admission filter: a power of two in length
}

// filterCells is the number of the filter's cells per counter: the share
// of the untracked keys' decisions that take a counter over in a stream
// of many keys is about 1/(filterCells+1).
const filterCells = 4

type hotEntry struct {
	key         string
	hash        uint64
	err, denied int64
	vari        int64 // the sampling's variance: Σ w(w−1) over its samples of weight w
	bucket      int32
	prev, next  int32 // in the bucket's list of entries, -1 at its ends
}

type bucket struct {
	count      int64
	first      int32 // entry
	prev, next int32 // bucket, -1 at the list's ends
}

const none = -1

func newHotTable(n int) hotTable {
	cells := 1
	for cells < filterCells*n {
		cells <<= 1
	}
	return hotTable{entries: make([]hotEntry, 0, n), buckets: make([]bucket, 0, n), free: none, head: none, idx: newIndex(n), cells: make([]int64, cells)}
}

// cell returns the filter's cell of a key's hash, from bits the index and
// the shard do not use first.
func (h *hotTable) cell(hash uint64) *int64 {
	return &h.cells[(hash>>32)&uint64(len(h.cells)-1)]
}

// count returns the count of entry n.
func (h *hotTable) count(n int32) int64 { return h.buckets[h.entries[n].bucket].count }

// observe counts a decision of key, of weight w (the decisions it stands
// for: 1 unless the Tracker samples).
func (h *hotTable) observe(hash uint64, key string, denied bool, w int64) {
	var d int64
	if denied {
		d = w
	}
	v := w * (w - 1)
	if n := h.idx.find(hash, key); n >= 0 {
		h.entries[n].denied += d
		h.entries[n].vari += v
		h.increment(n, w)
		return
	}
	if len(h.entries) < cap(h.entries) {
		n := int32(len(h.entries))
		h.entries = append(h.entries, hotEntry{key: key, hash: hash, denied: d, vari: v})
		h.idx.insert(hash, key, n)
		prev, b := int32(none), h.head // the bucket of count w, or where it goes
		for b != none && h.buckets[b].count < w {
			prev, b = b, h.buckets[b].next
		}
		if b == none || h.buckets[b].count != w {
			b = h.newBucket(w, prev, b)
		}
		h.link(n, b)
		return
	}
	mu := h.buckets[h.head].count
	c := h.cell(hash)
	if *c += w; *c <= mu {
		return // decided at most μ times: it may stay untracked
	}
	*c = mu
	// The key takes over a counter with the smallest count, whose key's
	// cell now bounds that key's count too.
	n := h.buckets[h.head].first
	e := &h.entries[n]
	h.idx.remove(e.hash, e.key)
	if old := h.cell(e.hash); *old < mu {
		*old = mu
	}
	// Its decisions before, at most μ as counted, were sampled too: their
	// error goes into its variance as if sampled at w.
	e.key, e.hash, e.err, e.denied, e.vari = key, hash, mu, d, v+mu*(w-1)
	h.idx.insert(hash, key, n)
	h.increment(n, w)
}

// increment adds w to entry n's count, moving it to the bucket of its new
// count: past the buckets of the counts in between (none when w is 1;
// at most the shard's counters).
func (h *hotTable) increment(n int32, w int64) {
	b := h.entries[n].bucket
	c := h.buckets[b].count + w
	at := b // the last bucket of a count at most c
	for nx := h.buckets[at].next; nx != none && h.buckets[nx].count <= c; nx = h.buckets[at].next {
		at = nx
	}
	switch {
	case at != b && h.buckets[at].count == c:
		h.unlink(n)
		h.link(n, at)
	case at == b && h.buckets[b].first == n && h.entries[n].next == none:
		h.buckets[b].count = c // alone in its bucket: the order holds
	default:
		// Out of its bucket first, so that a bucket it empties is free
		// for the new one: buckets in use never outnumber the entries.
		h.unlink(n)
		h.link(n, h.newBucket(c, at, h.buckets[at].next))
	}
}

// newBucket returns a new bucket of count c between buckets prev and next.
func (h *hotTable) newBucket(c int64, prev, next int32) int32 {
	var b int32
	if h.free != none {
		b = h.free
		h.free = h.buckets[b].next
	} else {
		b = int32(len(h.buckets))
		h.buckets = append(h.buckets, bucket{})
	}
	h.buckets[b] = bucket{count: c, first: none, prev: prev, next: next}
	if prev != none {
		h.buckets[prev].next = b
	} else {
		h.head = b
	}
	if next != none {
		h.buckets[next].prev = b
	}
	return b
}

// link puts entry n first in bucket b.
func (h *hotTable) link(n, b int32) {
	e := &h.entries[n]
	e.bucket, e.prev, e.next = b, none, h.buckets[b].first
	if e.next != none {
		h.entries[e.next].prev = n
	}
	h.buckets[b].first = n
}

// unlink takes entry n out of its bucket, freeing the bucket if it empties.
func (h *hotTable) unlink(n int32) {
	e := &h.entries[n]
	b := e.bucket
	if e.prev != none {
		h.entries[e.prev].next = e.next
	} else {
		h.buckets[b].first = e.next
	}
	if e.next != none {
		h.entries[e.next].prev = e.prev
	}
	if h.buckets[b].first != none {
		return
	}
	bk := &h.buckets[b]
	if bk.prev != none {
		h.buckets[bk.prev].next = bk.next
	} else {
		h.head = bk.next
	}
	if bk.next != none {
		h.buckets[bk.next].prev = bk.prev
	}
	bk.next = h.free
	h.free = b
}

// threshold is the smallest count when every counter is in use: a key
// decided more often than that is tracked. 0 while counters are free
// (every key seen is then tracked, exactly).
func (h *hotTable) threshold() int64 {
	if len(h.entries) < cap(h.entries) || h.head == none {
		return 0
	}
	return h.buckets[h.head].count
}

// nearTable is one shard's keys nearest their limit: a min-heap by the
// instant each is whole again (then by use), found by key through idx.
type nearTable struct {
	entries []nearEntry
	heap    []int32
	idx     index
}

type nearEntry struct {
	key     string
	hash    uint64
	wholeAt int64 // Unix nanoseconds
	used    float64
	pos     int32
}

func newNearTable(n int) nearTable {
	return nearTable{entries: make([]nearEntry, 0, n), heap: make([]int32, 0, n), idx: newIndex(n)}
}

// nearCmp orders entries from least to most near their limit.
func nearCmp(a, b *nearEntry) int {
	return cmp.Or(cmp.Compare(a.wholeAt, b.wholeAt), cmp.Compare(a.used, b.used))
}

func (h *nearTable) observe(hash uint64, key string, wholeAt int64, used float64) {
	if n := h.idx.find(hash, key); n >= 0 {
		e := &h.entries[n]
		e.wholeAt, e.used = wholeAt, used
		h.fix(int(e.pos))
		return
	}
	if len(h.entries) < cap(h.entries) {
		n := int32(len(h.entries))
		h.entries = append(h.entries, nearEntry{key: key, hash: hash, wholeAt: wholeAt, used: used, pos: int32(len(h.heap))})
		h.heap = append(h.heap, n)
		h.idx.insert(hash, key, n)
		h.fix(len(h.heap) - 1)
		return
	}
	n := h.heap[0]
	e := &h.entries[n]
	cand := nearEntry{wholeAt: wholeAt, used: used}
	if nearCmp(&cand, e) <= 0 {
		return // no nearer than the least near kept
	}
	h.idx.remove(e.hash, e.key)
	e.key, e.hash, e.wholeAt, e.used = key, hash, wholeAt, used
	h.idx.insert(hash, key, n)
	h.fix(0)
}

func (h *nearTable) less(i, j int) bool {
	return nearCmp(&h.entries[h.heap[i]], &h.entries[h.heap[j]]) < 0
}

func (h *nearTable) swap(i, j int) {
	h.heap[i], h.heap[j] = h.heap[j], h.heap[i]
	h.entries[h.heap[i]].pos = int32(i)
	h.entries[h.heap[j]].pos = int32(j)
}

// fix restores the heap after the entry at i changed either way.
func (h *nearTable) fix(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.swap(i, p)
		i = p
	}
	for {
		l := 2*i + 1
		if l >= len(h.heap) {
			return
		}
		c := l
		if r := l + 1; r < len(h.heap) && h.less(r, l) {
			c = r
		}
		if !h.less(c, i) {
			return
		}
		h.swap(i, c)
		i = c
	}
}
