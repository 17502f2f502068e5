package sim

import (
	"fmt"
	"math/bits"
)

// lru is one instance's prefix cache: a fixed number of block slots evicted
// least-recently-used first. Slots live in flat slices (no per-block
// allocation).
type lru struct {
	cap        int
	idx        map[uint64]int32
	key        []uint64
	prev, next []int32
	head, tail int32   // head is the most recently used; -1 when empty
	free       []int32 // slots emptied by remove
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, idx: make(map[uint64]int32, capacity), head: -1, tail: -1,
		key: make([]uint64, 0, capacity), prev: make([]int32, 0, capacity), next: make([]int32, 0, capacity)}
}

func (c *lru) len() int { return len(c.idx) }

func (c *lru) unlink(s int32) {
	p, n := c.prev[s], c.next[s]
	if p >= 0 {
		c.next[p] = n
	} else {
		c.head = n
	}
	if n >= 0 {
		c.prev[n] = p
	} else {
		c.tail = p
	}
}

func (c *lru) pushFront(s int32) {
	c.prev[s], c.next[s] = -1, c.head
	if c.head >= 0 {
		c.prev[c.head] = s
	}
	c.head = s
	if c.tail < 0 {
		c.tail = s
	}
}

// touch makes k the most recently used block, inserting it if absent. When
// the insertion evicts a block, it returns that block's key and true.
func (c *lru) touch(k uint64) (evicted uint64, ok bool) {
	if c.cap <= 0 {
		return 0, false
	}
	if s, hit := c.idx[k]; hit {
		if c.head != s {
			c.unlink(s)
			c.pushFront(s)
		}
		return 0, false
	}
	var s int32
	if n := len(c.free); n > 0 {
		s = c.free[n-1]
		c.free = c.free[:n-1]
		c.key[s] = k
	} else if len(c.key) < c.cap {
		s = int32(len(c.key))
		c.key, c.prev, c.next = append(c.key, k), append(c.prev, -1), append(c.next, -1)
	} else {
		s = c.tail
		evicted, ok = c.key[s], true
		delete(c.idx, evicted)
		c.unlink(s)
		c.key[s] = k
	}
	c.idx[k] = s
	c.pushFront(s)
	return evicted, ok
}

// remove takes k out of the cache, if it holds it; its slot is the next
// one filled.
func (c *lru) remove(k uint64) bool {
	s, ok := c.idx[k]
	if !ok {
		return false
	}
	c.unlink(s)
	delete(c.idx, k)
	c.free = append(c.free, s)
	return true
}

func (c *lru) has(k uint64) bool {
	_, ok := c.idx[k]
	return ok
}

// Eviction is the order in which an instance's prefix cache gives up the
// blocks of one request once they are the least recently used.
type Eviction uint8

const (
	// EvictTailFirst, the default, is the engines' order: vLLM frees a
	// finished request's blocks in reverse so that its tail is evicted
	// first (SGLang's radix cache evicts leaves first; kvgate's engine
	// emulator does as vLLM), so a conversation that loses some blocks
	// keeps its prefix and its next turn recomputes only the end.
	EvictTailFirst Eviction = iota
	// EvictHeadFirst is the baseline chapter's model: a request's blocks
	// are touched in prompt order, so its first block is the least recent
	// and goes first, taking the whole prefix with it (the rest stays
	// until evicted in turn, unreachable). Figures in docs/ that do not
	// say tail-first were measured with it.
	EvictHeadFirst
)

// ParseEviction parses --eviction: tail-first or head-first.
func ParseEviction(s string) (Eviction, error) {
	switch s {
	case "tail-first":
		return EvictTailFirst, nil
	case "head-first":
		return EvictHeadFirst, nil
	}
	return 0, fmt.Errorf("unknown eviction order %q (known: tail-first, head-first)", s)
}

func (e Eviction) String() string {
	if e == EvictHeadFirst {
		return "head-first"
	}
	return "tail-first"
}

// fleetCache holds every prefill instance's LRU and, for fleets of up to 64
// instances, a holder mask per block so that one walk over a request's keys
// gives every instance's prefix match.
type fleetCache struct {
	inst    []*lru
	holders map[uint64]uint64 // nil when the fleet has more than 64 instances
	order   Eviction
	// onEvict, when set, hears of every block insert evicts (the
	// router's view drops its approximate entry, as kvindex does on a
	// KV event's removal).
	onEvict func(inst int, key uint64)
}

func newFleetCache(n, capBlocks int, order Eviction) *fleetCache {
	f := &fleetCache{inst: make([]*lru, n), order: order}
	for i := range f.inst {
		f.inst[i] = newLRU(capBlocks)
	}
	if n <= 64 {
		f.holders = make(map[uint64]uint64, n*capBlocks)
	}
	return f
}

// match sets matched[i] to the number of leading keys instance i holds.
func (f *fleetCache) match(keys []uint64, matched []int) {
	if f.holders == nil {
		for i, c := range f.inst {
			n := 0
			for _, k := range keys {
				if !c.has(k) {
					break
				}
				n++
			}
			matched[i] = n
		}
		return
	}
	alive := uint64(1)<<uint(len(f.inst)) - 1
	if len(f.inst) == 64 {
		alive = ^uint64(0)
	}
	for i := range matched {
		matched[i] = len(keys)
	}
	for j, k := range keys {
		h := f.holders[k] & alive
		gone := alive &^ h
		for gone != 0 {
			b := gone & -gone
			matched[bits.TrailingZeros64(b)] = j
			gone &^= b
		}
		alive = h
		if alive == 0 {
			return
		}
	}
}

// insert touches keys on instance i when a request is dispatched: last
// key first, so that its first block is the most recently used
// (EvictTailFirst), or in prompt order (EvictHeadFirst).
func (f *fleetCache) insert(i int, keys []uint64) {
	c := f.inst[i]
	bit := uint64(1) << uint(i)
	for j := range keys {
		k := keys[j]
		if f.order == EvictTailFirst {
			k = keys[len(keys)-1-j]
		}
		ev, ok := c.touch(k)
		if ok && f.onEvict != nil {
			f.onEvict(i, ev)
		}
		if f.holders == nil {
			continue
		}
		if ok {
			if m := f.holders[ev] &^ bit; m == 0 {
				delete(f.holders, ev)
			} else {
				f.holders[ev] = m
			}
		}
		f.holders[k] |= bit
	}
}

// missing returns the keys instance i does not hold (those an insert of
// keys would add).
func (f *fleetCache) missing(i int, keys []uint64) []uint64 {
	var out []uint64
	for _, k := range keys {
		if !f.inst[i].has(k) {
			out = append(out, k)
		}
	}
	return out
}

// remove takes keys out of instance i's cache (a request displaced before
// its prefill: sched.Scheduler.Displace).
func (f *fleetCache) remove(i int, keys []uint64) {
	bit := uint64(1) << uint(i)
	for _, k := range keys {
		if !f.inst[i].remove(k) || f.holders == nil {
			continue
		}
		if m := f.holders[k] &^ bit; m == 0 {
			delete(f.holders, k)
		} else {
			f.holders[k] = m
		}
	}
}
