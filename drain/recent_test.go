package drain

import (
	"math/rand/v2"
	"testing"
)

// TestRecentKeys checks recentKeys against a model (a map and a queue of
// the last ackedKeys distinct keys) over keys chosen so that many share a
// place in the table, and repeats both recent and forgotten, added one
// at a time (add) and in groups (addAll), a key sometimes twice in one.
func TestRecentKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var r recentKeys
	model := map[uint64]bool{}
	var order []uint64
	var group []uint64 // of addAll
	wantSeen := 0      // of group, by the model
	for n := range 300000 {
		var k uint64
		switch rng.IntN(4) {
		case 0: // a place shared by many: runs wrap and collide
			k = uint64(rng.IntN(64))<<16 | uint64(rng.IntN(8))
		case 1: // a recent one again, or one forgotten
			if len(order) > 0 {
				k = order[max(0, len(order)-1-rng.IntN(2*ackedKeys))]
			}
		default:
			k = rng.Uint64()
		}
		want := model[max(k, 1)]
		if rng.IntN(200) == 0 {
			// The group so far, then k alone.
			if got := r.addAll(group); got != wantSeen {
				t.Fatalf("addAll of %d keys (to #%d): %d seen, want %d", len(group), n, got, wantSeen)
			}
			group, wantSeen = group[:0], 0
			if got := r.add(k); got != want {
				t.Fatalf("add %d (#%d): seen %v, want %v", k, n, got, want)
			}
		} else {
			group = append(group, k)
			if want {
				wantSeen++
			}
		}
		if !want {
			k = max(k, 1)
			model[k] = true
			order = append(order, k)
			if len(order) > ackedKeys {
				delete(model, order[len(order)-ackedKeys-1])
			}
		}
	}
	if got := r.addAll(group); got != wantSeen {
		t.Fatalf("addAll of the last %d keys: %d seen, want %d", len(group), got, wantSeen)
	}
	held := 0
	for _, s := range r.slots {
		if s != 0 {
			held++
		}
	}
	if held != ackedKeys {
		t.Fatalf("the table holds %d keys, want %d", held, ackedKeys)
	}
}
