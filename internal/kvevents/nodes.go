package kvevents

import (
	"math/bits"
	"unsafe"

	"github.com/kvgate/kvgate/internal/kvindex/prefetch"
)

// nodeTable is the engine→router map: an open-addressing hash table
// (linear probing, backward-shift deletion) from engine block hash to node,
// owned by one goroutine. Slots hold no pointers, so the garbage collector
// never scans them; the rare per-block extras (unequal block sizes) live in
// a side slice addressed by index. One probe sequence serves both the
// lookup and the insert of a block, which is most of ingest's cost.
type nodeTable struct {
	slots []nodeSlot
	shift uint // 64 - log2(len(slots))
	n     int
	hand  int // eviction clock hand
	exts  []nodeExt
	free  []int32
}

type nodeSlot struct {
	hash uint64 // normalised engine hash; 0 = empty
	node
}

const minNodeCap = 64

func newNodeTable() *nodeTable {
	t := &nodeTable{}
	t.init(minNodeCap)
	return t
}

func (t *nodeTable) init(capacity int) {
	t.slots = make([]nodeSlot, capacity)
	t.shift = uint(64 - bits.TrailingZeros(uint(capacity)))
	t.n = 0
}

func nodeHash(h uint64) uint64 {
	if h == 0 {
		return 0x5bd1e9955bd1e995
	}
	return h
}

func (t *nodeTable) home(h uint64) int {
	return int((h * 0x9E3779B97F4A7C15) >> t.shift)
}

// slot returns the index of h, or of the empty slot where it would go.
func (t *nodeTable) slot(h uint64) (int, bool) {
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := t.slots[i].hash
		if s == h {
			return i, true
		}
		if s == 0 {
			return i, false
		}
	}
}

func (t *nodeTable) len() int { return t.n }

// prefetch asks for the home slot of every hash in hs, so that the cache
// misses of a batch overlap each other and the work done before the probes.
func (t *nodeTable) prefetch(hs []uint64) {
	for _, h := range hs {
		t.prefetch1(h)
	}
}

// get returns the node of engine hash h.
func (t *nodeTable) get(h uint64) (*node, bool) {
	i, ok := t.slot(nodeHash(h))
	if !ok {
		return nil, false
	}
	return &t.slots[i].node, true
}

// upsert returns h's node, inserting a zero node when absent (then fresh is
// true). The pointer is valid until the next insert or delete.
func (t *nodeTable) upsert(h uint64) (nd *node, fresh bool) {
	h = nodeHash(h)
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	i, ok := t.slot(h)
	if !ok {
		t.slots[i] = nodeSlot{hash: h}
		t.n++
	}
	return &t.slots[i].node, !ok
}

func (t *nodeTable) prefetch1(h uint64) {
	prefetch.Line(unsafe.Pointer(&t.slots[t.home(nodeHash(h))]))
}

// reserve grows the table so that n more entries fit without growing.
func (t *nodeTable) reserve(n int) {
	for (t.n+n)*4 > len(t.slots)*3 {
		t.grow()
	}
}

func (t *nodeTable) grow() {
	old := t.slots
	t.init(len(old) * 2)
	for _, s := range old {
		if s.hash != 0 {
			i, _ := t.slot(s.hash)
			t.slots[i] = s
			t.n++
		}
	}
}

// delete removes h, shifting back the entries after it.
func (t *nodeTable) delete(h uint64) {
	h = nodeHash(h)
	i, ok := t.slot(h)
	if !ok {
		return
	}
	t.deleteAt(i)
}

func (t *nodeTable) deleteAt(i int) {
	if e := t.slots[i].ext; e != 0 {
		t.exts[e-1] = nodeExt{}
		t.free = append(t.free, e)
	}
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s.hash == 0 {
			break
		}
		// Move s back to i if its home is not cyclically in (i, j].
		if hm := t.home(s.hash); (j-hm)&mask >= (j-i)&mask {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = nodeSlot{}
	t.n--
}

// ext returns node nd's extras, allocating them when missing.
func (t *nodeTable) ext(nd *node) *nodeExt {
	if nd.ext == 0 {
		if k := len(t.free); k > 0 {
			nd.ext = t.free[k-1]
			t.free = t.free[:k-1]
		} else {
			t.exts = append(t.exts, nodeExt{})
			nd.ext = int32(len(t.exts))
		}
	}
	return &t.exts[nd.ext-1]
}

// extOf returns nd's extras or nil.
func (t *nodeTable) extOf(nd *node) *nodeExt {
	if nd.ext == 0 {
		return nil
	}
	return &t.exts[nd.ext-1]
}

// keepOnReset is the most slots (40 bytes each) reset keeps for the
// refill that usually follows a clear; a larger table is released.
const keepOnReset = 1 << 18

// reset empties the table; a large table gives its memory back.
func (t *nodeTable) reset() {
	if len(t.slots) > keepOnReset {
		t.init(minNodeCap)
	} else {
		clear(t.slots)
		t.n = 0
	}
	t.exts, t.free = nil, nil
}

// shrinkIfSparse reallocates the table at half load when under 1/8 of
// its slots are used, so that the memory of a map that grew large and
// emptied is returned (growth happens at 3/4: the cost stays amortised).
func (t *nodeTable) shrinkIfSparse() {
	if len(t.slots) <= minNodeCap || t.n*8 >= len(t.slots) {
		return
	}
	t.rehash(max(minNodeCap, 1<<bits.Len(uint(t.n*2))))
}

// rehash moves every entry to a new array of the given capacity and packs
// the extras of the live entries into a new slice.
func (t *nodeTable) rehash(capacity int) {
	old, oldExts := t.slots, t.exts
	t.init(capacity)
	t.exts, t.free = nil, nil
	for _, s := range old {
		if s.hash == 0 {
			continue
		}
		if s.ext != 0 {
			t.exts = append(t.exts, oldExts[s.ext-1])
			s.ext = int32(len(t.exts))
		}
		i, _ := t.slot(s.hash)
		t.slots[i] = s
		t.n++
	}
}

// evict removes about n entries found by the clock hand (engine hashes are
// hashes, so this is random eviction).
func (t *nodeTable) evict(n int) int {
	var victims []uint64
	for scanned := 0; len(victims) < n && scanned < len(t.slots); scanned++ {
		t.hand = (t.hand + 1) & (len(t.slots) - 1)
		if h := t.slots[t.hand].hash; h != 0 {
			victims = append(victims, h)
		}
	}
	for _, h := range victims {
		i, ok := t.slot(h)
		if ok {
			t.deleteAt(i)
		}
	}
	return len(victims)
}
