package tokens

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// bpeModel is a byte-level BPE model (Hugging Face tokenizers' "BPE" model
// behind a ByteLevel pre-tokenizer): every word starts as one symbol per
// byte and adjacent symbols are merged, lowest merge rank first (leftmost
// first among equal ranks), until no adjacent pair has a merge.
//
// Token strings are kept as raw bytes, not in the byte-level alphabet
// ("Ġ" for a space) the file spells them in, so the text needs no mapping.
type bpeModel struct {
	vocab  map[string]uint32 // raw bytes → id, every token of model.vocab
	byteID [256]uint32       // id of each single-byte token
	merges pairTable         // left<<32 | right → rank<<32 | merged id
	// bytePair is merges for two single-byte tokens (the first round of
	// every word), indexed by left<<8 | right; noMerge when there is none.
	bytePair []uint64
	// ignoreMerges: a word that is a whole vocabulary token is that token
	// (Llama 3's "ignore_merges"). Otherwise direct[id] says whether the
	// merges turn token id's own bytes into id itself, so a word found in
	// the vocabulary skips the merges only when that gives the same ids.
	ignoreMerges bool
	direct       []bool
}

const noMerge = math.MaxUint64

// smallWord is the longest word (in bytes) merged with the quadratic scan;
// longer words use a heap so a huge word costs O(n log n).
const smallWord = 64

// newBPEModel builds the model from tokenizer.json's vocabulary (token
// strings in the byte-level alphabet) and merges (pairs of such strings).
func newBPEModel(vocab map[string]uint32, merges [][2]string, ignoreMerges bool) (*bpeModel, error) {
	m := &bpeModel{ignoreMerges: ignoreMerges}
	maxID := uint32(0)
	raws := make(map[string]uint32, len(vocab))
	for tok, id := range vocab {
		maxID = max(maxID, id)
		raw, ok := byteLevelDecode(tok)
		if !ok {
			continue // not byte-level text (e.g. an added token's spelling): merges never produce it
		}
		raws[raw] = id
	}
	m.vocab = raws
	for b := 0; b < 256; b++ {
		id, ok := raws[string([]byte{byte(b)})]
		if !ok {
			return nil, fmt.Errorf("tokens: byte-level vocabulary lacks the token for byte 0x%02X", b)
		}
		m.byteID[b] = id
	}
	if maxID >= 1<<31 {
		return nil, fmt.Errorf("tokens: token id %d out of range", maxID)
	}
	m.merges = newPairTable(len(merges))
	for rank, p := range merges {
		l, lok := vocab[p[0]]
		r, rok := vocab[p[1]]
		n, nok := vocab[p[0]+p[1]]
		if !lok || !rok || !nok {
			return nil, fmt.Errorf("tokens: merge %d (%q %q) uses a token missing from the vocabulary", rank, p[0], p[1])
		}
		// The first (lowest) rank of a pair wins, as in tokenizers.
		m.merges.insert(uint64(l)<<32|uint64(r), uint64(rank)<<32|uint64(n))
	}
	m.bytePair = make([]uint64, 1<<16)
	for a := 0; a < 256; a++ {
		for b := 0; b < 256; b++ {
			m.bytePair[a<<8|b] = m.merges.get(uint64(m.byteID[a])<<32 | uint64(m.byteID[b]))
		}
	}
	if !ignoreMerges {
		m.direct = make([]bool, int(maxID)+1)
		var buf []uint32
		for raw, id := range raws {
			buf = m.merge(raw, buf[:0])
			m.direct[id] = len(buf) == 1 && buf[0] == id
		}
	}
	return m, nil
}

// word appends the ids of one pre-tokenized word (raw bytes).
func (m *bpeModel) word(w string, out []uint32) []uint32 {
	switch len(w) {
	case 0:
		return out
	case 1:
		return append(out, m.byteID[w[0]])
	}
	if id, ok := m.vocab[w]; ok && (m.ignoreMerges || m.direct[id]) {
		return append(out, id)
	}
	return m.merge(w, out)
}

