package kvindex

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvgate/kvgate/internal/kvindex/prefetch"
)

// Reserved key values inside a table; no tkey or tbase is either.
const (
	emptyKey = 0
	tombKey  = 1
)

// Precise entries of all three tiers share one table per (model, group,
// page): the slot key is the block key with its low three bits replaced by
// 0b1tt, tt the tier (tkey; never emptyKey or tombKey), and a slot's home
// is chosen from the bits above them (home), so a block's GPU, CPU and
// storage entries start their probe at the same slot and lie in one run of
// the linear-probing array, normally in one cache line. One probe then
// answers every tier (walkFlat). Block keys differing only in their low
// three bits alias (a 2^-61 chance, which only costs a wrong prefix
// guess).
func tkey(k uint64, t Tier) uint64 { return tbase(k) | uint64(t) }

// tbase is tkey without the tier: what every tier's slot key of k starts
// with (its low two bits are 0).
func tbase(k uint64) uint64 { return k&^7 | 4 }

// home is the first slot of key k (a tkey, or a tbase in an approximate
// table) in an array with the given mask.
func home(k, mask uint64) uint64 { return (k >> 3) & mask }

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

// table maps keys to a 64-bit endpoint bitset for one page of 64
// endpoints of one model and one KV-cache group: either the precise entries
// of all tiers (slot keys are tkeys) or the approximate entries. It is
// sharded by the key's top bits; each shard has its own writer mutex and
// array. Per tier ("tag": the tier of a precise slot key, 0 for every
// approximate one) it counts entries and bounds them.
type table struct {
	stride  int
	shift1  uint // shard = key>>1>>(shift1&63): key's top log2(shards) bits, without a branch for one shard
	maxLive int  // per shard and tag; beyond it entries of that tag are evicted
	maxCap  int  // per shard slot capacity bound
	n       atomic.Int64
	nt      [4]atomic.Int64 // entries by tag
	evicted atomic.Int64
	eps     [4]atomic.Uint64          // by tag, every bit ever set (lookups skip tiers without theirs)
	onEvict func(t Tier, bits uint64) // precise tables: per-endpoint counters
	shards  []shard
}

type shard struct {
	mu    sync.Mutex
	arr   atomic.Pointer[slots]
	live  int      // live entries (under mu)
	used  int      // live + tombstones (under mu)
	hand  int      // eviction clock hand, in slots (under mu)
	liveT [4]int32 // live entries by tag (under mu)
	_     [8]byte  // 64 bytes: own cache line, and indexing is a shift
}

// tag is the tier of a precise slot key, 0 in an approximate table.
func (t *table) tag(k uint64) int {
	if t.stride == preciseStride {
		return int(k & 3)
	}
	return 0
}

const minShardCap = 8

