package drain

import (
	"math/rand/v2"
	"testing"
)

// TestRecentKeys checks recentKeys against a model (each key added with
// the number of its generation, a new one every ackedKeys keys added: a
// key is seen while it is of the current generation or the last one)
// over keys chosen so that many share a place in the table, and repeats
// both recent and forgotten.
func TestRecentKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var r recentKeys
	model := map[uint64]int{} // key → generation
	gen, inGen := 0, 0
	var order []uint64
	for n := range 300000 {
		var k uint64
		switch rng.IntN(4) {
		case 0: // a place shared by many: runs wrap and collide
			k = uint64(rng.IntN(64))<<16 | uint64(rng.IntN(8))
		case 1: // a recent one again, or one forgotten
			if len(order) > 0 {
				k = order[max(0, len(order)-1-rng.IntN(3*ackedKeys))]
			}
		default:
			k = rng.Uint64()
		}
		k1 := max(k, 1)
		g, ok := model[k1]
		want := ok && g >= gen-1
		if got := r.add(k); got != want {
			t.Fatalf("add %d (#%d): seen %v, want %v", k, n, got, want)
		}
		if !want {
			if inGen == ackedKeys {
				gen, inGen = gen+1, 0
			}
			model[k1] = gen
			inGen++
			order = append(order, k1)
		}
	}
	if gen < 2 {
		t.Fatalf("only %d generations: the test forgets nothing", gen+1)
	}
	for name, c := range map[string]struct {
		table []uint64
		want  int
	}{"current": {r.cur, inGen}, "last": {r.last, ackedKeys}} {
		held := 0
		for _, s := range c.table {
			if s != 0 {
				held++
			}
		}
		if held != c.want {
			t.Errorf("the %s generation holds %d keys, want %d", name, held, c.want)
		}
	}
}
