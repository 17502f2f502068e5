package kvindex

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvgate/kvgate/internal/kvindex/prefetch"
)

// Reserved key values inside a table. Block keys 0 and 1 are remapped by
// norm (a 2^-63 chance of aliasing, which only costs a wrong prefix guess).
const (
	emptyKey = 0
	tombKey  = 1
)

func norm(k uint64) uint64 {
	if k < 2 {
		return k + 2
	}
	return k
}

// Slot layouts. A precise slot is [key, endpoint bits]; an approximate slot
// is [key, generation, bits set in that generation, bits of the one before].
const (
	preciseStride = 2
	approxStride  = 4
)

// slots is one open-addressing array, linear probing. Every word is
// accessed atomically: writers (holding the shard mutex) store, readers
// load without any lock and re-check the key after reading the payload.
type slots struct {
	mask uint64 // capacity-1 (capacity in slots, a power of two)
	w    []atomic.Uint64
}

func newSlots(capacity, stride int) *slots {
	return &slots{mask: uint64(capacity - 1), w: make([]atomic.Uint64, capacity*stride)}
}

func (a *slots) capacity() int { return int(a.mask) + 1 }

// table maps block keys to a 64-bit endpoint bitset: one page of 64
// endpoints of one model, one KV-cache group, one tier (or the
// approximate entries). It is sharded by the key's top bits; each shard has
// its own writer mutex and array.
type table struct {
	stride  int
	shift1  uint // shard = key>>1>>(shift1&63): key's top log2(shards) bits, without a branch for one shard
	maxLive int  // per shard; beyond it entries are evicted
	maxCap  int  // per shard slot capacity bound
	n       atomic.Int64
	evicted atomic.Int64
	eps     atomic.Uint64     // every bit ever set in the table (lookups skip tables without theirs)
	onEvict func(bits uint64) // precise tables: per-endpoint counters
	shards  []shard
}

type shard struct {
	mu   sync.Mutex
	arr  atomic.Pointer[slots]
	live int      // live entries (under mu)
	used int      // live + tombstones (under mu)
	hand int      // eviction clock hand, in slots (under mu)
	_    [24]byte // 64 bytes: own cache line, and indexing is a shift
}

const minShardCap = 8

func newTable(stride, shards, maxLive int, onEvict func(uint64)) *table {
	if shards < 1 {
		shards = 1
	}
	shards = 1 << bits.Len(uint(shards-1)) // round up to a power of two
	per := (maxLive + shards - 1) / shards
	if per < 4 {
		per = 4
	}
	// Keep the load factor at or under 0.6 when a shard is full.
	maxCap := 1 << bits.Len(uint(per*5/3))
	t := &table{
		stride:  stride,
		shift1:  uint(63 - bits.TrailingZeros(uint(shards))),
		maxLive: per,
		maxCap:  maxCap,
		onEvict: onEvict,
		shards:  make([]shard, shards),
	}
	for i := range t.shards {
		c := minShardCap
		if c > maxCap {
			c = maxCap
		}
		t.shards[i].arr.Store(newSlots(c, stride))
	}
	return t
}

func (t *table) shardOf(k uint64) *shard {
	return &t.shards[t.shardIndex(k)]
}

// get returns the bits of key k (normalised), or 0. Lock-free.
func (t *table) get(k uint64) uint64 { return probe(t.shardOf(k).arr.Load(), k) }

// probe returns the bits of k in a: the home slot inline (the lookup walk
// calls it once per key and table), longer probe sequences in getFrom.
func probe(a *slots, k uint64) uint64 {
	i := (k & a.mask) * preciseStride
	w := a.w[i : i+2 : i+2]
	if kk := w[0].Load(); kk == k {
		if b := w[1].Load(); w[0].Load() == k {
			return b
		}
		return 0
	} else if kk == emptyKey {
		return 0
	}
	return getFrom(a, k)
}

func getFrom(a *slots, k uint64) uint64 {
	w := a.w
	m := a.mask
	for p := k & m; ; p = (p + 1) & m {
		i := p * preciseStride
		kk := w[i].Load()
		if kk == k {
			b := w[i+1].Load()
			if w[i].Load() != k {
				return 0
			}
			return b
		}
		if kk == emptyKey {
			return 0
		}
	}
}

