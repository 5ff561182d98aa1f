// Package topk finds, among the many keys one limit decides, the few an
// operator asks about during an incident — the hottest, the most denied and
// those nearest their limit — in memory fixed when the Tracker is made,
// whatever the number of distinct keys.
//
// # Model
//
// A Tracker follows one limit (a rule of a domain, a policy of a
// middleware). Observe records one decision of a key. Two tables are kept:
//
//   - Hot and denied: a Space-Saving sketch (Metwally, Agrawal and El
//     Abbadi, 2005) of Options.Counters counters over the decisions. A key
//     that is tracked has a count of its decisions and of its denials; a
//     key that is not, when it comes, takes the counter with the smallest
//     count c and starts from c+1, with an error of c. So a count is never
//     below the key's true count and never above it by more than its
//     error, and every key decided more than Threshold times (about
//     N/Counters for N decisions; Snapshot reports the exact figure) is
//     tracked. An admission filter in front of the sketch (cells bounding
//     the counts of untracked keys, as in Filtered Space-Saving) lets most
//     decisions of keys that are not among the heavy ones pass without
//     taking a counter over, with the same guarantees and counts.
//     Denials are counted from the moment a key is tracked: the
//     true number is at least the one reported and at most that plus the
//     entry's error (a key had at most that many decisions before).
//   - Near the limit: the K keys whose capacity will be whole again last,
//     from their latest decision that left them at least Options.NearFrom
//     of their limit used. The instant a key is whole again (the
//     decision's ResetAfter from then, rounded up to the millisecond:
//     keys whole again in one millisecond are as near, by what they
//     used, and a newer one does not replace an entry as near as it)
//     does not change as time passes, so
//     an entry never goes stale: for a token bucket (GCRA) or leaky bucket
//     of one rule, that order is the order of what each key has used now;
//     for a window, keys of the window in force are kept first, by what
//     they used. A Snapshot lists the entries not yet whole again by used
//     ÷ limit at that decision, largest first.
//
// The counters are split into shards by a hash of the key, each with its
// own lock, so that decisions of different keys seldom wait for each
// other; a key always falls in the same shard, where the guarantees above
// hold with that shard's counters and decisions, and Threshold is the
// largest over the shards.
//
// # Cost, and sampling above a rate
//
// Memory is fixed at New (Footprint bytes, plus the key strings the
// counters keep alive: at most Counters + shards×K of them) and never
// grows. Observe hashes the key once; a decision that is counted takes its
// shard's lock and does O(1) work (tens to hundreds of nanoseconds on a
// busy decision path, where the tables are out of the cache); it never
// allocates. It reads the clock for a decision at or above NearFrom, and
// once every 256 decisions of a shard to measure their rate, and not at
// all when the caller passes the time it has (ObserveAt). Snapshot
// allocates and sorts.
//
// Up to Options.FullRate decisions a second (DefaultFullRate, 5,000, in
// its share for each shard) every decision is counted, with the
// guarantees above. Above it a shard counts one decision in 2ⁿ, chosen at
// random, as 2ⁿ decisions, with n as small as keeps what it counts within
// its share (measured over windows of at least 20 ms and 32 samples); the
// others cost the hash, an atomic load and a random number, about 10–20
// ns. So the time the Tracker takes is bounded by FullRate counted
// decisions a second (below 0.5 % of a core at the default), whatever the
// rate, and at high rates a decision costs it tens of nanoseconds. The
// counts are then estimates (and the near-limit table keeps each key's
// latest counted decision): the sketch's guarantees hold for the sampled
// stream, weighted, and each Entry carries Sigma, the standard deviation
// of its sampling error, estimated from its samples (Σ w(w−1) over them,
// and its count before it was tracked as if sampled at the weight of
// then); ±3·Sigma is about a 99.7 % interval once the key has some 36
// samples. A key with a share s of a shard's decisions has about
// s × FullRate/8 samples a second, so the heavy keys a dashboard shows
// are well measured within a second. Snapshot.Sample reports the
// sampling in force. When the rate falls, a shard counts every decision
// again at its next measurement: at its next sample (2ⁿ decisions later,
// on average), or at a Snapshot a second after its last one.
//
// # Secret keys
//
// With Options.Secret, Snapshot shows each key as "#" and 12 hexadecimal
// digits of an HMAC-SHA-256 under a key drawn at random by New: the same
// key shows the same within a process, and a short key such as an IPv4
// address cannot be found by trying every value offline.
//
// A Tracker is safe for concurrent use. The zero value is not usable:
// call New.
package topk