// pairMerge returns the merge of two adjacent symbols (noMerge if none).
func (m *bpeModel) pairMerge(l, r uint32) uint64 {
	return m.merges.get(uint64(l)<<32 | uint64(r))
}

// pairTable is an open-addressing hash table from a pair of ids to a merge,
// with linear probing; a key of noMerge marks an empty slot (ids are below
// 2^31, so no pair has that key). It is written once, then only read, and
// is faster than a map for the merge loop's many lookups.
type pairTable struct {
	slots []uint64 // key, value, key, value, ...
	shift uint
	mask  uint64
}

func newPairTable(n int) pairTable {
	bits := uint(4)
	for 3<<bits < 4*n { // at most 3/4 full
		bits++
	}
	t := pairTable{slots: make([]uint64, 2<<bits), shift: 64 - bits, mask: 1<<bits - 1}
	for i := 0; i < len(t.slots); i += 2 {
		t.slots[i] = noMerge
	}
	return t
}

func (t *pairTable) insert(k, v uint64) {
	for i := (k * 0x9E3779B97F4A7C15) >> t.shift; ; i = (i + 1) & t.mask {
		switch t.slots[2*i] {
		case noMerge:
			t.slots[2*i], t.slots[2*i+1] = k, v
			return
		case k:
			return // keep the first value
		}
	}
}

func (t *pairTable) get(k uint64) uint64 {
	for i := (k * 0x9E3779B97F4A7C15) >> t.shift; ; i = (i + 1) & t.mask {
		switch t.slots[2*i] {
		case k:
			return t.slots[2*i+1]
		case noMerge:
			return noMerge
		}
	}
}

// merge runs the merges over w's bytes and appends the resulting ids.
func (m *bpeModel) merge(w string, out []uint32) []uint32 {
	if len(w) > smallWord {
		return m.mergeHeap(w, out)
	}
	var symBuf [smallWord]uint32
	var pairBuf [smallWord]uint64 // pair i: symbols i and i+1
	n := len(w)
	sym := symBuf[:n]
	pair := pairBuf[:n-1]
	for i := 0; i < n; i++ {
		sym[i] = m.byteID[w[i]]
	}
	for i := 0; i < n-1; i++ {
		pair[i] = m.bytePair[int(w[i])<<8|int(w[i+1])]
	}
	for len(pair) > 0 {
		best := 0
		for i := 1; i < len(pair); i++ {
			if pair[i] < pair[best] { // ranks are the high bits: strict < keeps the leftmost
				best = i
			}
		}
		if pair[best] == noMerge {
			break
		}
		sym[best] = uint32(pair[best])
		copy(sym[best+1:], sym[best+2:])
		sym = sym[:len(sym)-1]
		copy(pair[best:], pair[best+1:])
		pair = pair[:len(pair)-1]
		if best > 0 {
			pair[best-1] = m.pairMerge(sym[best-1], sym[best])
		}
		if best < len(pair) {
			pair[best] = m.pairMerge(sym[best], sym[best+1])
		}
	}
	return append(out, sym...)
}

// mergeCand is a candidate merge of the symbol at pos with its successor,
// valid while those two symbols are still left and right.
type mergeCand struct {
	key             uint64 // rank<<32 | pos: the heap order
	left, right, to uint32
}