// getApprox returns the approximate bits of k still valid at generation g.
func (t *table) getApprox(k, g uint64) uint64 {
	a := t.shardOf(k).arr.Load()
	w := a.w
	m := a.mask
	for p := k & m; ; p = (p + 1) & m {
		i := p * approxStride
		kk := w[i].Load()
		if kk == k {
			gen, cur, prev := w[i+1].Load(), w[i+2].Load(), w[i+3].Load()
			if w[i].Load() != k {
				return 0
			}
			return approxBits(gen, cur, prev, g)
		}
		if kk == emptyKey {
			return 0
		}
	}
}

func approxBits(gen, cur, prev, g uint64) uint64 {
	switch {
	case gen == g:
		return cur | prev
	case gen+1 == g:
		return cur
	}
	return 0
}

// find returns the word index of k in a, or, when absent, the index where
// it would be inserted (the first tombstone on its probe path, else the
// empty slot that ends it). Caller holds the shard mutex.
func (t *table) find(a *slots, k uint64) (idx int, found bool) {
	m := a.mask
	st := uint64(t.stride)
	ins := -1
	for p := k & m; ; p = (p + 1) & m {
		i := p * st
		kk := a.w[i].Load()
		if kk == k {
			return int(i), true
		}
		if kk == emptyKey {
			if ins < 0 {
				ins = int(i)
			}
			return ins, false
		}
		if kk == tombKey && ins < 0 {
			ins = int(i)
		}
	}
}

// insertSlot makes room for one new key in s and returns the word index at
// which to write it; i is where find said it would go. Caller holds s.mu, has checked k is absent, and adds
// the key to t.n.
func (t *table) insertSlot(s *shard, k, g uint64, i int) int {
	if s.live >= t.maxLive {
		t.evict(s, g) // only turns entries into tombstones: i stays valid
	}
	a := s.arr.Load()
	if (s.used+1)*4 > a.capacity()*3 {
		a = t.rehash(s, g)
		i, _ = t.find(a, k)
	}
	if a.w[i].Load() == emptyKey {
		s.used++
	}
	s.live++
	return i
}

// markEndpoint records bit in t.eps before any entry with it is written.
func (t *table) markEndpoint(bit uint64) {
	if t.eps.Load()&bit == 0 {
		t.eps.Or(bit)
	}
}

// setBit sets bit in k's precise entry; it reports whether the bit was new.
func (t *table) setBit(k, bit uint64) bool {
	t.markEndpoint(bit)
	s := t.shardOf(k)
	s.mu.Lock()
	added, inserted := t.setBitLocked(s, k, bit)
	s.mu.Unlock()
	if inserted {
		t.n.Add(1)
	}
	return added
}

// prefetchChunk is how many keys setBits loads ahead of writing them.
const prefetchChunk = 32

// prefetchKey asks for the home slot of k (normalised).
func (t *table) prefetchKey(k uint64) {
	a := t.shardOf(k).arr.Load()
	prefetch.Line(unsafe.Pointer(&a.w[(k&a.mask)*uint64(t.stride)]))
}

// prefetch asks for the home slots of keys.
func (t *table) prefetch(keys []uint64) {
	for _, k := range keys {
		k = norm(k)
		a := t.shardOf(k).arr.Load()
		prefetch.Line(unsafe.Pointer(&a.w[(k&a.mask)*uint64(t.stride)]))
	}
}

