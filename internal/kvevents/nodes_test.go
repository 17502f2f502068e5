package kvevents

import (
	"math/rand/v2"
	"testing"
)

// TestNodeTableAgainstMap checks the open-addressing table (with
// backward-shift deletion) against a Go map under random operations,
// including clustered keys.
func TestNodeTableAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tb := newNodeTable()
	ref := map[uint64]uint64{}
	for op := 0; op < 200000; op++ {
		h := uint64(r.IntN(5000))
		if r.IntN(2) == 0 {
			h <<= 40 // clustered homes
		}
		switch r.IntN(4) {
		case 0, 1:
			nd, fresh := tb.upsert(h)
			_, had := ref[h]
			if fresh == had {
				t.Fatalf("op %d: upsert(%d) fresh=%v, map had=%v", op, h, fresh, had)
			}
			nd.last = h + 1
			ref[h] = h + 1
		case 2:
			tb.delete(h)
			delete(ref, h)
		case 3:
			nd, ok := tb.get(h)
			v, had := ref[h]
			if ok != had || (ok && nd.last != v) {
				t.Fatalf("op %d: get(%d) = %v, %v; map %v, %v", op, h, nd, ok, v, had)
			}
		}
		if tb.len() != len(ref) {
			t.Fatalf("op %d: len %d, map %d", op, tb.len(), len(ref))
		}
	}
	for h, v := range ref {
		if nd, ok := tb.get(h); !ok || nd.last != v {
			t.Fatalf("final get(%d)", h)
		}
	}
	if n := tb.evict(100); n != 100 || tb.len() != len(ref)-100 {
		t.Fatalf("evict: %d, len %d", n, tb.len())
	}
	tb.reset()
	if tb.len() != 0 {
		t.Fatal("reset")
	}
}
