package load

import "testing"

// sizedCache is a prefix source that also sizes each endpoint's cache.
type sizedCache struct {
	fixedCache
	held []int
}

func (c sizedCache) HeldBlocks(i int) int { return c.held[i] }

// TestSnapshotHeldTokens: HeldTokens is a CacheSizer's block count in
// tokens, whatever the request; 0 from a plain prefix source.
func TestSnapshotHeldTokens(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000}, {Name: "b", PrefillSpeed: 1000}}, false)
	s, _ := snap(f, 0, 100, sizedCache{fixedCache{1, 0}, []int{10, 3}})
	if s.Endpoints[0].HeldTokens != 160 || s.Endpoints[1].HeldTokens != 48 || s.Endpoints[0].CachedTokens != 16 {
		t.Fatalf("held %d %d, cached %d; want 160 48 16", s.Endpoints[0].HeldTokens, s.Endpoints[1].HeldTokens, s.Endpoints[0].CachedTokens)
	}
	s, _ = snap(f, 0, 100, fixedCache{1, 0})
	if s.Endpoints[0].HeldTokens != 0 || s.Endpoints[1].HeldTokens != 0 {
		t.Fatalf("a plain prefix source sizes nothing: %+v", s.Endpoints)
	}
	s, _ = snap(f, 0, 100, sizedCache{fixedCache{0, 0}, []int{-5, 1 << 62}})
	if s.Endpoints[0].HeldTokens != 0 || s.Endpoints[1].HeldTokens <= 0 {
		t.Fatalf("negative counts are 0 and large ones saturate: %+v", s.Endpoints)
	}
}