// setBits sets bit in the precise entries of keys and returns how many
// bits were new. Per chunk of keys it first prefetches every key's home
// slot, so that the cache misses of the chunk overlap
// instead of being serialised by the mutexes and atomic stores (full
// fences on amd64) that follow; it then sorts the chunk by shard and takes
// each shard's mutex once for all its keys. The key count is published
// once at the end.
func (t *table) setBits(keys []uint64, bit uint64) int64 {
	t.markEndpoint(bit)
	var added, inserted int64
	var ks [prefetchChunk]uint64
	var sh [prefetchChunk]uint32
	for len(keys) > 0 {
		n := min(len(keys), prefetchChunk)
		for i, k := range keys[:n] {
			k = norm(k)
			si := t.shardIndex(k)
			a := t.shards[si].arr.Load()
			prefetch.Line(unsafe.Pointer(&a.w[(k&a.mask)*preciseStride]))
			j := i
			for ; j > 0 && sh[j-1] > si; j-- {
				ks[j], sh[j] = ks[j-1], sh[j-1]
			}
			ks[j], sh[j] = k, si
		}
		keys = keys[n:]
		for i := 0; i < n; {
			si := sh[i]
			s := &t.shards[si]
			s.mu.Lock()
			for ; i < n && sh[i] == si; i++ {
				a, ins := t.setBitLocked(s, ks[i], bit)
				if a {
					added++
				}
				if ins {
					inserted++
				}
			}
			s.mu.Unlock()
		}
	}
	t.n.Add(inserted)
	return added
}

func (t *table) shardIndex(k uint64) uint32 {
	return uint32(k >> 1 >> (t.shift1 & 63))
}

// setBitLocked sets bit in k's precise entry in s; it reports whether the
// bit was new and whether the key was inserted (the caller adds inserted
// keys to t.n). Caller holds s.mu.
func (t *table) setBitLocked(s *shard, k, bit uint64) (added, inserted bool) {
	a := s.arr.Load()
	i, found := t.find(a, k)
	if found {
		old := a.w[i+1].Load()
		if old&bit != 0 {
			return false, false
		}
		a.w[i+1].Store(old | bit)
		return true, false
	}
	i = t.insertSlot(s, k, 0, i)
	a = s.arr.Load()
	a.w[i+1].Store(bit)
	a.w[i].Store(k)
	return true, true
}

// clearBit clears bit in k's precise entry; it reports whether it was set.
func (t *table) clearBit(k, bit uint64) bool {
	s := t.shardOf(k)
	s.mu.Lock()
	a := s.arr.Load()
	i, found := t.find(a, k)
	if !found {
		s.mu.Unlock()
		return false
	}
	old := a.w[i+1].Load()
	if old&bit == 0 {
		s.mu.Unlock()
		return false
	}
	if nb := old &^ bit; nb != 0 {
		a.w[i+1].Store(nb)
	} else {
		a.w[i].Store(tombKey)
		a.w[i+1].Store(0)
		s.live--
		t.n.Add(-1)
	}
	s.mu.Unlock()
	return true
}

// setApprox marks bit as routed to k at generation g.
func (t *table) setApprox(k, bit, g uint64) {
	t.markEndpoint(bit)
	s := t.shardOf(k)
	s.mu.Lock()
	a := s.arr.Load()
	i, found := t.find(a, k)
	if found {
		gen, cur := a.w[i+1].Load(), a.w[i+2].Load()
		switch {
		case gen == g:
			a.w[i+2].Store(cur | bit)
		case gen+1 == g:
			a.w[i+3].Store(cur)
			a.w[i+2].Store(bit)
			a.w[i+1].Store(g)
		default:
			a.w[i+3].Store(0)
			a.w[i+2].Store(bit)
			a.w[i+1].Store(g)
		}
		s.mu.Unlock()
		return
	}
	i = t.insertSlot(s, k, g, i)
	a = s.arr.Load()
	a.w[i+1].Store(g)
	a.w[i+2].Store(bit)
	a.w[i+3].Store(0)
	a.w[i].Store(k)
	s.mu.Unlock()
	t.n.Add(1)
}

// clearApprox clears bit from k's approximate entry.
func (t *table) clearApprox(k, bit uint64) {
	s := t.shardOf(k)
	s.mu.Lock()
	a := s.arr.Load()
	if i, found := t.find(a, k); found {
		cur, prev := a.w[i+2].Load()&^bit, a.w[i+3].Load()&^bit
		if cur|prev == 0 {
			a.w[i].Store(tombKey)
			a.w[i+1].Store(0)
			a.w[i+2].Store(0)
			a.w[i+3].Store(0)
			s.live--
			t.n.Add(-1)
		} else {
			a.w[i+2].Store(cur)
			a.w[i+3].Store(prev)
		}
	}
	s.mu.Unlock()
}

