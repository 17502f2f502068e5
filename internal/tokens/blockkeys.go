// Package tokens turns requests into token ids and token ids into block keys.
package tokens

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// BlockKey identifies one full block of tokens together with everything
// before it: key(i) = hash(key(i-1), tokens of block i, extra).
type BlockKey = uint64

// RootKey is the parent of the first block of every prompt.
const RootKey BlockKey = 0x6b76676174650001 // "kvgate" + version

// Hasher computes chained block keys. The zero value is not usable; use
// NewHasher. A Hasher is not safe for concurrent use (it reuses a buffer).
type Hasher struct {
	blockSize int
	buf       []byte
}

// NewHasher returns a Hasher for blocks of blockSize tokens (> 0).
func NewHasher(blockSize int) *Hasher {
	if blockSize <= 0 {
		panic("tokens: block size must be > 0")
	}
	return &Hasher{blockSize: blockSize, buf: make([]byte, 0, 8+4*blockSize+64)}
}

// BlockSize is the number of tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Key returns the key of one block given its parent's key. extra carries
// whatever else makes KV differ for equal tokens (LoRA name, cache salt,
// multimodal hashes); it is mixed into every block.
func (h *Hasher) Key(parent BlockKey, block []uint32, extra []byte) BlockKey {
	b := h.buf[:0]
	b = binary.LittleEndian.AppendUint64(b, parent)
	for _, t := range block {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	b = append(b, extra...)
	h.buf = b
	k := xxhash.Sum64(b)
	if k == RootKey {
		k++
	}
	return k
}

// AppendKeys appends to dst the keys of every full block of tokens, chained
// from parent, and returns the extended slice. A trailing partial block gets
// no key (engines cache only full blocks).
func (h *Hasher) AppendKeys(dst []BlockKey, parent BlockKey, tokens []uint32, extra []byte) []BlockKey {
	bs := h.blockSize
	for i := 0; i+bs <= len(tokens); i += bs {
		parent = h.Key(parent, tokens[i:i+bs], extra)
		dst = append(dst, parent)
	}
	return dst
}

// Keys returns the chained keys of tokens starting from RootKey.
func (h *Hasher) Keys(tokens []uint32, extra []byte) []BlockKey {
	return h.AppendKeys(make([]BlockKey, 0, len(tokens)/h.blockSize), RootKey, tokens, extra)
}