func newTable(stride, shards, maxLive int, onEvict func(Tier, uint64)) *table {
	if shards < 1 {
		shards = 1
	}
	shards = 1 << bits.Len(uint(shards-1)) // round up to a power of two
	per := (maxLive + shards - 1) / shards
	if per < 4 {
		per = 4
	}
	// Keep the load factor at or under 0.6 when a shard is full (all
	// three tiers of a precise table).
	tags := 1
	if stride == preciseStride {
		tags = 3
	}
	maxCap := 1 << bits.Len(uint(tags*per*5/3))
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

// getTiers returns the GPU, CPU and storage bits of the block whose tkeys
// start with base (tbase). Lock-free: every word is loaded atomically and
// the slot key re-checked after the payload.
func (t *table) getTiers(base uint64) (tb [4]uint64) {
	a := t.shardOf(base).arr.Load()
	w := a.w
	m := a.mask
	for p := home(base, m); ; p = (p + 1) & m {
		i := p * preciseStride
		kk := w[i].Load()
		if kk&^3 == base {
			b := w[i+1].Load()
			if w[i].Load() == kk {
				tb[kk&3] = b
			}
			continue
		}
		if kk == emptyKey {
			return tb
		}
	}
}

// getApprox returns the approximate bits of k still valid at generation g.
func (t *table) getApprox(k, g uint64) uint64 {
	a := t.shardOf(k).arr.Load()
	w := a.w
	m := a.mask
	for p := home(k, m); ; p = (p + 1) & m {
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
	for p := home(k, m); ; p = (p + 1) & m {
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
	tag := t.tag(k)
	if int(s.liveT[tag]) >= t.maxLive {
		t.evict(s, g, tag) // only turns entries into tombstones: i stays valid
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
	s.liveT[tag]++
	return i
}

// markEndpoint records bit in t.eps[tag] before any entry with it is
// written.
func (t *table) markEndpoint(tag int, bit uint64) {
	if t.eps[tag].Load()&bit == 0 {
		t.eps[tag].Or(bit)
	}
}

// prefetchChunk is how many keys setBits loads ahead of writing them.
const prefetchChunk = 32

// prefetch asks for the home slots of keys' tier entries (a precise
// table).
func (t *table) prefetch(keys []uint64, tier Tier) {
	for _, k := range keys {
		k = tkey(k, tier)
		a := t.shardOf(k).arr.Load()
		prefetch.Line(unsafe.Pointer(&a.w[home(k, a.mask)*preciseStride]))
	}
}

// setBits sets bit in the precise entries of keys and returns how many
// bits were new. Per chunk of keys it first prefetches every key's home
// slot, so that the cache misses of the chunk overlap
// instead of being serialised by the mutexes and atomic stores (full
// fences on amd64) that follow; it then sorts the chunk by shard and takes
// each shard's mutex once for all its keys. The key count is published
// once at the end.
func (t *table) setBits(keys []uint64, tier Tier, bit uint64) int64 {
	t.markEndpoint(int(tier), bit)
	var added, inserted int64
	var ks [prefetchChunk]uint64
	var sh [prefetchChunk]uint32
	for len(keys) > 0 {
		n := min(len(keys), prefetchChunk)
		for i, k := range keys[:n] {
			k = tkey(k, tier)
			si := t.shardIndex(k)
			a := t.shards[si].arr.Load()
			prefetch.Line(unsafe.Pointer(&a.w[home(k, a.mask)*preciseStride]))
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
	t.nt[tier].Add(inserted)
	return added
}

func (t *table) shardIndex(k uint64) uint32 {
	return uint32(k >> 1 >> (t.shift1 & 63))
}

// setBitLocked sets bit in the precise entry of k (a tkey) in s; it reports whether the
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

// clearBit clears bit in the precise entry of k (a tkey); it reports
// whether it was set.
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
		s.liveT[k&3]--
		t.n.Add(-1)
		t.nt[k&3].Add(-1)
	}
	s.mu.Unlock()
	return true
}

// setApprox marks bit as routed to k at generation g.
func (t *table) setApprox(k, bit, g uint64) {
	t.markEndpoint(0, bit)
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
	t.nt[0].Add(1)
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
			s.liveT[0]--
			t.n.Add(-1)
			t.nt[0].Add(-1)
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
// cleared its cache). It returns how many entries held the bit, by tag.
func (t *table) clearBitAll(bit uint64) (n [4]int) {
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
			tag := t.tag(k)
			n[tag]++
			if rest == 0 {
				for j := 1; j < t.stride; j++ {
					a.w[i+j].Store(0)
				}
				a.w[i].Store(tombKey)
				s.live--
				s.liveT[tag]--
				t.n.Add(-1)
				t.nt[tag].Add(-1)
			}
		}
		s.mu.Unlock()
	}
	return n
}

// evict frees about 1/16 of the entries of a shard's tag when it is full:
// whatever entries of that tag the clock hand passes (keys are hashes, so
// this is random eviction). Caller holds s.mu.
func (t *table) evict(s *shard, g uint64, tag int) {
	a := s.arr.Load()
	target := int32(t.maxLive - t.maxLive/16 - 1)
	if target < 0 {
		target = 0
	}
	c := a.capacity()
	for scanned := 0; s.liveT[tag] > target && scanned < 2*c; scanned++ {
		p := s.hand % c
		s.hand = p + 1
		i := p * t.stride
		k := a.w[i].Load()
		if k == emptyKey || k == tombKey || t.tag(k) != tag {
			continue
		}
		b := t.payload(a, i, g)
		if t.stride == preciseStride && t.onEvict != nil {
			t.onEvict(Tier(tag), b)
		}
		a.w[i].Store(tombKey)
		for j := 1; j < t.stride; j++ {
			a.w[i+j].Store(0)
		}
		s.live--
		s.liveT[tag]--
		t.n.Add(-1)
		t.nt[tag].Add(-1)
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
	var liveT [4]int32
	for i := 0; i < len(old.w); i += t.stride {
		k := old.w[i].Load()
		if k == emptyKey || k == tombKey {
			continue
		}
		if t.stride == approxStride && t.payload(old, i, g) == 0 {
			t.n.Add(-1)
			t.nt[0].Add(-1)
			continue
		}
		liveT[t.tag(k)]++
		j, _ := t.find(na, k)
		for w := 1; w < t.stride; w++ {
			na.w[j+w].Store(old.w[i+w].Load())
		}
		na.w[j].Store(k)
		live++
	}
	s.live, s.used, s.liveT = live, live, liveT
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