// payload returns the bits held in the slot at word index i: the endpoint
// bits of a precise slot, or the union of both generations of an
// approximate one still valid at generation g (0 when expired).
func (t *table) payload(a *slots, i int, g uint64) uint64 {
	if t.stride == preciseStride {
		return a.w[i+1].Load()
	}
	return approxBits(a.w[i+1].Load(), a.w[i+2].Load(), a.w[i+3].Load(), g)
}

// clearBitAll removes bit from every entry (an endpoint restarted or
// cleared its cache). It returns how many entries held the bit.
func (t *table) clearBitAll(bit uint64) int {
	n := 0
	for si := range t.shards {
		s := &t.shards[si]
		s.mu.Lock()
		a := s.arr.Load()
		for i := 0; i < len(a.w); i += t.stride {
			k := a.w[i].Load()
			if k == emptyKey || k == tombKey {
				continue
			}
			var rest uint64
			if t.stride == preciseStride {
				b := a.w[i+1].Load()
				if b&bit == 0 {
					continue
				}
				rest = b &^ bit
				a.w[i+1].Store(rest)
			} else {
				cur, prev := a.w[i+2].Load(), a.w[i+3].Load()
				if (cur|prev)&bit == 0 {
					continue
				}
				a.w[i+2].Store(cur &^ bit)
				a.w[i+3].Store(prev &^ bit)
				rest = (cur | prev) &^ bit
			}
			n++
			if rest == 0 {
				for j := 1; j < t.stride; j++ {
					a.w[i+j].Store(0)
				}
				a.w[i].Store(tombKey)
				s.live--
				t.n.Add(-1)
			}
		}
		s.mu.Unlock()
	}
	return n
}

// evict frees about 1/16 of a full shard: expired approximate entries and
// otherwise whatever the clock hand passes (keys are hashes, so this is
// random eviction). Caller holds s.mu.
func (t *table) evict(s *shard, g uint64) {
	a := s.arr.Load()
	target := t.maxLive - t.maxLive/16 - 1
	if target < 0 {
		target = 0
	}
	c := a.capacity()
	for scanned := 0; s.live > target && scanned < 2*c; scanned++ {
		p := s.hand % c
		s.hand = p + 1
		i := p * t.stride
		k := a.w[i].Load()
		if k == emptyKey || k == tombKey {
			continue
		}
		b := t.payload(a, i, g)
		if t.stride == preciseStride && t.onEvict != nil {
			t.onEvict(b)
		}
		a.w[i].Store(tombKey)
		for j := 1; j < t.stride; j++ {
			a.w[i+j].Store(0)
		}
		s.live--
		t.n.Add(-1)
		t.evicted.Add(1)
	}
}

// rehash moves the live entries of s into a fresh array (doubled while the
// shard is at least half full and under its bound), dropping tombstones
// and expired approximate entries. Readers keep using the old array until
// they next load the pointer. Caller holds s.mu.
func (t *table) rehash(s *shard, g uint64) *slots {
	old := s.arr.Load()
	c := old.capacity()
	if (s.live+1)*2 > c && c < t.maxCap {
		c *= 2
	}
	na := newSlots(c, t.stride)
	live := 0
	for i := 0; i < len(old.w); i += t.stride {
		k := old.w[i].Load()
		if k == emptyKey || k == tombKey {
			continue
		}
		if t.stride == approxStride && t.payload(old, i, g) == 0 {
			t.n.Add(-1)
			continue
		}
		j, _ := t.find(na, k)
		for w := 1; w < t.stride; w++ {
			na.w[j+w].Store(old.w[i+w].Load())
		}
		na.w[j].Store(k)
		live++
	}
	s.live, s.used = live, live
	s.arr.Store(na)
	return na
}

// memBytes is the memory held by the table's arrays.
func (t *table) memBytes() int64 {
	var n int64
	for i := range t.shards {
		n += int64(len(t.shards[i].arr.Load().w)) * 8
	}
	return n
}