// mergeHeap is merge for long words: a doubly linked list of symbols and a
// min-heap of candidate merges (stale ones are skipped when popped).
func (m *bpeModel) mergeHeap(w string, out []uint32) []uint32 {
	n := len(w)
	// One buffer for the symbols, their links (next -2: merged away) and
	// the heap, which never holds more than 3n candidates: n-1 at first,
	// then at most two per merge.
	links := make([]int32, 3*n)
	sym, next, prev := links[:n], links[n:2*n], links[2*n:]
	h := make([]mergeCand, 0, 3*n)
	for i := 0; i < n; i++ {
		sym[i] = int32(m.byteID[w[i]])
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
	}
	next[n-1] = -1
	push := func(pos int32) {
		nx := next[pos]
		if nx < 0 {
			return
		}
		v := m.pairMerge(uint32(sym[pos]), uint32(sym[nx]))
		if v == noMerge {
			return
		}
		h = append(h, mergeCand{key: v&^(1<<32-1) | uint64(pos), left: uint32(sym[pos]), right: uint32(sym[nx]), to: uint32(v)})
		heapUp(h, len(h)-1)
	}
	for i := 0; i < n-1; i++ {
		v := m.bytePair[int(w[i])<<8|int(w[i+1])]
		if v != noMerge {
			h = append(h, mergeCand{key: v&^(1<<32-1) | uint64(i), left: uint32(sym[i]), right: uint32(sym[i+1]), to: uint32(v)})
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		heapDown(h, i)
	}
	for len(h) > 0 {
		c := h[0]
		h[0] = h[len(h)-1]
		h = h[:len(h)-1]
		if len(h) > 0 {
			heapDown(h, 0)
		}
		pos := int32(c.key & (1<<32 - 1))
		nx := next[pos]
		if nx < 0 || uint32(sym[pos]) != c.left || uint32(sym[nx]) != c.right {
			continue // merged away, now last, or its pair changed
		}
		sym[pos] = int32(c.to)
		next[pos] = next[nx]
		next[nx] = -2
		if next[pos] >= 0 {
			prev[next[pos]] = pos
		}
		if p := prev[pos]; p >= 0 {
			push(p)
		}
		push(pos)
	}
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, uint32(sym[i]))
	}
	return out
}

func heapUp(h []mergeCand, i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[p].key <= h[i].key {
			return
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
}

func heapDown(h []mergeCand, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		c := l
		if r := l + 1; r < len(h) && h[r].key < h[l].key {
			c = r
		}
		if h[i].key <= h[c].key {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// byteLevelRune is GPT-2's byte → printable rune mapping, used by every
// byte-level BPE vocabulary: printable Latin-1 bytes stand for themselves,
// the others (controls, space, 0x7F–0xA0, 0xAD) for U+0100 onwards.
var byteLevelRune = func() (m [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}()

// byteLevelByte inverts byteLevelRune for runes below 0x144 (-1: none).
var byteLevelByte = func() (m [0x144]int16) {
	for i := range m {
		m[i] = -1
	}
	for b, r := range byteLevelRune {
		m[r] = int16(b)
	}
	return m
}()

// byteLevelDecode turns a token spelled in the byte-level alphabet into its
// raw bytes; ok is false if it holds a rune outside the alphabet.
func byteLevelDecode(tok string) (string, bool) {
	if tok == "" {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(tok))
	for _, r := range tok {
		if r >= rune(len(byteLevelByte)) || byteLevelByte[r] < 0 {
			return "", false
		}
		b.WriteByte(byte(byteLevelByte[r]))
	}
	return b.String(), true
}

// byteLevelEncode spells raw bytes in the byte-level alphabet.
func byteLevelEncode(raw string) string {
	var b strings.Builder
	b.Grow(len(raw) * 2)
	for i := 0; i < len(raw); i++ {
		b.WriteRune(byteLevelRune[raw[i]])
	}
	return b.String()
}

// parseMerges reads model.merges in either of tokenizer.json's forms:
// "left right" strings or [left, right] pairs.
func parseMerges(raw []mergeEntry) ([][2]string, error) {
	out := make([][2]string, len(raw))
	for i, r := range raw {
		switch {
		case r.str != nil:
			l, rt, ok := strings.Cut(*r.str, " ")
			if !ok || l == "" || rt == "" || strings.Contains(rt, " ") {
				return nil, fmt.Errorf("tokens: merge %d %q is not two tokens separated by a space", i, *r.str)
			}
			out[i] = [2]string{l, rt}
		case len(r.pair) == 2:
			out[i] = [2]string{r.pair[0], r.pair[1]}
		default:
			return nil, fmt.Errorf("tokens: merge %d is neither \"a b\" nor [a, b]", i)
		}
		if !utf8.ValidString(out[i][0]) || !utf8.ValidString(out[i][1]) {
			return nil, errors.New("tokens: merges hold invalid UTF-8")
		}
	}
	return out, nil
}
