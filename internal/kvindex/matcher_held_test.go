package kvindex

import (
	"testing"

	"github.com/kvgate/kvgate/internal/tokens"
)

// TestMatcherHeldBlocks: an endpoint's GPU-tier block count in the
// caller's order, following stores and removals; other tiers and unknown
// positions count 0.
func TestMatcherHeldBlocks(t *testing.T) {
	x := New(Config{BlockSize: 4})
	a, _ := x.AddEndpoint("a", "m")
	b, _ := x.AddEndpoint("b", "m")
	keys := []tokens.BlockKey{0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb}
	x.Store(a, 0, TierGPU, keys[:1])
	x.Store(b, 0, TierGPU, keys)
	x.Store(a, 0, TierCPU, keys)
	m := x.NewMatcher("m", []EndpointID{b, a})
	if got := []int{m.HeldBlocks(0), m.HeldBlocks(1), m.HeldBlocks(2), m.HeldBlocks(-1)}; got[0] != 3 || got[1] != 1 || got[2] != 0 || got[3] != 0 {
		t.Fatalf("held %v, want [3 1 0 0]", got)
	}
	x.Remove(b, 0, TierGPU, keys[1:])
	if got := m.HeldBlocks(0); got != 1 {
		t.Fatalf("after removing two blocks b holds %d, want 1", got)
	}
}
