package kvindex

import (
	"testing"

	"github.com/kvgate/kvgate/internal/tokens"
)

func TestMatcherOrdersByTheCaller(t *testing.T) {
	x := New(Config{BlockSize: 4})
	a, _ := x.AddEndpoint("a", "m")
	b, _ := x.AddEndpoint("b", "m")
	other, _ := x.AddEndpoint("c", "other")
	keys := []tokens.BlockKey{0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb} // hashes: the table keeps its own bits low
	x.Store(a, 0, TierGPU, keys[:1])
	x.Store(b, 0, TierGPU, keys)
	x.Store(other, 0, TierGPU, keys)
	// b first, a second, and an id of another model that must stay 0.
	m := x.NewMatcher("m", []EndpointID{b, a, other})
	got := make([]int, 3)
	m.CachedBlocks(keys, got)
	if got[0] != 3 || got[1] != 1 || got[2] != 0 {
		t.Fatalf("matched %v, want [3 1 0]", got)
	}
	// Stale values in matched are cleared.
	got = []int{9, 9, 9}
	x.NewMatcher("nope", []EndpointID{a, b, other}).CachedBlocks(keys, got)
	if got[0] != 0 || got[1] != 0 || got[2] != 0 {
		t.Fatalf("unknown model: %v", got)
	}
}
