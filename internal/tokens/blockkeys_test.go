package tokens

import "testing"

func TestKeysChainAndPrefix(t *testing.T) {
	h := NewHasher(4)
	a := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	b := []uint32{1, 2, 3, 4, 5, 6, 7, 9, 9}
	ka, kb := h.Keys(a, nil), h.Keys(b, nil)
	if len(ka) != 2 || len(kb) != 2 {
		t.Fatalf("want 2 full blocks, got %d and %d", len(ka), len(kb))
	}
	if ka[0] != kb[0] {
		t.Error("equal first blocks must have equal keys")
	}
	if ka[1] == kb[1] {
		t.Error("different second blocks must differ")
	}
	// A block equal in tokens but with a different parent differs.
	c := []uint32{9, 9, 9, 9, 5, 6, 7, 8}
	if kc := h.Keys(c, nil); kc[1] == ka[1] {
		t.Error("keys must chain over the parent")
	}
	// Extra keys (LoRA, salt) separate otherwise equal prefixes.
	if kx := h.Keys(a, []byte("lora-x")); kx[0] == ka[0] {
		t.Error("extra keys must change the key")
	}
	// Incremental hashing equals hashing from scratch.
	inc := h.AppendKeys(append([]BlockKey(nil), ka[:1]...), ka[0], a[4:], nil)
	if inc[1] != ka[1] {
		t.Error("incremental keys differ from full keys")
	}
}

func BenchmarkKeys2000Blocks(b *testing.B) {
	h := NewHasher(16)
	toks := make([]uint32, 16*2000)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	dst := make([]BlockKey, 0, 2000)
	b.SetBytes(int64(len(toks) * 4))
	for b.Loop() {
		dst = h.AppendKeys(dst[:0], RootKey, toks, nil)
	}
}
